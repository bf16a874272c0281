import { readdir } from 'node:fs/promises';
import { join } from 'node:path';
import type { Logger } from 'pino';
import { isGone, readIfPresent, withPath } from '../errors.js';
import type { CgroupManager } from '../runtime/cgroups.js';
import { TtrpcServer } from '../ttrpc/server.js';
import { registerTaskService } from './task-service.js';
import { TaskTable, type ContainerCgroups, type RootfsMounter, type TaskEvents } from './tasks.js';

/** Where the task server keeps its records and runc its state, below tsbox's state dir. */
export function taskDirs(stateDir: string): { tasks: string; runcRoot: string } {
  return { tasks: join(stateDir, 'tasks'), runcRoot: join(stateDir, 'runc') };
}

/** True when tasks from an earlier run are recorded: they must be served even if no handler asks any more. */
export async function hasRecordedTasks(stateDir: string): Promise<boolean> {
  const dir = taskDirs(stateDir).tasks;
  try {
    return (await readdir(dir)).length > 0;
  } catch (err) {
    if (isGone(err)) return false;
    throw withPath(err, dir, 'list');
  }
}

/**
 * A container's cgroup as runc made it, read from its init's /proc/PID/cgroup (the path below
 * the hierarchy's root, as the manager takes it): on v2 the unified line, on v1 the memory
 * controller's.
 */
export function containerCgroups(manager: CgroupManager): ContainerCgroups {
  return {
    async locate(pid) {
      const text = await readIfPresent(`/proc/${pid}/cgroup`);
      if (text === undefined) return undefined;
      for (const line of text.split('\n')) {
        const [, controllers, path] = /^\d+:([^:]*):(.*)$/.exec(line) ?? [];
        if (path === undefined) continue;
        if (manager.version === 2 ? controllers === '' : (controllers ?? '').split(',').includes('memory')) return path;
      }
      return undefined;
    },
    oomKills: (cgroup) => manager.oomKills(cgroup),
    stats: (cgroup) => manager.metrics(cgroup),
  };
}

export interface TaskServerOptions {
  readonly logger: Logger;
  readonly socket: string;
  readonly stateDir: string;
  readonly holderPath: string;
  readonly runcPath: string;
  readonly createTimeoutMs: number;
  readonly rootfs: RootfsMounter;
  readonly events: TaskEvents;
  readonly cgroups: ContainerCgroups | undefined;
}

/** The running Task API v3 server. */
export interface TaskServer {
  readonly tasks: TaskTable;
  close(drainMs: number): Promise<void>;
}

/**
 * Recovers the recorded tasks, then serves the Task API on its socket (mode 0600: containerd
 * runs as root). Called before the sandbox socket is bound, so that a containerd started
 * meanwhile finds the task socket listening when it loads its tasks.
 */
export async function startTaskServer(options: TaskServerOptions): Promise<TaskServer> {
  const dirs = taskDirs(options.stateDir);
  const tasks = new TaskTable({
    logger: options.logger,
    dir: dirs.tasks,
    runcRoot: dirs.runcRoot,
    runcPath: options.runcPath,
    holderPath: options.holderPath,
    createTimeoutMs: options.createTimeoutMs,
    rootfs: options.rootfs,
    events: options.events,
    cgroups: options.cgroups,
  });
  await tasks.recover();
  const server = new TtrpcServer({ logger: options.logger });
  registerTaskService(server, tasks);
  await server.listen(options.socket, 0o600);
  return { tasks, close: (drainMs) => server.close(drainMs) };
}
