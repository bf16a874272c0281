/**
 * Runs the real tsbox daemon for integration tests, exactly as a user does:
 * `node dist/src/main.js serve --socket <tmp>/tsbox.sock --state-dir <tmp>/state --log-level debug`,
 * in a private temp dir. Start, SIGTERM, SIGKILL and restart it on the same socket and state
 * dir; run one-shot commands that are expected to exit (a second `serve`, a bad config); and
 * tear everything down even after a failure: sandboxes are shut down through the API, then
 * whatever is left of them (supervisors, sandbox processes, cgroups) is killed and removed.
 */
import { spawn } from 'node:child_process';
import { existsSync, readFileSync, readdirSync, rmdirSync } from 'node:fs';
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

export { processAlive, tsboxMain };

/** A namespace no other run uses, so that its cgroups and records can be found and removed. */
export function uniqueNamespace(label: string): string {
  return `${label}-${process.pid}-${Math.random().toString(36).slice(2, 8)}`;
}

/** How a one-shot command ended. */
export interface CommandResult {
  readonly code: number | null;
  readonly signal: NodeJS.Signals | null;
  readonly stdout: string;
  readonly stderr: string;
  /** Wall time from spawn to exit. */
  readonly ms: number;
}

/** The start time of a process (field 22 of /proc/PID/stat), or undefined when it is gone. */
export function processStartTime(pid: number): string | undefined {
  try {
    const text = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return text.slice(text.lastIndexOf(')') + 2).split(' ')[19];
  } catch {
    return undefined;
  }
}

function parentPid(pid: number): number | undefined {
  try {
    const text = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return Number(text.slice(text.lastIndexOf(')') + 2).split(' ')[1]);
  } catch {
    return undefined;
  }
}

function cmdline(pid: number): string[] {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0');
  } catch {
    return [];
  }
}

