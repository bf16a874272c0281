import { spawn } from 'node:child_process';
import { open, readdir } from 'node:fs/promises';
import { connect, type Socket } from 'node:net';
import { join } from 'node:path';
import { setTimeout as delay } from 'node:timers/promises';
import type { Logger } from 'pino';
import { TsboxError, errnoOf, isGone, readIfPresentNow, withPath } from '../errors.js';
import type { CgroupManager } from '../runtime/cgroups.js';
import type { HelperService } from '../runtime/helper-service.js';
import { TtrpcServer } from '../ttrpc/server.js';
import { registerTaskService } from './task-service.js';
import { TaskTable, type ContainerCgroups, type RootfsMounter, type TaskEvents } from './tasks.js';

/**
 * Where the task server keeps its tasks' records and holders' files, and runc its state: below
 * containerd's state dir (`tsbox/`), as containerd's runc shim keeps its bundles and runc's
 * root below /run/containerd. None of it outlives the containers, which a reboot ends; on a
 * node that state dir is a tmpfs, so runc's O_SYNC pid file, its state.json and the holders'
 * files cost no journal commit. `locked`: the directory whose lock makes it one tsbox's.
 */
export function taskDirs(containerdState: string): { tasks: string; runcRoot: string; locked: string } {
  const base = join(containerdState, 'tsbox');
  return { tasks: join(base, 'tasks'), runcRoot: join(base, 'runc'), locked: base };
}

/** Where tsbox kept them before, below its own state dir: tasks found there are served from there until deleted. */
export function formerTaskDirs(stateDir: string): { dir: string; runcRoot: string } {
  return { dir: join(stateDir, 'tasks'), runcRoot: join(stateDir, 'runc') };
}

/**
 * In tsbox's state dir once it has served tasks: the tasks below containerd's state dir are then
 * its own to look for. Another tsbox of the node (a state dir of its own, no task handlers) does
 * not take them for its own, nor fail on that directory's lock.
 */
export function tasksServedMark(stateDir: string): string {
  return join(stateDir, 'tasks-served');
}

/** True when this tsbox's tasks from an earlier run are recorded: they must be served even if no handler asks any more. */
export async function hasRecordedTasks(stateDir: string, containerdState: string): Promise<boolean> {
  const served = (await readIfPresentNow(tasksServedMark(stateDir))) !== undefined;
  for (const dir of served ? [formerTaskDirs(stateDir).dir, taskDirs(containerdState).tasks] : [formerTaskDirs(stateDir).dir]) {
    try {
      if ((await readdir(dir)).length > 0) return true;
    } catch (err) {
      if (!isGone(err)) throw withPath(err, dir, 'list');
    }
  }
  return false;
}

/**
 * A container's cgroup as runc made it, read from its init's /proc/PID/cgroup (the path below
 * the hierarchy's root, as the manager takes it): on v2 the unified line, on v1 the memory
 * controller's.
 */
export function containerCgroups(manager: CgroupManager): ContainerCgroups {
  return {
    async locate(pid) {
      const text = await readIfPresentNow(`/proc/${pid}/cgroup`);
      if (text === undefined) return undefined;
      for (const line of text.split('\n')) {
        const [, controllers, path] = /^\d+:([^:]*):(.*)$/.exec(line) ?? [];
        if (path === undefined) continue;
        if (manager.version === 2 ? controllers === '' : (controllers ?? '').split(',').includes('memory')) return path;
      }
      return undefined;
    },
    oomKills: (cgroup) => manager.oomKills(cgroup),
    oomFile: (cgroup) => manager.oomFile(cgroup),
    stats: (cgroup) => manager.metrics(cgroup),
    kill: (cgroup, bound) => manager.kill(cgroup, bound),
    killHierarchy: manager.killHierarchy,
  };
}

export interface TaskServerOptions {
  readonly logger: Logger;
  readonly socket: string;
  readonly stateDir: string;
  /** containerd's state dir: the tasks' files go below it (taskDirs). */
  readonly containerdState: string;
  readonly holderPath: string;
  /** The task front's program (native/tsbox-front.c), started when none answers. */
  readonly frontPath: string;
  /** Starts holders without a fork of tsbox when one of its processes is free. */
  readonly holderStarter?: HelperService;
  readonly runcPath: string;
  readonly rootfs: RootfsMounter;
  readonly events: TaskEvents;
  readonly cgroups: ContainerCgroups | undefined;
}

