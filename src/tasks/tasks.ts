import { readdir } from 'node:fs/promises';
import { type ChangeCalls, changesAt, changesFor, readFile } from '../base/fs-now.js';
import { basename, join } from 'node:path';
import type { Logger } from 'pino';
import { systemClock } from '../controller/clock.js';
import { validateIdentifier } from '../controller/identifiers.js';
import type { AnyValue, CallSignal, ExitInfo } from '../controller/types.js';
import { TsboxError, abortError, ignoreError, isGone, isTsboxError, messageOf, readIfPresentNow, withPath } from '../base/errors.js';
import { Options as RuncHandlerOptions } from '../gen/containerd/runc/v1/options.js';
import type { Mount } from '../gen/containerd/types/mount.js';
import { Status } from '../gen/containerd/v1/types/task.js';
import {
  ContainerHolder,
  createContainer,
  execProcess,
  endWorkingHolder,
  findContainerHolder,
  hasPoststartHooks,
  sharesPidNamespace,
} from '../runtime/container-holder.js';
import { SerialQueue } from '../base/serial-queue.js';
import { type Bound, boundOf } from '../runtime/bound.js';
import type { HelperService } from '../runtime/helper-service.js';
import { deleteStoppedContainer } from './runc-delete.js';
import { runc, type RuncOptions } from './runc.js';
import {
  EXEC_RECORD_FILE,
  TASK_RECORD_FILE,
  TASK_RECORD_VERSION,
  type ExecRecordFile,
  type TaskRecordFile,
  execDirName,
  readExecRecord,
  readTaskRecord,
  taskDirName,
} from './task-record.js';
import { type ProcessEvent, type ProcessKind, type ProcessState as ProcessLife, hasEnded, protocolStatus, transition } from './task-state.js';

/**
 * The tasks tsbox runs for containerd's Task API v3 (research notes on the Task API, §2): one
 * per container, keyed by namespace and id, each with its init process and its execs. A
 * process is held by its holder (native/tsbox-ctr.c), which is runc's parent, holds the
 * FIFOs and the tty and writes the exit; tsbox keeps a small record per task and per exec so
 * that after its own restart it answers for them as before.
 */


/** What Create, Exec and State carry of a process's IO. */
export interface ProcessIo {
  readonly stdin: string;
  readonly stdout: string;
  readonly stderr: string;
  readonly terminal: boolean;
}

export interface CreateRequest extends ProcessIo {
  readonly id: string;
  readonly bundle: string;
  readonly rootfs: readonly Mount[];
  /** containerd.runc.v1.Options, as the CRI handler sets them. */
  readonly options: AnyValue | undefined;
  readonly checkpoint: string;
}

/** A process's state, for State and Delete. */
export interface ProcessState extends ProcessIo {
  readonly id: string;
  readonly execId: string;
  readonly bundle: string;
  readonly pid: number;
  readonly status: Status;
  readonly exit: ExitInfo | undefined;
}

/** Mounts a task's rootfs (Node has no mount(2): a native helper does it). */
export interface RootfsMounter {
  mount(mounts: readonly Mount[], target: string, signal?: CallSignal): Promise<void>;
  /** Everything at and below `target`; a mount still busy is detached lazily and named in `detached`. */
  unmount(target: string, signal?: CallSignal): Promise<{ readonly detached: readonly string[] }>;
}

/** Task events for containerd's event bus (CRI acts on TaskOOM); publishing never fails a call. */
export interface TaskEvents {
  created(ns: string, task: { id: string; bundle: string; pid: number }): void;
  started(ns: string, id: string, pid: number): void;
  /** `sent` is called once containerd has it. */
  exited(ns: string, id: string, execId: string, pid: number, exit: ExitInfo, sent?: () => Promise<void>): void;
  deleted(ns: string, id: string, pid: number, exit: ExitInfo): void;
  execAdded(ns: string, id: string, execId: string): void;
  execStarted(ns: string, id: string, execId: string, pid: number): void;
  /** Must have reached containerd before the exit is answered (CRI then sets OOMKilled). */
  oom(ns: string, id: string): Promise<void>;
}

/** A container's cgroup, found from its init while it lives: OOM kills and stats. */
export interface ContainerCgroups {
  /** The cgroup of a live process (as the other two take it); undefined when it is gone. */
  locate(pid: number): Promise<string | undefined>;
  /** The kernel's OOM-kill count of the cgroup; undefined when the cgroup is gone. */
  oomKills(cgroup: string): Promise<number | undefined>;
  /** The file the container's holder watches for OOM kills while the container runs. */
  oomFile(cgroup: string): string;
  /** cgroups v1 or v2 Metrics of the cgroup, as an Any. */
  stats(cgroup: string): Promise<AnyValue>;
  /** Ends every process of the cgroup (and below it), resolving once none is left. */
  kill(cgroup: string, bound: Bound): Promise<void>;
  /** Where a container's holder ends its processes through its cgroup (CgroupManager.killHierarchy). */
  readonly killHierarchy: { readonly version: 1 | 2; readonly mount: string } | undefined;
}

export interface TaskTableOptions {
  readonly logger: Logger;
  /** Where task records and holder directories live (serve.ts: below containerd's state dir). */
  readonly dir: string;
  /** runc's root for these tasks (a namespace directory is made below it). */
  readonly runcRoot: string;
  /** Where an earlier tsbox kept them (its state dir): tasks found there are recovered and served from there. */
  readonly formerDirs?: { readonly dir: string; readonly runcRoot: string };
  readonly runcPath: string;
  readonly holderPath: string;
  /** Starts holders without a fork of tsbox when one of its processes is free. */
  readonly holderStarter?: HelperService;
  readonly rootfs: RootfsMounter;
  readonly events: TaskEvents;
  readonly cgroups: ContainerCgroups | undefined;
  /** Called at each TaskCrashPoint; the daemon's hook dies there when told to (crash tests only). */
  readonly crashPoint?: ((point: TaskCrashPoint) => void) | undefined;
}

/**
 * The record of a task, in `<dir>/<key>/task.json` (task-record.ts: its schema and version),
 * as the table holds it: it always names its runc root (recovery fills it in for a record of a
 * tsbox that kept one root).
 */
