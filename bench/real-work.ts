/**
 * Real-work figures of tsbox with the process backend (and Status latency against a growing
 * table with the no-process backend): prints one JSON object on stdout. A benchmark, not a
 * test: it measures and reports, it never passes or fails on a number.
 *
 *   node dist/bench/real-work.js --sbload PATH [--quick] [--only lifecycle,memory,recovery,status] [--main MAIN.js]
 *
 * `--main` runs another build of tsbox (such as an older one) through the same harness.
 */
import { execFileSync } from 'node:child_process';
import { readFileSync, readdirSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { SandboxClient } from '../test/support/grpc-client.js';
import { type SandboxerDaemon, createSandboxerDaemon, tsboxSandboxer } from '../test/support/tsbox-daemon.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const { values } = parseArgs({ options: { sbload: { type: 'string' }, quick: { type: 'boolean' }, only: { type: 'string' }, main: { type: 'string' } } });
const sbload = values.sbload ?? join(root, '.cache', 'sbbench', 'bin', 'sbload');
const quick = values.quick === true;
/** `--only lifecycle,memory,recovery,status` runs those parts only (all by default). */
const parts = new Set((values.only ?? 'lifecycle,memory,recovery,status').split(','));
const log = (msg: string): void => void process.stderr.write(`[real-work] ${msg}\n`);

/** tsbox through the test harness (tests/support/tsbox-daemon.ts), started; `startMs` to serving. */
interface Daemon {
  readonly harness: SandboxerDaemon;
  readonly pid: number;
  readonly socket: string;
  readonly stateDir: string;
  readonly startMs: number;
}

async function startDaemon(backend: 'process' | 'noop', harness?: SandboxerDaemon): Promise<Daemon> {
  const h =
    harness ??
    (await createSandboxerDaemon(tsboxSandboxer({ logLevel: 'info', args: ['--backend', backend], ...(values.main === undefined ? {} : { main: values.main }) }), {
      label: 'tsbox-bench-',
      startPollMs: 2,
      startTimeoutMs: 120_000,
    }));
  const t0 = performance.now();
  await h.start();
  const startMs = performance.now() - t0;
  return { harness: h, pid: h.pid as number, socket: h.socketPath, stateDir: h.stateDir, startMs };
}

/** SIGTERM, as a service manager stops it; sandboxes keep running. */
async function stopDaemon(d: Daemon): Promise<void> {
  await d.harness.stop({ graceMs: 60_000 });
}

/** Stops it and removes whatever is left of it. */
async function tearDown(d: Daemon): Promise<void> {
  await d.harness.teardown();
}

function kib(pid: number, file: 'status' | 'smaps_rollup', key: string): number {
  const text = readFileSync(`/proc/${pid}/${file}`, 'utf8');
  const m = new RegExp(`^${key}:\\s+(\\d+) kB`, 'm').exec(text);
  return m ? Number(m[1]) : 0;
}

/** Pids of every process whose parent chain reaches a tsbox-shim of this state dir. */
function shimFamily(stateDir: string): number[] {
  const parents = new Map<number, number>();
  const shims: number[] = [];
  for (const name of readdirSync('/proc')) {
    const pid = Number(name);
    if (!Number.isInteger(pid)) continue;
    try {
      const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
      parents.set(pid, Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]));
      const cmd = readFileSync(`/proc/${pid}/cmdline`, 'utf8');
      if (cmd.includes('tsbox-shim') && cmd.includes(stateDir)) shims.push(pid);
    } catch {
      // gone meanwhile
    }
  }
  const family = new Set(shims);
  for (const [pid, ppid] of parents) if (family.has(ppid)) family.add(pid);
  return [...family];
}

const ns = 'bench';
const ids = (prefix: string, n: number): string[] => Array.from({ length: n }, (_, i) => `${prefix}-${i}`);

async function createStarted(client: SandboxClient, list: string[], concurrency = 8): Promise<void> {
  let next = 0;
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      while (next < list.length) {
        const id = list[next++] as string;
        await client.create({ sandboxId: id });
        await client.start({ sandboxId: id });
      }
    }),
  );
}

async function shutdownAll(client: SandboxClient, list: string[], concurrency = 8): Promise<void> {
  let next = 0;
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      while (next < list.length) await client.shutdown({ sandboxId: list[next++] as string });
    }),
  );
}

function runSbload(args: string[]): Record<string, unknown> {
  return JSON.parse(execFileSync(sbload, args, { encoding: 'utf8', maxBuffer: 64 << 20 })) as Record<string, unknown>;
}

async function lifecycleRate(concurrency: number): Promise<number> {
  const d = await startDaemon('process');
  try {
    const r = runSbload(['--socket', d.socket, '--scenario', 'lifecycle', '--concurrency', String(concurrency),
      '--duration', quick ? '3s' : '8s', '--warmup', '1s', '--stop-exit-status', '137', '--namespace', ns]);
    return r['lifecycles_per_s'] as number;
  } finally {
    await tearDown(d);
  }
}

