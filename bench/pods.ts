/**
 * Whole pods through CRI, tsbox against containerd's own podsandbox (handler `runc`), on the
 * same containerd with the same image, alternating in one run: what a node feels. tsbox runs
 * under two handlers: `tsbox` (the version-2 route: containerd's runc shim runs the pod's
 * containers) and `tsbox-task` (the Task API route: tsbox runs them, a holder per container,
 * no shim). For each handler: the latency of each step of a pod with one container (RunPodSandbox,
 * CreateContainer, StartContainer, then the teardown kubelet does), serially and 4 pods at
 * once, pods per second, and the memory of running pods (PSS of every process of the pod:
 * the sandbox process, its supervisor, the container and the runc shim serving the pod or the
 * container's holder, plus the change of tsbox's own PSS and of containerd's, per pod: signed,
 * negative when it shrank). On the Task API route the pod's supervisor also relays its task
 * calls; it is counted with the pod (it is not in the pod's cgroup).
 *
 * Then, per handler, SCALE pods (100) are started and held, and the node's memory (every pod's
 * processes, tsbox and containerd) and tsbox's descriptors are read at each quarter: the per-pod
 * slope of a least-squares line through them, and how straight it is (R²). The pods then go,
 * and come and go once more: what tsbox holds after each time, against before.
 *
 *   node dist/bench/pods.js [--rounds 3] [--serial 8] [--concurrent 12] [--memory-pods 8] [--scale 100]
 *                           [--scale-handlers tsbox-task,runc] [--json out.json] [--breakdown]
 *   node dist/bench/pods.js --sandbox-only [--tsbox-main OTHER/dist/src/main.js]
 *
 * As on a node, whose /run is a tmpfs: containerd's state dir (/run/containerd there) is on a
 * tmpfs of its own, with the runc shims' runc root below it (/run/containerd/runc there) and
 * tsbox's tasks; containerd's root and tsbox's records stay on disk. `--run-on-disk` keeps all
 * of it on disk (this machine's /run is not a tmpfs).
 *
 * `--breakdown` also prints, per handler, the PSS of each kind of process of a held pod.
 *
 * `--sandbox-only` runs pods without containers (RunPodSandbox, then StopPodSandbox and
 * RemovePodSandbox), which also an older tsbox build can do: that compares builds.
 */
