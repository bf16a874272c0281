/**
 * The one daemon harness of the tests and the benchmark: runs a sandboxer as a real process,
 * exactly as a user does (tsbox: `node dist/src/main.js serve --socket <tmp>/sandboxer.sock
 * --state-dir <tmp>/state --log-level debug`; or sbbench's goref, or any command), in a
 * private temp dir with its socket, state dir and log. Start it (optionally with a crash point
 * armed through TSBOX_CRASH_AT), wait for its socket, stop it with SIGTERM then SIGKILL, crash
 * it with SIGKILL, restart it on the same socket and state dir, run one-shot commands that are
 * expected to exit, read its log, and tear everything down even after a failure: tracked
 * sandboxes are shut down through the API, then whatever is left of them (supervisors, sandbox
 * processes, cgroups, mounts) is killed and removed with the temp dir.
 *
 * The process toolkit it is built on (processes.ts) is re-exported for the tests.
 */
import { spawn } from 'node:child_process';
import { existsSync, readFileSync, rmdirSync } from 'node:fs';
import { mkdir } from 'node:fs/promises';
import path from 'node:path';
import { repoRoot } from './containerd-clients.js';
import { DAEMON_NODE_FLAGS } from '../../src/base/node-flags.js';
import { SandboxClient } from './grpc-client.js';
import { cgroupDirsOfNamespace, killSandboxLeftovers, processStartTime } from './host.js';
import {
  type ExitInfo,
  type ManagedProcess,
  createProcessTracker,
  makeTempDir,
  removeTree,
  signalPid,
  spawnLogged,
  stopProcess,
  tailFile,
  waitForSocket,
} from './processes.js';

export * from './processes.js';

/** The environment variable that arms a crash point (read once by src/config/config.ts). */
export const CRASH_ENV = 'TSBOX_CRASH_AT';

/** Path of the built tsbox entry point. */
export const tsboxMain = path.join(repoRoot, 'dist', 'src', 'main.js');

/** Path of the built sandbox supervisor (also tsbox's state dir lock helper). */
export const tsboxShim = path.join(repoRoot, 'dist', 'bin', 'tsbox-shim');

// ---------------------------------------------------------------------------------------------
// What runs

/** The command that runs a sandboxer on a socket path with a state dir. */
export type SandboxerCommand = (paths: { socketPath: string; stateDir: string }) => {
  file: string;
  args: string[];
  env?: NodeJS.ProcessEnv;
};