function allPids(): number[] {
  return readdirSync('/proc')
    .filter((name) => /^\d+$/.test(name))
    .map(Number);
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

/** Every cgroup directory tsbox may have made for a sandbox (default parent `tsbox`). */
export function sandboxCgroupDirs(namespace: string, id: string): string[] {
  return cgroupMounts().map((mount) => path.join(mount, 'tsbox', `${namespace}@${id}`));
}

/** A tsbox daemon with a private temp dir, socket and state dir. */
export interface TsboxDaemon {
  readonly dir: string;
  readonly socketPath: string;
  readonly stateDir: string;
  /** stdout and stderr of every run of the daemon, appended. */
  readonly logPath: string;
  /** Pid of the running daemon, undefined while it is not running. */
  readonly pid: number | undefined;
  /** The arguments after `main.js` that start this daemon. */
  serveArgs(): string[];
  /** Starts the daemon and waits until its socket accepts connections. */
  start(): Promise<void>;
  /** SIGTERM to the daemon; SIGKILL to its process group after `graceMs`. */
  stop(graceMs?: number): Promise<ExitInfo & { graceful: boolean }>;
  /** SIGKILL to the daemon only: a crash, which leaves its socket file behind. */
  kill9(): Promise<ExitInfo>;
  /** Resolves when the current run of the daemon exits. */
  exited(): Promise<ExitInfo>;
  /**
   * A client for `namespace`, cached until the daemon is started again (a new run gets fresh
   * channels, so that no reconnect backoff of the old one delays the first calls).
   */
  client(namespace: string): SandboxClient;
  /** A client of its own, closed at teardown. */
  newClient(namespace: string): SandboxClient;
  /** Remembers a sandbox (and its pid, once started) so that teardown removes it. */
  track(namespace: string, id: string, pid?: number): void;
  /** Runs `node main.js ...args` to its exit (killed after `timeoutMs`). */
  run(args: readonly string[], timeoutMs?: number): Promise<CommandResult>;
  /** `<state>/sandboxes/<ns>/<id>`. */
  sandboxDir(namespace: string, id: string): string;
  /** Last lines of the daemon log, for failure messages. */
  logTail(lines?: number): string;
  /** Shuts down the tracked sandboxes, stops the daemon, kills and removes what is left. */
  teardown(): Promise<void>;
}

/** Creates the temp dir and starts tsbox; call `teardown()` in an after-hook. */
export async function startTsbox(label = 'tsbox-it'): Promise<TsboxDaemon> {
  const daemon = await createTsbox(label);
  try {
    await daemon.start();
  } catch (err) {
    await daemon.teardown();
    throw err;
  }
  return daemon;
}

/** Like {@link startTsbox}, without starting it. */
export async function createTsbox(label = 'tsbox-it'): Promise<TsboxDaemon> {
  if (!existsSync(tsboxMain)) throw new Error(`${tsboxMain} not found: run npm run build first`);
  const dir = await makeTempDir(`${label}-`);
  const socketPath = path.join(dir, 'tsbox.sock');
  const stateDir = path.join(dir, 'state');
  const logPath = path.join(dir, 'tsbox.log');
  await mkdir(stateDir, { recursive: true });
  const tracker = createProcessTracker(dir);
  const sandboxes = new Map<string, { namespace: string; id: string; pids: Map<number, string> }>();
  let clients = new Map<string, SandboxClient>();
  const ownClients: SandboxClient[] = [];
  let current: ManagedProcess | undefined;
  let tornDown = false;

  const closeClients = (): void => {
    for (const client of clients.values()) client.close();
    clients = new Map();
  };

  const logTail = (lines = 40): string => `--- tsbox log (${logPath}) ---\n${tailFile(logPath, lines)}`;
  const serveArgs = (): string[] => [
    tsboxMain,
    'serve',
    '--socket',
    socketPath,
    '--state-dir',
    stateDir,
    '--log-level',
    'debug',
  ];

  /** Kills every supervisor of this state dir and its sandbox process, and what it tracked. */
  const killSandboxProcesses = async (): Promise<number[]> => {
    const victims = new Set<number>();
    for (const { pids } of sandboxes.values()) {
      for (const [pid, startTime] of pids) if (processStartTime(pid) === startTime && processAlive(pid)) victims.add(pid);
    }
    const prefix = `${stateDir}${path.sep}`;
    const pids = allPids();
    const supervisors = pids.filter((pid) => pid !== process.pid && cmdline(pid).some((arg) => arg.startsWith(prefix)));
    for (const pid of pids) {
      const parent = parentPid(pid);
      if (parent !== undefined && supervisors.includes(parent)) victims.add(pid);
    }
    for (const pid of supervisors) victims.add(pid);
    const alive = [...victims].filter(processAlive);
    for (const pid of alive) {
      try {
        process.kill(-pid, 'SIGKILL');
      } catch {
        // not a group leader, or already gone: the pid itself is killed below
      }
    }
    if (alive.length > 0) await killAndReap(alive);
    return alive;
  };

  const removeCgroups = (): void => {
    const namespaces = new Set([...sandboxes.values()].map((s) => s.namespace));
    for (const mount of cgroupMounts()) {
      const parent = path.join(mount, 'tsbox');
      let names: string[];
      try {
        names = readdirSync(parent);
      } catch {
        continue;
      }
      for (const name of names) {
        const ns = name.slice(0, name.indexOf('@'));
        if (!name.includes('@') || !namespaces.has(ns)) continue;
        try {
          rmdirSync(path.join(parent, name));
        } catch (err) {
          process.stderr.write(`# cannot remove cgroup ${path.join(parent, name)}: ${(err as Error).message}\n`);
        }
      }
    }
  };

  const daemon: TsboxDaemon = {
    dir,
    socketPath,
    stateDir,
    logPath,
    get pid() {
      return current !== undefined && current.exitInfo() === undefined ? current.pid : undefined;
    },
    serveArgs,
    async start() {
      if (tornDown) throw new Error('tsbox daemon was torn down');
      if (daemon.pid !== undefined) throw new Error('tsbox is already running');
      closeClients();
      current = await spawnLogged(process.execPath, serveArgs(), { logPath, env: tracker.env(), cwd: dir });
      tracker.addLeader(current.pid);
      await waitForSocket(current, socketPath, { name: 'tsbox', logTail, timeoutMs: 20_000 });
    },
    async stop(graceMs = 10_000) {
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
      return current.exited;
    },
    exited() {
      if (current === undefined) throw new Error('tsbox was never started');
      return current.exited;
    },
    client(namespace) {
      let client = clients.get(namespace);
      if (client === undefined) {
        client = new SandboxClient(socketPath, namespace);
        clients.set(namespace, client);
      }
      return client;
    },
    newClient(namespace) {
      const client = new SandboxClient(socketPath, namespace);
      ownClients.push(client);
      return client;
    },
    track(namespace, id, pid) {
      const key = `${namespace}/${id}`;
      let entry = sandboxes.get(key);
      if (entry === undefined) {
        entry = { namespace, id, pids: new Map() };
        sandboxes.set(key, entry);
      }
      if (pid !== undefined && pid > 0) {
        const startTime = processStartTime(pid);
        if (startTime !== undefined) entry.pids.set(pid, startTime);
      }
    },
    run(args, timeoutMs = 20_000) {
      const began = Date.now();
      return new Promise<CommandResult>((resolve, reject) => {
        const child = spawn(process.execPath, [...args], { stdio: ['ignore', 'pipe', 'pipe'], cwd: dir, detached: true });
        let stdout = '';
        let stderr = '';
        child.stdout.setEncoding('utf8').on('data', (chunk: string) => (stdout += chunk));
        child.stderr.setEncoding('utf8').on('data', (chunk: string) => (stderr += chunk));
        const timer = setTimeout(() => {
          try {
            process.kill(-(child.pid ?? 0), 'SIGKILL');
          } catch {
            // gone meanwhile
          }
        }, timeoutMs);
        child.once('error', (err) => {
          clearTimeout(timer);
          reject(err);
        });
        child.once('close', (code, signal) => {
          clearTimeout(timer);
          resolve({ code, signal, stdout, stderr, ms: Date.now() - began });
        });
      });
    },
    sandboxDir: (namespace, id) => path.join(stateDir, 'sandboxes', namespace, id),
    logTail,
    async teardown() {
      if (tornDown) return;
      tornDown = true;
      const problems: string[] = [];
      try {
        if (daemon.pid !== undefined) {
          for (const { namespace, id } of sandboxes.values()) {
            await daemon
              .client(namespace)
              .shutdown({ sandboxId: id }, { timeoutMs: 10_000 })
              .catch((err: unknown) => problems.push(`shutdown ${namespace}/${id}: ${(err as Error).message}`));
          }
        }
      } finally {
        closeClients();
        for (const client of ownClients) client.close();
        await daemon.stop().catch((err: unknown) => problems.push(`stop: ${(err as Error).message}`));
        const killed = [...(await killSandboxProcesses()), ...(await tracker.killLeftovers())];
        if (killed.length > 0) process.stderr.write(`# tsbox teardown: killed leftover processes ${killed.join(', ')}\n`);
        removeCgroups();
        if (process.env['TSBOX_IT_KEEP'] !== '1') await removeTree(dir);
        if (problems.length > 0) process.stderr.write(`# tsbox teardown: ${problems.join('; ')}\n`);
      }
    },
  };
  return daemon;
}