import { readFileSync, readdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { parseArgs } from 'node:util';
import type { PodSandboxConfig } from '../test/support/containerd-clients.js';
import { BUSYBOX_IMAGE } from '../test/support/images.js';
import { type PodEnv, RUNC_HANDLER, TSBOX_HANDLER, TSBOX_TASK_HANDLER, podShimSocket, runcShimsOf, startPodEnv } from '../test/support/pod-env.js';
import { containerHolders } from '../test/support/host.js';

const { values } = parseArgs({
  options: {
    rounds: { type: 'string', default: '3' },
    serial: { type: 'string', default: '8' },
    concurrent: { type: 'string', default: '12' },
    'memory-pods': { type: 'string', default: '8' },
    scale: { type: 'string', default: '100' },
    'scale-handlers': { type: 'string' },
    json: { type: 'string' },
    'sandbox-only': { type: 'boolean', default: false },
    'tsbox-main': { type: 'string' },
    'run-on-disk': { type: 'boolean', default: false },
    breakdown: { type: 'boolean', default: false },
  },
});
const RUN_ON_TMPFS = values['run-on-disk'] !== true;
const SANDBOX_ONLY = values['sandbox-only'] === true;
const ROUNDS = Number(values.rounds);
const SERIAL = Number(values.serial);
const CONCURRENT = Number(values.concurrent);
const MEMORY_PODS = Number(values['memory-pods']);
const SCALE_PODS = Number(values.scale);
const PARALLEL = 4;
const HANDLERS = [TSBOX_HANDLER, TSBOX_TASK_HANDLER, RUNC_HANDLER] as const;
type Handler = (typeof HANDLERS)[number];
/** The handlers whose pods are held at scale (all unless named: a run of 1 000 pods may skip one). */
const SCALE_HANDLERS: readonly Handler[] = (values['scale-handlers'] ?? HANDLERS.join(',')).split(',').map((h) => {
  if (!(HANDLERS as readonly string[]).includes(h)) throw new Error(`--scale-handlers: ${h} is not one of ${HANDLERS.join(', ')}`);
  return h as Handler;
});
const STEPS = ['run', 'create', 'start', 'podStart', 'teardown', 'lifecycle'] as const;
type Step = (typeof STEPS)[number];

const now = (): number => Number(process.hrtime.bigint()) / 1e6;

interface Pod {
  readonly id: string;
  readonly container: string;
  readonly config: PodSandboxConfig;
}

async function startPod(env: PodEnv, handler: Handler, name: string, times?: Partial<Record<Step, number>>): Promise<Pod> {
  const config = env.podConfig(name);
  const t0 = now();
  const { pod_sandbox_id: id } = await env.cri.call('RunPodSandbox', { config, runtime_handler: handler }, { timeoutMs: 120_000 });
  const t1 = now();
  if (SANDBOX_ONLY) {
    if (times !== undefined) Object.assign(times, { run: t1 - t0, podStart: t1 - t0 });
    return { id, container: '', config };
  }
  const { container_id: container } = await env.cri.call(
    'CreateContainer',
    { pod_sandbox_id: id, config: { metadata: { name: 'main' }, image: { image: BUSYBOX_IMAGE }, command: ['sleep', '100000'] }, sandbox_config: config },
    { timeoutMs: 120_000 },
  );
  const t2 = now();
  await env.cri.call('StartContainer', { container_id: container }, { timeoutMs: 120_000 });
  const t3 = now();
  if (times !== undefined) Object.assign(times, { run: t1 - t0, create: t2 - t1, start: t3 - t2, podStart: t3 - t0 });
  return { id, container, config };
}

async function removePod(env: PodEnv, pod: Pod): Promise<number> {
  const t0 = now();
  if (pod.container !== '') {
    await env.cri.call('StopContainer', { container_id: pod.container, timeout: 0 }, { timeoutMs: 120_000 });
    await env.cri.call('RemoveContainer', { container_id: pod.container }, { timeoutMs: 120_000 });
  }
  await env.cri.call('StopPodSandbox', { pod_sandbox_id: pod.id }, { timeoutMs: 120_000 });
  await env.cri.call('RemovePodSandbox', { pod_sandbox_id: pod.id }, { timeoutMs: 120_000 });
  return now() - t0;
}

function percentile(xs: readonly number[], p: number): number {
  if (xs.length === 0) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.ceil((p / 100) * s.length) - 1)] as number;
}

/** PSS of a process in KiB (smaps_rollup), 0 when it is gone. */
function pssKiB(pid: number): number {
  try {
    const m = /^Pss:\s+(\d+) kB$/m.exec(readFileSync(`/proc/${pid}/smaps_rollup`, 'utf8'));
    return m === null ? 0 : Number(m[1]);
  } catch {
    return 0; // ended meanwhile
  }
}

/** Pids whose cgroup (in any hierarchy) lies below `prefix`. */
function pidsInCgroup(prefix: string): number[] {
  const out: number[] = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const text = readFileSync(`/proc/${entry}/cgroup`, 'utf8');
      if (text.split('\n').some((line) => line.slice(line.indexOf(':', line.indexOf(':') + 1) + 1).startsWith(`${prefix}/`))) out.push(Number(entry));
    } catch {
      // ended meanwhile
    }
  }
  return out;
}

/** The holders (tsbox-ctr) of a container. */
function holdersOf(container: string): number[] {
  return containerHolders()
    .filter((h) => h.id === container)
    .map((h) => h.pid);
}


/** A tsbox pod's supervisor, named by the pid file it writes in the sandbox's directory; none for podsandbox. */
function supervisorOf(env: PodEnv, pod: Pod): number[] {
  try {
    const pid = Number(readFileSync(path.join(env.tsbox.stateDir, 'sandboxes', 'k8s.io', pod.id, 'pid'), 'utf8').split(' ')[0]);
    return readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0')[0]?.endsWith('tsbox-shim') === true ? [pid] : [];
  } catch {
    return []; // not a tsbox pod, or gone
  }
}

