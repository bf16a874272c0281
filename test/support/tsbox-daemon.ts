/**
 * Runs a sandboxer daemon (tsbox, or any server of containerd's sandbox Controller API given as
 * a command) for end-to-end tests: a private temp dir with its socket, state dir and log;
 * start, stop (SIGTERM), restart, crash (SIGKILL), and a teardown that leaves no process,
 * mount or file behind.
 *
 * Also home of the small process toolkit the containerd harness shares: processes run in their
 * own process group, always have an 'error' listener, their exit is taken from 'exit', and
 * stopping is SIGTERM to the leader, then SIGKILL to the whole group after a bound.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { existsSync, openSync, closeSync, readFileSync, readdirSync, statSync } from 'node:fs';
import { mkdtemp, mkdir, rm } from 'node:fs/promises';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { repoRoot } from './containerd-clients.js';

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

function signalGroup(pid: number, signal: NodeJS.Signals): void {
  try {
    process.kill(-pid, signal);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'ESRCH') throw err;
  }
}

function signalPid(pid: number, signal: NodeJS.Signals): void {
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
  options: { timeoutMs?: number; name: string; logTail: () => string },
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
    { what: `${options.name} socket ${socketPath}`, timeoutMs: options.timeoutMs ?? 15_000, describe: options.logTail },
  );
}

/** The last `lines` lines of a log file, without those matching `skip` ('' if it does not exist). */
export function tailFile(file: string, lines = 40, skip?: RegExp): string {
  try {
    const all = readFileSync(file, 'utf8').split('\n');
    return (skip === undefined ? all : all.filter((l) => !skip.test(l))).slice(-lines - 1).join('\n');
  } catch {
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
    const tree = new Set<number>();
    for (const st of stats) {
      const isLeader = leaders.get(st.pid) === st.startTime;
      if (isLeader || leaders.has(st.sid) || leaders.has(st.pgid)) tree.add(st.pid);
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

// ---------------------------------------------------------------------------------------------
// Sandboxer daemon

/** The command that runs a sandboxer on a socket path with a state dir. */
export type SandboxerCommand = (paths: { socketPath: string; stateDir: string }) => {
  file: string;
  args: string[];
  env?: NodeJS.ProcessEnv;
};

/** A sandboxer implementation the end-to-end tests can run. */
export interface SandboxerSpec {
  /** For messages. */
  readonly name: string;
  readonly command: SandboxerCommand;
  /**
   * True when each started sandbox is a real host process whose pid Start returns (tsbox);
   * false for in-memory servers such as goref (pid 0).
   */
  readonly runsProcesses: boolean;
  /** Exit status Wait reports after Stop(timeout 0): 128 + SIGKILL. */
  readonly stopExitStatus: number;
}

/** Path of the built tsbox entry point. */
export const tsboxMain = path.join(repoRoot, 'dist', 'src', 'main.js');

/** tsbox itself: `node dist/src/main.js serve --socket S --state-dir D --log-level debug`. */
export function tsboxSandboxer(main: string = tsboxMain): SandboxerSpec {
  return {
    name: 'tsbox',
    runsProcesses: true,
    stopExitStatus: 137,
    command: ({ socketPath, stateDir }) => {
      if (!existsSync(main)) throw new Error(`${main} not found: build tsbox first (npm run build)`);
      return {
        file: process.execPath,
        args: [main, 'serve', '--socket', socketPath, '--state-dir', stateDir, '--log-level', 'debug'],
      };
    },
  };
}

/** Default location of the reference server built by sbbench's build.sh. */
export const gorefDefaultPath = path.join(process.env['SBBENCH_OUT'] ?? '/tmp/sbbench', 'bin', 'goref');

/** sbbench's in-memory Go reference server (`goref --socket S`); its sandboxes have pid 0. */
export function gorefSandboxer(binary: string = process.env['TSBOX_GOREF'] ?? gorefDefaultPath): SandboxerSpec {
  return {
    name: 'goref',
    runsProcesses: false,
    stopExitStatus: 137,
    command: ({ socketPath }) => {
      if (!existsSync(binary)) throw new Error(`${binary} not found: build it with tools/sbbench/build.sh`);
      return { file: binary, args: ['--socket', socketPath] };
    },
  };
}

/** Quotes a word for bash. */
function shellQuote(s: string): string {
  return `'${s.replace(/'/g, `'\\''`)}'`;
}

/**
 * Any server given as a shell command line, run as `bash -c "exec <command>"` (so the pid is
 * the server's) with `{SOCK}` and `{DIR}` replaced by the socket path and state dir, as
 * sbbench's `B_CMD`.
 */
export function commandSandboxer(commandLine: string, runsProcesses: boolean): SandboxerSpec {
  return {
    name: 'custom',
    runsProcesses,
    stopExitStatus: 137,
    command: ({ socketPath, stateDir }) => ({
      file: 'bash',
      args: [
        '-c',
        `exec ${commandLine.replaceAll('{SOCK}', shellQuote(socketPath)).replaceAll('{DIR}', shellQuote(stateDir))}`,
      ],
    }),
  };
}

/**
 * The sandboxer the end-to-end tests run: tsbox by default. `TSBOX_E2E_SANDBOXER=goref`
 * selects sbbench's reference server (to check the harness and containerd's behaviour on
 * their own); `TSBOX_E2E_SANDBOXER=command` runs `TSBOX_E2E_SANDBOXER_CMD` (see
 * {@link commandSandboxer}), whose sandboxes count as real processes when
 * `TSBOX_E2E_SANDBOXER_PROCESSES=1`.
 */
export function sandboxerFromEnv(): SandboxerSpec {
  const which = process.env['TSBOX_E2E_SANDBOXER'] ?? 'tsbox';
  switch (which) {
    case 'tsbox':
      return tsboxSandboxer();
    case 'goref':
      return gorefSandboxer();
    case 'command': {
      const cmd = process.env['TSBOX_E2E_SANDBOXER_CMD'];
      if (cmd === undefined || cmd === '') throw new Error('TSBOX_E2E_SANDBOXER=command needs TSBOX_E2E_SANDBOXER_CMD');
      return commandSandboxer(cmd, process.env['TSBOX_E2E_SANDBOXER_PROCESSES'] === '1');
    }
    default:
      throw new Error(`TSBOX_E2E_SANDBOXER=${which}: expected tsbox, goref or command`);
  }
}

/** A running (or stopped) sandboxer daemon with a private socket, state dir and log. */
export interface SandboxerDaemon {
  readonly spec: SandboxerSpec;
  /** Private temp dir holding everything below. */
  readonly dir: string;
  readonly socketPath: string;
  readonly stateDir: string;
  /** stdout and stderr of every run, appended. */
  readonly logPath: string;
  /** Pid of the current run, undefined while stopped. */
  readonly pid: number | undefined;
  /** Starts the daemon (again) and waits until its socket accepts connections. */
  start(): Promise<void>;
  /** SIGTERM, then SIGKILL to its process group after `graceMs`. */
  stop(options?: { graceMs?: number }): Promise<ExitInfo & { graceful: boolean }>;
  /** stop() then start() on the same socket and state dir. */
  restart(): Promise<void>;
  /** SIGKILL to the daemon process only (a crash: what it started stays). */
  kill9(): Promise<ExitInfo>;
  /** Last lines of the log. */
  logTail(lines?: number): string;
  /**
   * Stops the daemon, kills whatever is left of what it started (sandbox processes
   * included; see {@link ProcessTracker}), unmounts and removes the temp dir (kept when
   * `TSBOX_E2E_KEEP=1`). Resolves with the pids it had to kill. Safe to call more than once.
   */
  teardown(): Promise<number[]>;
}

/** Options of {@link startSandboxerDaemon}. */
export interface SandboxerDaemonOptions {
  startTimeoutMs?: number;
  stopGraceMs?: number;
}

/** Creates the temp dir and starts the sandboxer; call `teardown()` in `after`. */
export async function startSandboxerDaemon(
  spec: SandboxerSpec,
  options: SandboxerDaemonOptions = {},
): Promise<SandboxerDaemon> {
  const daemon = await createSandboxerDaemon(spec, options);
  try {
    await daemon.start();
  } catch (err) {
    await daemon.teardown();
    throw err;
  }
  return daemon;
}

/** Like {@link startSandboxerDaemon}, without starting it. */
export async function createSandboxerDaemon(
  spec: SandboxerSpec,
  options: SandboxerDaemonOptions = {},
): Promise<SandboxerDaemon> {
  const dir = await makeTempDir(`${spec.name}-e2e-`);
  const socketPath = path.join(dir, 'sandboxer.sock');
  const stateDir = path.join(dir, 'state');
  const logPath = path.join(dir, 'sandboxer.log');
  await mkdir(stateDir, { recursive: true });
  let current: ManagedProcess | undefined;
  const tracker = createProcessTracker(dir);
  let tornDown = false;

  const logTail = (lines = 40): string => `--- ${spec.name} log (${logPath}) ---\n${tailFile(logPath, lines)}`;

  const daemon: SandboxerDaemon = {
    spec,
    dir,
    socketPath,
    stateDir,
    logPath,
    get pid() {
      return current?.exitInfo() === undefined ? current?.pid : undefined;
    },
    async start() {
      if (tornDown) throw new Error('sandboxer daemon was torn down');
      if (current !== undefined && current.exitInfo() === undefined) throw new Error(`${spec.name} already running`);
      const cmd = spec.command({ socketPath, stateDir });
      current = await spawnLogged(cmd.file, cmd.args, { logPath, env: tracker.env(cmd.env), cwd: dir });
      tracker.addLeader(current.pid);
      await waitForSocket(current, socketPath, {
        name: spec.name,
        logTail,
        timeoutMs: options.startTimeoutMs ?? 15_000,
      });
    },
    async stop(stopOptions = {}) {
      if (current === undefined) return { code: null, signal: null, graceful: true };
      tracker.snapshot();
      return stopProcess(current, { graceMs: stopOptions.graceMs ?? options.stopGraceMs ?? 10_000 });
    },
    async restart() {
      await daemon.stop();
      await daemon.start();
    },
    async kill9() {
      if (current === undefined) throw new Error(`${spec.name} was never started`);
      tracker.snapshot();
      signalPid(current.pid, 'SIGKILL');
      return current.exited;
    },
    logTail,
    async teardown() {
      if (tornDown) return [];
      tornDown = true;
      await daemon.stop({ graceMs: options.stopGraceMs ?? 10_000 });
      const killed = await tracker.killLeftovers();
      if (killed.length > 0) {
        process.stderr.write(`# ${spec.name} teardown: killed leftover processes ${killed.join(', ')}\n`);
      }
      if (process.env['TSBOX_E2E_KEEP'] !== '1') await removeTree(dir);
      return killed;
    },
  };
  return daemon;
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
