/**
 * The process toolkit of the test harnesses (tsbox-daemon.ts, containerd.ts, host.ts) and the
 * benchmark: bounded polling; processes in their own process group that always have an
 * 'error' listener, whose exit is taken from 'exit', stopped with SIGTERM to the leader and
 * then SIGKILL to the whole group after a bound; a tracker that finds whatever a daemon left
 * behind; temp dirs short enough for unix sockets.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { closeSync, existsSync, openSync, readFileSync, readdirSync, statSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';

// ---------------------------------------------------------------------------------------------
// Polling

/** Options of {@link waitFor}. */
export interface WaitForOptions {
  /** What is awaited, for the timeout message. */
  what: string;
  timeoutMs?: number;
  intervalMs?: number;
  /** Extra text for the timeout message (e.g. a log tail), computed only on failure. */
  describe?: () => string;
}

/**
 * Polls `check` until it returns a value other than `undefined`/`false` (and returns it), or
 * throws after `timeoutMs`. `check` may throw to abort the wait at once.
 */
export async function waitFor<T>(
  check: () => T | undefined | false | Promise<T | undefined | false>,
  options: WaitForOptions,
): Promise<T> {
  const timeoutMs = options.timeoutMs ?? 10_000;
  const intervalMs = options.intervalMs ?? 50;
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await check();
    if (value !== undefined && value !== false) return value;
    if (Date.now() >= deadline) {
      const extra = options.describe?.() ?? '';
      throw new Error(`timed out after ${timeoutMs} ms waiting for ${options.what}${extra ? `\n${extra}` : ''}`);
    }
    await new Promise((resolve) => setTimeout(resolve, intervalMs));
  }
}

// ---------------------------------------------------------------------------------------------
// Processes