type TaskRecord = Readonly<Omit<TaskRecordFile, 'runcRoot'> & { runcRoot: string }>;

/** The record of an exec, in `<task dir>/<exec key>/exec.json`. */
type ExecRecord = Readonly<ExecRecordFile>;

/**
 * Named points in the task table's calls where a crash of tsbox matters. The crash tests make
 * the daemon die at one of them (TSBOX_CRASH_AT, as the controller's CrashPoint); in normal use
 * the hook is a no-op. What each leaves and how it is recovered is in DESIGN.md ("The Task
 * API route": crashes).
 */
export type TaskCrashPoint =
  | 'task-create:after-record'
  | 'task-create:after-mount'
  | 'task-create:after-holder'
  | 'task-start:after-holder-start'
  | 'task-exec:after-record'
  | 'task-exec-start:after-holder'
  | 'task-exit:before-report'
  | 'task-delete:after-runc-delete'
  | 'task-delete:after-unmount'
  | 'task-delete:after-record-remove';

export const TASK_CRASH_POINTS: readonly TaskCrashPoint[] = [
  'task-create:after-record',
  'task-create:after-mount',
  'task-create:after-holder',
  'task-start:after-holder-start',
  'task-exec:after-record',
  'task-exec-start:after-holder',
  'task-exit:before-report',
  'task-delete:after-runc-delete',
  'task-delete:after-unmount',
  'task-delete:after-record-remove',
];

/** One process of a task: the init or an exec, with its state (task-state.ts). */
class Proc {
  holder: ContainerHolder | undefined;
  /** The exit, once known (the state is then exited, ended-unstarted, or deleted). */
  exit: ExitInfo | undefined;
  #state: ProcessLife;
  /** Resolves once the exit is known (and, for an OOM, published). */
  readonly exited: Promise<ExitInfo>;
  #resolve!: (exit: ExitInfo) => void;
  readonly kind: ProcessKind;

  constructor(
    readonly execId: string,
    readonly dir: string,
    readonly io: ProcessIo,
    readonly spec: Record<string, unknown> | undefined,
    /** What messages call it: `process <exec id or task id>`. */
    readonly name: string,
    state: ProcessLife,
  ) {
    this.kind = execId === '' ? 'init' : 'exec';
    this.#state = state;
    this.exited = new Promise((resolve) => (this.#resolve = resolve));
  }

  get state(): ProcessLife {
    return this.#state;
  }

  get pid(): number {
    return this.holder?.pid ?? 0;
  }

  /** The state after `event` (task-state.ts's transition), or its refusal thrown. */
  on(event: ProcessEvent): ProcessLife {
    this.#state = transition(this.kind, this.#state, event, this.name);
    return this.#state;
  }

  /**
   * The state read back at recovery (from the holder's files and runc's state): where this
   * process's life goes on in this tsbox. An exit found with it is told after, as any exit.
   */
  recovered(state: 'created' | 'running' | 'paused'): void {
    this.#state = state;
  }

  /** Whether `event` may happen now, without changing anything: the refusal thrown when not. */
  check(event: ProcessEvent): ProcessLife {
    return transition(this.kind, this.#state, event, this.name);
  }

  /** The exit is known: recorded once, the state moved on (an ended one stays as it is), Waits answered. */
  settle(exit: ExitInfo): void {
    if (this.exit !== undefined) return;
    this.exit = exit;
    if (!hasEnded(this.#state)) this.on('exit');
    this.#resolve(exit);
  }
}

class Task {
  readonly execs = new Map<string, Proc>();
  /** The container's cgroup, located at Create (the init's /proc entry is gone after its exit). */
  cgroup: string | undefined;
  /** The OOM-kill count of the container's cgroup that containerd has been told of (TaskOOM). */
  oomSeen = 0;

  constructor(
    readonly record: TaskRecord,
    readonly dir: string,
    readonly init: Proc,
  ) {}
}

/**
 * How long a holder may take to create a container or start an exec when the call's own
 * deadline is not sooner: kubelet's own bound on a runtime call (2 min). runc alone may wait
 * 30 s for systemd to start a container's scope on a busy node, and the runc shim waits for
 * runc as long as the call lasts.
 */
const CONTAINER_ANSWER_MS = 120_000;

/** How long a holder found at work after a restart may take to die of SIGKILL. */
const HOLDER_END_MS = 10_000;

/** In a process's directory once containerd has its TaskExit. */
const EXIT_REPORTED = 'exit-reported';

/**
 * How long a Delete waits for what outlived a container's init to be gone from its cgroup
 * (runc delete --force waits up to 10 s for its kill).
 */
const DELETE_KILL_MS = 10_000;

async function exists(path: string): Promise<boolean> {
  return (await readIfPresentNow(path)) !== undefined;
}

async function writeJson(fs: ChangeCalls, path: string, value: unknown): Promise<void> {
  await fs.writeFile(`${path}.tmp`, JSON.stringify(value), { mode: 0o600 });
  await fs.rename(`${path}.tmp`, path);
}

/** True when the Any holds JSON equal to `value`. */
function sameJson(value: unknown, spec: AnyValue | undefined): boolean {
  try {
    return JSON.stringify(value) === JSON.stringify(JSON.parse(Buffer.from(spec?.value ?? []).toString('utf8')));
  } catch {
    return false; // not JSON: not the same request
  }
}

/** The decoded runc options of a Create; the defaults when none are sent. */
function runcHandlerOptions(options: AnyValue | undefined): RuncHandlerOptions {
  if (options === undefined || options.value.length === 0) return RuncHandlerOptions.fromPartial({});
  if (!options.typeUrl.endsWith('containerd.runc.v1.Options')) {
    throw new TsboxError('InvalidArgument', `task options of type ${options.typeUrl} are not runc's (containerd.runc.v1.Options)`);
  }
  try {
    return RuncHandlerOptions.decode(options.value);
  } catch (err) {
    throw new TsboxError('InvalidArgument', `cannot decode the task's runc options: ${messageOf(err)}`, { cause: err });
  }
}

export class TaskTable {
  #closed = false;
  readonly #opts: TaskTableOptions;
  readonly #log: Logger;
  readonly #tasks = new Map<string, Task>();
  readonly #queue = new SerialQueue<string>();
  readonly #crash: (point: TaskCrashPoint) => void;
  /**
   * The directories whose record could not be read at recovery, with the reason: left as they
   * are for an operator (or the build that reads them), never served, never made anew.
   */
  readonly #unreadable = new Map<string, string>();

  /** The tasks' directory and their runc root, with their change calls (at once on a tmpfs). */
  readonly #places: readonly { readonly dir: string; readonly calls: ChangeCalls }[];

  constructor(options: TaskTableOptions) {
    this.#opts = options;
    this.#log = options.logger.child({ component: 'tasks' });
    this.#crash = options.crashPoint ?? (() => undefined);
    const unknown = (err: unknown, path: string): void => this.#log.warn({ err, path }, 'cannot tell the file system of the tasks\' files: changed through the thread pool');
    const tasks = changesFor(options.dir, unknown);
    const runcRoot = changesFor(options.runcRoot, unknown);
    this.#places = [
      { dir: options.dir, calls: tasks },
      { dir: options.runcRoot, calls: runcRoot },
    ];
    this.#log.info({ dir: options.dir, atOnce: tasks.now, runcRoot: options.runcRoot, runcRootAtOnce: runcRoot.now }, 'task files: changed at once where held in memory');
  }

  /** The change calls for `path`: a task's files in the former place go through the pool. */
  #changes(path: string): ChangeCalls {
    return changesAt(path, this.#places);
  }

  get size(): number {
    return this.#tasks.size;
  }

  #key(ns: string, id: string): string {
    return `${ns}/${id}`;
  }

  #runc(record: TaskRecord): RuncOptions {
    return { runcPath: record.runcPath, root: record.runcRoot, systemdCgroup: record.systemdCgroup };
  }

  #get(ns: string, id: string): Task {
    const task = this.#tasks.get(this.#key(ns, id));
    if (task === undefined || task.init.state === 'deleted') throw new TsboxError('NotFound', `task ${id} not found in namespace ${ns}`);
    return task;
  }

  #proc(ns: string, id: string, execId: string): { task: Task; proc: Proc } {
    const task = this.#get(ns, id);
    if (execId === '') return { task, proc: task.init };
    const proc = task.execs.get(execId);
    if (proc === undefined) throw new TsboxError('NotFound', `process ${execId} not found in task ${id}`);
    return { task, proc };
  }

