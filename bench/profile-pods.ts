/**
 * Where a pod's time goes on the Task API route: N pods with one container, one after the
 * other, through CRI, with tsbox logging at debug; prints each CRI step's p50 beside the p50
 * of what tsbox logged for the container (rootfs mount, runc create through the holder, runc
 * start; at Delete, the container's deletion from runc and the rootfs unmount) and of each Task API call as tsbox's ttrpc server saw it. Information, not a test.
 *
 *   node dist/bench/profile-pods.js [--pods 20] [--handler tsbox-task]
 */
import { readFileSync } from 'node:fs';
import { parseArgs } from 'node:util';
import { BUSYBOX_IMAGE } from '../test/support/images.js';
import { TSBOX_TASK_HANDLER, startPodEnv } from '../test/support/pod-env.js';

const { values } = parseArgs({ options: { pods: { type: 'string', default: '20' }, handler: { type: 'string', default: TSBOX_TASK_HANDLER } } });
const PODS = Number(values.pods);
const now = (): number => Number(process.hrtime.bigint()) / 1e6;
const p50 = (xs: number[]): number => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] ?? NaN;

async function main(): Promise<void> {
  const env = await startPodEnv({ tsboxLogLevel: 'debug', containerdLogLevel: 'warn' });
  const steps: Record<string, number[]> = {};
  const add = (k: string, v: number): void => void (steps[k] ??= []).push(v);
  try {
    for (let i = -2; i < PODS; i++) {
      const config = env.podConfig(`prof-${i + 2}`);
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
      await env.cri.call('StopContainer', { container_id: c, timeout: 0 }, { timeoutMs: 60_000 });
      const t4 = now();
      await env.cri.call('RemoveContainer', { container_id: c }, { timeoutMs: 60_000 });
      const t5 = now();
      await env.cri.call('StopPodSandbox', { pod_sandbox_id: id }, { timeoutMs: 60_000 });
      const t6 = now();
      await env.cri.call('RemovePodSandbox', { pod_sandbox_id: id }, { timeoutMs: 60_000 });
      const t7 = now();
      if (i < 0) continue; // warm-up
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
}

main().catch((err: unknown) => {
  process.stderr.write(`profile-pods: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
  process.exitCode = 1;
});