/** How a process ended. */
/** Rejects if `p` has not settled within `ms`: a call that hangs fails the test, never hangs it. */
export async function within<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_resolve, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms waiting for ${what}`)), ms);
  });
  try {
    return await Promise.race([p, late]);
  } finally {
    clearTimeout(timer);
  }
}

export interface ExitInfo {
  code: number | null;
  signal: NodeJS.Signals | null;
}

/** A child process started by {@link spawnLogged}. */
export interface ManagedProcess {
  readonly pid: number;
  readonly child: ChildProcess;
  /** Resolves once, on 'exit'. */
  readonly exited: Promise<ExitInfo>;
  /** Set once the process has exited. */
  exitInfo(): ExitInfo | undefined;
}

/**
 * Spawns `file args` in a new session and process group (so the group can be killed as one),
 * with stdout and stderr appended to `logPath`. Resolves once the process is running; rejects
 * if it could not be spawned.
 */
export async function spawnLogged(
  file: string,
  args: readonly string[],
  options: { logPath: string; env?: NodeJS.ProcessEnv; cwd?: string },
): Promise<ManagedProcess> {
  const fd = openSync(options.logPath, 'a');
  let child: ChildProcess;
  try {
    child = spawn(file, args, {
      stdio: ['ignore', fd, fd],
      detached: true,
      env: options.env ?? process.env,
      cwd: options.cwd ?? os.tmpdir(),
    });
  } finally {
    closeSync(fd);
  }
  let exit: ExitInfo | undefined;
  const exited = new Promise<ExitInfo>((resolve) => {
    child.once('exit', (code, signal) => {
      exit = { code, signal };
      resolve(exit);
    });
  });
  await new Promise<void>((resolve, reject) => {
    child.once('spawn', resolve);
    child.once('error', reject);
  });
  // Errors after spawn (e.g. kill on a gone process) must not crash the test runner.
  child.on('error', () => undefined);
  const pid = child.pid;
  if (pid === undefined) throw new Error(`${file}: spawned without a pid`);
  return { pid, child, exited, exitInfo: () => exit };
}

export function signalGroup(pid: number, signal: NodeJS.Signals): void {
  try {
    process.kill(-pid, signal);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'ESRCH') throw err;
  }
}

export function signalPid(pid: number, signal: NodeJS.Signals): void {
  try {
    process.kill(pid, signal);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'ESRCH') throw err;
  }
}

async function exitedWithin(p: ManagedProcess, ms: number): Promise<ExitInfo | undefined> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<undefined>((resolve) => {
    timer = setTimeout(() => resolve(undefined), ms);
  });
  try {
    return await Promise.race([p.exited, timeout]);
  } finally {
    clearTimeout(timer);
  }
}

/**
 * Stops a process: `signal` (SIGTERM) to the leader only, so that it can shut down the way it
 * would under a service manager; after `graceMs`, SIGKILL to its whole process group. Resolves
 * with how it exited. `graceful` tells whether it exited before the SIGKILL.
 */
export async function stopProcess(
  p: ManagedProcess,
  options: { graceMs?: number; signal?: NodeJS.Signals } = {},
): Promise<ExitInfo & { graceful: boolean }> {
  const done = p.exitInfo();
  if (done !== undefined) return { ...done, graceful: true };
  signalPid(p.pid, options.signal ?? 'SIGTERM');
  const exit = await exitedWithin(p, options.graceMs ?? 10_000);
  if (exit !== undefined) return { ...exit, graceful: true };
  signalGroup(p.pid, 'SIGKILL');
  return { ...(await p.exited), graceful: false };
}

/** Resolves when a unix socket accepts a connection, false when it does not (yet). */
export function socketAccepts(socketPath: string): Promise<boolean> {
  return new Promise((resolve) => {
    const s = net.connect(socketPath);
    s.once('connect', () => {
      s.destroy();
      resolve(true);
    });
    s.once('error', () => {
      s.destroy();
      resolve(false);
    });
  });
}

/** Waits until `socketPath` accepts connections; fails at once if `p` exits meanwhile. */
export async function waitForSocket(
  p: ManagedProcess,
  socketPath: string,
  options: { timeoutMs?: number; intervalMs?: number; name: string; logTail: () => string },
): Promise<void> {
  await waitFor(
    async () => {
      const exit = p.exitInfo();
      if (exit !== undefined) {
        throw new Error(
          `${options.name} exited (code ${exit.code}, signal ${exit.signal}) before ${socketPath} was ready\n${options.logTail()}`,
        );
      }
      return existsSync(socketPath) && (await socketAccepts(socketPath));
    },
    {
      what: `${options.name} socket ${socketPath}`,
      timeoutMs: options.timeoutMs ?? 15_000,
      ...(options.intervalMs === undefined ? {} : { intervalMs: options.intervalMs }),
      describe: options.logTail,
    },
  );
}

/** The last `lines` lines of a log file, without those matching `skip` ('' if it does not exist). */
export function tailFile(file: string, lines = 40, skip?: RegExp): string {
  try {
    const all = readFileSync(file, 'utf8').split('\n');
    return (skip === undefined ? all : all.filter((l) => !skip.test(l))).slice(-lines - 1).join('\n');
  } catch {
    // no log yet
    return '';
  }
}

interface ProcStat {
  pid: number;
  ppid: number;
  pgid: number;
  sid: number;
  /** Start time in clock ticks since boot: with the pid, identifies a process for good. */
  startTime: string;
}

function readProcStat(pid: number): ProcStat | undefined {
  try {
    const text = readFileSync(`/proc/${pid}/stat`, 'utf8');
    // Fields after the command name, which is in parentheses and may contain anything;
    // rest[0] is field 3 (state), so field N is rest[N - 3].
    const rest = text.slice(text.lastIndexOf(')') + 2).split(' ');
    return { pid, ppid: Number(rest[1]), pgid: Number(rest[2]), sid: Number(rest[3]), startTime: rest[19] ?? '' };
  } catch {
    // the process is gone
    return undefined;
  }
}

function allProcStats(): ProcStat[] {
  const out: ProcStat[] = [];
  for (const name of readdirSync('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    const st = readProcStat(Number(name));
    if (st !== undefined) out.push(st);
  }
  return out;
}

function hasEnv(pid: number, entry: string): boolean {
  try {
    return readFileSync(`/proc/${pid}/environ`, 'latin1').split('\0').includes(entry);
  } catch {
    // gone, or not ours to read: not marked
    return false;
  }
}

/**
 * Remembers the processes a harness's daemon started, so that teardown can kill what is left
 * even after the daemon restarted or crashed (its children are then re-parented to init).
 * A process belongs to it when it descends from, or shares the session or process group of, a
 * leader the tracker was given, or carries the tracker's marker in its environment (inherited
 * by everything the daemon spawns unless it scrubs the environment).
 */
export interface ProcessTracker {
  /** `base` plus the marker variable: the environment to start leaders with. */
  env(base?: NodeJS.ProcessEnv): NodeJS.ProcessEnv;
  addLeader(pid: number): void;
  /** Records the leaders' current process trees (call before stopping or killing a leader). */
  snapshot(): void;
  /** Snapshots once more, then SIGKILLs every remembered process still alive; returns their pids. */
  killLeftovers(): Promise<number[]>;
}

/** A tracker whose marker is `TSBOX_TEST_OWNER=<owner>` (the harness's temp dir). */
export function createProcessTracker(owner: string): ProcessTracker {
  const markerKey = 'TSBOX_TEST_OWNER';
  const marker = `${markerKey}=${owner}`;
  const leaders = new Map<number, string>();
  const seen = new Map<number, string>();

  const scan = (): void => {
    const stats = allProcStats();
    const startOf = new Map(stats.map((st) => [st.pid, st.startTime]));
    // A session or group is a leader's only while its number is not some other process's: a
    // dead leader's number stays reserved while members remain, but once they are gone the
    // kernel may hand it to an unrelated process (a shim of another containerd, say).
    const ours = (id: number): boolean => {
      const leaderStart = leaders.get(id);
      if (leaderStart === undefined) return false;
      const now = startOf.get(id);
      return now === undefined || now === leaderStart;
    };
    const tree = new Set<number>();
    for (const st of stats) {
      const isLeader = leaders.get(st.pid) === st.startTime;
      if (isLeader || ours(st.sid) || ours(st.pgid)) tree.add(st.pid);
    }
    for (let grew = true; grew; ) {
      grew = false;
      for (const st of stats) {
        if (!tree.has(st.pid) && tree.has(st.ppid)) {
          tree.add(st.pid);
          grew = true;
        }
      }
    }
    for (const st of stats) {
      if (st.pid === process.pid) continue;
      if (tree.has(st.pid) || hasEnv(st.pid, marker)) seen.set(st.pid, st.startTime);
    }
  };

  return {
    env: (base = process.env) => ({ ...base, [markerKey]: owner }),
    addLeader(pid) {
      const st = readProcStat(pid);
      if (st !== undefined) {
        leaders.set(pid, st.startTime);
        seen.set(pid, st.startTime);
      }
    },
    snapshot: scan,
    async killLeftovers() {
      scan();
      const alive = [...seen].filter(([pid, startTime]) => {
        const st = readProcStat(pid);
        return st !== undefined && st.startTime === startTime && processAlive(pid);
      });
      const pids = alive.map(([pid]) => pid);
      if (pids.length > 0) await killAndReap(pids);
      return pids;
    },
  };
}

/** True while `/proc/<pid>` exists and the process is not a zombie. */
export function processAlive(pid: number): boolean {
  try {
    const text = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const state = text.slice(text.lastIndexOf(')') + 2).split(' ')[0];
    return state !== 'Z' && state !== 'X';
  } catch {
    // no such process
    return false;
  }
}

/** SIGKILLs the given pids and waits (bounded) until they are gone. */
export async function killAndReap(pids: readonly number[], timeoutMs = 10_000): Promise<void> {
  for (const pid of pids) signalPid(pid, 'SIGKILL');
  await waitFor(() => pids.every((pid) => !processAlive(pid)), {
    what: `processes ${pids.join(', ')} to exit`,
    timeoutMs,
  });
}

/** Decodes the octal escapes /proc/self/mountinfo uses for spaces and the like. */
function unescapeMountPath(p: string): string {
  return p.replace(/\\([0-7]{3})/g, (_, oct: string) => String.fromCharCode(parseInt(oct, 8)));
}

/** Lazily unmounts everything mounted at or below `dir`, deepest first. */
export function unmountBelow(dir: string): string[] {
  let info: string;
  try {
    info = readFileSync('/proc/self/mountinfo', 'utf8');
  } catch {
    // no mount table to read: nothing to unmount
    return [];
  }
  const prefix = path.resolve(dir);
  const points = info
    .split('\n')
    .map((line) => line.split(' ')[4])
    .filter((p): p is string => p !== undefined)
    .map(unescapeMountPath)
    .filter((p) => p === prefix || p.startsWith(`${prefix}/`))
    .sort((a, b) => b.length - a.length);
  for (const p of points) spawnSync('umount', ['-l', p], { stdio: 'ignore' });
  return points;
}

/** Removes a temp dir made by a harness, after unmounting anything below it. */
export async function removeTree(dir: string): Promise<void> {
  unmountBelow(dir);
  await rm(dir, { recursive: true, force: true, maxRetries: 3 });
}

/** A fresh private temp dir for a harness (short, since it holds unix sockets). */
export async function makeTempDir(prefix: string): Promise<string> {
  const base = os.tmpdir();
  const dir = await mkdtemp(path.join(base, prefix));
  // sun_path holds 107 bytes; leave room for the socket names below it.
  if (dir.length > 70) throw new Error(`temp dir ${dir} is too long for unix sockets; set TMPDIR`);
  return dir;
}

/** Resolves a binary on PATH, or undefined. */
export function which(binary: string): string | undefined {
  for (const dir of (process.env['PATH'] ?? '').split(':')) {
    if (dir === '') continue;
    const candidate = path.join(dir, binary);
    try {
      if (statSync(candidate).isFile()) return candidate;
    } catch {
      // not in this directory
    }
  }
  return undefined;
}