  /**
   * A directory whose record could not be read at recovery is left for an operator (or the
   * build that reads it): a call that would make it anew is refused, naming the file and why.
   */
  #refuseUnreadable(dir: string, what: string): void {
    const reason = this.#unreadable.get(dir);
    if (reason !== undefined) throw new TsboxError('FailedPrecondition', `${what}: its directory ${dir} holds a record tsbox cannot read (${reason}); it is left as it is until removed`);
  }

  /**
   * Stops reporting exits: a tsbox that is stopping leaves them to the next one, which finds
   * them recorded and not yet published. Calls still waiting get their answers from that one.
   */
  close(): void {
    this.#closed = true;
  }

  /** The init's pid of a task, 0 when there is none (Connect never fails). */
  pidOf(ns: string, id: string): number {
    const task = this.#tasks.get(this.#key(ns, id));
    return task === undefined || task.init.state === 'deleted' ? 0 : task.init.pid;
  }

  /**
   * Create: mounts the rootfs, has a holder run `runc create`, and records the task. The
   * container exists but has not run anything when this answers. Creating a task that exists
   * answers its pid (a replayed call is harmless).
   */
  create(ns: string, request: CreateRequest, signal: CallSignal): Promise<number> {
    validateIdentifier('task id', request.id);
    const key = this.#key(ns, request.id);
    return this.#queue.run(key, async () => {
      const tPrep = performance.now();
      const existing = this.#tasks.get(key);
      if (existing !== undefined && existing.init.state !== 'deleted') {
        if (existing.record.bundle === request.bundle) return existing.init.pid;
        throw new TsboxError('AlreadyExists', `task ${request.id} already exists in namespace ${ns}`);
      }
      if (request.checkpoint !== '') throw new TsboxError('FailedPrecondition', `task ${request.id}: restoring from a checkpoint is not supported`);
      const dir = join(this.#opts.dir, taskDirName(ns, request.id));
      this.#refuseUnreadable(dir, `task ${request.id}`);
      const options = runcHandlerOptions(request.options);
      let config: unknown;
      try {
        config = JSON.parse(await readFile(join(request.bundle, 'config.json'), 'utf8'));
      } catch (err) {
        throw new TsboxError('InvalidArgument', `task ${request.id}: cannot read the bundle's config.json: ${messageOf(err)}`, { cause: err });
      }
      const record: TaskRecord = {
        version: TASK_RECORD_VERSION,
        namespace: ns,
        id: request.id,
        bundle: request.bundle,
        stdin: request.stdin,
        stdout: request.stdout,
        stderr: request.stderr,
        terminal: request.terminal,
        systemdCgroup: options.systemdCgroup,
        runcPath: options.binaryName || this.#opts.runcPath,
        runcRoot: join(this.#opts.runcRoot, ns),
        sandboxId: ((await readIfPresentNow(join(request.bundle, 'sandbox'))) ?? '').trim(),
      };
      const rootfs = join(request.bundle, 'rootfs');
      const fs = this.#changes(dir);
      await fs.rm(dir, { recursive: true, force: true });
      await fs.mkdir(join(dir, 'init'), { recursive: true, mode: 0o700 });
      await this.#changes(this.#runc(record).root).mkdir(this.#runc(record).root, { recursive: true, mode: 0o700 });
      let mounted = false;
      const task = new Task(record, dir, new Proc('', join(dir, 'init'), record, undefined, `process ${request.id}`, 'creating'));
      try {
        // First, so that a tsbox that dies part-way leaves a record naming what to undo.
        await writeJson(fs, join(dir, TASK_RECORD_FILE), record);
        this.#crash('task-create:after-record');
        const t0 = performance.now();
        if (request.rootfs.length > 0) {
          await this.#opts.rootfs.mount(request.rootfs, rootfs, signal);
          mounted = true;
        }
        this.#crash('task-create:after-mount');
        const t1 = performance.now();
        const holder = await createContainer({
          dir: join(dir, 'init'),
          id: request.id,
          root: this.#runc(record).root,
          stdin: request.stdin,
          stdout: request.stdout,
          stderr: request.stderr,
          terminal: request.terminal,
          systemdCgroup: record.systemdCgroup,
          holderPath: this.#opts.holderPath,
          ...(this.#opts.holderStarter === undefined ? {} : { starter: this.#opts.holderStarter }),
          runcPath: record.runcPath,
          timeoutMs: CONTAINER_ANSWER_MS,
          signal,
          bundle: request.bundle,
          killAll: sharesPidNamespace(config),
          ...(this.#opts.cgroups?.killHierarchy === undefined ? {} : { killThrough: this.#opts.cgroups.killHierarchy }),
          // What runc start does is known for runc itself (another runtime's may differ).
          directStart: !hasPoststartHooks(config) && basename(record.runcPath) === 'runc',
          // What tsbox mounted goes as the init ends; Delete then finds nothing left to unmount.
          unmountRootfs: mounted,
        });
        this.#crash('task-create:after-holder');
        const t2 = performance.now();
        task.init.holder = holder;
        task.init.on('created');
        task.cgroup = await this.#locate(holder.pid);
        // Kept for a restarted tsbox: the init's /proc entry, which locates it, goes at its exit.
        if (task.cgroup !== undefined) await fs.writeFile(join(dir, 'cgroup'), task.cgroup, { mode: 0o600 });
        this.#tasks.set(key, task);
        this.#watch(task, task.init);
        void this.#watchOom(task);
        this.#opts.events.created(ns, { id: request.id, bundle: request.bundle, pid: holder.pid });
        const ms = (x: number): number => Math.round(x * 10) / 10;
        this.#log.debug({ id: request.id, prepareMs: ms(t0 - tPrep), mountMs: ms(t1 - t0), runcCreateMs: ms(t2 - t1), afterMs: ms(performance.now() - t2) }, 'task created');
        return holder.pid;
      } catch (err) {
        task.init.on(task.init.state === 'creating' ? 'create-failed' : 'delete');
        // runc may have made the container although its holder did not answer in time (or the
        // call was cancelled): deleted in any case, so that a retried Create finds nothing.
        await runc(this.#runc(record), ['delete', '--force', request.id]).catch((e: unknown) => {
          if (!isTsboxError(e, 'NotFound')) this.#log.error({ err: e, id: request.id }, 'cannot delete the container of a failed create');
        });
        if (mounted) await this.#opts.rootfs.unmount(rootfs).catch((e: unknown) => this.#log.error({ err: e, rootfs }, 'cannot unmount the rootfs of a failed create'));
        await fs.rm(dir, { recursive: true, force: true }).catch((e: unknown) => this.#log.error({ err: e, dir }, 'cannot remove a failed task\'s directory'));
        throw err;
      }
    });
  }

  async #locate(pid: number): Promise<string | undefined> {
    try {
      return await this.#opts.cgroups?.locate(pid);
    } catch (err) {
      this.#log.warn({ err, pid }, 'cannot find a container\'s cgroup: no stats or OOM reports for it');
      return undefined;
    }
  }

  /**
   * The container's holder watches its cgroup for OOM kills while it runs, and each one is
   * published (TaskOOM) as it happens, as the runc shim does: CRI then reports the container
   * OOMKilled even when the process killed was not its init.
   */
  async #watchOom(task: Task): Promise<void> {
    const holder = task.init.holder;
    if (holder === undefined || task.cgroup === undefined || this.#opts.cgroups === undefined) return;
    try {
      // Asked again by a restarted tsbox, the holder keeps its watch, and the wait tells the
      // kills since it began: published again, or for the first time if tsbox was away.
      await holder.watchOom(this.#opts.cgroups.oomFile(task.cgroup));
    } catch (err) {
      // Exited meanwhile: its exit tells an OOM kill.
      if (isTsboxError(err, 'NotFound')) return;
      this.#log.warn({ err, id: task.record.id }, 'cannot watch a container for OOM kills: only an OOM-killed init is reported, at its exit');
    }
  }

  #liveOom(task: Task, kills: number): void {
    if (this.#closed || kills <= task.oomSeen) return;
    task.oomSeen = kills;
    void this.#opts.events.oom(task.record.namespace, task.record.id);
  }

  /** Follows a process's exit: from its holder, then (init) an OOM published first. */
  #watch(task: Task, proc: Proc): void {
    const holder = proc.holder;
    if (holder === undefined) return;
    const onWatchLost = (err: Error): void => this.#log.warn({ err, id: task.record.id, execId: proc.execId }, 'cannot watch for a process\'s exit file; its holder\'s socket tells the exit');
    const onOom = (kills: number): void => this.#liveOom(task, kills);
    holder.waitExit(undefined, proc.execId === '' ? { onWatchLost, onOom } : { onWatchLost }).then(
      (exit) => {
        if (!this.#closed) this.#crash('task-exit:before-report');
        return this.#reportExit(task, proc, exit);
      },
      (err: unknown) => {
        this.#log.error({ err, id: task.record.id, execId: proc.execId }, 'cannot follow a process\'s exit; reporting status 255');
        proc.settle({ status: 255, exitedAt: systemClock(), reason: `exit unknown: ${messageOf(err)}` });
      },
    );
  }

  /**
   * An exit, seen live or found at recovery: an OOM kill published first (the init's), then
   * Waits answered, then TaskExit published. Once containerd has TaskExit, a marker in the
   * process's directory says so, and a tsbox restarted later does not publish it again.
   */
  async #reportExit(task: Task, proc: Proc, exit: ExitInfo): Promise<void> {
    // Closed (tsbox is stopping): the next tsbox finds the exit file and reports it.
    if (this.#closed) return;
    if (proc.execId === '' && this.#opts.cgroups !== undefined) await this.#reportOom(task, exit);
    proc.settle(exit);
    this.#opts.events.exited(task.record.namespace, task.record.id, proc.execId, proc.pid, exit, () =>
      this.#changes(proc.dir).writeFile(join(proc.dir, EXIT_REPORTED), '', { mode: 0o600 }).catch((err: unknown) => {
        // Gone: the process was deleted meanwhile, and its directory with it.
        if (!isGone(err)) this.#log.warn({ err, dir: proc.dir }, 'cannot mark an exit as published; a restarted tsbox publishes it again');
      }),
    );
  }

  /**
   * An init killed by the OOM killer: TaskOOM reaches containerd before its Wait is answered,
   * unless the live watch has told it already.
   */
  async #reportOom(task: Task, exit: ExitInfo): Promise<void> {
    if (exit.status !== 137 || task.cgroup === undefined) return;
    try {
      const kills = await this.#opts.cgroups?.oomKills(task.cgroup);
      if (kills !== undefined && kills > 0 && kills > task.oomSeen) {
        task.oomSeen = kills;
        await this.#opts.events.oom(task.record.namespace, task.record.id);
      }
    } catch (err) {
      this.#log.warn({ err, id: task.record.id }, 'cannot tell whether the container was OOM-killed');
    }
  }

  /** Start: the init runs (runc start), or an exec's process is started in the container. */
  start(ns: string, id: string, execId: string, signal: CallSignal): Promise<number> {
    return this.#queue.run(this.#key(ns, id), async () => {
      const { task, proc } = this.#proc(ns, id, execId);
      // Started already: the same Start again (the pod's process replays what a restarted tsbox
      // left unanswered), answered as the first, even if the process has exited since. A
      // process that ended unstarted is refused.
      const before = proc.state;
      if (proc.check('start') === before) return proc.pid;
      if (execId === '') {
        const t0 = performance.now();
        proc.on('start');
        try {
          await (proc.holder as ContainerHolder).start(signal);
        } catch (err) {
          proc.on('start-failed');
          throw err;
        }
        this.#crash('task-start:after-holder-start');
        this.#log.debug({ id, runcStartMs: Math.round((performance.now() - t0) * 10) / 10 }, 'task started');
        proc.on('started');
        this.#opts.events.started(ns, id, proc.pid);
        return proc.pid;
      }
      // An exec starts in a container whose init runs.
      task.init.check('start-exec');
      proc.on('start');
      let holder: ContainerHolder;
      try {
        holder = await execProcess({
          dir: proc.dir,
          changes: this.#changes(proc.dir),
          id,
          root: this.#runc(task.record).root,
          stdin: proc.io.stdin,
          stdout: proc.io.stdout,
          stderr: proc.io.stderr,
          terminal: proc.io.terminal,
          systemdCgroup: task.record.systemdCgroup,
          holderPath: this.#opts.holderPath,
          ...(this.#opts.holderStarter === undefined ? {} : { starter: this.#opts.holderStarter }),
          runcPath: task.record.runcPath,
          timeoutMs: CONTAINER_ANSWER_MS,
          signal,
          process: proc.spec ?? {},
        });
      } catch (err) {
        // Waits on a process that never ran end now, as the runc shim ends them: its exit.
        proc.settle({ status: 255, exitedAt: systemClock(), reason: `never started: ${messageOf(err)}` });
        throw err;
      }
      this.#crash('task-exec-start:after-holder');
      proc.holder = holder;
      proc.on('started');
      this.#watch(task, proc);
      this.#opts.events.execStarted(ns, id, execId, proc.pid);
      return proc.pid;
    });
  }

  /** Exec: records the process to run; it runs at Start. */
  exec(ns: string, id: string, execId: string, io: ProcessIo, spec: AnyValue | undefined): Promise<void> {
    validateIdentifier('exec id', execId);
    return this.#queue.run(this.#key(ns, id), async () => {
      const task = this.#get(ns, id);
      const known = task.execs.get(execId);
      if (known !== undefined) {
        // The same request again (the pod's process replays what a restarted tsbox left unanswered).
        if (sameJson(known.spec, spec) && known.io.stdin === io.stdin && known.io.stdout === io.stdout && known.io.stderr === io.stderr && known.io.terminal === io.terminal) return;
        throw new TsboxError('AlreadyExists', `process ${execId} already exists in task ${id}`);
      }
      // In a container whose init has not exited.
      task.init.check('exec');
      const dir = join(task.dir, execDirName(execId));
      this.#refuseUnreadable(dir, `process ${execId}`);
      let process: Record<string, unknown>;
      try {
        const parsed: unknown = JSON.parse(Buffer.from(spec?.value ?? []).toString('utf8'));
        if (parsed === null || typeof parsed !== 'object' || Array.isArray(parsed)) throw new Error('not a JSON object');
        process = parsed as Record<string, unknown>;
      } catch (err) {
        throw new TsboxError('InvalidArgument', `exec ${execId}: the process spec is not an OCI process in JSON: ${messageOf(err)}`, { cause: err });
      }
      const fs = this.#changes(dir);
      await fs.mkdir(dir, { recursive: true, mode: 0o700 });
      const record: ExecRecord = { version: TASK_RECORD_VERSION, execId, spec: process, ...io };
      await writeJson(fs, join(dir, EXEC_RECORD_FILE), record);
      this.#crash('task-exec:after-record');
      task.execs.set(execId, new Proc(execId, dir, io, process, `process ${execId}`, 'created'));
      this.#opts.events.execAdded(ns, id, execId);
    });
  }

  state(ns: string, id: string, execId: string): ProcessState {
    const { task, proc } = this.#proc(ns, id, execId);
    const status = protocolStatus(proc.state, task.init.state);
    return { id: execId || id, execId, bundle: task.record.bundle, pid: proc.pid, status, exit: proc.exit, ...proc.io };
  }

  /** Wait: resolves with the exit once the process has one; ends early with the call's signal. */
  async wait(ns: string, id: string, execId: string, signal: CallSignal): Promise<ExitInfo> {
    const { proc } = this.#proc(ns, id, execId);
    if (proc.exit !== undefined) return proc.exit;
    return new Promise<ExitInfo>((resolve, reject) => {
      const onAbort = (): void => reject(abortError(signal));
      if (signal.aborted) {
        onAbort();
        return;
      }
      signal.addEventListener('abort', onAbort, { once: true });
      void proc.exited.then((exit) => {
        signal.removeEventListener('abort', onAbort);
        resolve(exit);
      });
    });
  }

  /**
   * Kill: the init through runc (`all`: every process of the container), an exec's process by
   * its pid. A process that has exited is NotFound; an exec never started is
   * FailedPrecondition, as containerd's client expects.
   */
  async kill(ns: string, id: string, execId: string, signalNumber: number, all: boolean, signal: CallSignal): Promise<void> {
    if (!Number.isInteger(signalNumber) || signalNumber <= 0 || signalNumber > 64) {
      throw new TsboxError('InvalidArgument', `signal ${signalNumber} is not a signal number`);
    }
    const { task, proc } = this.#proc(ns, id, execId);
    // Exited: NotFound; an exec never started: FailedPrecondition.
    proc.check('kill');
    // Every process of the container, or a frozen one: runc's work (its cgroup, thawing).
    if (execId === '' && (all || task.init.state === 'paused')) {
      await runc(this.#runc(task.record), ['kill', ...(all ? ['--all'] : []), id, String(signalNumber)], { signal });
      return;
    }
    if (proc.holder === undefined) throw new TsboxError('FailedPrecondition', `process ${execId} has not been started`);
    // One process: its holder signals it, which costs no runc and cannot hit a reused pid.
    await proc.holder.kill(signalNumber, signal);
  }

  /**
   * Delete: an exec that has exited or never started is forgotten; the init must not be
   * running: its container is deleted from runc, the rootfs unmounted, the record removed.
   */
  delete(ns: string, id: string, execId: string, signal: CallSignal): Promise<{ pid: number; exit: ExitInfo }> {
    return this.#queue.run(this.#key(ns, id), async () => {
      const { task, proc } = this.#proc(ns, id, execId);
      // A running (or paused) process is FailedPrecondition.
      proc.check('delete');
      if (execId !== '') {
        const exit = proc.exit ?? { status: 0, exitedAt: systemClock(), reason: 'never started' };
        await this.#changes(proc.dir).rm(proc.dir, { recursive: true, force: true });
        // A Wait on an exec deleted before it ran ends with it.
        proc.settle(exit);
        proc.on('delete');
        task.execs.delete(execId);
        return { pid: proc.pid, exit };
      }
      // A container whose init has ended is deleted as runc would, without runc where nothing
      // needs it; a created container that never ran: runc delete --force kills its init first.
      const t0 = performance.now();
      const cgroups = this.#opts.cgroups;
      const done =
        proc.exit !== undefined &&
        (await deleteStoppedContainer({
          root: this.#runc(task.record).root,
          id,
          changes: this.#changes(this.#runc(task.record).root),
          kill: cgroups === undefined ? undefined : (cgroup, bound) => cgroups.kill(cgroup, bound),
          bound: boundOf(DELETE_KILL_MS, signal),
        })) === 'deleted';
      if (!done) {
        await runc(this.#runc(task.record), ['delete', '--force', id], { signal }).catch((err: unknown) => {
          if (!isTsboxError(err, 'NotFound')) throw err;
        });
      }
      this.#crash('task-delete:after-runc-delete');
      const t1 = performance.now();
      const exit = proc.exit ?? (await this.#settledWithin(proc, 10_000)) ?? { status: 255, exitedAt: systemClock(), reason: 'deleted before it exited' };
      // Cleaned up before the task is forgotten: a Delete that fails here leaves the task, and
      // containerd's next Delete does it again.
      const { detached } = await this.#opts.rootfs.unmount(join(task.record.bundle, 'rootfs'), signal);
      if (detached.length > 0) this.#log.warn({ id, detached }, 'the rootfs was still busy at delete: detached lazily, it goes when its last user does');
      this.#crash('task-delete:after-unmount');
      const t2 = performance.now();
      await this.#changes(task.dir).rm(task.dir, { recursive: true, force: true });
      for (const dir of this.#unreadable.keys()) if (dir.startsWith(`${task.dir}/`)) this.#unreadable.delete(dir);
      this.#crash('task-delete:after-record-remove');
      const ms = (x: number): number => Math.round(x * 10) / 10;
      this.#log.debug({ id, runcDelete: !done, deleteMs: ms(t1 - t0), unmountMs: ms(t2 - t1) }, 'task deleted');
      proc.on('delete');
      this.#tasks.delete(this.#key(ns, id));
      for (const exec of task.execs.values()) {
        exec.settle(exec.exit ?? { status: 255, exitedAt: systemClock(), reason: 'its task was deleted' });
        if (hasEnded(exec.state)) exec.on('delete');
      }
      this.#opts.events.deleted(ns, id, proc.pid, exit);
      return { pid: proc.pid, exit };
    });
  }

  async #settledWithin(proc: Proc, ms: number): Promise<ExitInfo | undefined> {
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<undefined>((resolve) => (timer = setTimeout(() => resolve(undefined), ms)));
    try {
      return await Promise.race([proc.exited, timeout]);
    } finally {
      clearTimeout(timer);
    }
  }

  async resize(ns: string, id: string, execId: string, width: number, height: number, signal: CallSignal): Promise<void> {
    const { proc } = this.#proc(ns, id, execId);
    if (proc.holder === undefined || hasEnded(proc.state)) return;
    await proc.holder.resize(width, height, signal).catch((err: unknown) => {
      if (!isTsboxError(err, 'NotFound')) throw err; // exited meanwhile: nothing to resize
    });
  }

  async closeIO(ns: string, id: string, execId: string, signal: CallSignal): Promise<void> {
    const { proc } = this.#proc(ns, id, execId);
    if (proc.holder === undefined || hasEnded(proc.state)) return;
    await proc.holder.closeIO(signal).catch((err: unknown) => {
      if (!isTsboxError(err, 'NotFound')) throw err; // exited meanwhile: its stdin is closed
    });
  }

  /**
   * Pids: the container's processes from runc. A stopped init that is not deleted yet answers
   * its own pid, so that containerd, loading tasks after its restart, keeps the task and
   * later reads its real exit code (runc would answer none, and containerd would drop it).
   */
  async pids(ns: string, id: string, signal: CallSignal): Promise<{ pid: number; execId: string }[]> {
    const task = this.#get(ns, id);
    if (hasEnded(task.init.state)) return [{ pid: task.init.pid, execId: '' }];
    const out = await runc(this.#runc(task.record), ['ps', '--format', 'json', id], { signal });
    let pids: unknown;
    try {
      pids = JSON.parse(out || '[]');
    } catch (err) {
      throw new TsboxError('Internal', `runc ps answered what is not JSON: ${out.slice(0, 80)}`, { cause: err });
    }
    const execOf = new Map<number, string>();
    for (const exec of task.execs.values()) if (exec.pid > 0 && !hasEnded(exec.state)) execOf.set(exec.pid, exec.execId);
    return (Array.isArray(pids) ? pids : []).filter((p): p is number => Number.isInteger(p)).map((pid) => ({ pid, execId: execOf.get(pid) ?? '' }));
  }

  async stats(ns: string, id: string): Promise<AnyValue> {
    const task = this.#get(ns, id);
    if (this.#opts.cgroups === undefined) throw new TsboxError('Unimplemented', 'no cgroups on this host');
    if (task.cgroup === undefined) throw new TsboxError('NotFound', `task ${id}: its cgroup is not known`);
    return this.#opts.cgroups.stats(task.cgroup);
  }

  /** Update: new resources (an OCI LinuxResources in JSON) through runc update. */
  async update(ns: string, id: string, resources: AnyValue | undefined, signal: CallSignal): Promise<void> {
    const task = this.#get(ns, id);
    if (hasEnded(task.init.state)) throw new TsboxError('NotFound', `task ${id} has exited`);
    const json = Buffer.from(resources?.value ?? []).toString('utf8');
    try {
      JSON.parse(json);
    } catch (err) {
      throw new TsboxError('InvalidArgument', `task ${id}: the resources are not an OCI LinuxResources in JSON: ${messageOf(err)}`, { cause: err });
    }
    await runc(this.#runc(task.record), ['update', '--resources', '-', id], { input: json, signal });
  }

  /**
   * Ends and deletes every task of a sandbox that is still here when the sandbox goes (its
   * Shutdown): tasks containerd lost track of (a failure between its calls, a restart) would
   * otherwise run on with no pod. Bounded: a process that does not die of SIGKILL within 10 s
   * is logged and its task left.
   */
  #sandboxTasks(ns: string, sandboxId: string): Task[] {
    return [...this.#tasks.values()].filter((t) => t.init.state !== 'deleted' && t.record.namespace === ns && t.record.sandboxId === sandboxId && sandboxId !== '');
  }

  /**
   * Ends every process of a task with SIGKILL (its execs through their holders, the container with
   * runc kill --all); true once its init has ended, false when it is still there 10 s later.
   */
  async #killTask(task: Task, signal: CallSignal): Promise<boolean> {
    const { namespace: ns, id } = task.record;
    for (const exec of task.execs.values()) {
      if (exec.pid > 0 && !hasEnded(exec.state)) await this.kill(ns, id, exec.execId, 9, false, signal).catch(ignoreError('it ended meanwhile'));
    }
    if (hasEnded(task.init.state)) return true;
    await runc(this.#runc(task.record), ['kill', '--all', id, '9'], { signal }).catch((err: unknown) => {
      if (!isTsboxError(err, 'NotFound')) throw err;
    });
    return (await this.#settledWithin(task.init, 10_000)) !== undefined;
  }

  /**
   * Ends the processes of the tasks that name the sandbox, whose pod's process is gone:
   * containerd's connections to them closed with it, so nothing else would. Their exits are
   * recorded and published as any; the tasks stay until the sandbox's Shutdown deletes them.
   */
  async killSandboxTasks(ns: string, sandboxId: string, signal: CallSignal): Promise<void> {
    for (const task of this.#sandboxTasks(ns, sandboxId)) {
      const id = task.record.id;
      this.#log.warn({ ns, id, sandbox: sandboxId }, "ending a task whose pod's process is gone");
      try {
        if (!(await this.#killTask(task, signal))) this.#log.error({ ns, id }, "a task whose pod's process is gone did not end within 10 s of SIGKILL");
      } catch (err) {
        if (!isTsboxError(err, 'NotFound')) this.#log.error({ err, ns, id }, "cannot end a task whose pod's process is gone");
      }
    }
  }

  async removeSandboxTasks(ns: string, sandboxId: string, signal: CallSignal): Promise<void> {
    for (const task of this.#sandboxTasks(ns, sandboxId)) {
      const id = task.record.id;
      this.#log.warn({ ns, id, sandbox: sandboxId }, 'deleting a task its sandbox left behind');
      try {
        if (!(await this.#killTask(task, signal))) {
          this.#log.error({ ns, id }, 'a task of a removed sandbox did not end within 10 s of SIGKILL; it is left');
          continue;
        }
        for (const exec of [...task.execs.keys()]) await this.delete(ns, id, exec, signal).catch(ignoreError('deleted meanwhile'));
        await this.delete(ns, id, '', signal);
      } catch (err) {
        if (!isTsboxError(err, 'NotFound')) this.#log.error({ err, ns, id }, 'cannot delete a task its sandbox left behind');
      }
    }
  }

  /** Pause freezes every process of the container (runc pause); Resume thaws them. State says PAUSED meanwhile. */
  pause(ns: string, id: string, resume: boolean, signal: CallSignal): Promise<void> {
    return this.#queue.run(this.#key(ns, id), async () => {
      const task = this.#get(ns, id);
      // Not running: FailedPrecondition. A pause of a paused container and a resume of one
      // that is not paused are runc's to answer, as they always were.
      const event = resume ? 'resume' : 'pause';
      task.init.check(event);
      await runc(this.#runc(task.record), [event, id], { signal });
      task.init.on(event);
    });
  }

  /**
   * Reads the tasks back from their records after a restart of tsbox: each process's holder
   * is found by its recorded pid and start time, or its exit file.
   */
  async recover(): Promise<void> {
    const { formerDirs } = this.#opts;
    for (const { dir: tasksDir, runcRoot } of formerDirs === undefined ? [this.#opts] : [this.#opts, formerDirs]) {
      let names: string[];
      try {
        names = await readdir(tasksDir);
      } catch (err) {
        if (isGone(err)) continue;
        throw withPath(err, tasksDir, 'list');
      }
      for (const name of names) {
        const dir = join(tasksDir, name);
        try {
          await this.#recoverTask(dir, runcRoot);
        } catch (err) {
          this.#log.error({ err, dir }, 'cannot recover a task; its record is left as it is');
        }
      }
    }
    if (this.#tasks.size > 0) this.#log.info({ tasks: this.#tasks.size }, 'tasks recovered');
  }

  /**
   * A record that cannot be read (not JSON, not of its schema, of a newer version, in another
   * task's directory) is left where it is, with its directory and whatever runs from it: an
   * error line names the file and the reason. Its task or exec is not served (containerd's
   * calls about it are NotFound); the other tasks are.
   */
  #leaveUnreadable(dir: string, file: string, reason: string, what: 'task' | 'exec'): void {
    this.#unreadable.set(dir, reason);
    this.#log.error({ file, reason }, `${what} record cannot be read: ${what === 'task' ? 'the task' : 'the process'} is not served; its record, its directory and its processes are left as they are`);
  }

  /** `runcRoot`: the root of the directory the task was found in, for a record that names none. */
  async #recoverTask(dir: string, runcRoot: string): Promise<void> {
    const file = join(dir, TASK_RECORD_FILE);
    const text = await readIfPresentNow(file);
    if (text === undefined) {
      // A Create that did not finish: nothing was answered, nothing to keep.
      await this.#changes(dir).rm(dir, { recursive: true, force: true });
      return;
    }
    const read = readTaskRecord(text, basename(dir));
    if (!read.ok) {
      this.#leaveUnreadable(dir, file, read.reason, 'task');
      return;
    }
    const record: TaskRecord = { ...read.record, runcRoot: read.record.runcRoot ?? join(runcRoot, read.record.namespace) };
    const known = this.#tasks.get(this.#key(record.namespace, record.id));
    if (known !== undefined) {
      // The same id in both places (a record of the former place left after a failure, and the
      // id made again): the one found first is served; this one is left for an operator.
      this.#log.error({ id: record.id, ns: record.namespace, dir, served: known.dir }, 'a task recorded twice: this record is left as it is');
      return;
    }
    // Creating until its holder is found: a Create that never answered otherwise.
    const task = new Task(record, dir, new Proc('', join(dir, 'init'), record, undefined, `process ${record.id}`, 'creating'));
    task.cgroup = (await readIfPresentNow(join(dir, 'cgroup'))) || undefined;
    await this.#recoverProc(task, task.init);
    if (task.init.state === 'creating') {
      // A Create that never answered: undo what it did; containerd asks again or gives up.
      this.#log.warn({ id: record.id, ns: record.namespace }, 'undoing a task create that did not finish');
      await runc(this.#runc(record), ['delete', '--force', record.id]).catch((err: unknown) => {
        if (!isTsboxError(err, 'NotFound')) this.#log.error({ err, id: record.id }, 'cannot delete the container of an unfinished create');
      });
      await this.#opts.rootfs.unmount(join(record.bundle, 'rootfs'));
      await this.#changes(dir).rm(dir, { recursive: true, force: true });
      task.init.on('create-failed');
      return;
    }
    const live = task.init.holder !== undefined && !hasEnded(task.init.state);
    if (task.cgroup === undefined && live) task.cgroup = await this.#locate(task.init.pid);
    if (live) void this.#watchOom(task);
    for (const name of await readdir(dir)) {
      if (!name.startsWith('e-')) continue;
      const execFile = join(dir, name, EXEC_RECORD_FILE);
      const execText = await readIfPresentNow(execFile);
      if (execText === undefined) continue;
      const exec = readExecRecord(execText, name);
      if (!exec.ok) {
        this.#leaveUnreadable(join(dir, name), execFile, exec.reason, 'exec');
        continue;
      }
      const { execId, spec, stdin, stdout, stderr, terminal } = exec.record;
      const proc = new Proc(execId, join(dir, name), { stdin, stdout, stderr, terminal }, spec, `process ${execId}`, 'created');
      await this.#recoverProc(task, proc);
      task.execs.set(execId, proc);
    }
    this.#tasks.set(this.#key(record.namespace, record.id), task);
  }

  /**
   * A process's state from its holder's files: none, or a holder still at work (ended now),
   * leaves it as it was made (an init creating, an exec created); an exit file, or a holder
   * that runs, makes it started (an init runc still calls created or paused is that).
   */
  async #recoverProc(task: Task, proc: Proc): Promise<void> {
    const found = await findContainerHolder(proc.dir);
    if (found.kind === 'absent') return;
    if (found.kind === 'working') {
      // tsbox stopped while this holder was making the container or starting the exec: nobody
      // was answered. It is ended, so that undoing it does not race it; a replayed call redoes it.
      this.#log.warn({ id: task.record.id, execId: proc.execId, holder: found.holder.pid }, 'a container holder was still at work when tsbox stopped: ending it');
      if (!(await endWorkingHolder(found.holder, HOLDER_END_MS))) {
        this.#log.error({ id: task.record.id, holder: found.holder.pid }, `a container holder did not end within ${HOLDER_END_MS} ms of SIGKILL`);
      }
      return;
    }
    if (found.kind === 'exited') {
      proc.recovered('running');
      // Exited while tsbox was away: containerd may not have heard (nor of an OOM kill).
      if (await exists(join(proc.dir, EXIT_REPORTED))) proc.settle(found.exit);
      else await this.#reportExit(task, proc, found.exit);
      return;
    }
    proc.holder = found.holder;
    if (proc.execId !== '') {
      proc.recovered('running');
    } else {
      // A running init has been started unless runc still says created.
      const status = await this.#runcStatus(task);
      proc.recovered(status === 'created' ? 'created' : status === 'paused' ? 'paused' : 'running');
    }
    this.#watch(task, proc);
  }

  async #runcStatus(task: Task): Promise<string | undefined> {
    try {
      const state = JSON.parse(await runc(this.#runc(task.record), ['state', task.record.id])) as { status?: unknown };
      return typeof state.status === 'string' ? state.status : undefined;
    } catch (err) {
      this.#log.warn({ err, id: task.record.id }, 'cannot read runc state of a recovered task');
      return undefined;
    }
  }
}