/** The processes of a running pod, found from the host: its cgroup tree, its supervisor, its runc shim or its containers' holders. */
function podProcesses(env: PodEnv, pod: Pod): number[] {
  const parent = pod.config.linux?.cgroup_parent ?? '';
  const shims = runcShimsOf(env)
    .filter((s) => s.sockets.includes(podShimSocket(env, pod.id)))
    .map((s) => s.pid);
  return [...new Set([...pidsInCgroup(parent), ...supervisorOf(env, pod), ...shims, ...(pod.container === '' ? [] : holdersOf(pod.container))])];
}

/** What a process is, for --breakdown: its program's name and, for tsbox's own programs, its mode. */
function processKind(pid: number): string {
  try {
    const argv = readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0');
    const program = path.basename(argv[0] ?? '?');
    // A mode is a word (tsbox-ctr create, tsbox-shim serve); options and paths are not.
    return program.startsWith('tsbox-') && argv[1] !== undefined && /^[a-z-]+$/.test(argv[1]) && !argv[1].startsWith('-') ? `${program} ${argv[1]}` : program;
  } catch {
    return 'gone'; // ended meanwhile: its PSS read 0 too
  }
}

async function settle(): Promise<void> {
  await new Promise((resolve) => setTimeout(resolve, 1500));
}

interface MemoryFigures {
  /** PSS of the pod's own processes, per pod. */
  readonly podProcessesKiB: number;
  /** Change of tsbox's PSS, per pod, negative when it shrank (0 for podsandbox). */
  readonly tsboxKiB: number;
  /** Change of containerd's PSS, per pod, negative when it shrank. */
  readonly containerdKiB: number;
  readonly totalKiB: number;
  readonly processesPerPod: number;
}

async function measureMemory(env: PodEnv, handler: Handler): Promise<MemoryFigures> {
  const tsboxPid = env.tsbox.pid ?? 0;
  const containerdPid = env.containerd.pid ?? 0;
  await settle();
  const before = { tsbox: pssKiB(tsboxPid), containerd: pssKiB(containerdPid) };
  const pods: Pod[] = [];
  for (let i = 0; i < MEMORY_PODS; i++) pods.push(await startPod(env, handler, `mem-${handler}-${i}`));
  await settle();
  let processes = 0;
  let podKiB = 0;
  const byKind = new Map<string, { kib: number; count: number }>();
  for (const pod of pods) {
    const pids = podProcesses(env, pod);
    processes += pids.length;
    for (const pid of pids) {
      const kib = pssKiB(pid);
      podKiB += kib;
      const kind = processKind(pid);
      const seen = byKind.get(kind) ?? { kib: 0, count: 0 };
      byKind.set(kind, { kib: seen.kib + kib, count: seen.count + 1 });
    }
  }
  if (values.breakdown === true) {
    const lines = [...byKind].map(([kind, { kib, count }]) => `  ${kind}: ${(count / MEMORY_PODS).toFixed(1)} per pod, ${(kib / count).toFixed(0)} KiB PSS each`);
    process.stdout.write(`${handler}, the pod's processes:\n${lines.join('\n')}\n`);
  }
  const after = { tsbox: pssKiB(tsboxPid), containerd: pssKiB(containerdPid) };
  for (const pod of pods) await removePod(env, pod);
  // Signed: a daemon that shrank while the pods ran (a collection, pages returned) shows as such.
  const tsboxKiB = handler === RUNC_HANDLER ? 0 : (after.tsbox - before.tsbox) / MEMORY_PODS;
  const containerdKiB = (after.containerd - before.containerd) / MEMORY_PODS;
  const podProcessesKiB = podKiB / MEMORY_PODS;
  return { podProcessesKiB, tsboxKiB, containerdKiB, totalKiB: podProcessesKiB + tsboxKiB + containerdKiB, processesPerPod: processes / MEMORY_PODS };
}

/** Open descriptors of a process, 0 when it is gone. */
function fdCount(pid: number): number {
  try {
    return readdirSync(`/proc/${pid}/fd`).length;
  } catch {
    return 0; // ended meanwhile
  }
}

/** Least squares through (x, y): slope and R². */
function fit(points: readonly (readonly [number, number])[]): { slope: number; r2: number } {
  const n = points.length;
  const mx = points.reduce((a, [x]) => a + x, 0) / n;
  const my = points.reduce((a, [, y]) => a + y, 0) / n;
  let sxy = 0;
  let sxx = 0;
  let syy = 0;
  for (const [x, y] of points) {
    sxy += (x - mx) * (y - my);
    sxx += (x - mx) ** 2;
    syy += (y - my) ** 2;
  }
  const slope = sxx === 0 ? NaN : sxy / sxx;
  return { slope, r2: syy === 0 ? 1 : (sxy * sxy) / (sxx * syy) };
}

