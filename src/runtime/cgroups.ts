import { existsSync, readFileSync } from 'node:fs';
import { mkdir, readFile, rmdir, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { TsboxError, ignoreError, messageOf } from '../errors.js';
import type { AnyValue } from '../controller/types.js';
import { Metrics as MetricsV1 } from '../gen/cgroups/v1/metrics.js';
import { Metrics as MetricsV2 } from '../gen/cgroups/v2/metrics.js';

/**
 * One cgroup per sandbox, under `<hierarchy>/<parent>/<namespace>@<id>`, created before the
 * sandbox starts (its supervisor joins it, the sandbox inherits it) and removed once it has
 * exited. Its statistics are what Metrics answers, as containerd/cgroups' v1 or v2 messages.
 */
export interface CgroupManager {
  readonly version: 1 | 2;
  /** Creates the sandbox's cgroup directories; returns them (one per v1 hierarchy). */
  create(namespace: string, id: string): Promise<string[]>;
  /** Removes them; tolerates their absence. */
  remove(namespace: string, id: string): Promise<void>;
  /** The statistics as an Any of io.containerd.cgroups.v1.Metrics or v2.Metrics. */
  metrics(namespace: string, id: string): Promise<AnyValue>;
}

/** What a cgroup file's "max" (no limit) becomes: 0 in v1 stats, 2^64-1 in v2, as containerd/cgroups reports them. */
type Unlimited = 0n | 18446744073709551615n;
const V1_UNLIMITED: Unlimited = 0n;
const V2_UNLIMITED: Unlimited = 18446744073709551615n;

function toBigInt(text: string): bigint {
  try {
    return BigInt(text);
  } catch {
    // A value the kernel did not write as an integer: reported as 0, as containerd does.
    return 0n;
  }
}

async function readNumber(path: string, unlimited: Unlimited): Promise<bigint> {
  const text = (await readFile(path, 'utf8')).trim();
  return text === 'max' ? unlimited : toBigInt(text);
}

async function readKeyed(path: string): Promise<Map<string, bigint>> {
  const out = new Map<string, bigint>();
  for (const line of (await readFile(path, 'utf8')).split('\n')) {
    const [key, value] = line.split(' ');
    if (key && value !== undefined) out.set(key, toBigInt(value));
  }
  return out;
}

/** rmdir that tolerates absence and waits out a supervisor that is still exiting (EBUSY). */
async function removeDir(dir: string): Promise<void> {
  for (let attempt = 0; ; attempt++) {
    try {
      await rmdir(dir);
      return;
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      if (code === 'ENOENT') return;
      if (code !== 'EBUSY' || attempt >= 50) throw err;
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
  }
}

/**
 * A statistics file read with a fallback: which files exist depends on the kernel and the
 * controllers enabled, and Metrics reports what it can read (absent counters as zero).
 */
const optional = <T>(promise: Promise<T>, fallback: T): Promise<T> =>
  promise.catch(() => {
    // An absent or unreadable statistic is reported as its fallback, never as a failure.
    return fallback;
  });

interface Mount {
  readonly path: string;
  readonly type: string;
  readonly options: readonly string[];
}

function mounts(): Mount[] {
  const out: Mount[] = [];
  for (const line of readFileSync('/proc/self/mountinfo', 'utf8').split('\n')) {
    const [left, right] = line.split(' - ');
    if (left === undefined || right === undefined) continue;
    const path = left.split(' ')[4];
    const [type, , superOptions] = right.split(' ');
    if (path !== undefined && type !== undefined) out.push({ path, type, options: (superOptions ?? '').split(',') });
  }
  return out;
}

const V1_CONTROLLERS = ['memory', 'cpuacct', 'cpu', 'pids'] as const;

/**
 * Finds the cgroup file system and returns a manager, or undefined (with the reason) when
 * no writable cgroup hierarchy exists (then Metrics is Unimplemented, as SPEC.md allows).
 */
export function detectCgroups(parent: string): { manager?: CgroupManager; reason?: string } {
  if (process.getuid?.() !== 0) return { reason: 'not running as root' };
  let all: Mount[];
  try {
    all = mounts();
  } catch (err) {
    return { reason: `cannot read mountinfo: ${messageOf(err)}` };
  }
  const v1 = new Map<string, string>();
  for (const m of all) {
    if (m.type !== 'cgroup') continue;
    for (const c of V1_CONTROLLERS) if (m.options.includes(c) && !v1.has(c)) v1.set(c, m.path);
  }
  if (v1.has('memory') && v1.has('cpuacct')) return { manager: new CgroupV1(v1, parent) };
  const unified = all.find((m) => m.type === 'cgroup2' && existsSync(join(m.path, 'cgroup.controllers')));
  if (unified !== undefined && readFileSync(join(unified.path, 'cgroup.controllers'), 'utf8').includes('memory')) {
    return { manager: new CgroupV2(unified.path, parent) };
  }
  return { reason: 'no cgroup hierarchy with the memory and cpu controllers' };
}

class CgroupV1 implements CgroupManager {
  readonly version = 1;
  readonly #hierarchies: ReadonlyMap<string, string>;
  readonly #parent: string;

  constructor(hierarchies: ReadonlyMap<string, string>, parent: string) {
    this.#hierarchies = hierarchies;
    this.#parent = parent;
  }

  #dir(controller: string, namespace: string, id: string): string {
    return join(this.#hierarchies.get(controller) ?? '', this.#parent, `${namespace}@${id}`);
  }

  #dirs(namespace: string, id: string): string[] {
    const unique = new Set<string>();
    for (const c of this.#hierarchies.keys()) unique.add(this.#dir(c, namespace, id));
    return [...unique];
  }

  async create(namespace: string, id: string): Promise<string[]> {
    const dirs = this.#dirs(namespace, id);
    for (const dir of dirs) await mkdir(dir, { recursive: true });
    return dirs;
  }

  async remove(namespace: string, id: string): Promise<void> {
    for (const dir of this.#dirs(namespace, id)) await removeDir(dir);
  }

  async metrics(namespace: string, id: string): Promise<AnyValue> {
    const mem = this.#dir('memory', namespace, id);
    const cpu = this.#dir('cpuacct', namespace, id);
    const pids = this.#hierarchies.has('pids') ? this.#dir('pids', namespace, id) : undefined;
    if (!existsSync(mem)) throw new TsboxError('NotFound', `sandbox ${id} has no cgroup (not running)`);
    const number = (path: string): Promise<bigint> => optional(readNumber(path, V1_UNLIMITED), 0n);
    const stat = await readKeyed(join(mem, 'memory.stat'));
    const s = (key: string): bigint => stat.get(key) ?? 0n;
    const entry = async (prefix: string): Promise<{ limit: bigint; usage: bigint; max: bigint; failcnt: bigint }> => ({
      limit: await number(join(mem, `${prefix}.limit_in_bytes`)),
      usage: await number(join(mem, `${prefix}.usage_in_bytes`)),
      max: await number(join(mem, `${prefix}.max_usage_in_bytes`)),
      failcnt: await number(join(mem, `${prefix}.failcnt`)),
    });
    const cpuStat = await optional(readKeyed(join(cpu, 'cpuacct.stat')), new Map<string, bigint>());
    const ticksToNs = 10_000_000n; // cpuacct.stat counts USER_HZ (100/s) ticks
    const perCpu = (await optional(readFile(join(cpu, 'cpuacct.usage_percpu'), 'utf8'), ''))
      .trim()
      .split(/\s+/)
      .filter((v) => v !== '')
      .map(toBigInt);
    const throttle = await optional(readKeyed(join(this.#dir('cpu', namespace, id), 'cpu.stat')), new Map<string, bigint>());
    const metrics = MetricsV1.fromPartial({
      pids:
        pids === undefined
          ? undefined
          : {
              current: await number(join(pids, 'pids.current')),
              limit: await number(join(pids, 'pids.max')),
            },
      cpu: {
        usage: {
          total: await number(join(cpu, 'cpuacct.usage')),
          user: (cpuStat.get('user') ?? 0n) * ticksToNs,
          kernel: (cpuStat.get('system') ?? 0n) * ticksToNs,
          perCpu,
        },
        throttling: {
          periods: throttle.get('nr_periods') ?? 0n,
          throttledPeriods: throttle.get('nr_throttled') ?? 0n,
          throttledTime: throttle.get('throttled_time') ?? 0n,
        },
      },
      memory: {
        cache: s('cache'),
        rss: s('rss'),
        rssHuge: s('rss_huge'),
        mappedFile: s('mapped_file'),
        dirty: s('dirty'),
        writeback: s('writeback'),
        pgPgIn: s('pgpgin'),
        pgPgOut: s('pgpgout'),
        pgFault: s('pgfault'),
        pgMajFault: s('pgmajfault'),
        inactiveAnon: s('inactive_anon'),
        activeAnon: s('active_anon'),
        inactiveFile: s('inactive_file'),
        activeFile: s('active_file'),
        unevictable: s('unevictable'),
        hierarchicalMemoryLimit: s('hierarchical_memory_limit'),
        hierarchicalSwapLimit: s('hierarchical_memsw_limit'),
        totalCache: s('total_cache'),
        totalRss: s('total_rss'),
        totalRssHuge: s('total_rss_huge'),
        totalMappedFile: s('total_mapped_file'),
        totalDirty: s('total_dirty'),
        totalWriteback: s('total_writeback'),
        totalPgPgIn: s('total_pgpgin'),
        totalPgPgOut: s('total_pgpgout'),
        totalPgFault: s('total_pgfault'),
        totalPgMajFault: s('total_pgmajfault'),
        totalInactiveAnon: s('total_inactive_anon'),
        totalActiveAnon: s('total_active_anon'),
        totalInactiveFile: s('total_inactive_file'),
        totalActiveFile: s('total_active_file'),
        totalUnevictable: s('total_unevictable'),
        usage: await entry('memory'),
        swap: await entry('memory.memsw'),
        kernel: await entry('memory.kmem'),
        kernelTcp: await entry('memory.kmem.tcp'),
      },
    });
    return { typeUrl: 'io.containerd.cgroups.v1.Metrics', value: MetricsV1.encode(metrics).finish() };
  }
}

const camel = (key: string): string => key.replace(/_([a-z])/g, (_, c: string) => c.toUpperCase());

class CgroupV2 implements CgroupManager {
  readonly version = 2;
  readonly #root: string;
  readonly #parent: string;

  constructor(root: string, parent: string) {
    this.#root = root;
    this.#parent = parent;
  }

  #dir(namespace: string, id: string): string {
    return join(this.#root, this.#parent, `${namespace}@${id}`);
  }

  async create(namespace: string, id: string): Promise<string[]> {
    const parentDir = join(this.#root, this.#parent);
    await mkdir(parentDir, { recursive: true });
    // Let the sandboxes' cgroups use the controllers metrics read.
    const available = (await readFile(join(this.#root, 'cgroup.subtree_control'), 'utf8')).trim();
    const wanted = ['cpu', 'memory', 'pids'].filter((c) => available.split(' ').includes(c));
    if (wanted.length > 0) {
      await writeFile(join(parentDir, 'cgroup.subtree_control'), wanted.map((c) => `+${c}`).join(' ')).catch(
        // Already enabled, or refused (the parent holds processes of its own): the sandbox's
        // cgroup works either way, and Metrics reads what the enabled controllers provide.
        ignoreError('the controllers only add statistics'),
      );
    }
    const dir = this.#dir(namespace, id);
    await mkdir(dir, { recursive: true });
    return [dir];
  }

  async remove(namespace: string, id: string): Promise<void> {
    await removeDir(this.#dir(namespace, id));
  }

  async metrics(namespace: string, id: string): Promise<AnyValue> {
    const dir = this.#dir(namespace, id);
    if (!existsSync(dir)) throw new TsboxError('NotFound', `sandbox ${id} has no cgroup (not running)`);
    const number = (path: string): Promise<bigint> => optional(readNumber(path, V2_UNLIMITED), 0n);
    const cpu = await optional(readKeyed(join(dir, 'cpu.stat')), new Map<string, bigint>());
    const memStat = await optional(readKeyed(join(dir, 'memory.stat')), new Map<string, bigint>());
    const memory: Record<string, bigint> = {};
    for (const [key, value] of memStat) memory[camel(key)] = value;
    const metrics = MetricsV2.fromPartial({
      pids: {
        current: await number(join(dir, 'pids.current')),
        limit: await number(join(dir, 'pids.max')),
      },
      cpu: {
        usageUsec: cpu.get('usage_usec') ?? 0n,
        userUsec: cpu.get('user_usec') ?? 0n,
        systemUsec: cpu.get('system_usec') ?? 0n,
        nrPeriods: cpu.get('nr_periods') ?? 0n,
        nrThrottled: cpu.get('nr_throttled') ?? 0n,
        throttledUsec: cpu.get('throttled_usec') ?? 0n,
      },
      memory: {
        ...memory,
        usage: await number(join(dir, 'memory.current')),
        usageLimit: await number(join(dir, 'memory.max')),
        maxUsage: await number(join(dir, 'memory.peak')),
        swapUsage: await number(join(dir, 'memory.swap.current')),
        swapLimit: await number(join(dir, 'memory.swap.max')),
      },
    });
    return { typeUrl: 'io.containerd.cgroups.v2.Metrics', value: MetricsV2.encode(metrics).finish() };
  }
}
