import { existsSync, readFileSync } from 'node:fs';
import { mkdir, readFile, readdir, rmdir, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { TsboxError, allOrFirstError, errnoOf, isGone, messageOf, readIfPresentNow, withPath } from '../base/errors.js';
import type { PodSpec, Resources } from '../controller/pod-spec.js';
import type { AnyValue } from '../controller/types.js';
import { Metrics as MetricsV1 } from '../gen/cgroups/v1/metrics.js';
import { type IOEntry, type PSIStats, Metrics as MetricsV2 } from '../gen/cgroups/v2/metrics.js';
import { pollUntil, type Bound } from './bound.js';
import { signalProcess } from './proc.js';

/**
 * One cgroup per sandbox, created before the sandbox starts (its supervisor joins it, the
 * sandbox inherits it) and removed once it has exited. Its statistics are what Metrics
 * answers, as containerd/cgroups' v1 or v2 messages. Paths are relative to the hierarchy
 * root (see sandboxCgroupPath).
 */
export interface CgroupManager {
  readonly version: 1 | 2;
  /** Creates the sandbox's cgroup directories; returns them (one per v1 hierarchy). */
  create(path: string, limits: Resources | undefined): Promise<string[]>;
  /** Writes new limits (Update); a limit left out is reset to unlimited. */
  applyLimits(path: string, limits: Resources): Promise<void>;
  /** The pids in the sandbox's cgroup and the cgroups below it; none when it is gone. */
  pids(path: string): Promise<number[]>;
  /**
   * Ends every process of the sandbox's cgroup and the cgroups below it (cgroup.kill on v2;
   * freeze, SIGKILL each, thaw on v1) and resolves once none is left. Throws, naming the
   * cgroup and the pids left, when the bound passes first.
   */
  kill(path: string, bound: Bound): Promise<void>;
  /**
   * Removes the sandbox's own directories and any below them (never its parents); tolerates
   * their absence. A directory the kernel still calls busy is retried until the bound.
   */
  remove(path: string, bound: Bound): Promise<void>;
  /**
   * Removes the sandbox's own directories that hold no process and no cgroup below (what a
   * sandbox that exited leaves): true when none is left. False when one is busy (the others,
   * empty, are gone): kill and remove then end what is left, and take a directory already gone
   * as removed.
   */
  removeIfEmpty(path: string): Promise<boolean>;
  /** The statistics as an Any of io.containerd.cgroups.v1.Metrics or v2.Metrics. */
  metrics(path: string): Promise<AnyValue>;
  /**
   * How many processes of the cgroup the kernel's OOM killer has killed (v2 `memory.events`,
   * v1 `memory.oom_control`, field `oom_kill`); undefined when the cgroup or the field is gone.
   */
  oomKills(path: string): Promise<number | undefined>;
  /** The file whose changes tell an OOM kill (v2 `memory.events`, v1 `memory.oom_control`). */
  oomFile(path: string): string;
  /**
   * The hierarchy a cgroup's processes are ended through, for a process that reads a cgroup's
   * path from /proc/PID/cgroup: the cgroup2 mount (v2), the freezer's (v1); none without one.
   */
  readonly killHierarchy: { readonly version: 1 | 2; readonly mount: string } | undefined;
}

/** The `oom_kill` count of a keyed cgroup file; undefined when the file is gone. */
async function oomKillsIn(file: string): Promise<number | undefined> {
  let keyed: Map<string, bigint>;
  try {
    keyed = await readKeyed(file);
  } catch (err) {
    if (isGone(err)) return undefined;
    throw withPath(err, file, 'read');
  }
  const kills = keyed.get('oom_kill');
  return kills === undefined ? undefined : Number(kills);
}

/**
 * runc's systemd slice expansion: "a-b-c.slice" lives at /a.slice/a-b.slice/a-b-c.slice,
 * and "-.slice" is the root.
 */
export function expandSlice(slice: string): string {
  const name = slice.slice(0, -'.slice'.length);
  if (name === '-' || name === '') return '';
  let path = '';
  let prefix = '';
  for (const part of name.split('-')) {
    if (part === '') throw new TsboxError('InvalidArgument', `cgroup_parent ${JSON.stringify(slice)} is not a valid slice name`);
    prefix = prefix === '' ? part : `${prefix}-${part}`;
    path += `/${prefix}.slice`;
  }
  return path;
}

/**
 * Where a sandbox's process lives, relative to the cgroup root. A Kubernetes pod goes where
 * CRI would put its pause container: `<cgroup_parent>/<id>` for the cgroupfs driver, and for
 * the systemd driver (a parent that is a `.slice`) the scope runc would make of
 * `<slice>:cri-containerd:<id>`, so kubelet's pod cgroup holds and limits the whole pod.
 * Other sandboxes go under tsbox's own parent, as `<ns>@<id>`.
 */
export function sandboxCgroupPath(defaultParent: string, namespace: string, id: string, pod: PodSpec | undefined): string {
  const parent = pod?.cgroupParent;
  if (parent === undefined) return `/${defaultParent}/${namespace}@${id}`.replace(/\/+/g, '/');
  const base = parent.split('/').pop() ?? '';
  if (base.endsWith('.slice')) return `${expandSlice(base)}/cri-containerd-${id}.scope`;
  return `/${parent}/${id}`.replace(/\/+/g, '/');
}

/** cgroup v2's cpu.weight for CRI's cpu shares (the conversion runc and the kubelet use). */
export function sharesToWeight(shares: number): number {
  if (shares <= 2) return 1;
  return Math.min(10000, 1 + Math.floor(((shares - 2) * 9999) / 262142));
}

async function writeLimit(dir: string, file: string, value: string): Promise<void> {
  try {
    await writeFile(join(dir, file), value);
  } catch (err) {
    throw new TsboxError('FailedPrecondition', `cannot set ${file} = ${value} in ${dir}: ${messageOf(err)}`, { cause: err });
  }
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

/** `dir` and the directories below it, deepest first; none when `dir` is gone. */
async function treeOf(dir: string): Promise<string[]> {
  let entries;
  try {
    entries = await readdir(dir, { withFileTypes: true });
  } catch (err) {
    if (isGone(err)) return [];
    throw withPath(err, dir, 'list');
  }
  const below = await Promise.all(entries.filter((e) => e.isDirectory()).map((e) => treeOf(join(dir, e.name))));
  return [...below.flat(), dir];
}

/** The pids listed in cgroup.procs of `dir` and of every cgroup below it. */
async function pidsBelow(dir: string): Promise<number[]> {
  const lists = await Promise.all(
    (await treeOf(dir)).map(async (d) => ((await readIfPresentNow(join(d, 'cgroup.procs'))) ?? '').split('\n').filter((l) => l !== '').map(Number)),
  );
  return lists.flat();
}

/** Writes an existing cgroup file (never creates one); false when it (or its cgroup) is absent. */
async function writeIfPresent(file: string, value: string): Promise<boolean> {
  try {
    await writeFile(file, value, { flag: 'r+' });
    return true;
  } catch (err) {
    if (isGone(err)) return false;
    throw withPath(err, file, `write ${JSON.stringify(value)} to`);
  }
}

/**
 * SIGKILLs whatever `pids` lists, again at each check (a process forked meanwhile goes
 * too), until nothing is left; throws with the cgroup and the pids left at the deadline.
 */
async function killUntilEmpty(cgroup: string, pids: () => Promise<number[]>, bound: Bound): Promise<void> {
  let left: number[] = [];
  const empty = await pollUntil(async () => {
    left = [...new Set(await pids())];
    for (const pid of left) signalProcess(pid, 'SIGKILL');
    return left.length === 0;
  }, bound);
  if (!empty) {
    // DeadlineExceeded: the kill did not complete within its bound (and the message reaches the caller).
    throw new TsboxError(
      'DeadlineExceeded',
      `cgroup ${cgroup} still holds ${left.length} process(es) ${bound.ms} ms after they were killed (kill_timeout_ms): pids ${left.join(', ')}`,
    );
  }
}

/** rmdir of `dir` and everything below it, deepest first; a busy one is retried until the bound. */
export async function removeTree(dir: string, bound: Bound): Promise<void> {
  for (const d of await treeOf(dir)) {
    let failure: unknown;
    const removed = await pollUntil(async () => {
      try {
        await rmdir(d);
        return true;
      } catch (err) {
        if (isGone(err)) return true;
        if (errnoOf(err) !== 'EBUSY') throw withPath(err, d, 'remove cgroup');
        failure = err;
        return false;
      }
    }, bound);
    if (!removed) throw withPath(failure, d, `remove cgroup (still busy after ${bound.ms} ms)`);
  }
}

/** rmdir of each directory, side by side: true when every one is gone, false when one was busy (EBUSY). */
async function rmdirEach(dirs: readonly string[]): Promise<boolean> {
  const results = await Promise.allSettled(
    dirs.map(async (d) => {
      try {
        await rmdir(d);
        return true;
      } catch (err) {
        if (isGone(err)) return true;
        if (errnoOf(err) === 'EBUSY') return false;
        throw withPath(err, d, 'remove cgroup');
      }
    }),
  );
  const failed = results.find((r) => r.status === 'rejected');
  if (failed !== undefined) throw failed.reason;
  return results.every((r) => r.status === 'fulfilled' && r.value);
}

/**
 * A statistics file read with a fallback: which files exist depends on the kernel and the
 * controllers enabled, and Metrics reports what it can read (absent counters as zero).
 */
const optional = <T>(promise: Promise<T>, fallback: T): Promise<T> =>
  promise.catch((err: unknown) => {
    // Absent (or a counter this kernel does not keep): reported as its fallback. Any other
    // failure is the caller's, with the file named.
    if (isGone(err, ['EOPNOTSUPP', 'ENOTSUP'])) return fallback;
    throw withPath(err, (err as { path?: string }).path ?? 'a cgroup statistic', 'read');
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

/**
 * The directories of the cgroups this process is in, one per mounted hierarchy (a v1 named
 * hierarchy such as systemd's included): where a pod's supervisor goes back to once systemd has
 * put it into the pod's scope, so that only the sandbox stays there. Hierarchies this process
 * cannot see mounted are left out.
 */
export function ownCgroupDirs(): string[] {
  const all = mounts();
  const dirs: string[] = [];
  for (const line of readFileSync('/proc/self/cgroup', 'utf8').split('\n')) {
    const match = /^\d+:([^:]*):(\/.*)$/.exec(line);
    if (match === null) continue;
    const [, controllers = '', path = '/'] = match;
    const mount = controllers === ''
      ? all.find((m) => m.type === 'cgroup2')
      : all.find((m) => m.type === 'cgroup' && controllers.split(',').every((c) => m.options.includes(c)));
    if (mount !== undefined) dirs.push(join(mount.path, path));
  }
  return dirs;
}

/** Those whose hierarchies hold a sandbox's cgroup; freezer is how its processes are ended. */
const V1_CONTROLLERS = ['memory', 'cpuacct', 'cpu', 'pids', 'cpuset', 'freezer'] as const;

/**
 * Finds the cgroup file system and returns a manager, or undefined (with the reason) when
 * no writable cgroup hierarchy exists (then Metrics is Unimplemented, as SPEC.md allows).
 */
export function detectCgroups(): { manager?: CgroupManager; reason?: string } {
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
  if (v1.has('memory') && v1.has('cpuacct')) return { manager: new CgroupV1(v1) };
  const unified = all.find((m) => m.type === 'cgroup2' && existsSync(join(m.path, 'cgroup.controllers')));
  if (unified !== undefined && readFileSync(join(unified.path, 'cgroup.controllers'), 'utf8').includes('memory')) {
    return { manager: new CgroupV2(unified.path) };
  }
  return { reason: 'no cgroup hierarchy with the memory and cpu controllers' };
}

export class CgroupV1 implements CgroupManager {
  readonly version = 1;
  readonly #hierarchies: ReadonlyMap<string, string>;

  constructor(hierarchies: ReadonlyMap<string, string>) {
    this.#hierarchies = hierarchies;
  }

  get killHierarchy(): { version: 1; mount: string } | undefined {
    const mount = this.#hierarchies.get('freezer');
    return mount === undefined ? undefined : { version: 1, mount };
  }

  #dir(controller: string, path: string): string {
    return join(this.#hierarchies.get(controller) ?? '', path);
  }

  /** One directory per hierarchy; cpuset only when a cpuset limit asks for it. */
  #dirs(path: string, withCpuset: boolean): string[] {
    const unique = new Set<string>();
    for (const c of this.#hierarchies.keys()) if (c !== 'cpuset' || withCpuset) unique.add(this.#dir(c, path));
    return [...unique];
  }

  async create(path: string, limits: Resources | undefined): Promise<string[]> {
    if (limits?.unified !== undefined) {
      throw new TsboxError('FailedPrecondition', 'the pod sets unified (cgroup v2) resources, but this node has cgroup v1');
    }
    const withCpuset = limits?.cpusetCpus !== undefined || limits?.cpusetMems !== undefined;
    if (withCpuset && !this.#hierarchies.has('cpuset')) throw new TsboxError('FailedPrecondition', 'the pod sets a cpuset, but no cpuset cgroup is mounted');
    const dirs = this.#dirs(path, withCpuset);
    await allOrFirstError(dirs.map((dir) => mkdir(dir, { recursive: true })));
    if (withCpuset) await this.#fillCpuset(path);
    if (limits !== undefined) await this.applyLimits(path, limits);
    return dirs;
  }

  /** A new v1 cpuset takes no process until its cpus and mems are set: inherit them level by level. */
  async #fillCpuset(path: string): Promise<void> {
    const root = this.#hierarchies.get('cpuset') ?? '';
    let dir = root;
    for (const part of path.split('/').filter((p) => p !== '')) {
      const child = join(dir, part);
      for (const file of ['cpuset.cpus', 'cpuset.mems']) {
        if ((await readFile(join(child, file), 'utf8')).trim() === '') await writeFile(join(child, file), await readFile(join(dir, file), 'utf8'));
      }
      dir = child;
    }
  }

  async applyLimits(path: string, limits: Resources): Promise<void> {
    const cpu = this.#dir('cpu', path);
    const mem = this.#dir('memory', path);
    // Each controller in order, the controllers side by side.
    const cpuLimits = async (): Promise<void> => {
      if (!this.#hierarchies.has('cpu')) return;
      await writeLimit(cpu, 'cpu.cfs_period_us', String(limits.cpuPeriod ?? 100_000));
      await writeLimit(cpu, 'cpu.cfs_quota_us', String(limits.cpuQuota ?? -1));
      await writeLimit(cpu, 'cpu.shares', String(limits.cpuShares ?? 1024));
    };
    const memoryLimits = async (): Promise<void> => {
      // The swap limit (memory plus swap) must never be below the memory limit: lift it first.
      const memsw = existsSync(join(mem, 'memory.memsw.limit_in_bytes'));
      if (memsw) await writeLimit(mem, 'memory.memsw.limit_in_bytes', '-1');
      await writeLimit(mem, 'memory.limit_in_bytes', String(limits.memoryLimitBytes ?? -1));
      if (memsw && limits.memorySwapLimitBytes !== undefined) await writeLimit(mem, 'memory.memsw.limit_in_bytes', String(limits.memorySwapLimitBytes));
    };
    const cpusetLimits = async (): Promise<void> => {
      if (limits.cpusetCpus !== undefined) await writeLimit(this.#dir('cpuset', path), 'cpuset.cpus', limits.cpusetCpus);
      if (limits.cpusetMems !== undefined) await writeLimit(this.#dir('cpuset', path), 'cpuset.mems', limits.cpusetMems);
    };
    await allOrFirstError([cpuLimits(), memoryLimits(), cpusetLimits()]);
  }

  async pids(path: string): Promise<number[]> {
    const lists = await Promise.all(this.#dirs(path, true).map((dir) => pidsBelow(dir)));
    return [...new Set(lists.flat())];
  }

  /**
   * Freezes the cgroup (so that nothing forks while the pids are read), SIGKILLs every
   * process, thaws it (a frozen process dies once thawed), then waits for it to empty.
   * Without a freezer hierarchy the kill is repeated until nothing is left.
   */
  async kill(path: string, bound: Bound): Promise<void> {
    if ((await this.pids(path)).length === 0) return;
    const freezer = this.#hierarchies.has('freezer') ? this.#dir('freezer', path) : undefined;
    const state = freezer === undefined ? undefined : join(freezer, 'freezer.state');
    if (state !== undefined && (await writeIfPresent(state, 'FROZEN'))) {
      try {
        // FREEZING until every task is frozen; one that never is gets killed all the same.
        await pollUntil(async () => (await readIfPresentNow(state))?.trim() !== 'FREEZING', bound);
        for (const pid of await this.pids(path)) signalProcess(pid, 'SIGKILL');
      } finally {
        await writeIfPresent(state, 'THAWED');
      }
    }
    await killUntilEmpty(`v1 ${path}`, () => this.pids(path), bound);
  }

  async remove(path: string, bound: Bound): Promise<void> {
    await allOrFirstError(this.#dirs(path, true).map((dir) => removeTree(dir, bound)));
  }

  removeIfEmpty(path: string): Promise<boolean> {
    return rmdirEach(this.#dirs(path, true));
  }

  oomKills(path: string): Promise<number | undefined> {
    return oomKillsIn(this.oomFile(path));
  }

  oomFile(path: string): string {
    return join(this.#dir('memory', path), 'memory.oom_control');
  }

  async metrics(path: string): Promise<AnyValue> {
    const mem = this.#dir('memory', path);
    const cpu = this.#dir('cpuacct', path);
    const pids = this.#hierarchies.has('pids') ? this.#dir('pids', path) : undefined;
    if (!existsSync(mem)) throw new TsboxError('NotFound', `the sandbox has no cgroup ${path} (not running)`);
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
    const throttle = await optional(readKeyed(join(this.#dir('cpu', path), 'cpu.stat')), new Map<string, bigint>());
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

/** A cgroup v2 pressure file (`some avg10=… avg60=… avg300=… total=…`, and `full …`), or undefined without one. */
async function readPressure(file: string): Promise<PSIStats | undefined> {
  const text = await optional(readFile(file, 'utf8'), undefined);
  if (text === undefined) return undefined;
  const out: PSIStats = { some: undefined, full: undefined };
  for (const line of text.split('\n')) {
    const [kind, ...pairs] = line.split(' ');
    if (kind !== 'some' && kind !== 'full') continue;
    const values = new Map(pairs.map((p) => p.split('=') as [string, string]));
    out[kind] = {
      avg10: Number(values.get('avg10') ?? 0),
      avg60: Number(values.get('avg60') ?? 0),
      avg300: Number(values.get('avg300') ?? 0),
      total: toBigInt(values.get('total') ?? '0'),
    };
  }
  return out;
}

/** io.stat: one line per block device, `MAJ:MIN rbytes=… wbytes=… rios=… wios=… …`. */
async function readIoStat(file: string): Promise<IOEntry[]> {
  const text = await optional(readFile(file, 'utf8'), '');
  const out: IOEntry[] = [];
  for (const line of text.split('\n')) {
    const [device, ...pairs] = line.split(' ');
    const match = /^(\d+):(\d+)$/.exec(device ?? '');
    if (match === null) continue;
    const values = new Map(pairs.map((p) => p.split('=') as [string, string]));
    const value = (key: string): bigint => toBigInt(values.get(key) ?? '0');
    out.push({ major: BigInt(match[1] ?? 0), minor: BigInt(match[2] ?? 0), rbytes: value('rbytes'), wbytes: value('wbytes'), rios: value('rios'), wios: value('wios') });
  }
  return out;
}

/** What a v2 sandbox cgroup gets for its statistics, when the node offers them. */
const STATS_CONTROLLERS = ['cpu', 'memory', 'pids', 'io'] as const;

/** The controllers listed in a cgroup v2 `cgroup.controllers` or `cgroup.subtree_control`. */
async function readControllers(file: string): Promise<string[]> {
  return (await readFile(file, 'utf8')).split(/\s+/).filter((c) => c !== '');
}

/** A level's controller list on the way down to a sandbox's cgroup; unreadable is a precondition failure naming the file. */
async function readLevelControllers(file: string): Promise<string[]> {
  return readControllers(file).catch((err: unknown) => {
    throw new TsboxError('FailedPrecondition', `cannot read the controllers of ${file}: ${messageOf(err)}`, { cause: err });
  });
}

/**
 * The v2 controllers whose files a pod's limits write: cpu and memory always (a limit left out
 * is reset), cpuset for a cpuset, and each `unified` file's own (`pids.max` needs pids;
 * `cgroup.*` files need none).
 */
export function controllersFor(limits: Resources): string[] {
  const out = new Set(['cpu', 'memory']);
  if (limits.cpusetCpus !== undefined || limits.cpusetMems !== undefined) out.add('cpuset');
  for (const file of Object.keys(limits.unified ?? {})) {
    const prefix = file.split('.')[0] ?? '';
    if (prefix !== '' && prefix !== 'cgroup') out.add(prefix);
  }
  return [...out];
}

const camel = (key: string): string => key.replace(/_([a-z])/g, (_, c: string) => c.toUpperCase());

export class CgroupV2 implements CgroupManager {
  readonly version = 2;
  readonly #root: string;

  constructor(root: string) {
    this.#root = root;
  }

  get killHierarchy(): { version: 2; mount: string } {
    return { version: 2, mount: this.#root };
  }

  #dir(path: string): string {
    return join(this.#root, path);
  }

  async create(path: string, limits: Resources | undefined): Promise<string[]> {
    // Each level down to the sandbox's parent hands the controllers on, so that the sandbox's
    // cgroup has the files that limits and metrics use. A level may refuse (one with processes
    // of its own cannot hand controllers down): that only matters for a controller the limits
    // need, and then the refusal is part of the error.
    const needed = limits === undefined ? [] : controllersFor(limits);
    const offered = await readControllers(join(this.#root, 'cgroup.controllers'));
    const wanted = [...new Set([...STATS_CONTROLLERS.filter((c) => offered.includes(c)), ...needed])];
    const refusals = new Map<string, string>();
    let dir = this.#root;
    for (const part of path.split('/').filter((p) => p !== '')) {
      const here = await readLevelControllers(join(dir, 'cgroup.controllers'));
      const enabled = await readLevelControllers(join(dir, 'cgroup.subtree_control'));
      const missing = wanted.filter((c) => here.includes(c) && !enabled.includes(c));
      if (missing.length > 0) {
        await writeFile(join(dir, 'cgroup.subtree_control'), missing.map((c) => `+${c}`).join(' ')).catch((err: unknown) => {
          // Kept for the error of a limit that needs one of these controllers (checked below).
          refusals.set(dir, messageOf(err));
        });
      }
      dir = join(dir, part);
      await mkdir(dir, { recursive: true });
    }
    if (limits !== undefined) await this.applyLimits(path, limits, refusals);
    return [dir];
  }

  /**
   * Throws FailedPrecondition when the sandbox's cgroup lacks a controller its limits need,
   * naming the controller and the cgroup whose cgroup.subtree_control must enable it (or the
   * kernel, when the node offers no such controller at all).
   */
  async #requireControllers(path: string, needed: readonly string[], refusals: ReadonlyMap<string, string>): Promise<void> {
    const present = await readControllers(join(this.#dir(path), 'cgroup.controllers'));
    const controller = needed.find((c) => !present.includes(c));
    if (controller === undefined) return;
    const what = `the pod's limits need the cgroup v2 ${controller} controller`;
    const offered = await readControllers(join(this.#root, 'cgroup.controllers'));
    if (!offered.includes(controller)) {
      throw new TsboxError(
        'FailedPrecondition',
        `${what}, which this node's kernel does not offer (${join(this.#root, 'cgroup.controllers')}: ${offered.join(' ') || 'none'}): use a kernel with it, or leave that limit out`,
      );
    }
    let parent = this.#root;
    for (const part of path.split('/').filter((p) => p !== '')) {
      if (!(await readControllers(join(parent, 'cgroup.subtree_control'))).includes(controller)) {
        const refusal = refusals.get(parent);
        const why = refusal === undefined ? '' : ` (tsbox's +${controller} was refused: ${refusal}; a cgroup with processes of its own hands no controller down)`;
        throw new TsboxError(
          'FailedPrecondition',
          `${what}, but ${parent} does not enable it for its children${why}: enable it with "echo +${controller} > ${join(parent, 'cgroup.subtree_control')}"`,
        );
      }
      parent = join(parent, part);
    }
  }

  async applyLimits(path: string, limits: Resources, refusals: ReadonlyMap<string, string> = new Map()): Promise<void> {
    const dir = this.#dir(path);
    await this.#requireControllers(path, controllersFor(limits), refusals);
    await writeLimit(dir, 'cpu.max', `${limits.cpuQuota ?? 'max'} ${limits.cpuPeriod ?? 100_000}`);
    await writeLimit(dir, 'cpu.weight', String(limits.cpuShares === undefined ? 100 : sharesToWeight(limits.cpuShares)));
    await writeLimit(dir, 'memory.max', limits.memoryLimitBytes === undefined ? 'max' : String(limits.memoryLimitBytes));
    if (existsSync(join(dir, 'memory.swap.max'))) {
      // CRI's swap limit counts memory plus swap; cgroup v2 counts swap alone.
      const swap =
        limits.memorySwapLimitBytes === undefined || limits.memoryLimitBytes === undefined
          ? 'max'
          : String(Math.max(0, limits.memorySwapLimitBytes - limits.memoryLimitBytes));
      await writeLimit(dir, 'memory.swap.max', swap);
    }
    if (limits.cpusetCpus !== undefined) await writeLimit(dir, 'cpuset.cpus', limits.cpusetCpus);
    if (limits.cpusetMems !== undefined) await writeLimit(dir, 'cpuset.mems', limits.cpusetMems);
    for (const [file, value] of Object.entries(limits.unified ?? {})) await writeLimit(dir, file, value);
  }

  async pids(path: string): Promise<number[]> {
    return pidsBelow(this.#dir(path));
  }

  /**
   * cgroup.kill (Linux 5.14+) kills the whole subtree at once, forks included. Before it:
   * freeze (cgroup.freeze, 5.2+), SIGKILL every process, thaw; without either, the kill is
   * repeated until nothing is left.
   */
  async kill(path: string, bound: Bound): Promise<void> {
    if ((await this.pids(path)).length === 0) return;
    const dir = this.#dir(path);
    if (!(await writeIfPresent(join(dir, 'cgroup.kill'), '1'))) {
      const freeze = join(dir, 'cgroup.freeze');
      if (await writeIfPresent(freeze, '1')) {
        try {
          // cgroup.events says "frozen 1" once every process is frozen.
          await pollUntil(async () => !/^frozen 0$/m.test((await readIfPresentNow(join(dir, 'cgroup.events'))) ?? ''), bound);
          for (const pid of await this.pids(path)) signalProcess(pid, 'SIGKILL');
        } finally {
          await writeIfPresent(freeze, '0');
        }
      }
    }
    await killUntilEmpty(`v2 ${path}`, () => this.pids(path), bound);
  }

  async remove(path: string, bound: Bound): Promise<void> {
    await removeTree(this.#dir(path), bound);
  }

  removeIfEmpty(path: string): Promise<boolean> {
    return rmdirEach([this.#dir(path)]);
  }

  oomKills(path: string): Promise<number | undefined> {
    return oomKillsIn(this.oomFile(path));
  }

  oomFile(path: string): string {
    return join(this.#dir(path), 'memory.events');
  }

  async metrics(path: string): Promise<AnyValue> {
    const dir = this.#dir(path);
    if (!existsSync(dir)) throw new TsboxError('NotFound', `the sandbox has no cgroup ${path} (not running)`);
    const number = (path: string): Promise<bigint> => optional(readNumber(path, V2_UNLIMITED), 0n);
    const keyed = (file: string): Promise<Map<string, bigint>> => optional(readKeyed(join(dir, file)), new Map<string, bigint>());
    const [cpu, memStat, events] = await Promise.all([keyed('cpu.stat'), keyed('memory.stat'), keyed('memory.events')]);
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
        psi: await readPressure(join(dir, 'cpu.pressure')),
      },
      memory: {
        ...memory,
        usage: await number(join(dir, 'memory.current')),
        usageLimit: await number(join(dir, 'memory.max')),
        maxUsage: await number(join(dir, 'memory.peak')),
        swapUsage: await number(join(dir, 'memory.swap.current')),
        swapLimit: await number(join(dir, 'memory.swap.max')),
        swapMaxUsage: await number(join(dir, 'memory.swap.peak')),
        psi: await readPressure(join(dir, 'memory.pressure')),
      },
      // As containerd/cgroups: only when the kernel has the file.
      memoryEvents:
        events.size === 0
          ? undefined
          : { low: events.get('low') ?? 0n, high: events.get('high') ?? 0n, max: events.get('max') ?? 0n, oom: events.get('oom') ?? 0n, oomKill: events.get('oom_kill') ?? 0n },
      io: { usage: await readIoStat(join(dir, 'io.stat')), psi: await readPressure(join(dir, 'io.pressure')) },
    });
    return { typeUrl: 'io.containerd.cgroups.v2.Metrics', value: MetricsV2.encode(metrics).finish() };
  }
}
