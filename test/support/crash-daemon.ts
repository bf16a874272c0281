/**
 * The real tsbox daemon for crash, recovery and soak tests: `node dist/src/main.js serve` on a
 * private socket and state dir, started optionally with `TSBOX_CRASH_AT=<point>` (the daemon
 * then SIGKILLs itself at that named point, see CrashPoint in src/controller/controller.ts),
 * restarted without it on the same socket and state dir, killed with SIGKILL from outside, or
 * stopped with SIGTERM.
 *
 * It also finds what a sandbox left on the host, independently of tsbox's own records: its
 * supervisors (`tsbox-shim` processes whose command line names a directory of this state dir),
 * their children, and every process in the sandbox's cgroup, plus its cgroup directories. The
 * teardown uses the same search, so nothing of a run survives it, even when the daemon died in
 * the middle of an operation and no record names what it had started.
 */
import { readFileSync, readdirSync, rmdirSync } from 'node:fs';
import { mkdir } from 'node:fs/promises';
import path from 'node:path';
import { SandboxClient } from './grpc-client.js';
import {
  type ExitInfo,
  type ManagedProcess,
  createProcessTracker,
  killAndReap,
  makeTempDir,
  processAlive,
  removeTree,
  spawnLogged,
  stopProcess,
  tailFile,
  tsboxMain,
  waitForSocket,
} from './tsbox-daemon.js';

export { processAlive };

/** The environment variable that arms a crash point (read once by config.ts). */
export const CRASH_ENV = 'TSBOX_CRASH_AT';

/** A namespace no other run uses, so that its cgroups and records can be told apart. */
export function uniqueNamespace(label: string): string {
  return `${label}-${process.pid}-${Math.random().toString(36).slice(2, 8)}`;
}

// ---------------------------------------------------------------------------------------------
// /proc

/** What the tests read from /proc/PID/stat. */
export interface ProcInfo {
  readonly pid: number;
  readonly ppid: number;
  /** Process state letter: R, S, D, Z, … */
  readonly state: string;
  /** Start time in clock ticks since boot: with the pid, names one process for good. */
  readonly startTime: string;
}

/** /proc/PID/stat of a process, or undefined when there is no such process. */
export function procInfo(pid: number): ProcInfo | undefined {
  try {
    const text = readFileSync(`/proc/${pid}/stat`, 'utf8');
    // Fields after the command name (in parentheses, may contain anything); rest[0] is field 3.
    const rest = text.slice(text.lastIndexOf(')') + 2).split(' ');
    return { pid, ppid: Number(rest[1]), state: rest[0] ?? '', startTime: rest[19] ?? '' };
  } catch {
    return undefined;
  }
}

/** The command line of a process as its words ([] when it is gone). */
export function cmdlineOf(pid: number): string[] {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').filter((w) => w !== '');
  } catch {
    return [];
  }
}

/** Every pid in /proc. */
export function listPids(): number[] {
  return readdirSync('/proc')
    .filter((name) => /^\d+$/.test(name))
    .map(Number);
}

/** The cgroup paths a process is in (one per hierarchy), e.g. `/tsbox/ns@id`. */
export function cgroupPathsOf(pid: number): string[] {
  try {
    return readFileSync(`/proc/${pid}/cgroup`, 'utf8')
      .split('\n')
      .filter((line) => line !== '')
      .map((line) => line.slice(line.indexOf(':', line.indexOf(':') + 1) + 1));
  } catch {
    return [];
  }
}

/** Mount points of the cgroup v1 hierarchies and the v2 one. */
export function cgroupMounts(): string[] {
  const out: string[] = [];
  for (const line of readFileSync('/proc/self/mountinfo', 'utf8').split('\n')) {
    const [left, right] = line.split(' - ');
    const mountPoint = left?.split(' ')[4];
    const type = right?.split(' ')[0];
    if (mountPoint !== undefined && (type === 'cgroup' || type === 'cgroup2')) out.push(mountPoint);
  }
  return out;
}

/** tsbox's cgroup name for a sandbox (src/runtime/cgroups.ts: `<parent>/<ns>@<id>`). */
export function sandboxCgroupName(namespace: string, id: string): string {
  return `${namespace}@${id}`;
}

/** The cgroup directories of a sandbox that exist now, over every hierarchy. */
export function existingCgroupDirs(namespace: string, id: string): string[] {
  const out: string[] = [];
  for (const mount of cgroupMounts()) {
    const dir = path.join(mount, 'tsbox', sandboxCgroupName(namespace, id));
    try {
      readdirSync(dir);
      out.push(dir);
    } catch {
      // absent in this hierarchy
    }
  }
  return out;
}

