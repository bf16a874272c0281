/**
 * Runs the real tsbox daemon for integration tests, exactly as a user does:
 * `node dist/src/main.js serve --socket <tmp>/tsbox.sock --state-dir <tmp>/state --log-level debug`,
 * in a private temp dir. Start, SIGTERM, SIGKILL and restart it on the same socket and state
 * dir; run one-shot commands that are expected to exit (a second `serve`, a bad config); and
 * tear everything down even after a failure: sandboxes are shut down through the API, then
 * whatever is left of them (supervisors, sandbox processes, cgroups) is killed and removed.
 */
import { spawn } from 'node:child_process';
import { existsSync, readFileSync, rmdirSync } from 'node:fs';
import { mkdir } from 'node:fs/promises';
import path from 'node:path';
import { SandboxClient } from './grpc-client.js';
import { cgroupDirsOfNamespace, killSandboxLeftovers, processStartTime } from './host.js';
import {
  type ExitInfo,
  type ManagedProcess,
  createProcessTracker,
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

/** The environment variable that arms a crash point (read once by config.ts). */
export const CRASH_ENV = 'TSBOX_CRASH_AT';

/** Options of one run of the daemon. */
export interface RunOptions {
  /** Arms this crash point (TSBOX_CRASH_AT) for this run only. */
  readonly crashAt?: string;
}

/** Options of a daemon for all its runs. */
export interface TsboxOptions {
  /** Closes the cached clients as soon as a run is stopped or killed, not only at the next start. */
  readonly closeClientsOnExit?: boolean;
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
  start(options?: RunOptions): Promise<void>;
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
  /**
   * Remembers a namespace (its cgroups are removed at teardown), a sandbox of it (shut down
   * through the API at teardown) and, once known, a pid (killed at teardown).
   */
  track(namespace: string, id?: string, pid?: number): void;
  /** Runs `node main.js ...args` to its exit (killed after `timeoutMs`). */
  run(args: readonly string[], timeoutMs?: number): Promise<CommandResult>;
  /** `<state>/sandboxes/<ns>/<id>`. */
  sandboxDir(namespace: string, id: string): string;
  /** The whole log of every run so far. */
  logText(): string;
  /** Last lines of the daemon log, for failure messages. */
  logTail(lines?: number): string;
  /**
   * Shuts down the tracked sandboxes, stops the daemon, kills every process of every sandbox
   * of this state dir and of the tracked namespaces, removes their cgroups and the temp dir.
   * Resolves with the pids it had to kill. Safe to call more than once.
   */
  teardown(): Promise<number[]>;
}

/** Creates the temp dir and starts tsbox; call `teardown()` in an after-hook. */
export async function startTsbox(label = 'tsbox-it', options: TsboxOptions = {}): Promise<TsboxDaemon> {
  const daemon = await createTsbox(label, options);
  try {
    await daemon.start();
  } catch (err) {
    await daemon.teardown();
    throw err;
  }
  return daemon;
}

/** Like {@link startTsbox}, without starting it. */
export async function createTsbox(label = 'tsbox-it', options: TsboxOptions = {}): Promise<TsboxDaemon> {
  if (!existsSync(tsboxMain)) throw new Error(`${tsboxMain} not found: run npm run build first`);
  const dir = await makeTempDir(`${label}-`);
  const socketPath = path.join(dir, 'tsbox.sock');
  const stateDir = path.join(dir, 'state');
  const logPath = path.join(dir, 'tsbox.log');
  await mkdir(stateDir, { recursive: true });
  const tracker = createProcessTracker(dir);
  const namespaces = new Set<string>();
  const sandboxes = new Map<string, { namespace: string; id: string }>();
  const pids = new Map<number, string>();
  let clients = new Map<string, SandboxClient>();
  const ownClients: SandboxClient[] = [];
  let current: ManagedProcess | undefined;
  let tornDown = false;

  const closeClients = (): void => {
    for (const client of clients.values()) client.close();
    clients = new Map();
  };
  const closeClientsOnExit = (): void => {
    if (options.closeClientsOnExit === true) closeClients();
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

  const daemon: TsboxDaemon = {
    dir,
    socketPath,
    stateDir,
    logPath,
    get pid() {
      return current !== undefined && current.exitInfo() === undefined ? current.pid : undefined;
    },
    serveArgs,
    async start(runOptions = {}) {
      if (tornDown) throw new Error('tsbox daemon was torn down');
      if (daemon.pid !== undefined) throw new Error('tsbox is already running');
      closeClients();
      const env: NodeJS.ProcessEnv = { ...process.env };
      delete env[CRASH_ENV];
      if (runOptions.crashAt !== undefined) env[CRASH_ENV] = runOptions.crashAt;
      current = await spawnLogged(process.execPath, serveArgs(), { logPath, env: tracker.env(env), cwd: dir });
      tracker.addLeader(current.pid);
      await waitForSocket(current, socketPath, { name: 'tsbox', logTail, timeoutMs: 20_000 });
    },
    async stop(graceMs = 10_000) {
      closeClientsOnExit();
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
      closeClientsOnExit();
      return exit;
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
      namespaces.add(namespace);
      if (id !== undefined) sandboxes.set(`${namespace}/${id}`, { namespace, id });
      if (pid !== undefined && pid > 0) {
        const startTime = processStartTime(pid);
        if (startTime !== undefined) pids.set(pid, startTime);
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
      const problems: string[] = [];
      const killed: number[] = [];
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
        killed.push(
          ...(await killSandboxLeftovers(stateDir, [...namespaces], pids).catch((err: unknown) => {
            problems.push(`kill: ${(err as Error).message}`);
            return [] as number[];
          })),
        );
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
      }
      return killed;
    },
  };
  return daemon;
}