/** A sandboxer implementation the harness can run. */
export interface SandboxerSpec {
  /** For messages and temp dir names. */
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

/** Options of {@link tsboxSandboxer}. */
export interface TsboxSpecOptions {
  /** The entry point; default the built one. */
  readonly main?: string;
  /** Default `debug`. */
  readonly logLevel?: string;
  /** More flags for `serve`, such as `['--backend', 'noop']`. */
  readonly args?: readonly string[];
  /**
   * Leave the routes of pods' containers to tsbox's defaults (task_api_handlers `*`, read from
   * containerd's config). Otherwise every handler keeps the version-2 route
   * (`--task-api-handlers ''`), so a test tsbox never reads the machine's containerd handlers
   * into a Task API server below the machine's containerd state dir.
   */
  readonly defaultRoutes?: boolean;
}

/** tsbox itself: `node FLAGS dist/src/main.js serve --socket S --state-dir D --log-level debug` (FLAGS: DAEMON_NODE_FLAGS). */
export function tsboxSandboxer(options: TsboxSpecOptions = {}): SandboxerSpec {
  const main = options.main ?? tsboxMain;
  return {
    name: 'tsbox',
    runsProcesses: true,
    stopExitStatus: 137,
    command: ({ socketPath, stateDir }) => {
      if (!existsSync(main)) throw new Error(`${main} not found: build tsbox first (npm run build)`);
      return {
        file: process.execPath,
        args: [
          ...DAEMON_NODE_FLAGS,
          main,
          'serve',
          '--socket',
          socketPath,
          '--state-dir',
          stateDir,
          '--log-level',
          options.logLevel ?? 'debug',
          ...(options.defaultRoutes === true ? [] : ['--task-api-handlers', '']),
          ...(options.args ?? []),
        ],
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

/** Options of a daemon for all its runs. */
export interface SandboxerDaemonOptions {
  /** Prefix of the temp dir; default `<name>-`. */
  readonly label?: string;
  /**
   * How long start() waits for the socket (a daemon that exits fails it at once). Default 60 s:
   * on the user-mode Linux node, with the other node busy beside it, Node alone once took 18 s
   * to load tsbox before its first log line.
   */
  readonly startTimeoutMs?: number;
  /** How often start() checks the socket. Default 50 ms; the benchmark times start-up finer. */
  readonly startPollMs?: number;
  /** SIGTERM to SIGKILL in stop() and teardown(). Default 10 s. */
  readonly stopGraceMs?: number;
  /**
   * Closes the clients of a run as soon as it is stopped or killed, not only at the next
   * start: calls in flight then fail at once (the crash tests).
   */
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

/** A sandboxer daemon with a private temp dir, socket, state dir and log. */
export interface SandboxerDaemon {
  readonly spec: SandboxerSpec;
  /** Private temp dir holding everything below. */
  readonly dir: string;
  readonly socketPath: string;
  readonly stateDir: string;
  /** stdout and stderr of every run, appended. */
  readonly logPath: string;
  /** Pid of the current run, undefined while it is not running. */
  readonly pid: number | undefined;
  /** The arguments after the program (for tsbox: after `node`) that start this daemon. */
  serveArgs(): string[];
  /** Starts the daemon (again) and waits until its socket accepts connections. */
  start(options?: RunOptions): Promise<void>;
  /** SIGTERM to the daemon; SIGKILL to its process group after `graceMs`. */
  stop(options?: { graceMs?: number }): Promise<ExitInfo & { graceful: boolean }>;
  /** stop() then start() on the same socket and state dir. */
  restart(): Promise<void>;
  /** SIGKILL to the daemon process only: a crash, which leaves its socket file and sandboxes behind. */
  kill9(): Promise<ExitInfo>;
  /** Resolves when the current run exits. */
  exited(): Promise<ExitInfo>;
  /**
   * A client for `namespace` that always calls the current run, each run on a fresh channel
   * (so no reconnect backoff of an earlier run delays the first calls).
   */
  client(namespace: string): TsboxClient;
  /** A client of its own on the current socket, closed at teardown. */
  newClient(namespace: string): SandboxClient;
  /**
   * Remembers a namespace (its cgroups are removed at teardown), a sandbox of it (shut down
   * through the API at teardown) and, once known, a pid (killed at teardown).
   */
  track(namespace: string, id?: string, pid?: number): void;
  /** Runs `node ...args` to its exit (killed after `timeoutMs`). */
  run(args: readonly string[], timeoutMs?: number): Promise<CommandResult>;
  /** `<state>/sandboxes/<ns>/<id>`. */
  sandboxDir(namespace: string, id: string): string;
  /** The whole log of every run so far. */
  logText(): string;
  /** Last lines of the log, for failure messages. */
  logTail(lines?: number): string;
  /**
   * Shuts down the tracked sandboxes, stops the daemon, kills whatever is left of what it
   * started (sandbox processes included), removes their cgroups, unmounts and removes the
   * temp dir (kept when `TSBOX_KEEP=1`). Resolves with the pids it had to kill. Safe to call
   * more than once.
   */
  teardown(): Promise<number[]>;
}

/** tsbox through the harness; the name the integration tests use. */
export type TsboxDaemon = SandboxerDaemon;

/** Creates the temp dir and starts the sandboxer; call `teardown()` in an after-hook. */
export async function startSandboxerDaemon(spec: SandboxerSpec, options: SandboxerDaemonOptions = {}): Promise<SandboxerDaemon> {
  const daemon = await createSandboxerDaemon(spec, options);
  try {
    await daemon.start();
  } catch (err) {
    await daemon.teardown();
    throw err;
  }
  return daemon;
}

/** tsbox with the default flags, started; call `teardown()` in an after-hook. */
export function startTsbox(label = 'tsbox-it', options: SandboxerDaemonOptions = {}): Promise<TsboxDaemon> {
  return startSandboxerDaemon(tsboxSandboxer(), { label: `${label}-`, ...options });
}

/** Like {@link startTsbox}, without starting it. */
export function createTsbox(label = 'tsbox-it', options: SandboxerDaemonOptions = {}): Promise<TsboxDaemon> {
  return createSandboxerDaemon(tsboxSandboxer(), { label: `${label}-`, ...options });
}

/** Whether teardown keeps the temp dir (for a look after a failure). */
const keepTempDirs = (): boolean =>
  process.env['TSBOX_KEEP'] === '1' || process.env['TSBOX_E2E_KEEP'] === '1' || process.env['TSBOX_IT_KEEP'] === '1';

/** Like {@link startSandboxerDaemon}, without starting it. */
export async function createSandboxerDaemon(spec: SandboxerSpec, options: SandboxerDaemonOptions = {}): Promise<SandboxerDaemon> {
  const dir = await makeTempDir(options.label ?? `${spec.name}-`);
  const socketPath = path.join(dir, 'sandboxer.sock');
  const stateDir = path.join(dir, 'state');
  const logPath = path.join(dir, 'sandboxer.log');
  await mkdir(stateDir, { recursive: true });
  const stopGraceMs = options.stopGraceMs ?? 10_000;
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
  /** The current run's channel for `namespace`. */
  const channel = (namespace: string): SandboxClient => {
    let client = clients.get(namespace);
    if (client === undefined) {
      client = new SandboxClient(socketPath, namespace);
      clients.set(namespace, client);
    }
    return client;
  };
  const logTail = (lines = 40): string => `--- ${spec.name} log (${logPath}) ---\n${tailFile(logPath, lines)}`;

  const daemon: SandboxerDaemon = {
    spec,
    dir,
    socketPath,
    stateDir,
    logPath,
    get pid() {
      return current !== undefined && current.exitInfo() === undefined ? current.pid : undefined;
    },
    serveArgs: () => spec.command({ socketPath, stateDir }).args,
    async start(runOptions = {}) {
      if (tornDown) throw new Error(`${spec.name} daemon was torn down`);
      if (daemon.pid !== undefined) throw new Error(`${spec.name} is already running`);
      closeClients();
      const cmd = spec.command({ socketPath, stateDir });
      const env: NodeJS.ProcessEnv = { ...process.env, ...cmd.env };
      delete env[CRASH_ENV];
      if (runOptions.crashAt !== undefined) env[CRASH_ENV] = runOptions.crashAt;
      current = await spawnLogged(cmd.file, cmd.args, { logPath, env: tracker.env(env), cwd: dir });
      tracker.addLeader(current.pid);
      await waitForSocket(current, socketPath, {
        name: spec.name,
        logTail,
        timeoutMs: options.startTimeoutMs ?? 60_000,
        ...(options.startPollMs === undefined ? {} : { intervalMs: options.startPollMs }),
      });
    },
    async stop(stopOptions = {}) {
      closeClientsOnExit();
      if (current === undefined) return { code: null, signal: null, graceful: true };
      tracker.snapshot();
      return stopProcess(current, { graceMs: stopOptions.graceMs ?? stopGraceMs });
    },
    async restart() {
      await daemon.stop();
      await daemon.start();
    },
    async kill9() {
      if (current === undefined) throw new Error(`${spec.name} was never started`);
      tracker.snapshot();
      signalPid(current.pid, 'SIGKILL');
      const exit = await current.exited;
      closeClientsOnExit();
      return exit;
    },
    exited() {
      if (current === undefined) throw new Error(`${spec.name} was never started`);
      return current.exited;
    },
    client(namespace) {
      return {
        namespace,
        create: (request, callOptions) => channel(namespace).create(request, callOptions),
        start: (request, callOptions) => channel(namespace).start(request, callOptions),
        platform: (request, callOptions) => channel(namespace).platform(request, callOptions),
        stop: (request, callOptions) => channel(namespace).stop(request, callOptions),
        wait: (request, callOptions) => channel(namespace).wait(request, callOptions),
        status: (request, callOptions) => channel(namespace).status(request, callOptions),
        shutdown: (request, callOptions) => channel(namespace).shutdown(request, callOptions),
        metrics: (request, callOptions) => channel(namespace).metrics(request, callOptions),
        update: (request, callOptions) => channel(namespace).update(request, callOptions),
      };
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
          if (child.pid !== undefined) signalPid(-child.pid, 'SIGKILL');
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
        // Nothing was logged yet: the file is made by the first start.
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
            await channel(namespace)
              .shutdown({ sandboxId: id }, { timeoutMs: 10_000 })
              .catch((err: unknown) => problems.push(`shutdown ${namespace}/${id}: ${(err as Error).message}`));
          }
        }
      } finally {
        closeClients();
        for (const client of ownClients) client.close();
        await daemon.stop({ graceMs: stopGraceMs }).catch((err: unknown) => problems.push(`stop: ${(err as Error).message}`));
        if (spec.runsProcesses) {
          killed.push(
            ...(await killSandboxLeftovers(stateDir, [...namespaces], pids).catch((err: unknown) => {
              problems.push(`kill: ${(err as Error).message}`);
              return [] as number[];
            })),
          );
        }
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
        if (!keepTempDirs()) await removeTree(dir);
        if (killed.length > 0) process.stderr.write(`# ${spec.name} teardown: killed leftover processes ${killed.join(', ')}\n`);
        if (problems.length > 0) process.stderr.write(`# ${spec.name} teardown: ${problems.join('; ')}\n`);
      }
      return killed;
    },
  };
  return daemon;
}