/** Every cgroup directory left under any `<hierarchy>/tsbox/` for sandboxes of `namespace`. */
export function cgroupDirsOfNamespace(namespace: string): string[] {
  const out: string[] = [];
  for (const mount of cgroupMounts()) {
    const parent = path.join(mount, 'tsbox');
    let names: string[];
    try {
      names = readdirSync(parent);
    } catch {
      continue;
    }
    for (const name of names) if (name.startsWith(`${namespace}@`)) out.push(path.join(parent, name));
  }
  return out;
}

/** A live process that is not a zombie. */
function live(pid: number): boolean {
  const info = procInfo(pid);
  return info !== undefined && info.state !== 'Z' && info.state !== 'X';
}

/** What runs on the host for one sandbox, found without asking tsbox. */
export interface SandboxProcesses {
  /** Live supervisors whose command line names the sandbox's directory. */
  readonly supervisors: number[];
  /** Live processes that are not supervisors: children of its supervisors, members of its cgroup. */
  readonly sandbox: number[];
}

/** Finds the live processes of sandbox (ns, id) of a state dir. */
export function sandboxProcesses(stateDir: string, namespace: string, id: string): SandboxProcesses {
  const dir = path.join(stateDir, 'sandboxes', namespace, id);
  const cgroup = `/tsbox/${sandboxCgroupName(namespace, id)}`;
  const pids = listPids().filter((pid) => pid !== process.pid);
  // A supervisor names the directory on its command line, and so does the built-in pause
  // process, a fork of it. The supervisor is the one whose parent does not name it, unless
  // the pid file names it as the sandbox's (a pause process whose supervisor was killed).
  const naming = pids.filter((pid) => cmdlineOf(pid).includes(dir) && live(pid));
  const recorded = readPidFile(dir)?.pid;
  const supervisors = naming.filter((pid) => pid !== recorded && !naming.includes(procInfo(pid)?.ppid ?? 0));
  const sandbox = new Set<number>();
  for (const pid of pids) {
    if (supervisors.includes(pid) || !live(pid)) continue;
    const info = procInfo(pid);
    const inCgroup = cgroupPathsOf(pid).some((p) => p === cgroup || p.startsWith(`${cgroup}/`));
    if (inCgroup || (info !== undefined && supervisors.includes(info.ppid))) sandbox.add(pid);
  }
  return { supervisors, sandbox: [...sandbox] };
}

/** The live supervisors of any sandbox of a state dir, with the directory each one serves. */
export function supervisorsOfStateDir(stateDir: string): { pid: number; dir: string }[] {
  const prefix = `${path.join(stateDir, 'sandboxes')}${path.sep}`;
  const out: { pid: number; dir: string }[] = [];
  for (const pid of listPids()) {
    if (pid === process.pid) continue;
    const words = cmdlineOf(pid);
    const at = words.indexOf('--dir');
    const dir = at >= 0 ? words[at + 1] : undefined;
    if (dir !== undefined && dir.startsWith(prefix) && live(pid)) out.push({ pid, dir });
  }
  // A fork of a supervisor (the pause process) is a sandbox process, not a supervisor.
  const pids = new Set(out.map((s) => s.pid));
  return out.filter((s) => !pids.has(procInfo(s.pid)?.ppid ?? 0) && readPidFileQuietly(s.dir)?.pid !== s.pid);
}

/** Live processes in any cgroup of a sandbox of `namespace` (supervisors included). */
export function processesInNamespaceCgroups(namespace: string): number[] {
  const prefix = `/tsbox/${namespace}@`;
  return listPids().filter(
    (pid) => pid !== process.pid && live(pid) && cgroupPathsOf(pid).some((p) => p.startsWith(prefix)),
  );
}

/** The sandbox's pid file: "<supervisor pid> <sandbox pid>", or undefined when absent. */
export function readPidFile(sandboxDir: string): { shimPid: number; pid: number } | undefined {
  let text: string;
  try {
    text = readFileSync(path.join(sandboxDir, 'pid'), 'utf8');
  } catch {
    return undefined;
  }
  const match = /^(\d+) (\d+)\n?$/.exec(text);
  if (match === null) throw new Error(`${sandboxDir}/pid is malformed: ${JSON.stringify(text)}`);
  return { shimPid: Number(match[1]), pid: Number(match[2]) };
}

function readPidFileQuietly(sandboxDir: string): { shimPid: number; pid: number } | undefined {
  try {
    return readPidFile(sandboxDir);
  } catch {
    return undefined;
  }
}

