import { mkdir } from 'node:fs/promises';
import type { Logger } from 'pino';
import type { Config } from './config.js';
import { CRASH_POINTS, Controller, type CrashPoint } from './controller/controller.js';
import type { RuntimeBackend } from './controller/types.js';
import { hostPlatform } from './platform.js';
import { detectCgroups } from './runtime/cgroups.js';
import { NoopBackend } from './runtime/noop-backend.js';
import { ProcessBackend } from './runtime/process-backend.js';
import { JournaledRecordStore } from './state/journaled-store.js';
import { stateLayout } from './state/layout.js';
import { createServer } from './transport/server.js';
import { prepareSocketPath } from './transport/socket.js';

/** A running daemon. */
export interface Daemon {
  /** Ordered shutdown: refuse calls, end Waits as UNAVAILABLE, drain, close; sandboxes keep running. */
  stop(): Promise<void>;
}

async function createBackend(config: Config, logger: Logger): Promise<RuntimeBackend> {
  if (config.backend === 'noop') {
    logger.warn('backend "noop": sandboxes run no process (for benchmarks only)');
    return new NoopBackend();
  }
  const { manager, reason } = detectCgroups(config.cgroupParent);
  if (manager === undefined) logger.warn({ reason }, 'no cgroups: Metrics will answer UNIMPLEMENTED');
  if (!config.namespaces) logger.warn('sandboxes run without their own namespaces (not root, or disabled)');
  const backend = new ProcessBackend({
    layout: stateLayout(config.stateDir),
    shimPath: config.shimPath,
    namespaces: config.namespaces,
    cgroups: manager,
    logger: logger.child({ component: 'process-backend' }),
    pollIntervalMs: config.supervisorPollMs,
  });
  await backend.init();
  return backend;
}

/** The crash-test hook: dies with SIGKILL at the configured point; nothing when unset. */
function crashHook(crashAt: string, logger: Logger): ((point: CrashPoint) => void) | undefined {
  if (crashAt === '') return undefined;
  if (!CRASH_POINTS.includes(crashAt as CrashPoint)) {
    throw new Error(`TSBOX_CRASH_AT=${crashAt} is not one of: ${CRASH_POINTS.join(', ')}`);
  }
  logger.warn({ crashAt }, 'crash test: this daemon will kill itself at the named point');
  return (point) => {
    if (point === crashAt) process.kill(process.pid, 'SIGKILL');
  };
}

/**
 * Builds and starts tsbox: refuses a socket another server answers on, recovers every
 * sandbox from the state dir, and only then accepts calls.
 */
export async function startDaemon(config: Config, logger: Logger): Promise<Daemon> {
  logger.info({ socket: config.socket, stateDir: config.stateDir, backend: config.backend }, 'tsbox starting');
  // Before recovery, so a second instance never touches the first one's sandboxes.
  await prepareSocketPath(config.socket);
  await mkdir(config.stateDir, { recursive: true, mode: 0o700 });
  const backend = await createBackend(config, logger);
  // Records: every change is group-committed to a journal (one fdatasync for all the
  // changes that arrive during the previous one) before the RPC is answered; record files
  // are written and fsynced at checkpoints, so a short-lived sandbox costs no file at all.
  const store = new JournaledRecordStore(stateLayout(config.stateDir), logger.child({ component: 'state' }));
  const controller = new Controller({
    crashPoint: crashHook(config.crashAt, logger),
    backend,
    store,
    logger: logger.child({ component: 'controller' }),
    platform: hostPlatform(),
    stateDir: config.stateDir,
  });
  const summary = await controller.recover(config.recoveryConcurrency);
  logger.info(summary, 'recovery done');
  const server = createServer({ controller, logger, socketPath: config.socket, socketMode: config.socketMode });
  try {
    await server.listen();
  } catch (err) {
    controller.close();
    await store.close();
    throw err;
  }
  // Recovery is done and the socket is bound: the health service says SERVING from now on.
  server.setServing(true);
  return {
    async stop() {
      await server.close(config.shutdownDrainMs);
      controller.close();
      await store.close();
      logger.info('tsbox stopped; sandboxes keep running');
    },
  };
}
