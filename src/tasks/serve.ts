import { readdir, rm } from 'node:fs/promises';
import { join } from 'node:path';
import { setTimeout as delay } from 'node:timers/promises';
import type { Logger } from 'pino';
import { isGone, readIfPresent, readIfPresentNow, withPath } from '../base/errors.js';
import { signalProcess } from '../runtime/proc.js';
import type { CgroupManager } from '../runtime/cgroups.js';
import type { HelperService } from '../runtime/helper-service.js';
import { TtrpcServer } from '../ttrpc/server.js';
import { PodLinks, dialUnix, podRequests } from './pod-links.js';
import { registerTaskService } from './task-service.js';
import { TaskTable, type ContainerCgroups, type RootfsMounter, type TaskCrashPoint, type TaskEvents } from './tasks.js';

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
  readonly stateDir: string;
  /** containerd's state dir: the tasks' files go below it (taskDirs). */
  readonly containerdState: string;
  readonly holderPath: string;
  /** Starts holders without a fork of tsbox when one of its processes is free. */
  readonly holderStarter?: HelperService;
  readonly runcPath: string;
  readonly rootfs: RootfsMounter;
  readonly events: TaskEvents;
  readonly cgroups: ContainerCgroups | undefined;
  /** The crash tests' hook (TSBOX_CRASH_AT); none in normal use. */
  readonly crashPoint?: ((point: TaskCrashPoint) => void) | undefined;
}

/** The running Task API v3 server. */
export interface TaskServer {
  readonly tasks: TaskTable;
  /** The links to the pods' processes, which relay containerd's calls to the task service. */
  readonly links: PodLinks;
  /**
   * No pod of an earlier build's node-wide task front is left: that front, if it still runs,
   * is ended (SIGTERM), so that nothing of tsbox stays on the node once its pods are gone.
   */
  endFormerFront(): Promise<void>;
  close(drainMs: number): Promise<void>;
}

/** The node-wide task front of earlier builds: its backend socket and pid file below tsbox's state dir. */
export function formerFrontFiles(stateDir: string): { socket: string; pid: string } {
  return { socket: join(stateDir, 'task-front.sock'), pid: join(stateDir, 'task-front.pid') };
}

/**
 * Serves the pods an earlier build started through its node-wide task front, while that front
 * still runs: it holds containerd's connections to those pods' tasks. None is ever started; once
 * it is gone (or was never there) this does nothing.
 */
async function serveFormerFront(server: TtrpcServer, stateDir: string, logger: Logger, closing: () => boolean): Promise<void> {
  const path = formerFrontFiles(stateDir).socket;
  const socket = await dialUnix(path).catch((err: unknown) => {
    logger.warn({ err }, "cannot reach an earlier build's task front");
    return undefined;
  });
  if (socket === undefined) return;
  logger.info({ backend: path }, "serving the pods of an earlier build's task front");
  await server.serveConnection(socket, podRequests(() => undefined));
  if (closing()) return;
  await delay(1000);
  if (!closing()) await serveFormerFront(server, stateDir, logger, closing);
}

/**
 * Recovers the recorded tasks and makes the task service, which each pod's process reaches
 * through its link (PodLinks: the caller attaches each pod as its sandbox starts or is
 * recovered). Called before the sandboxes are recovered, so that a pod's process is served as
 * soon as its sandbox is.
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
    crashPoint: options.crashPoint,
  });
  await tasks.recover();
  const server = new TtrpcServer({ logger: options.logger });
  registerTaskService(server, tasks);
  const links = new PodLinks({ logger: options.logger, server });
  let closing = false;
  let formerDone = false;
  void serveFormerFront(server, options.stateDir, options.logger, () => closing || formerDone);
  return {
    tasks,
    links,
    endFormerFront: async () => {
      formerDone = true;
      const files = formerFrontFiles(options.stateDir);
      const pid = Number((await readIfPresentNow(files.pid))?.trim() ?? '0');
      // Only the front of this state dir: its command line names its backend socket.
      const cmdline = pid > 0 ? await readIfPresent(`/proc/${pid}/cmdline`) : undefined;
      if (cmdline !== undefined && cmdline.split('\0').includes(files.socket)) {
        options.logger.info({ pid }, "no pod of an earlier build's task front is left: ending that front");
        signalProcess(pid, 'SIGTERM');
      }
      await rm(files.pid, { force: true });
    },
    close: async (drainMs) => {
      closing = true;
      links.close();
      tasks.close();
      await server.close(drainMs);
    },
  };
}