/** The supervisor's exit file: "<status> <seconds> <nanoseconds>", or undefined when absent. */
export function readExitFile(sandboxDir: string): { status: number; seconds: number; nanos: number } | undefined {
  let text: string;
  try {
    text = readFileSync(path.join(sandboxDir, 'exit'), 'utf8');
  } catch {
    return undefined;
  }
  const match = /^(\d+) (-?\d+) (\d+)\n?$/.exec(text);
  if (match === null) throw new Error(`${sandboxDir}/exit is malformed: ${JSON.stringify(text)}`);
  return { status: Number(match[1]), seconds: Number(match[2]), nanos: Number(match[3]) };
}

/**
 * Everything still alive of the sandboxes of a state dir and of `namespaces`: supervisors,
 * their children, processes in the namespaces' sandbox cgroups, and the given pids (each
 * with the start time it was recorded with).
 */
export function sandboxLeftovers(
  stateDir: string,
  namespaces: readonly string[],
  pids: ReadonlyMap<number, string> = new Map(),
): number[] {
  const found = new Set<number>();
  const supervisors = supervisorsOfStateDir(stateDir).map((s) => s.pid);
  const prefix = `${path.join(stateDir, 'sandboxes')}${path.sep}`;
  for (const pid of listPids()) {
    const info = procInfo(pid);
    if (info === undefined || !live(pid)) continue;
    // Supervisors, their children, and a sandbox whose supervisor is gone (it keeps the
    // supervisor's command line).
    if (supervisors.includes(pid) || supervisors.includes(info.ppid)) found.add(pid);
    else if (cmdlineOf(pid).some((word) => word.startsWith(prefix))) found.add(pid);
  }
  for (const ns of namespaces) for (const pid of processesInNamespaceCgroups(ns)) found.add(pid);
  for (const [pid, startTime] of pids) if (procInfo(pid)?.startTime === startTime && live(pid)) found.add(pid);
  found.delete(process.pid);
  return [...found];
}

/** SIGKILLs {@link sandboxLeftovers} (each one's process group too) and waits until they are gone. */
export async function killSandboxLeftovers(
  stateDir: string,
  namespaces: readonly string[],
  pids: ReadonlyMap<number, string> = new Map(),
): Promise<number[]> {
  const victims = sandboxLeftovers(stateDir, namespaces, pids);
  for (const pid of victims) {
    try {
      process.kill(-pid, 'SIGKILL');
    } catch {
      // not a group leader, or gone: the pid itself is killed below
    }
  }
  if (victims.length > 0) await killAndReap(victims);
  return victims;
}

// ---------------------------------------------------------------------------------------------
// The daemon

/** The calls of the Sandbox Controller API, for one namespace. */
export type TsboxClient = Pick<
  SandboxClient,
  'namespace' | 'create' | 'start' | 'platform' | 'stop' | 'wait' | 'status' | 'shutdown' | 'metrics' | 'update'
>;

/** Options of one run of the daemon. */
export interface RunOptions {
  /** Arms this crash point (TSBOX_CRASH_AT) for this run only. */
  readonly crashAt?: string;
}

/** tsbox on a private socket and state dir, run as often as a test needs. */
export interface CrashDaemon {
  /** Private temp dir holding everything below. */
  readonly dir: string;
  readonly socketPath: string;
  readonly stateDir: string;
  /** stdout and stderr of every run, appended. */
  readonly logPath: string;
  /** Pid of the current run while it runs. */
  readonly pid: number | undefined;
  /** Starts a run and waits until its socket accepts connections. */
  start(options?: RunOptions): Promise<void>;
  /** SIGTERM (an ordered shutdown); SIGKILL to its group after `graceMs`. */
  stop(graceMs?: number): Promise<ExitInfo & { graceful: boolean }>;
  /** SIGKILL to the daemon only: a crash; its sandboxes keep running. */
  kill9(): Promise<ExitInfo>;
  /** Resolves when the current run exits. */
  exited(): Promise<ExitInfo>;
  /**
   * A client for `namespace` that always calls the current run, each run on a fresh channel
   * (so no reconnect backoff of an earlier run delays the first calls); calls in flight when
   * a run ends fail.
   */
  client(namespace: string): TsboxClient;
  /** `<state>/sandboxes/<ns>/<id>`. */
  sandboxDir(namespace: string, id: string): string;
  /** Remembers a namespace (its cgroups are removed at teardown) and, once known, a pid. */
  track(namespace: string, pid?: number): void;
  /** The whole log of every run so far. */
  logText(): string;
  logTail(lines?: number): string;
  /**
   * Stops the daemon, kills every process of every sandbox of this state dir and of the
   * tracked namespaces, removes their cgroups and the temp dir. Resolves with the pids it had
   * to kill. Safe to call more than once.
   */
  teardown(): Promise<number[]>;
}