async function memoryAndWaits(): Promise<Record<string, number>> {
  const d = await startDaemon('process');
  const pid = d.pid;
  const client = new SandboxClient(d.socket, ns);
  const out: Record<string, number> = {};
  try {
    await new Promise((r) => setTimeout(r, 500));
    out['idle_rss_mib'] = kib(pid, 'status', 'VmRSS') / 1024;
    const basePss = kib(pid, 'smaps_rollup', 'Pss');
    const list = ids('mem', 100);
    await createStarted(client, list);
    const tsboxPss = kib(pid, 'smaps_rollup', 'Pss');
    const family = shimFamily(d.stateDir);
    const familyPss = family.reduce((sum, p) => sum + kib(p, 'smaps_rollup', 'Pss'), 0);
    out['processes_per_sandbox'] = family.length / list.length;
    out['pss_per_sandbox_kib'] = (Math.max(0, tsboxPss - basePss) + familyPss) / list.length;
    out['pss_per_sandbox_supervision_kib'] = familyPss / list.length;
    out['pss_per_sandbox_tsbox_kib'] = Math.max(0, tsboxPss - basePss) / list.length;

    // 5 000 pending Waits: 100 sandboxes x 50 Waits, all on one connection. tsbox admits 8 192
    // streams per connection (src/transport/limits.ts): past that a gRPC client queues its
    // calls, and the Status below would wait behind Waits that never end.
    const waiters = 50;
    const before = kib(pid, 'status', 'VmRSS');
    const waits: Promise<unknown>[] = [];
    for (const id of list) for (let i = 0; i < waiters; i++) waits.push(client.wait({ sandboxId: id }));
    // Every Wait has reached the server when a Status on the same connection answers after them.
    await client.status({ sandboxId: list[0] as string });
    await new Promise((r) => setTimeout(r, 1000));
    const pending = kib(pid, 'status', 'VmRSS');
    await shutdownAll(client, list);
    await Promise.all(waits);
    await new Promise((r) => setTimeout(r, 2000));
    const after = kib(pid, 'status', 'VmRSS');
    out['rss_before_waits_mib'] = before / 1024;
    out['rss_waits_pending_mib'] = pending / 1024;
    out['rss_after_waits_mib'] = after / 1024;
    out['kib_per_pending_wait'] = (pending - before) / (list.length * waiters);
  } finally {
    client.close();
    await tearDown(d);
  }
  return out;
}

async function recovery(count: number): Promise<Record<string, number>> {
  const d = await startDaemon('process');
  const list = ids('rec', count);
  try {
    const client = new SandboxClient(d.socket, ns);
    try {
      await createStarted(client, list, 16);
    } finally {
      client.close();
    }
    await stopDaemon(d);
    const again = await startDaemon('process', d.harness);
    const summaryLine = again.harness.logText().split('\n').findLast((l) => l.includes('"recovery done"')) ?? '{}';
    const summary = JSON.parse(summaryLine) as { seconds?: number; running?: number };
    const client2 = new SandboxClient(again.socket, ns);
    try {
      await shutdownAll(client2, list, 16);
    } finally {
      client2.close();
    }
    return { recovery_sandboxes: count, recovery_running: summary.running ?? 0, recovery_to_serving_s: again.startMs / 1000, recovery_internal_s: summary.seconds ?? NaN };
  } finally {
    await tearDown(d);
  }
}

async function statusLatency(known: number): Promise<number> {
  const d = await startDaemon('noop');
  try {
    const r = runSbload(['--socket', d.socket, '--scenario', 'status', '--count', String(known), '--concurrency', '1',
      '--duration', quick ? '2s' : '5s', '--warmup', '1s', '--namespace', ns]);
    return (r['latency'] as Record<string, number>)['p50_us'] as number;
  } finally {
    await tearDown(d);
  }
}

const result: Record<string, number> = {};
if (parts.has('lifecycle')) {
  log('lifecycles with real processes, concurrency 1 and 8');
  result['lifecycles_per_s_c1'] = await lifecycleRate(1);
  result['lifecycles_per_s_c8'] = await lifecycleRate(8);
}
if (parts.has('memory')) {
  log('memory per running sandbox, idle RSS, 5 000 pending Waits');
  Object.assign(result, await memoryAndWaits());
}
if (parts.has('recovery')) {
  log('recovery of 1 000 running sandboxes');
  Object.assign(result, await recovery(quick ? 200 : 1000));
}
if (parts.has('status')) {
  for (const known of [10, 1000, 10000]) {
    log(`Status latency with ${known} sandboxes known`);
    result[`status_p50_us_known_${known}`] = await statusLatency(known);
  }
}
process.stdout.write(`${JSON.stringify(result)}\n`);
