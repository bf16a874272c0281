import { existsSync } from 'node:fs';
import { mkdir, writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { setTimeout as delay } from 'node:timers/promises';
import type { Logger } from 'pino';
import type { Config } from './config/config.js';
import { type SandboxerHandler, findOnPath, findShim, readContainerdConfig, sandboxerHandlers, shimBinaryName } from './config/containerd-config.js';
import { TsboxError, isTsboxError, messageOf } from './base/errors.js';
import { CRASH_POINTS, Controller, type CrashPoint } from './controller/controller.js';
import { NO_POD_CONTAINERS, type RuntimeBackend } from './controller/types.js';
import { criPodContainers } from './containerd/cri-containers.js';
import { createMetrics, instrumentBackend, instrumentStore } from './metrics/metrics.js';
import { type MetricsServer, startMetricsServer } from './metrics/server.js';
import { EXIT, OperatorError } from './ops/exit-codes.js';
import { hostPlatform } from './runtime/platform.js';
import { detectCgroups } from './runtime/cgroups.js';
import { NoopBackend } from './runtime/noop-backend.js';
import { PodFiles, criDirs } from './runtime/pod-files.js';
import { ProcessBackend, type TaskRoute } from './runtime/process-backend.js';
import { type StateLock, StateDirInUseError, lockStateDir } from './runtime/state-lock.js';
import { SystemdScopes, connectSystemd, systemdIsInit } from './runtime/systemd.js';
import { MAX_SOCKET_PATH, longestPodSocket, stateLayout } from './state/layout.js';
import { FileRecordStore } from './state/record-store.js';
import { createServer } from './transport/server.js';
import { prepareSocketPath } from './transport/socket.js';
import { mountRootfs, unmountRootfs } from './tasks/rootfs.js';
import { HelperService } from './runtime/helper-service.js';
import { socketOwner } from './runtime/socket-owner.js';
import { containerCgroups, hasRecordedTasks, startTaskServer, taskDirs, tasksServedMark, type TaskServer } from './tasks/serve.js';
import { TASK_CRASH_POINTS, type TaskCrashPoint } from './tasks/tasks.js';
import { containerdTaskEvents } from './containerd/task-events.js';
import { RUNC_RUNTIME_TYPE, routeHandlers } from './config/task-routes.js';

/** A running daemon. */
export interface Daemon {
  /** Ordered shutdown: refuse calls, end Waits as UNAVAILABLE, drain, close; sandboxes keep running. */
  stop(): Promise<void>;
}

/** The runc the Task API route runs (on PATH), unless a handler's runc options name another. */
const RUNC = 'runc';

/**
 * The Task API route as the backend uses it: the handlers on it, and the task server's links
 * and tasks. A Shutdown's removal of the tasks a sandbox left is bounded (30 s; it never fails
 * the Shutdown), as is a lost pod's kill of its tasks; each bound's timer goes with the call (a
 * timer left armed per Shutdown would stay in the heap for its 30 s after every pod).
 */
function taskRoute(handlers: readonly string[], server: TaskServer, logger: Logger): TaskRoute & { recovered(): void } {
  const bounded = async (sandboxId: string, what: string, work: (signal: AbortSignal) => Promise<void>): Promise<void> => {
    const bound = new AbortController();
    const timer = setTimeout(() => bound.abort(new TsboxError('DeadlineExceeded', `the tasks of sandbox ${sandboxId} were not ${what} within 30 s`)), 30_000);
    try {
      await work(bound.signal);
    } finally {
      clearTimeout(timer);
    }
  };
  // The pods an earlier build's node-wide task front carries; once recovery is done and none is
  // left, that front is ended.
  const formerPods = new Set<string>();
  let recovered = false;
  const endFormerFront = (): void => {
    void server.endFormerFront().catch((err: unknown) => logger.warn({ err }, "cannot end an earlier build's task front"));
  };
  return {
    handlers,
    formerPod: (key, present) => {
      if (present) formerPods.add(key);
      else if (formerPods.delete(key) && formerPods.size === 0 && recovered) endFormerFront();
    },
    recovered: () => {
      recovered = true;
      if (formerPods.size === 0) endFormerFront();
    },
    attach: (pod) => server.links.attach(pod),
    detach: (key) => server.links.detach(key),
    release: (key) => server.links.release(key),
    killTasks: (ns, id) => bounded(id, 'ended', (signal) => server.tasks.killSandboxTasks(ns, id, signal)),
    removeTasks: (ns, id) => bounded(id, 'removed', (signal) => server.tasks.removeSandboxTasks(ns, id, signal)),
  };
}

async function createBackend(config: Config, logger: Logger, taskApi: TaskRoute | undefined, helper: HelperService): Promise<RuntimeBackend> {
  if (config.backend === 'noop') {
    logger.warn('backend "noop": sandboxes run no process (for benchmarks only)');
    return new NoopBackend();
  }
  const { manager, reason } = detectCgroups();
  if (manager === undefined) logger.warn({ reason }, 'no cgroups: Metrics will answer UNIMPLEMENTED');
  if (!config.namespaces) logger.warn('sandboxes run without their own namespaces (not root, or disabled)');
  const systemdLog = logger.child({ component: 'systemd' });
  const backend = new ProcessBackend({
    layout: stateLayout(config.stateDir),
    shimPath: config.shimPath,
    namespaces: config.namespaces,
    cgroups: manager,
    cgroupParent: config.cgroupParent,
    systemd: systemdIsInit() ? new SystemdScopes(() => connectSystemd(systemdLog), systemdLog) : undefined,
    podFiles: config.namespaces ? new PodFiles(criDirs(config.containerdRoot, config.containerdState), helper) : undefined,
    containerdAddress: config.containerdAddress,
    ...(taskApi === undefined ? {} : { taskApi }),
    startTimeoutMs: config.startTimeoutMs,
    starter: helper,
    killTimeoutMs: config.killTimeoutMs,
    logger: logger.child({ component: 'process-backend' }),
    pollIntervalMs: config.supervisorPollMs,
  });
  await backend.init();
  return backend;
}

/**
 * Which handlers' pods go over the Task API route (src/config/task-routes.ts), read from
 * containerd's config with task_api_handlers; the others run their containers in the shim their
 * runtime_type names (SPEC.md section 7): says so loudly at start-up when that cannot work.
 */
function resolveHandlerRoutes(config: Config, logger: Logger): readonly string[] {
  const runc = RUNC_RUNTIME_TYPE;
  let handlers: SandboxerHandler[] | undefined;
  if (!existsSync(config.containerdConfig)) {
    logger.warn({ file: config.containerdConfig }, "containerd's config is not there: the CRI handlers that use tsbox are not known (set containerd_config)");
  } else {
    try {
      handlers = sandboxerHandlers(readContainerdConfig(config.containerdConfig), 'tsbox');
    } catch (err) {
      logger.warn({ err }, `cannot read containerd's config to know the CRI handlers that use tsbox: ${messageOf(err)}`);
    }
  }
  let setting = config.taskApiHandlers;
  if (setting.includes('*') && process.getuid?.() !== 0) {
    // runc, rootfs mounts and containerd's state dir need root: a tsbox of another user keeps
    // every handler it is not told by name on the version-2 route.
    logger.info({ taskApiHandlers: setting }, "not root: task_api_handlers' * names no handler");
    setting = setting.filter((name) => name !== '*');
  } else if (handlers === undefined && setting.includes('*')) {
    logger.warn({ taskApiHandlers: setting }, "task_api_handlers' * names no handler while containerd's config is unknown: their pods keep the version-2 route");
    if (findShim(runc) === undefined) {
      logger.error({ runtimeType: runc, binary: shimBinaryName(runc) }, `${shimBinaryName(runc)} is not on PATH: pods on tsbox's version-2 route cannot run containers`);
    }
  }
  const routes = routeHandlers(setting, handlers);
  for (const { name, runtimeType } of routes.notRunc) {
    logger.warn({ handler: name, runtimeType }, `CRI runtime handler "${name}" has runtime_type "${runtimeType}" but is in task_api_handlers: tsbox runs its containers with runc`);
  }
  for (const name of routes.taskApi) logger.info({ handler: name, route: 'task-api' }, "CRI runtime handler uses tsbox; tsbox runs its pods' containers (Task API v3)");
  if (routes.taskApi.length > 0 && findOnPath(RUNC) === undefined) {
    logger.error({ handlers: routes.taskApi }, `${RUNC} is not on PATH: the containers of the pods on tsbox's Task API route cannot start (install runc; Debian: runc)`);
  }
  for (const { handler, why } of routes.version2) {
    const { name, runtimeType, shim, file } = handler;
    if (shim === undefined) {
      logger.error(
        { handler: name, runtimeType, file },
        `CRI runtime handler "${name}" puts pods on tsbox with runtime_type "${runtimeType}", which names no shim binary (${shimBinaryName(runtimeType || '?')} is not on PATH): its pods can run no container; set runtime_type = "${runc}"`,
      );
    } else {
      logger.info({ handler: name, route: 'version-2', runtimeType, shim, why }, 'CRI runtime handler uses tsbox; its containers run in its shim');
    }
  }
  return routes.taskApi;
}

/** Serves containerd's Task API v3 for the containers of pods on the Task API route. */
async function startTasks(config: Config, logger: Logger, helper: HelperService, crash: CrashHook | undefined): Promise<TaskServer> {
  const log = logger.child({ component: 'tasks' });
  // The tasks' directory below containerd's state dir is one tsbox's, as its state dir is.
  // containerd's state dir, when tsbox comes first, as containerd would make it (0711: not
  // 0700, which user-namespaced pods and a socket group need); tsbox's own part 0700.
  const { locked } = taskDirs(config.containerdState);
  await mkdir(config.containerdState, { recursive: true, mode: 0o711 });
  await mkdir(locked, { recursive: true, mode: 0o700 });
  const lock = await lockStateDir(locked, config.shimPath, logger.child({ component: 'state-lock' })).catch((err: unknown) => {
    if (!(err instanceof StateDirInUseError)) throw err;
    throw new OperatorError(EXIT.usage, err.message, `another tsbox serves tasks for the containerd whose state dir is ${config.containerdState}: stop it (pid ${err.holderPid ?? 'in the lock file'}), or give this tsbox another containerd`);
  });
  try {
    return await serveTasks(config, log, helper, lock, crash);
  } catch (err) {
    await lock.release();
    throw err;
  }
}

async function serveTasks(config: Config, log: Logger, helper: HelperService, lock: StateLock, crash: CrashHook | undefined): Promise<TaskServer> {
  await writeFile(tasksServedMark(config.stateDir), '', { mode: 0o600 });
  const { manager } = detectCgroups();
  const events = containerdTaskEvents(config.containerdAddress, log);
  const server = await startTaskServer({
    logger: log,
    stateDir: config.stateDir,
    containerdState: config.containerdState,
    holderPath: join(dirname(config.shimPath), 'tsbox-ctr'),
    holderStarter: helper,
    runcPath: RUNC,
    rootfs: { mount: (mounts, target, signal) => mountRootfs(helper, mounts, target, signal), unmount: (target, signal) => unmountRootfs(helper, target, signal, { helperOnlyWhenMounted: true }) },
    events,
    cgroups: manager === undefined ? undefined : containerCgroups(manager),
    crashPoint: crash,
  }).catch((err: unknown) => {
    events.close();
    throw err;
  });
  return {
    tasks: server.tasks,
    links: server.links,
    endFormerFront: () => server.endFormerFront(),
    async close(drainMs) {
      await server.close(drainMs);
      await Promise.race([events.drained(), delay(drainMs)]);
      events.close();
      await lock.release();
    },
  };
}

/** A named point of the controller's (sandboxes) or of the task table's (the Task API route). */
type CrashHook = (point: CrashPoint | TaskCrashPoint) => void;

/** The crash-test hook: dies with SIGKILL at the configured point; nothing when unset. */
function crashHook(crashAt: string, logger: Logger): CrashHook | undefined {
  if (crashAt === '') return undefined;
  const points: readonly string[] = [...CRASH_POINTS, ...TASK_CRASH_POINTS];
  if (!points.includes(crashAt)) {
    throw new Error(`TSBOX_CRASH_AT=${crashAt} is not one of: ${points.join(', ')}`);
  }
  logger.warn({ crashAt }, 'crash test: this daemon will kill itself at the named point');
  return (point) => {
    if (point === crashAt) process.kill(process.pid, 'SIGKILL');
  };
}

/**
 * Makes this daemon the only one on its state dir; another one there is a configuration
 * mistake (exit 2), whatever socket each was given.
 */
async function lockState(config: Config, logger: Logger): Promise<StateLock> {
  try {
    return await lockStateDir(config.stateDir, config.shimPath, logger.child({ component: 'state-lock' }));
  } catch (err) {
    if (!(err instanceof StateDirInUseError)) throw err;
    throw new OperatorError(EXIT.usage, err.message, `stop the tsbox with pid ${err.holderPid ?? '(see the lock file)'}, or give this one another --state-dir`);
  }
}

/**
 * Builds and starts tsbox: refuses a state dir another daemon holds and a socket another
 * server answers on, recovers every sandbox from the state dir, and only then accepts calls.
 */
export async function startDaemon(config: Config, logger: Logger): Promise<Daemon> {
  logger.info(
    { socket: config.socket, stateDir: config.stateDir, backend: config.backend, containerdConfig: config.containerdConfig, containerdRoot: config.containerdRoot, containerdState: config.containerdState, containerdAddress: config.containerdAddress },
    'tsbox starting',
  );
  await mkdir(config.stateDir, { recursive: true, mode: 0o700 });
  // Before anything else, so a second instance never touches the first one's sandboxes
  // or its socket.
  const lock = await lockState(config, logger);
  try {
    return await startLocked(config, logger, lock);
  } catch (err) {
    await lock.release();
    throw err;
  }
}

async function startLocked(config: Config, logger: Logger, lock: StateLock): Promise<Daemon> {
  // The crash tests' hook (TSBOX_CRASH_AT only), for the task table and the controller alike.
  const crash = crashHook(config.crashAt, logger);
  await prepareSocketPath(config.socket).catch(async (err: unknown) => {
    // In use: its owner is named (another tsbox, with its pid and state dir, as a rule).
    const owner = isTsboxError(err, 'FailedPrecondition') ? await socketOwner(config.socket, config.shimPath) : undefined;
    if (owner === undefined) throw err;
    const who = owner.stateDir === undefined ? `pid ${owner.pid} (${owner.command})` : `another tsbox, pid ${owner.pid}, state dir ${owner.stateDir}`;
    throw new OperatorError(EXIT.usage, `${config.socket} is served by ${who}`, `stop it, or give this tsbox another --socket`);
  });
  const taskApiHandlers = config.backend === 'process' ? resolveHandlerRoutes(config, logger) : [];
  if (config.taskSocket !== undefined) logger.warn({ taskSocket: config.taskSocket }, `task_socket is no longer used: each pod has a task socket of its own below ${join(config.stateDir, 's')}`);
  const longest = longestPodSocket(config.stateDir);
  if (taskApiHandlers.length > 0 && longest > MAX_SOCKET_PATH) {
    throw new OperatorError(EXIT.usage, `the pods' task sockets below ${config.stateDir} would be ${longest} bytes long, more than a unix socket's ${MAX_SOCKET_PATH}`, 'give tsbox a shorter --state-dir');
  }
  // Metrics are kept only when an endpoint serves them; otherwise no call or record save
  // pays for them. Before recovery, so /healthz answers and /readyz says 503 while tsbox
  // recovers.
  const metrics = config.metricsAddress !== '' ? createMetrics() : undefined;
  let metricsServer: MetricsServer | undefined;
  if (metrics !== undefined) metricsServer = await startMetricsServer(config.metricsAddress, metrics, logger);
  // mount(2) and umount(2) for pods and tasks, without a process started from tsbox for each.
  const helper = new HelperService(config.shimPath, logger.child({ component: 'mount-helper' }));
  // Running from the start, not from the first request: what tsbox holds for them (three
  // descriptors each) is then the same whatever came before, a restart included.
  helper.start();
  // The Task API v3 server, when a handler uses it or tasks of an earlier run are recorded:
  // its tasks recovered before the sandboxes, whose recovery links each pod's process to it.
  const taskServer = config.backend === 'process' && (taskApiHandlers.length > 0 || (await hasRecordedTasks(config.stateDir, config.containerdState)))
    ? await startTasks(config, logger, helper, crash)
    : undefined;
  const route = taskServer === undefined ? undefined : taskRoute(taskApiHandlers, taskServer, logger.child({ component: 'tasks' }));
  const rawBackend = await createBackend(config, logger, route, helper);
  const backend = metrics !== undefined ? instrumentBackend(rawBackend, metrics) : rawBackend;
  // Records: one file per sandbox, written atomically and fsynced before the RPC that
  // changed it is answered.
  const store = new FileRecordStore(stateLayout(config.stateDir), logger.child({ component: 'state' }));
  // CRI's view of a pod's containers, which a Stop waits to settle; a noop backend runs no pod.
  const podContainers = config.backend === 'process' ? criPodContainers(config.containerdAddress, { logger: logger.child({ component: 'cri' }) }) : NO_POD_CONTAINERS;
  const controller = new Controller({
    crashPoint: crash,
    backend,
    store: metrics !== undefined ? instrumentStore(store, metrics) : store,
    logger: logger.child({ component: 'controller' }),
    platform: hostPlatform(),
    stateDir: config.stateDir,
    podContainers,
  });
  const summary = await controller.recover(config.recoveryConcurrency);
  route?.recovered();
  metrics?.recoveryDone(summary);
  logger.info(summary, 'recovery done');
  const server = createServer({
    controller,
    logger,
    socketPath: config.socket,
    socketMode: config.socketMode,
    ...(metrics !== undefined && { rpcDone: (method: string, code: number, seconds: number) => metrics.rpcDone(method, code, seconds) }),
  });
  try {
    await server.listen();
  } catch (err) {
    await taskServer?.close(0);
    controller.close();
    await helper.close();
    podContainers.close();
    await store.close();
    await metricsServer?.close();
    throw err;
  }
  metrics?.setReady(true);
  // Recovery is done and the socket is bound: the health service says SERVING from now on.
  server.setServing(true);
  return {
    async stop() {
      metrics?.setReady(false);
      await server.close(config.shutdownDrainMs);
      await taskServer?.close(config.shutdownDrainMs);
      controller.close();
      await helper.close();
      podContainers.close();
      await store.close();
      await metricsServer?.close();
      await lock.release();
      logger.info('tsbox stopped; sandboxes keep running');
    },
  };
}
