/**
 * Where a pod's time goes on the Task API route: N pods with one container, one after the
 * other, through CRI, with tsbox logging at debug; prints each CRI step's p50 beside the p50
 * of what tsbox logged for the container (rootfs mount, runc create through the holder, runc
 * start; at Delete, the container's deletion from runc and the rootfs unmount) and of each Task API call as tsbox's ttrpc server saw it;
 * then the CPU a pod cost (user + system time from /proc, per pod, warm-up left out): tsbox,
 * containerd and the whole machine, for the pods' start and for their whole life
 * (four pods at once keep this machine's cores busy, so pods per second follows it). tsbox at
 * debug pays for its log lines. Information, not a test.
 *
 *   node dist/bench/profile-pods.js [--pods 20] [--handler tsbox-task] [--run-on-disk]
 *
 * containerd's state dir is on a tmpfs, as on a node (bench/pods.ts); --run-on-disk keeps it on disk.
 */
import { readFileSync } from 'node:fs';
import { parseArgs } from 'node:util';
import { BUSYBOX_IMAGE } from '../test/support/images.js';
import { TSBOX_TASK_HANDLER, startPodEnv } from '../test/support/pod-env.js';

const { values } = parseArgs({ options: { pods: { type: 'string', default: '20' }, handler: { type: 'string', default: TSBOX_TASK_HANDLER }, 'run-on-disk': { type: 'boolean', default: false } } });
const PODS = Number(values.pods);
const now = (): number => Number(process.hrtime.bigint()) / 1e6;
const p50 = (xs: number[]): number => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] ?? NaN;

/** CPU time (user + system, ms) a process has used; 0 when it is gone or none. */
function cpuMs(pid: number): number {
  if (pid <= 0) return 0;
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    // Fields 14 and 15 (utime, stime), in clock ticks (100 per second on Linux).
    return (Number(fields[11]) + Number(fields[12])) * 10;
  } catch {
    return 0; // gone meanwhile
  }
}

/** CPU time (ms) the whole machine has been busy: user, nice, system, irq, softirq. */
function machineBusyMs(): number {
  const [, user, nice, system, , , irq, softirq] = (readFileSync('/proc/stat', 'utf8').split('\n')[0] ?? '').split(/\s+/).map(Number);
  return ((user ?? 0) + (nice ?? 0) + (system ?? 0) + (irq ?? 0) + (softirq ?? 0)) * 10;
}

async function main(): Promise<void> {
  const env = await startPodEnv({ tsboxLogLevel: 'debug', containerdLogLevel: 'warn', runOnTmpfs: values['run-on-disk'] !== true });
  const steps: Record<string, number[]> = {};
  const add = (k: string, v: number): void => void (steps[k] ??= []).push(v);
  const cpuNow = (): Record<string, number> => ({ tsbox: cpuMs(env.tsbox.pid ?? 0), containerd: cpuMs(env.containerd.pid ?? 0), machine: machineBusyMs() });
  const cpu: Record<string, number> = {};
  const addCpu = (phase: string, from: Record<string, number>, to: Record<string, number>): void => {
    for (const [k, v] of Object.entries(to)) cpu[`${phase} ${k}`] = (cpu[`${phase} ${k}`] ?? 0) + v - (from[k] ?? 0);
  };
  try {
    for (let i = -2; i < PODS; i++) {
      const config = env.podConfig(`prof-${i + 2}`);
      const c0 = cpuNow();
      const t0 = now();
      const { pod_sandbox_id: id } = await env.cri.call('RunPodSandbox', { config, runtime_handler: values.handler }, { timeoutMs: 60_000 });
      const t1 = now();
      const { container_id: c } = await env.cri.call(
        'CreateContainer',
        { pod_sandbox_id: id, config: { metadata: { name: 'main' }, image: { image: BUSYBOX_IMAGE }, command: ['sleep', '100000'] }, sandbox_config: config },
        { timeoutMs: 60_000 },
      );
      const t2 = now();
      await env.cri.call('StartContainer', { container_id: c }, { timeoutMs: 60_000 });
      const t3 = now();
      const c3 = cpuNow();
      await env.cri.call('StopContainer', { container_id: c, timeout: 0 }, { timeoutMs: 60_000 });
      const t4 = now();
      await env.cri.call('RemoveContainer', { container_id: c }, { timeoutMs: 60_000 });
      const t5 = now();
      await env.cri.call('StopPodSandbox', { pod_sandbox_id: id }, { timeoutMs: 60_000 });
      const t6 = now();
      await env.cri.call('RemovePodSandbox', { pod_sandbox_id: id }, { timeoutMs: 60_000 });
      const t7 = now();
      if (i < 0) continue; // warm-up
      addCpu('start', c0, c3);
      addCpu('life', c0, cpuNow());
      for (const [k, v] of Object.entries({ RunPodSandbox: t1 - t0, CreateContainer: t2 - t1, StartContainer: t3 - t2, StopContainer: t4 - t3, RemoveContainer: t5 - t4, StopPodSandbox: t6 - t5, RemovePodSandbox: t7 - t6 })) add(`cri ${k}`, v);
    }
    const log = readFileSync(env.tsbox.logPath, 'utf8').split('\n');
    for (const line of log) {
      let entry: Record<string, unknown>;
      try {
        entry = JSON.parse(line) as Record<string, unknown>;
      } catch {
        continue; // not a JSON line
      }
      // Every duration tsbox logs: a number in a field named ms or ending in Ms.
      for (const [key, v] of Object.entries(entry)) {
        if (typeof v === 'number' && (key === 'ms' || key.endsWith('Ms'))) add(`tsbox ${String(entry['msg'])}${typeof entry['rpc'] === 'string' ? ` ${entry['rpc']}` : ''} ${key}`, v);
      }
    }
  } finally {
    await env.teardown();
  }
  for (const [k, xs] of Object.entries(steps)) process.stdout.write(`${k.padEnd(70)} p50 ${p50(xs).toFixed(1).padStart(7)} ms  (n=${xs.length})\n`);
  for (const [k, total] of Object.entries(cpu)) process.stdout.write(`${`cpu per pod, ${k}`.padEnd(70)}     ${(total / PODS).toFixed(1).padStart(7)} ms\n`);
}

main().catch((err: unknown) => {
  process.stderr.write(`profile-pods: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
  process.exitCode = 1;
});