interface ScaleFigures {
  /** Node memory (KiB) and tsbox's descriptors against pods held. */
  readonly memory: [number, number][];
  /** The node memory's parts (KiB) against pods held: the pods' processes, tsbox, containerd. */
  readonly parts: Record<NodePart, [number, number][]>;
  readonly fds: [number, number][];
  /** tsbox's PSS (KiB) and descriptors: before, after the pods went, after a second come-and-go. */
  readonly daemon: { pssKiB: number; fds: number }[];
}

const NODE_PARTS = ['pods', 'tsbox', 'containerd'] as const;
type NodePart = (typeof NODE_PARTS)[number];

/** Every process that grows with a handler's pods, and the daemons, in KiB of PSS: in all, and each part. */
function nodeKiB(env: PodEnv, pods: readonly Pod[]): { readonly all: number } & Record<NodePart, number> {
  const daemons = new Set<number>([env.tsbox.pid ?? 0, env.containerd.pid ?? 0]);
  const podPids = new Set<number>();
  for (const pod of pods) for (const pid of podProcesses(env, pod)) if (!daemons.has(pid)) podPids.add(pid);
  let podsKiB = 0;
  for (const pid of podPids) podsKiB += pssKiB(pid);
  const tsbox = pssKiB(env.tsbox.pid ?? 0);
  const containerd = pssKiB(env.containerd.pid ?? 0);
  return { all: podsKiB + tsbox + containerd, pods: podsKiB, tsbox, containerd };
}

async function measureScale(env: PodEnv, handler: Handler): Promise<ScaleFigures> {
  const daemonNow = (): { pssKiB: number; fds: number } => ({
    pssKiB: pssKiB(env.tsbox.pid ?? 0),
    fds: fdCount(env.tsbox.pid ?? 0),
  });
  const figures: ScaleFigures = { memory: [], parts: { pods: [], tsbox: [], containerd: [] }, fds: [], daemon: [] };
  const sample = (held: number, pods: readonly Pod[]): void => {
    const node = nodeKiB(env, pods);
    figures.memory.push([held, node.all]);
    for (const part of NODE_PARTS) figures.parts[part].push([held, node[part]]);
  };
  await settle();
  figures.daemon.push(daemonNow());
  const quarter = Math.max(1, Math.floor(SCALE_PODS / 4));
  for (let cycle = 0; cycle < 2; cycle++) {
    const pods: Pod[] = [];
    if (cycle === 0) {
      sample(0, pods);
      figures.fds.push([0, figures.daemon[0]?.fds ?? 0]);
    }
    for (let i = 0; i < SCALE_PODS; i++) {
      pods.push(await startPod(env, handler, `scale-${handler}-${cycle}-${i}`));
      if (cycle === 0 && (i + 1) % quarter === 0) {
        await settle();
        sample(i + 1, pods);
        figures.fds.push([i + 1, daemonNow().fds]);
      }
    }
    for (const pod of pods) await removePod(env, pod);
    await settle();
    figures.daemon.push(daemonNow());
  }
  return figures;
}

type Samples = Record<Handler, Record<Step, number[]>>;
const empty = (): Record<Step, number[]> => Object.fromEntries(STEPS.map((s) => [s, [] as number[]])) as unknown as Record<Step, number[]>;