/** Creates the temp dir; nothing runs until `start()`. Call `teardown()` in an after-hook. */
export async function createCrashDaemon(label: string): Promise<CrashDaemon> {
  const dir = await makeTempDir(`${label}-`);
  const socketPath = path.join(dir, 'tsbox.sock');
  const stateDir = path.join(dir, 'state');
  const logPath = path.join(dir, 'tsbox.log');
  await mkdir(stateDir, { recursive: true });
  const tracker = createProcessTracker(dir);
  const namespaces = new Set<string>();
  const pids = new Map<number, string>();
  let clients = new Map<string, SandboxClient>();
  let current: ManagedProcess | undefined;
  let tornDown = false;

  const closeClients = (): void => {
    for (const c of clients.values()) c.close();
    clients = new Map();
  };
  const logTail = (lines = 40): string => `--- tsbox log (${logPath}) ---\n${tailFile(logPath, lines)}`;

  const daemon: CrashDaemon = {
    dir,
    socketPath,
    stateDir,
    logPath,
    get pid() {
      return current !== undefined && current.exitInfo() === undefined ? current.pid : undefined;
    },
    async start(options = {}) {
      if (tornDown) throw new Error('tsbox daemon was torn down');
      if (daemon.pid !== undefined) throw new Error('tsbox is already running');
      closeClients();
      const env: NodeJS.ProcessEnv = { ...process.env };
      delete env[CRASH_ENV];
      if (options.crashAt !== undefined) env[CRASH_ENV] = options.crashAt;
      const args = [tsboxMain, 'serve', '--socket', socketPath, '--state-dir', stateDir, '--log-level', 'debug'];
      current = await spawnLogged(process.execPath, args, { logPath, env: tracker.env(env), cwd: dir });
      tracker.addLeader(current.pid);
      await waitForSocket(current, socketPath, { name: 'tsbox', logTail, timeoutMs: 20_000 });
    },
    async stop(graceMs = 10_000) {
      closeClients();
      if (current === undefined) return { code: null, signal: null, graceful: true };
      tracker.snapshot();
      return stopProcess(current, { graceMs });
    },
    async kill9() {
      if (current === undefined) throw new Error('tsbox was never started');
      tracker.snapshot();
      try {
        process.kill(current.pid, 'SIGKILL');
      } catch {
        // already gone
      }
      const exit = await current.exited;
      closeClients();
      return exit;
    },
    exited() {
      if (current === undefined) throw new Error('tsbox was never started');
      return current.exited;
    },
    client(namespace) {
      const channel = (): SandboxClient => {
        let c = clients.get(namespace);
        if (c === undefined) {
          c = new SandboxClient(socketPath, namespace);
          clients.set(namespace, c);
        }
        return c;
      };
      return {
        namespace,
        create: (request, options) => channel().create(request, options),
        start: (request, options) => channel().start(request, options),
        platform: (request, options) => channel().platform(request, options),
        stop: (request, options) => channel().stop(request, options),
        wait: (request, options) => channel().wait(request, options),
        status: (request, options) => channel().status(request, options),
        shutdown: (request, options) => channel().shutdown(request, options),
        metrics: (request, options) => channel().metrics(request, options),
        update: (request, options) => channel().update(request, options),
      };
    },
    sandboxDir: (namespace, id) => path.join(stateDir, 'sandboxes', namespace, id),
    track(namespace, pid) {
      namespaces.add(namespace);
      if (pid !== undefined && pid > 0) {
        const startTime = procInfo(pid)?.startTime;
        if (startTime !== undefined) pids.set(pid, startTime);
      }
    },
    logText() {
      try {
        return readFileSync(logPath, 'utf8');
      } catch {
        return '';
      }
    },
    logTail,
    async teardown() {
      if (tornDown) return [];
      tornDown = true;
      closeClients();
      const problems: string[] = [];
      await daemon.stop().catch((err: unknown) => problems.push(`stop: ${(err as Error).message}`));
      const killed = await killSandboxLeftovers(stateDir, [...namespaces], pids).catch((err: unknown) => {
        problems.push(`kill: ${(err as Error).message}`);
        return [] as number[];
      });
      killed.push(...(await tracker.killLeftovers()));
      for (const ns of namespaces) {
        for (const cgroup of cgroupDirsOfNamespace(ns)) {
          try {
            rmdirSync(cgroup);
          } catch (err) {
            problems.push(`cannot remove cgroup ${cgroup}: ${(err as Error).message}`);
          }
        }
      }
      if (process.env['TSBOX_IT_KEEP'] !== '1') await removeTree(dir);
      if (killed.length > 0) process.stderr.write(`# tsbox teardown: killed leftover processes ${killed.join(', ')}\n`);
      if (problems.length > 0) process.stderr.write(`# tsbox teardown: ${problems.join('; ')}\n`);
      return killed;
    },
  };
  return daemon;
}
