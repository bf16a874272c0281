/**
 * Which containerd tsbox deals with, and what that release asks of a sandboxer or gives it
 * (read from containerd's source at each tag; README, "containerd releases"). `tsbox doctor`
 * names the release and checks what applies to it; `tsbox install` sets what it knows.
 */
import { execFileSync } from 'node:child_process';
import { messageOf } from '../base/errors.js';

/** major.minor.patch */
export type Release = readonly [number, number, number];

/** The releases whose behaviour tsbox knows: 2.0 to 2.4. */
export const KNOWN_RELEASES = { from: [2, 0], to: [2, 4] } as const;

/** Reads "2.1.9" out of `containerd --version` or the version service's "v2.3.4" / "2.4.0-dev+main". */
export function parseRelease(text: string): Release | undefined {
  const match = /\bv?(\d+)\.(\d+)\.(\d+)/.exec(text);
  if (match === null) return undefined;
  return [Number(match[1]), Number(match[2]), Number(match[3])];
}

const atLeast = (r: Release, major: number, minor: number): boolean => r[0] > major || (r[0] === major && r[1] >= minor);

/** What a containerd release does with a sandboxer such as tsbox. */
export interface ReleaseTraits {
  /** Within 2.0–2.4, whose behaviour tsbox knows. */
  readonly known: boolean;
  /** Keeps Start's `spec`: CRI's runtimeSpec and NRI's view of the pod come from it (2.3). */
  readonly keepsPodSpec: boolean;
  /** UpdatePodSandboxResources reaches the sandboxer's Update (2.3). */
  readonly updatesPodResources: boolean;
  /** Pulls the sandbox (pause) image at every RunPodSandbox, whatever the sandboxer (2.3). */
  readonly pullsPauseImage: boolean;
  /** Knows `disable_pause_image_pull` on a runtime handler (2.4). */
  readonly knowsDisablePausePull: boolean;
  /** Takes a pod's CPU and memory from the sandboxer's Metrics (2.4). */
  readonly statsFromMetrics: boolean;
  /** Calls the Task API's Shutdown after every task delete (2.4). */
  readonly shutdownAfterDelete: boolean;
  /** CRI's default sandbox image. */
  readonly defaultSandboxImage: string;
}

export function traitsOf(r: Release): ReleaseTraits {
  const v23 = atLeast(r, 2, 3);
  const v24 = atLeast(r, 2, 4);
  return {
    known: atLeast(r, ...KNOWN_RELEASES.from) && !atLeast(r, KNOWN_RELEASES.to[0], KNOWN_RELEASES.to[1] + 1),
    keepsPodSpec: v23,
    updatesPodResources: v23,
    pullsPauseImage: v23,
    knowsDisablePausePull: v24,
    statsFromMetrics: v24,
    shutdownAfterDelete: v24,
    defaultSandboxImage: v23 ? 'registry.k8s.io/pause:3.10.2' : 'registry.k8s.io/pause:3.10',
  };
}

/** What applies to a release, one phrase each, for doctor. */
export function describeTraits(t: ReleaseTraits): string[] {
  return [
    t.keepsPodSpec ? "keeps the pod's OCI spec tsbox returns from Start (crictl inspectp, NRI plugins see the pod)" : "ignores the pod's spec from Start (NRI plugins see a tsbox pod without namespaces or cgroup)",
    t.updatesPodResources ? 'passes UpdatePodSandboxResources to tsbox, which sets the pod cgroup' : 'has no UpdatePodSandboxResources for sandboxers',
    t.statsFromMetrics ? "takes a pod's CPU and memory from tsbox's Metrics" : "takes pod stats from the pod's containers",
    t.shutdownAfterDelete ? "calls Shutdown on a pod's task endpoint after every task delete" : "calls Shutdown on a pod's task endpoint only when the pod goes",
  ];
}

/** The release of `containerd --version` of a binary, or why it cannot be known. */
export function releaseOfBinary(binary: string): { release: Release; text: string } | { error: string } {
  let text: string;
  try {
    text = execFileSync(binary, ['--version'], { encoding: 'utf8', timeout: 10_000 }).trim();
  } catch (err) {
    return { error: `${binary} --version failed: ${messageOf(err)}` };
  }
  // "containerd github.com/containerd/containerd/v2 2.1.9+ds1 <commit>": the third word.
  const release = parseRelease(text.split(/\s+/).slice(2).join(' ') || text);
  return release === undefined ? { error: `cannot read a version from "${text}"` } : { release, text };
}
