/**
 * What a process holds, read from /proc, for the tests that check a server stays bounded
 * under attack (test/hostile/): its resident memory and open descriptors, sampled all along.
 */
import { readFileSync, readdirSync } from 'node:fs';

/** The process's resident set size, in MiB (0 once it is gone). */
export function rssMiB(pid: number): number {
  const match = /^VmRSS:\s+(\d+) kB/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  return match === null ? 0 : Number(match[1]) / 1024;
}

/** The process's open file descriptors. */
export function fdCount(pid: number): number {
  return readdirSync(`/proc/${pid}/fd`).length;
}

/** Samples the process's RSS and descriptors every 50 ms until stopped; returns the highest of each. */
export function sampler(pid: number): { stop(): { maxRss: number; maxFds: number } } {
  let maxRss = rssMiB(pid);
  let maxFds = fdCount(pid);
  const sample = (): void => {
    maxRss = Math.max(maxRss, rssMiB(pid));
    maxFds = Math.max(maxFds, fdCount(pid));
  };
  const timer = setInterval(sample, 50);
  return {
    stop() {
      clearInterval(timer);
      sample();
      return { maxRss, maxFds };
    },
  };
}