/** The running Task API v3 server. */
export interface TaskServer {
  readonly tasks: TaskTable;
  close(drainMs: number): Promise<void>;
}

/** The front's files below tsbox's state dir: its backend socket, pid and log. */
export function frontFiles(stateDir: string): { backend: string; pid: string; log: string } {
  return { backend: join(stateDir, 'task-front.sock'), pid: join(stateDir, 'task-front.pid'), log: join(stateDir, 'task-front.log') };
}

const FRONT_START_MS = 10_000;

/** A connection to the front's backend socket; undefined when no front answers there. */
function dialFront(path: string): Promise<Socket | undefined> {
  return new Promise((resolve, reject) => {
    const socket = connect(path);
    socket.once('connect', () => {
      socket.removeAllListeners('error');
      resolve(socket);
    });
    socket.once('error', (err) => {
      const code = errnoOf(err);
      if (code === 'ENOENT' || code === 'ECONNREFUSED') resolve(undefined);
      else reject(withPath(err, path, 'connect to'));
    });
  });
}

/**
 * A connection to the task front, started first when none answers: the front owns the Task API
 * socket and containerd's connections, and outlives tsbox (native/tsbox-front.c).
 */
async function reachFront(frontPath: string, socket: string, stateDir: string, logger: Logger): Promise<Socket> {
  const files = frontFiles(stateDir);
  const found = await dialFront(files.backend);
  if (found !== undefined) return found;
  const log = await open(files.log, 'a', 0o600);
  try {
    const child = spawn(frontPath, ['--listen', socket, '--backend', files.backend, '--pid-file', files.pid, '--log-file', files.log], {
      detached: true,
      stdio: ['ignore', log.fd, log.fd],
    });
    // A program that cannot run (missing, not executable) fails the dial below, with its reason here.
    child.once('error', (err) => logger.error({ err, path: frontPath }, 'cannot start the task front'));
    child.unref();
    logger.info({ pid: child.pid, socket, log: files.log }, 'task front started');
  } finally {
    await log.close();
  }
  const until = Date.now() + FRONT_START_MS;
  while (Date.now() < until) {
    const dialled = await dialFront(files.backend);
    if (dialled !== undefined) return dialled;
    await delay(50);
  }
  throw new TsboxError('Unavailable', `the task front did not answer on ${files.backend} within ${FRONT_START_MS} ms (its log: ${files.log})`);
}

/**
 * Recovers the recorded tasks, then serves the Task API through the task front, which owns
 * the socket (mode 0600: containerd runs as root), starting the front when none runs. Called
 * before the sandbox socket is bound, so that a containerd started meanwhile finds the task
 * socket listening when it loads its tasks. A front that goes away is started again.
 */
export async function startTaskServer(options: TaskServerOptions): Promise<TaskServer> {
  const dirs = taskDirs(options.containerdState);
  const tasks = new TaskTable({
    logger: options.logger,
    dir: dirs.tasks,
    runcRoot: dirs.runcRoot,
    formerDirs: formerTaskDirs(options.stateDir),
    runcPath: options.runcPath,
    holderPath: options.holderPath,
    ...(options.holderStarter === undefined ? {} : { holderStarter: options.holderStarter }),
    rootfs: options.rootfs,
    events: options.events,
    cgroups: options.cgroups,
  });
  await tasks.recover();
  const server = new TtrpcServer({ logger: options.logger });
  registerTaskService(server, tasks);
  let closing = false;
  const serve = (socket: Socket): void => {
    void server.serveConnection(socket).then(async () => {
      // The front went away (it was killed): start another, so that new tasks are served.
      while (!closing) {
        options.logger.warn('the connection to the task front closed: reaching it again');
        try {
          serve(await reachFront(options.frontPath, options.socket, options.stateDir, options.logger));
          return;
        } catch (err) {
          options.logger.error({ err }, 'cannot reach the task front');
          await delay(1000);
        }
      }
    });
  };
  serve(await reachFront(options.frontPath, options.socket, options.stateDir, options.logger));
  return {
    tasks,
    close: async (drainMs) => {
      closing = true;
      tasks.close();
      await server.close(drainMs);
    },
  };
}