async function main(): Promise<void> {
  const env = await startPodEnv({
    tsboxLogLevel: 'warn',
    containerdLogLevel: 'warn',
    runOnTmpfs: RUN_ON_TMPFS,
    ...(values['tsbox-main'] === undefined ? {} : { tsboxMain: values['tsbox-main'] }),
  });
  const serial: Samples = { tsbox: empty(), 'tsbox-task': empty(), runc: empty() };
  const concurrent: Samples = { tsbox: empty(), 'tsbox-task': empty(), runc: empty() };
  const rate: Record<Handler, number[]> = { tsbox: [], 'tsbox-task': [], runc: [] };
  const memory: Record<Handler, MemoryFigures[]> = { tsbox: [], 'tsbox-task': [], runc: [] };
  const scale: Partial<Record<Handler, ScaleFigures>> = {};
  try {
    // One warm-up pod per handler: the first container of an image pays for its snapshot.
    for (const h of HANDLERS) await removePod(env, await startPod(env, h, `warm-${h}`));
    for (let round = 0; round < ROUNDS; round++) {
      // Rotate which handler goes first, so that none always runs on a warmer node.
      const order = [...HANDLERS.slice(round % HANDLERS.length), ...HANDLERS.slice(0, round % HANDLERS.length)];
      for (const h of order) {
        for (let i = 0; i < SERIAL; i++) {
          const times: Partial<Record<Step, number>> = {};
          const pod = await startPod(env, h, `s-${h}-${round}-${i}`, times);
          times.teardown = await removePod(env, pod);
          times.lifecycle = (times.podStart ?? 0) + times.teardown;
          for (const s of STEPS) serial[h][s].push(times[s] ?? NaN);
        }
        const begin = now();
        const started: Pod[] = [];
        let next = 0;
        await Promise.all(
          Array.from({ length: PARALLEL }, async () => {
            while (next < CONCURRENT) {
              const i = next++;
              const times: Partial<Record<Step, number>> = {};
              started.push(await startPod(env, h, `c-${h}-${round}-${i}`, times));
              for (const s of ['run', 'create', 'start', 'podStart'] as const) concurrent[h][s].push(times[s] ?? NaN);
            }
          }),
        );
        rate[h].push(CONCURRENT / ((now() - begin) / 1000));
        let idx = 0;
        await Promise.all(
          Array.from({ length: PARALLEL }, async () => {
            while (idx < started.length) {
              const pod = started[idx++] as Pod;
              concurrent[h].teardown.push(await removePod(env, pod));
            }
          }),
        );
        memory[h].push(await measureMemory(env, h));
      }
    }
    if (SCALE_PODS > 0) for (const h of SCALE_HANDLERS) scale[h] = await measureScale(env, h);
  } finally {
    await env.teardown();
  }

  const med = (xs: number[]): number => percentile(xs, 50);
  const rows: string[][] = [];
  const ratio = (a: number, b: number): string => (Number.isFinite(a / b) ? (a / b).toFixed(2) : '–');
  const ms = (x: number): string => x.toFixed(1);
  const TSBOXES = [TSBOX_HANDLER, TSBOX_TASK_HANDLER] as const;
  for (const [label, samples] of [
    ['serial', serial],
    [`${PARALLEL} at once`, concurrent],
  ] as const) {
    for (const step of STEPS) {
      const r = samples.runc[step].filter(Number.isFinite);
      if (r.length === 0 || samples.tsbox[step].filter(Number.isFinite).length === 0) continue;
      const cell = (xs: number[]): string => `${ms(percentile(xs, 50))} / ${ms(percentile(xs, 90))} / ${ms(percentile(xs, 99))}`;
      const ts = TSBOXES.map((h) => samples[h][step].filter(Number.isFinite));
      rows.push([`${label}: ${step} p50 / p90 / p99 ms`, cell(r), ...ts.map(cell), ...ts.map((t) => ratio(percentile(t, 50), percentile(r, 50)))]);
    }
  }
  rows.push([`${PARALLEL} at once: pods started per second`, med(rate.runc).toFixed(1), ...TSBOXES.map((h) => med(rate[h]).toFixed(1)), ...TSBOXES.map((h) => ratio(med(rate[h]), med(rate.runc)))]);
  const memMed = (h: Handler, k: keyof MemoryFigures): number => med(memory[h].map((m) => m[k]));
  /** A daemon's change with its sign (+12, -3, 0); the other figures cannot be negative. */
  const signed = (x: number): string => {
    const text = x.toFixed(0);
    return Number(text) > 0 ? `+${text}` : text === '-0' ? '0' : text;
  };
  for (const [key, label] of [
    ['totalKiB', `memory per running pod (${SANDBOX_ONLY ? 'no container' : '1 container'}), KiB`],
    ['podProcessesKiB', '  of which the pod\'s processes (PSS), KiB'],
    ['tsboxKiB', '  of which tsbox\'s growth, KiB'],
    ['containerdKiB', '  of which containerd\'s growth, KiB'],
    ['processesPerPod', 'processes per pod (shim, sandbox, container…)'],
  ] as const) {
    const show = key === 'tsboxKiB' || key === 'containerdKiB' ? signed : (x: number): string => x.toFixed(0);
    rows.push([label, show(memMed('runc', key)), ...TSBOXES.map((h) => show(memMed(h, key))), ...TSBOXES.map((h) => ratio(memMed(h, key), memMed('runc', key)))]);
  }
  const header = ['figure (through CRI, one run)', 'podsandbox (runc)', 'tsbox, shim route', 'tsbox, Task API route', 'shim route / podsandbox', 'Task API route / podsandbox'];
  const table = [header, header.map(() => '---'), ...rows].map((r) => `| ${r.join(' | ')} |`).join('\n');
  const when = new Date().toISOString().slice(0, 16).replace('T', ' ');
  process.stdout.write(
    `\n${SANDBOX_ONLY ? 'Pod sandboxes without containers' : 'Pods with one container'} through CRI, ${when} UTC${values['tsbox-main'] === undefined ? '' : ` (tsbox: ${values['tsbox-main']})`}: ${ROUNDS} rounds × (${SERIAL} serial + ${CONCURRENT} with ${PARALLEL} at once + ${MEMORY_PODS} held for memory) per handler, alternating; containerd's state dir ${RUN_ON_TMPFS ? 'on a tmpfs, as /run/containerd on a node' : 'on disk'}\n\n${table}\n`,
  );
  if (SCALE_PODS > 0) {
    const order = [RUNC_HANDLER, ...TSBOXES] as const;
    const scaleRows: string[][] = [];
    const cell = (h: Handler, f: (x: ScaleFigures) => string): string => {
      const x = scale[h];
      return x === undefined ? '–' : f(x);
    };
    const line = (points: [number, number][]): string => {
      const { slope, r2 } = fit(points);
      return `${slope.toFixed(1)} (R² ${r2.toFixed(3)})`;
    };
    scaleRows.push([`node memory per pod held, slope over ${SCALE_PODS} pods, KiB`, ...order.map((h) => cell(h, (x) => line(x.memory)))]);
    for (const [part, label] of [['pods', "the pods' processes"], ['tsbox', 'tsbox'], ['containerd', 'containerd']] as const) {
      scaleRows.push([`  of which ${label}, slope, KiB`, ...order.map((h) => (part === 'tsbox' && h === RUNC_HANDLER ? '–' : cell(h, (x) => line(x.parts[part]))))]);
    }
    scaleRows.push([`tsbox's descriptors per pod held, slope`, ...order.map((h) => (h === RUNC_HANDLER ? '–' : cell(h, (x) => line(x.fds))))]);
    const change = (x: ScaleFigures, i: number, k: 'pssKiB' | 'fds'): string => {
      const a = x.daemon[0];
      const b = x.daemon[i];
      return a === undefined || b === undefined ? '–' : signed(b[k] - a[k]);
    };
    for (const [i, when2] of [
      [1, `after the ${SCALE_PODS} pods went`],
      [2, `after they came and went once more`],
    ] as const) {
      scaleRows.push([`tsbox PSS ${when2}, KiB against before`, ...order.map((h) => (h === RUNC_HANDLER ? '–' : cell(h, (x) => change(x, i, 'pssKiB'))))]);
      scaleRows.push([`tsbox descriptors ${when2}, against before`, ...order.map((h) => (h === RUNC_HANDLER ? '–' : cell(h, (x) => change(x, i, 'fds'))))]);
    }
    const scaleHeader = ['figure', 'podsandbox (runc)', 'tsbox, shim route', 'tsbox, Task API route'];
    const scaleTable = [scaleHeader, scaleHeader.map(() => '---'), ...scaleRows].map((r) => `| ${r.join(' | ')} |`).join('\n');
    process.stdout.write(`\n${SCALE_PODS} pods held, then gone, then come and gone once more, per handler:\n\n${scaleTable}\n`);
  }
  if (values.json !== undefined) writeFileSync(values.json, JSON.stringify({ when, serial, concurrent, rate, memory, scale }, null, 2));
}

main().catch((err: unknown) => {
  process.stderr.write(`bench/pods: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
  process.exitCode = 1;
});
