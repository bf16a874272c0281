import { spawn, type ChildProcess } from 'node:child_process';
import { watch, type FSWatcher } from 'node:fs';
import { mkdir, rm, unlink } from 'node:fs/promises';
import { writeProcFile } from '../base/fs-now.js';
import { dirname, join } from 'node:path';
import type { Logger } from 'pino';
import { z } from 'zod';
import { systemClock } from '../controller/clock.js';
import { sandboxLimits, type Resources } from '../controller/pod-spec.js';
import type {
  AnyValue,
  CallSignal,
  ExitInfo,
  LaunchSpec,
  Recovered,
  RunningSandbox,
  RuntimeBackend,
  SandboxPlacement,
  TaskEndpoint,
  TeardownStage,
} from '../controller/types.js';
import { TsboxError, abortError, allOrFirstError, ignoreError, messageOf, readIfPresent, readIfPresentNow } from '../base/errors.js';
import type { StateLayout } from '../state/layout.js';
import { boundOf, pollUntil, type Bound } from './bound.js';
import { ownCgroupDirs, sandboxCgroupPath, type CgroupManager } from './cgroups.js';
import { type ProgramAnswer, programAnswerOf, readChildAnswer } from './child-answer.js';
import { type HelperService, spawnThrough } from './helper-service.js';
import { POD_SHM_BYTES, type PodFiles } from './pod-files.js';
import { processStat, signalGroup, signalProcess } from './proc.js';
import { type ProcessId, endProcess, isRunning, processIdOf, readExitRecord, signalIfRunning, superviseAgain, untilGone } from './supervised.js';
import { scopeUnit, sliceOf, type SystemdScopes } from './systemd.js';
import { removeStaleShimSockets, shimSocketPath, stopPodShims } from './task-shim.js';

/** The pod's pause, which the supervisor finds beside its own program (native/pause.c). */
const PAUSE_PROGRAM = 'tsbox-pause';

/** What the process backend records to find a sandbox again: pids with their start times. */
const handleSchema = z.object({
  shimPid: z.number().int().positive(),
  shimStart: z.string(),
  pid: z.number().int().positive(),
  pidStart: z.string(),
  /**
   * The link socket of a pod whose supervisor relays its task calls (the Task API route): that
   * supervisor outlives the sandbox process, serving the pod's tasks, until the sandbox's
   * Shutdown. Absent for other sandboxes, whose supervisor ends with the sandbox.
   */
  link: z.string().optional(),
});
export type ProcessHandle = z.infer<typeof handleSchema>;

/** The supervisor a handle records. */
function supervisorOf(handle: ProcessHandle): ProcessId {
  return { pid: handle.shimPid, start: handle.shimStart };
}

/** The sandbox process a handle records. */
function sandboxOf(handle: ProcessHandle): ProcessId {
  return { pid: handle.pid, start: handle.pidStart };
}

export interface ProcessBackendOptions {
  readonly layout: StateLayout;
  readonly shimPath: string;
  /** Own pid, ipc, uts and mount namespaces (needs root); a pod's NODE modes keep the host's. */
  readonly namespaces: boolean;
  readonly cgroups: CgroupManager | undefined;
  /** Parent of the cgroups of sandboxes that are not Kubernetes pods (relative to the root). */
  readonly cgroupParent: string;
  /** systemd's scopes for pods whose cgroup_parent is a slice; undefined when systemd is not init. */
  readonly systemd: SystemdScopes | undefined;
  /** The pod files CRI mounts into containers; undefined when tsbox runs without root. */
  readonly podFiles: PodFiles | undefined;
  /** containerd's socket, from which its runtime shim names the pod's task socket. */
  readonly containerdAddress: string;
  /** The Task API v3 route (the task server), when tsbox serves tasks. */
  readonly taskApi?: TaskRoute;
  /** How long the supervisor may take to answer its start handshake. */
  readonly startTimeoutMs: number;
  /** Starts supervisors without a fork of tsbox when one of its processes is free. */
  readonly starter?: HelperService;
  /** How long a sandbox's processes may take to die of SIGKILL before a clean-up fails. */
  readonly killTimeoutMs: number;
  readonly logger: Logger;
  /** How often sandboxes whose supervisor is not tsbox's child are checked for a lost supervisor. */
  readonly pollIntervalMs: number;
}

/**
 * The Task API v3 route as the backend uses it: pods of these CRI runtime handlers (names, as
 * src/config/task-routes.ts resolved them) get a supervisor that also owns the pod's task socket
 * and relays containerd's calls to tsbox's task service over the pod's link; containerd is told
 * that socket, version 3, and runs no shim for them.
 */
export interface TaskRoute {
  readonly handlers: readonly string[];
  /** Starts serving a pod's tasks through its supervisor's link (src/tasks/pod-links.ts). */
  attach(pod: { key: string; path: string; alive(): Promise<boolean>; lost(): void }): void;
  /** Stops serving them: the link closes and is not opened again. */
  detach(key: string): void;
  /**
   * The pod's supervisor is being ended: its link is not opened again; resolves once the link
   * has closed (the supervisor's end, as it happens), at once when none is open.
   */
  release(key: string): Promise<void>;
  /** Ends the processes of the tasks that name the sandbox (its supervisor is gone). */
  killTasks(namespace: string, sandboxId: string): Promise<void>;
  /** Deletes the tasks that name the sandbox (its Shutdown). */
  removeTasks(namespace: string, sandboxId: string): Promise<void>;
  /**
   * A pod an earlier build started, whose tasks its node-wide task front carries (`present`), or
   * its Shutdown (`false`): once none is left that front is ended.
   */
  formerPod(key: string, present: boolean): void;
}

const UNKNOWN = 255;

/** What podsandbox gives a pause container: the OOM killer takes the pod's containers first. */
const SANDBOX_OOM_SCORE_ADJ = -998;

/** What releases a supervisor started with --hold. */
const GO_AHEAD = Buffer.from([1]);

const now = systemClock;

/** One sandbox the backend watches. Fires its exit once. */
class Watched implements RunningSandbox {
  #exit: ExitInfo | undefined;
  readonly #listeners: ((exit: ExitInfo) => void)[] = [];
  /** The supervisor is gone without an exit file: the pod is being ended. */
  ending = false;
  /** The supervisor, tsbox's child, has exited (its 'exit' event came). */
  childExited = false;
  /** Where the sandbox's cgroup is, for operators. */
  cgroupPath = '';

  constructor(
    readonly key: string,
    readonly dir: string,
    readonly handle: ProcessHandle,
    readonly child: boolean,
  ) {}

  get pid(): number {
    return this.handle.pid;
  }

  get exited(): boolean {
    return this.#exit !== undefined;
  }

  onExit(listener: (exit: ExitInfo) => void): void {
    if (this.#exit !== undefined) listener(this.#exit);
    else this.#listeners.push(listener);
  }

  fire(exit: ExitInfo): void {
    if (this.#exit !== undefined) return;
    this.#exit = exit;
    for (const listener of this.#listeners.splice(0)) listener(exit);
  }
}

/**
 * pollUntil(done, bound), woken as soon as the sandbox's exit is seen (its supervisor's end, the
 * exits directory's watch) rather than at the poll's next turn; the poll stays for what no event
 * tells (a supervisor that died without an exit file).
 */
function untilExit(watched: Watched, done: () => Promise<boolean>, bound: Bound): Promise<boolean> {
  return pollUntil(done, bound, new Promise((resolve) => watched.onExit(resolve)));
}

/**
 * The default backend: each sandbox is a real process, the child of a small supervisor
 * (native/tsbox-shim.c) that outlives tsbox and writes the exit status to the sandbox's
 * directory. Exits are seen through the supervisor's exit (when tsbox started it), an
 * inotify watch on the exits directory (always), and a slow poll for a supervisor that was
 * itself killed.
 */
export class ProcessBackend implements RuntimeBackend {
  readonly name = 'process';
  readonly #opts: ProcessBackendOptions;
  readonly #log: Logger;
  readonly #watched = new Map<string, Watched>();
  /**
   * Supervisors that relay a pod's task calls and outlive their sandbox process: kept until the
   * sandbox's Shutdown ends them.
   */
  readonly #serving = new Map<string, ProcessHandle>();
  #watcher: FSWatcher | undefined;
  /** The exits directory cannot be watched: the poll reads the exit files too. */
  #unwatched = false;
  #oomWarned = false;
  #poll: NodeJS.Timeout | undefined;

  constructor(options: ProcessBackendOptions) {
    this.#opts = options;
    this.#log = options.logger;
  }

  /** Creates the exits directory and starts watching it. Call before start/recover. */
  async init(): Promise<void> {
    const { exits } = this.#opts.layout;
    await mkdir(exits, { recursive: true, mode: 0o700 });
    this.#watcher = watch(exits, (_event, filename) => {
      if (typeof filename === 'string') this.#onNotice(filename);
    });
    this.#watcher.on('error', (err) => {
      this.#unwatched = true;
      this.#log.error({ err }, 'exit notice watch failed; falling back to polling');
    });
    this.#poll = setInterval(() => void this.#pollSupervisors(), this.#opts.pollIntervalMs);
    this.#poll.unref();
  }

  #onNotice(filename: string): void {
    const at = filename.indexOf('@');
    if (at <= 0) return;
    const key = `${filename.slice(0, at)}/${filename.slice(at + 1)}`;
    const watched = this.#watched.get(key);
    if (watched !== undefined) void this.#collect(watched);
    // A notice of an exit already known (the exit file read first, by a Stop's poll) or of no
    // sandbox watched: the exit file says all; the notice would only be left behind.
    else this.#dropNotice(key);
  }

  /** Reads the exit file of a sandbox whose supervisor ended (or announced the exit). */
  async #collect(watched: Watched): Promise<void> {
    if (watched.exited) return;
    // Gone only when it is: a read before the exit is written (a Stop's poll, a notice) finds a
    // live supervisor, also one that is tsbox's child (reaped once it has exited: not running).
    const found = await superviseAgain(supervisorOf(watched.handle), () => this.#readExit(watched.dir));
    if (found.kind === 'exited') this.#finish(watched, found.exit);
    else if (found.kind === 'lost') await this.#supervisorLost(watched);
  }

  /** Whether the sandbox's supervisor is the recorded process. */
  #alive(handle: ProcessHandle): Promise<boolean> {
    return isRunning(supervisorOf(handle));
  }

  /** Serves the pod's tasks through its supervisor's link, while it lives. */
  #attach(key: string, handle: ProcessHandle): void {
    const { taskApi } = this.#opts;
    const link = handle.link;
    if (taskApi === undefined || link === undefined) return;
    taskApi.attach({
      key,
      path: link,
      alive: () => this.#alive(handle),
      lost: () => {
        const watched = this.#watched.get(key);
        if (watched !== undefined) {
          void this.#collect(watched);
          return;
        }
        // The sandbox had exited; its supervisor served the pod's tasks, which nothing else can.
        if (this.#serving.delete(key)) void this.#killTasks(key);
      },
    });
  }

  async #killTasks(key: string): Promise<void> {
    const [ns, id] = key.split('/') as [string, string];
    await this.#opts.taskApi?.killTasks(ns, id).catch((err: unknown) => this.#log.error({ key, err }, "cannot end the tasks of a pod whose supervisor is gone"));
  }

  /** The exit file; undefined while there is none, and when it cannot be read (logged: the next check retries). */
  async #readExit(dir: string): Promise<ExitInfo | undefined> {
    try {
      return await readExitRecord(dir);
    } catch (err) {
      this.#log.error({ file: join(dir, 'exit'), err }, 'cannot read exit file');
      return undefined;
    }
  }

  /**
   * The supervisor died without writing the exit: the pod ends with it, as a pod whose runc shim
   * is killed does. Its processes are ended (its cgroup's, and its tasks'), and the exit, which
   * nobody can know any more, is 255.
   */
  async #supervisorLost(watched: Watched): Promise<void> {
    if (watched.exited || watched.ending) return;
    watched.ending = true;
    this.#opts.taskApi?.detach(watched.key);
    this.#log.warn({ key: watched.key, supervisor: watched.handle.shimPid }, "the sandbox's supervisor is gone: ending the pod");
    try {
      await this.#endSandbox(watched, this.#bound(new AbortController().signal));
    } catch (err) {
      this.#log.error({ key: watched.key, err }, "cannot end the processes of a pod whose supervisor is gone");
    }
    this.#finish(watched, (await this.#readExit(watched.dir)) ?? {
      status: UNKNOWN,
      exitedAt: now(),
      reason: 'exit status unknown: the sandbox supervisor was killed before it could record it',
    });
    await this.#killTasks(watched.key);
  }

  /** Ends every process of the sandbox: its cgroup's, or without cgroups its process group. */
  async #endSandbox(watched: Watched, bound: Bound): Promise<void> {
    if (this.#opts.cgroups !== undefined) {
      await this.#endCgroup(watched.key, watched.cgroupPath, bound);
      return;
    }
    await endProcess(sandboxOf(watched.handle), bound, { group: true });
  }

  #finish(watched: Watched, exit: ExitInfo): void {
    this.#watched.delete(watched.key);
    // A supervisor that relays the pod's task calls goes on serving them until the Shutdown.
    if (watched.handle.link !== undefined && !watched.ending) this.#serving.set(watched.key, watched.handle);
    this.#dropNotice(watched.key);
    watched.fire(exit);
  }

  /**
   * Removes the sandbox's exit notice. The supervisor touches it just after it writes the exit
   * file, so an exit read first (a Stop's poll) can come before it: it is removed again once the
   * supervisor has ended (its 'exit' event, or the end of its serving).
   */
  #dropNotice(key: string): void {
    const [ns, id] = key.split('/') as [string, string];
    unlink(this.#opts.layout.exitNotice(ns, id)).catch(ignoreError('a leftover notice only makes tsbox look at the exit file again'));
  }

  async #pollSupervisors(): Promise<void> {
    for (const watched of this.#watched.values()) {
      if (watched.exited) continue;
      if (this.#unwatched || (!watched.child && !(await this.#alive(watched.handle)))) await this.#collect(watched);
    }
  }

  #cgroupPath(spec: LaunchSpec): string {
    return sandboxCgroupPath(this.#opts.cgroupParent, spec.namespace, spec.id, spec.pod);
  }

  /** The namespaces the sandbox gets of its own: all four, less those a pod takes from the host. */
  #unshare(spec: LaunchSpec): string[] {
    if (!this.#opts.namespaces) return [];
    const pod = spec.pod;
    const own = ['mnt'];
    if (pod?.pid !== 'node') own.push('pid');
    if (pod?.ipc !== 'node') own.push('ipc');
    if (pod?.network !== 'node') own.push('uts');
    return own;
  }

  async start(spec: LaunchSpec, signal: CallSignal): Promise<RunningSandbox> {
    const { layout, cgroups, shimPath, podFiles } = this.#opts;
    const pod = spec.pod;
    if (pod !== undefined && !this.#opts.namespaces) {
      throw new TsboxError('FailedPrecondition', 'a Kubernetes pod needs namespaces of its own: run tsbox as root with namespaces = true');
    }
    const slice = sliceOf(pod?.cgroupParent);
    if (slice !== undefined && this.#opts.systemd === undefined) {
      throw new TsboxError(
        'FailedPrecondition',
        `cgroup_parent ${JSON.stringify(pod?.cgroupParent)} is a systemd slice (kubelet's systemd cgroup driver), but systemd is not this node's init (/run/systemd/system is absent): set kubelet's cgroupDriver to cgroupfs`,
      );
    }
    const dir = layout.sandboxDir(spec.namespace, spec.id);
    await mkdir(dir, { recursive: true, mode: 0o700 });
    await allOrFirstError([rm(join(dir, 'exit'), { force: true }), rm(join(dir, 'pid'), { force: true })]);
    const args = ['--dir', dir, '--notify', layout.exitNotice(spec.namespace, spec.id), '--log', join(dir, 'console.log')];
    const unshare = this.#unshare(spec);
    if (unshare.length > 0) args.push('--unshare', unshare.join(','));
    if (spec.hostname !== undefined && unshare.includes('uts')) args.push('--hostname', spec.hostname);
    if (spec.netnsPath !== undefined) args.push('--netns', spec.netnsPath);
    for (const [key, value] of Object.entries(pod?.sysctls ?? {})) args.push('--sysctl', `${key}=${value}`);
    // On the Task API route the supervisor also owns the pod's task socket and relays
    // containerd's calls on it to tsbox over the pod's link.
    const sockets = this.#onTaskRoute(spec) ? layout.podSockets(spec.namespace, spec.id) : undefined;
    if (sockets !== undefined) args.push('--task-socket', sockets.task, '--link', sockets.link, '--relay-log', join(dir, 'relay.log'));
    // systemd puts the supervisor into the pod's scope; it goes back to tsbox's cgroups once
    // the sandbox process runs there, so that the scope holds the pod alone.
    if (slice !== undefined) for (const home of ownCgroupDirs()) args.push('--home', home);
    if (spec.command !== undefined) args.push('--cwd', spec.command.cwd, '--', ...spec.command.args);
    const env: Record<string, string> = {};
    for (const pair of spec.command?.env ?? []) {
      const eq = pair.indexOf('=');
      if (eq > 0) env[pair.slice(0, eq)] = pair.slice(eq + 1);
    }

    let child: ChildProcess | undefined;
    let reply: { shimPid: number; pid: number };
    let [t0, t1, t2] = [0, 0, 0];
    const limits = pod === undefined ? undefined : sandboxLimits(pod);
    try {
      if (pod !== undefined && podFiles === undefined) throw new TsboxError('FailedPrecondition', 'pod files need root: tsbox cannot make them here');
      if (cgroups === undefined && limits !== undefined) throw new TsboxError('FailedPrecondition', 'the pod sets resource limits, but tsbox has no cgroups here');
      // The pod's files and its cgroup side by side; both settle before a failure is cleaned up.
      t0 = performance.now();
      const [files, dirs] = await allOrFirstError([
        pod === undefined || podFiles === undefined ? Promise.resolve<{ readonly shm?: string }>({}) : podFiles.create(spec.id, pod),
        cgroups === undefined || slice !== undefined
          ? Promise.resolve<string[]>([])
          : cgroups.create(this.#cgroupPath(spec), limits).catch((err: unknown) => {
              throw err instanceof TsboxError ? err : new TsboxError('Internal', `create cgroup: ${messageOf(err)}`, { cause: err });
            }),
      ]);
      if (files.shm !== undefined) args.splice(args.indexOf('--log'), 0, '--shm', files.shm, '--shm-size', String(POD_SHM_BYTES));
      for (const cgroup of dirs) args.splice(args.indexOf('--log'), 0, '--cgroup', cgroup);
      // In a slice, the supervisor waits until systemd has put it in the sandbox's scope.
      if (slice !== undefined) args.unshift('--hold');
      t1 = performance.now();
      // Started by a serving process when one is free (no fork of tsbox); one that must wait
      // for systemd's scope (--hold) is tsbox's own child.
      const timeoutMs = this.#opts.startTimeoutMs;
      const started = slice === undefined ? spawnThrough(this.#opts.starter, { path: shimPath, args, env }, { timeoutMs, signal, timeoutError: () => supervisorTimeout(timeoutMs) }) : undefined;
      if (started === undefined) child = spawn(shimPath, args, { detached: true, stdio: [slice === undefined ? 'ignore' : 'pipe', 'pipe', 'pipe'], env, cwd: '/' });
      const replied = started === undefined ? readReply(child as ChildProcess, timeoutMs, signal) : started.then(replyOf);
      if (slice !== undefined && child !== undefined) {
        await this.#enterScope(child, spec, slice, limits).catch((err: unknown) => {
          replied.catch(ignoreError('the start failed before the supervisor was let go; its answer says only that'));
          throw err;
        });
      }
      reply = await replied;
      t2 = performance.now();
      if (pod !== undefined) await this.#setOomScoreAdj(reply.pid, limits?.oomScoreAdj ?? SANDBOX_OOM_SCORE_ADJ);
    } catch (err) {
      // Whatever the attempt started goes, within the kill bound (also when the call's own
      // signal ended it): the supervisor's group at once, then every process of the cgroup,
      // where a sandbox may have forked before its pid file existed.
      const bound = this.#bound(signal.aborted ? new AbortController().signal : signal);
      if (child !== undefined && child.exitCode === null && child.signalCode === null) signalGroup(child.pid ?? 0, 'SIGKILL');
      await this.#abandon(spec, bound).catch((e: unknown) => this.#log.error({ err: e }, 'cannot end the processes of a failed start'));
      await this.#removeCgroup(spec, bound).catch((e: unknown) => this.#log.error({ err: e }, 'cannot remove the cgroup of a failed start'));
      await podFiles?.remove(spec.id).catch((e: unknown) => this.#log.warn({ err: e }, 'cannot remove the pod files of a failed start'));
      throw err;
    }
    child?.unref();
    const [shim, sandbox] = await Promise.all([processIdOf(reply.shimPid), processIdOf(reply.pid)]);
    const handle: ProcessHandle = {
      shimPid: reply.shimPid,
      shimStart: shim?.start ?? '',
      pid: reply.pid,
      pidStart: sandbox?.start ?? '',
      ...(sockets === undefined ? {} : { link: sockets.link }),
    };
    const key = `${spec.namespace}/${spec.id}`;
    const watched = new Watched(key, dir, handle, child !== undefined);
    watched.cgroupPath = this.#cgroupPath(spec);
    this.#watched.set(key, watched);
    this.#attach(key, handle);
    if (child !== undefined) {
      // The supervisor writes the exit file before it exits, so its exit is the moment to
      // read it, also when the sandbox ended before its start time could be read.
      const exited = (): void => {
        watched.childExited = true;
        if (watched.exited) this.#dropNotice(key);
        else void this.#collect(watched);
      };
      child.once('exit', exited);
      if (child.exitCode !== null || child.signalCode !== null) exited();
    } else {
      // Not tsbox's child: its exit notice, or the poll of supervisors, tells its end. A notice
      // that came before it was watched went unheard: the exit file is looked at now.
      void this.#collect(watched);
    }
    const ms = (x: number): number => Math.round(x * 10) / 10;
    this.#log.debug({ ns: spec.namespace, id: spec.id, podFilesMs: ms(t1 - t0), supervisorMs: ms(t2 - t1), afterMs: ms(performance.now() - t2) }, 'sandbox process running');
    return watched;
  }

  /**
   * Has systemd make the sandbox's scope in the pod's slice with the held supervisor in it,
   * writes the pod's limits to the scope's cgroup files (systemd has them as properties too),
   * then lets the supervisor go on: the sandbox process starts in the scope.
   */
  async #enterScope(child: ChildProcess, spec: LaunchSpec, slice: string, limits: Resources | undefined): Promise<void> {
    // A supervisor that could not be spawned has no pid: its 'error' fails the start.
    const { systemd, cgroups } = this.#opts;
    if (child.pid === undefined || systemd === undefined) return;
    // A supervisor that died meanwhile makes the write fail: its exit fails the start.
    child.stdin?.on('error', (err) => this.#log.warn({ err }, 'cannot let the sandbox supervisor go on'));
    try {
      await systemd.start({ unit: scopeUnit(spec.id), slice, pid: child.pid, description: `tsbox sandbox ${spec.namespace}/${spec.id}`, limits });
      if (limits !== undefined) await cgroups?.applyLimits(this.#cgroupPath(spec), limits);
    } catch (err) {
      child.stdin?.destroy();
      throw err;
    }
    child.stdin?.end(GO_AHEAD);
  }

  /** Removes the sandbox's cgroup: its scope, for a pod in a slice (systemd removes the cgroup). */
  async #removeCgroup(spec: LaunchSpec, bound: Bound): Promise<void> {
    if (sliceOf(spec.pod?.cgroupParent) !== undefined) await this.#opts.systemd?.stop(scopeUnit(spec.id));
    else await this.#opts.cgroups?.remove(this.#cgroupPath(spec), bound);
  }

  /**
   * Sets the sandbox process's oom_score_adj. Lowering it below tsbox's own needs
   * CAP_SYS_RESOURCE; without it the sandbox keeps tsbox's value, as CRI's
   * restrict_oom_score_adj does for a pause container, and a warning says so once.
   */
  async #setOomScoreAdj(pid: number, value: number): Promise<void> {
    try {
      await writeProcFile(`/proc/${pid}/oom_score_adj`, String(value));
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      if (code !== 'EACCES' && code !== 'EPERM') throw new TsboxError('Internal', `set oom_score_adj of ${pid}: ${messageOf(err)}`, { cause: err });
      if (!this.#oomWarned) {
        this.#oomWarned = true;
        this.#log.warn({ wanted: value, err }, 'cannot lower a sandbox\'s oom_score_adj below tsbox\'s own (no CAP_SYS_RESOURCE): sandboxes keep tsbox\'s');
      }
    }
  }

  /**
   * Version 3 for a pod of a handler on the Task API route: containerd speaks the Task API to
   * tsbox's task socket. Otherwise version 2 (SPEC.md section 7): containerd runs the CRI
   * handler's runtime shim for the pod's containers itself; the address is the socket that
   * shim serves the pod on.
   */
  endpoint(spec: LaunchSpec): TaskEndpoint {
    if (this.#onTaskRoute(spec)) return { address: `ttrpc+unix://${this.#opts.layout.podSockets(spec.namespace, spec.id).task}`, version: 3 };
    return { address: `ttrpc+unix://${shimSocketPath(this.#opts.containerdAddress, spec.namespace, spec.id)}`, version: 2 };
  }

  #onTaskRoute(spec: LaunchSpec): boolean {
    const handler = spec.runtimeHandler;
    return handler !== undefined && this.#opts.taskApi?.handlers.includes(handler) === true;
  }

  /**
   * Ends a supervisor that served its pod's tasks after the sandbox's exit (SIGTERM, which it
   * takes once its sandbox has exited; SIGKILL if it is still there after half the kill bound),
   * and removes the pod's sockets.
   */
  async #endServing(spec: LaunchSpec): Promise<void> {
    const key = `${spec.namespace}/${spec.id}`;
    const handle = this.#serving.get(key);
    this.#serving.delete(key);
    const released = this.#opts.taskApi?.release(key);
    if (handle !== undefined) {
      // Its link closes as it ends: that wakes the wait, not the poll's next turn.
      await endProcess(supervisorOf(handle), this.#bound(new AbortController().signal), {
        gentle: true,
        ...(released === undefined ? {} : { wake: released }),
        onStubborn: () => this.#log.warn({ key, supervisor: handle.shimPid }, 'the supervisor did not end on SIGTERM: SIGKILL'),
      });
    }
    this.#dropNotice(key);
    const sockets = this.#opts.layout.podSockets(spec.namespace, spec.id);
    await allOrFirstError([rm(sockets.task, { force: true }), rm(sockets.link, { force: true })]);
  }

  async teardown(spec: LaunchSpec, stage: TeardownStage): Promise<void> {
    const { podFiles } = this.#opts;
    if (stage === 'stop') {
      await podFiles?.unmount(spec.id);
      return;
    }
    const log = this.#log.child({ ns: spec.namespace, id: spec.id });
    const key = `${spec.namespace}/${spec.id}`;
    await this.#opts.taskApi?.removeTasks(spec.namespace, spec.id);
    // A pod whose own process served its tasks had no runc shim: containerd was told that
    // process's socket and started none. Any other pod's shim is looked for and ended.
    const servedItself = this.#serving.has(key);
    // The pod's process or shim, and the pod's files, side by side: neither holds the other.
    await allOrFirstError([
      (async () => {
        await this.#endServing(spec);
        this.#opts.taskApi?.formerPod(key, false);
        if (servedItself) return;
        await stopPodShims(spec.namespace, spec.id, log, { containerdAddress: this.#opts.containerdAddress });
        await removeStaleShimSockets(this.#opts.containerdAddress, spec.namespace, spec.id, log);
      })(),
      podFiles?.remove(spec.id) ?? Promise.resolve(),
    ]);
  }

  async updateResources(spec: LaunchSpec, sandbox: RunningSandbox, limits: Resources): Promise<void> {
    const { cgroups } = this.#opts;
    if (cgroups === undefined) throw new TsboxError('FailedPrecondition', 'tsbox has no cgroups here: limits cannot be applied');
    if (sliceOf(spec.pod?.cgroupParent) !== undefined) await this.#opts.systemd?.update(scopeUnit(spec.id), limits);
    await cgroups.applyLimits(this.#cgroupPath(spec), limits);
    if (limits.oomScoreAdj !== undefined && (await isRunning(sandboxOf((sandbox as Watched).handle)))) {
      await this.#setOomScoreAdj(sandbox.pid, limits.oomScoreAdj);
    }
  }

  async recover(spec: LaunchSpec, raw: unknown): Promise<Recovered> {
    const dir = this.#opts.layout.sandboxDir(spec.namespace, spec.id);
    const parsed = handleSchema.safeParse(raw);
    const key = `${spec.namespace}/${spec.id}`;
    // Started by an earlier build on the Task API route: its tasks' calls come through that
    // build's node-wide task front, served as long as such a pod is left.
    if (parsed.success && parsed.data.link === undefined && this.#onTaskRoute(spec)) this.#opts.taskApi?.formerPod(key, true);
    if (!parsed.success) {
      return { kind: 'exited', exit: (await this.#readExit(dir)) ?? { status: UNKNOWN, exitedAt: now(), reason: 'exit status unknown: no process recorded' } };
    }
    const found = await superviseAgain(supervisorOf(parsed.data), () => this.#readExit(dir));
    if (found.kind === 'exited') {
      // A supervisor that relays the pod's task calls serves them on after the exit.
      if (parsed.data.link !== undefined && (await this.#alive(parsed.data))) {
        this.#serving.set(key, parsed.data);
        this.#attach(key, parsed.data);
      }
      return { kind: 'exited', exit: found.exit };
    }
    if (found.kind === 'running') {
      // The supervisor lives; the sandbox pid is trusted only with its start time, else it
      // is taken from the supervisor's own pid file.
      const handle = await this.#verifiedHandle(dir, parsed.data);
      if (handle !== undefined) {
        const watched = new Watched(key, dir, handle, false);
        watched.cgroupPath = this.#cgroupPath(spec);
        this.#watched.set(key, watched);
        this.#attach(key, handle);
        return { kind: 'running', sandbox: watched };
      }
      this.#log.warn({ key, pid: parsed.data.pid }, 'recorded sandbox pid is not the sandbox process; removing the sandbox');
      // Recovery has no call of its own: the kill bound alone limits the wait.
      await this.abandon(spec, new AbortController().signal);
      return {
        kind: 'exited',
        exit: (await this.#readExit(dir)) ?? { status: UNKNOWN, exitedAt: now(), reason: 'exit status unknown: the recorded process was not the sandbox' },
      };
    }
    // The supervisor was killed while tsbox was away: the pod ends with it (#supervisorLost).
    this.#log.warn({ key }, "the sandbox's supervisor was killed while tsbox was away: ending the pod, exit status unknown (255)");
    const watched = new Watched(key, dir, parsed.data, false);
    watched.cgroupPath = this.#cgroupPath(spec);
    watched.ending = true;
    await this.#endSandbox(watched, this.#bound(new AbortController().signal)).catch((err: unknown) =>
      this.#log.error({ key, err }, "cannot end the processes of a pod whose supervisor is gone"),
    );
    await this.#killTasks(key);
    return {
      kind: 'exited',
      exit: (await this.#readExit(dir)) ?? { status: UNKNOWN, exitedAt: now(), reason: 'exit status unknown: the sandbox supervisor was killed' },
    };
  }

  /** The handle with a sandbox pid that is really the supervisor's child, or undefined. */
  async #verifiedHandle(dir: string, handle: ProcessHandle): Promise<ProcessHandle | undefined> {
    if (await isRunning(sandboxOf(handle))) return handle;
    // No pid file to correct the handle with: the handle is not verified.
    const text = (await readIfPresentNow(join(dir, 'pid'))) ?? '';
    const [shimPid, pid] = text.trim().split(' ').map(Number);
    if (shimPid !== handle.shimPid || pid === undefined) return undefined;
    const stat = await processStat(pid);
    return stat?.parent === shimPid ? { ...handle, pid, pidStart: stat.startTime } : undefined;
  }

  #bound(signal: CallSignal): Bound {
    return boundOf(this.#opts.killTimeoutMs, signal);
  }

  abandon(spec: LaunchSpec, signal: CallSignal): Promise<void> {
    return this.#abandon(spec, this.#bound(signal));
  }

  /**
   * Ends a sandbox tsbox has no running record of: the process group its supervisor's pid
   * file names (when it is this sandbox's), then every process of its cgroup. Without
   * cgroups, waits for the supervisor to be gone.
   */
  async #abandon(spec: LaunchSpec, bound: Bound): Promise<void> {
    const dir = this.#opts.layout.sandboxDir(spec.namespace, spec.id);
    // No pid file: the supervisor never ran. Unreadable: its process must not be left
    // running without a record, so the caller hears of it (readIfPresent throws).
    const text = (await readIfPresentNow(join(dir, 'pid'))) ?? '';
    const [shimPid = 0, pid = 0] = text.trim().split(' ').map(Number);
    const key = `${spec.namespace}/${spec.id}`;
    const path = this.#cgroupPath(spec);
    let ours = false;
    let supervisor: ProcessId | undefined;
    if (pid > 0) {
      // Only a supervisor whose command line names this sandbox's directory is ours; without
      // it, a sandbox process is ours only if it sits in this sandbox's cgroup. A process
      // that is gone has neither file: nothing of it is ours to kill.
      const cmdline = (await readIfPresent(`/proc/${shimPid}/cmdline`)) ?? '';
      const cgroup = (await readIfPresentNow(`/proc/${pid}/cgroup`)) ?? '';
      ours = cmdline.split('\0').includes(dir) || cgroup.split('\n').some((line) => line.endsWith(`:${path}`));
      if (ours) {
        supervisor = shimPid > 0 ? await processIdOf(shimPid) : undefined;
        this.#log.warn({ ns: spec.namespace, id: spec.id, pid }, 'killing a sandbox process whose start never answered');
        signalGroup(pid, 'SIGKILL');
        // A supervisor that relays task calls would outlive its sandbox: it goes too.
        if (cmdline.split('\0').includes(dir)) signalProcess(shimPid, 'SIGKILL');
      }
    }
    const sockets = this.#opts.layout.podSockets(spec.namespace, spec.id);
    await allOrFirstError([rm(sockets.task, { force: true }), rm(sockets.link, { force: true })]);
    if (this.#opts.cgroups !== undefined) {
      await this.#endCgroup(key, path, bound);
    } else if (supervisor !== undefined && !(await untilGone(supervisor, bound))) {
      throw new TsboxError('DeadlineExceeded', `the supervisor ${shimPid} of sandbox ${key} is still there ${bound.ms} ms after its sandbox was killed (kill_timeout_ms)`);
    }
  }

  /** Ends every process of the sandbox's cgroup; says in the log which, when some outlive the bound. */
  async #endCgroup(key: string, path: string, bound: Bound): Promise<void> {
    const { cgroups } = this.#opts;
    if (cgroups === undefined) return;
    try {
      await cgroups.kill(path, bound);
    } catch (err) {
      if (!bound.signal.aborted) this.#log.error({ key, cgroup: `v${cgroups.version}:${path}`, err }, `cannot end the processes of the sandbox: ${messageOf(err)}`);
      throw err;
    }
  }

  /** Sends `signal` to the sandbox's process group, only if it is still the recorded process. */
  async #signal(watched: Watched, signal: NodeJS.Signals): Promise<void> {
    // Signals go only to the process recorded with this start time, never to a reused pid.
    if (watched.exited) return;
    await signalIfRunning(sandboxOf(watched.handle), signal, { group: true });
  }

  async terminate(sandbox: RunningSandbox): Promise<void> {
    await this.#signal(sandbox as Watched, 'SIGTERM');
  }

  /**
   * SIGKILL to the sandbox's process group; half the bound for it to die of that and its
   * supervisor to record the exit (137), the rest to end everything in its cgroup (what the
   * sandbox left outside its group) and for the supervisor to record that exit.
   */
  async kill(sandbox: RunningSandbox, signal: CallSignal): Promise<void> {
    const watched = sandbox as Watched;
    const bound = this.#bound(signal);
    await this.#signal(watched, 'SIGKILL');
    const exited = async (): Promise<boolean> => {
      await this.#collect(watched);
      return watched.exited;
    };
    if (await untilExit(watched, exited, { ...bound, deadline: Date.now() + bound.ms / 2 })) return;
    await this.#endSandbox(watched, bound);
    await untilExit(watched, exited, bound);
    if (!watched.exited) {
      throw new TsboxError('DeadlineExceeded', `sandbox ${watched.key}: process ${watched.pid} is still there ${bound.ms} ms after SIGKILL (kill_timeout_ms)`);
    }
  }

  async release(spec: LaunchSpec, signal: CallSignal): Promise<void> {
    const { cgroups } = this.#opts;
    // What an exited sandbox usually leaves: an empty cgroup, removed at once (rmdir fails
    // with EBUSY on one that still holds a process or a cgroup below, which then goes the long way).
    const path = this.#cgroupPath(spec);
    const emptyGone = cgroups !== undefined && sliceOf(spec.pod?.cgroupParent) === undefined && (await cgroups.removeIfEmpty(path));
    if (!emptyGone) {
      // Whatever the sandbox left in its cgroup (a child that left its process group) goes too.
      if (cgroups !== undefined) await this.#endCgroup(`${spec.namespace}/${spec.id}`, path, this.#bound(signal));
      await this.#removeCgroup(spec, this.#bound(signal));
    }
    await unlink(this.#opts.layout.exitNotice(spec.namespace, spec.id)).catch(
      ignoreError('usually absent; a leftover notice only makes tsbox look at the exit file again'),
    );
  }

  async metrics(spec: LaunchSpec, _sandbox: RunningSandbox | undefined): Promise<AnyValue> {
    const { cgroups } = this.#opts;
    if (cgroups === undefined) throw new TsboxError('Unimplemented', 'metrics need cgroups, which are not available to tsbox here');
    // Read while the cgroup is there (a sandbox that ended keeps it until it is removed); NotFound after.
    return cgroups.metrics(this.#cgroupPath(spec));
  }

  describe(sandbox: RunningSandbox): Record<string, unknown> {
    const watched = sandbox as Watched;
    return {
      supervisorPid: watched.handle.shimPid,
      directory: watched.dir,
      cgroup: this.#opts.cgroups === undefined ? undefined : `v${this.#opts.cgroups.version}:${watched.cgroupPath}`,
      namespaces: this.#opts.namespaces,
      ...(watched.handle.link === undefined ? {} : { link: watched.handle.link }),
    };
  }

  placement(spec: LaunchSpec, sandbox: RunningSandbox): SandboxPlacement {
    // /proc names the namespaces by these files; the OCI spec by these types.
    const types: Record<string, string> = { mnt: 'mount', pid: 'pid', ipc: 'ipc', uts: 'uts' };
    const namespaces = this.#unshare(spec).map((file) => ({ type: types[file] ?? file, path: `/proc/${sandbox.pid}/ns/${file}` }));
    if (spec.netnsPath !== undefined) namespaces.push({ type: 'network', path: spec.netnsPath });
    const slice = sliceOf(spec.pod?.cgroupParent);
    // runc's systemd form names the scope the sandbox is in (scopeUnit: cri-containerd-ID.scope).
    const cgroupsPath = slice !== undefined ? `${slice}:cri-containerd:${spec.id}` : this.#opts.cgroups === undefined ? undefined : this.#cgroupPath(spec);
    const args = spec.command?.args ?? [join(dirname(this.#opts.shimPath), PAUSE_PROGRAM), (sandbox as Watched).dir];
    return { namespaces, ...(cgroupsPath === undefined ? {} : { cgroupsPath }), args: [...args] };
  }

  close(): void {
    this.#watcher?.close();
    this.#opts.systemd?.close();
    clearInterval(this.#poll);
  }
}

/**
 * Reads the supervisor's one-line answer. A supervisor that does not answer within
 * `timeoutMs`, or a Start call that ends first, fails the start; the caller kills what was
 * started.
 */
async function readReply(child: ChildProcess, timeoutMs: number, signal: CallSignal): Promise<{ shimPid: number; pid: number }> {
  const answer = await readChildAnswer(child, {
    timeoutMs,
    timeoutError: () => supervisorTimeout(timeoutMs),
    spawnError: (e) => new TsboxError('Internal', `cannot run the sandbox supervisor: ${e.message}`, { cause: e }),
    signal,
    abortError,
  });
  return replyOf(programAnswerOf(answer));
}

function supervisorTimeout(timeoutMs: number): TsboxError {
  return new TsboxError('FailedPrecondition', `cannot start sandbox: its supervisor did not answer within ${timeoutMs} ms (a network namespace or cgroup that blocks?)`);
}

/** The supervisor's answer: its two pids, or the error it (or what it wrote instead) says. */
function replyOf(said: ProgramAnswer): { shimPid: number; pid: number } {
  const line = 'line' in said ? said.line : '';
  const ok = /^ok (\d+) (\d+)$/.exec(line);
  if (ok !== null) return { shimPid: Number(ok[1]), pid: Number(ok[2]) };
  if (line.startsWith('error ')) throw new TsboxError('FailedPrecondition', `cannot start sandbox: ${line.slice(6)}`);
  throw new TsboxError('Internal', `sandbox supervisor failed: ${('line' in said ? line : said.said).slice(0, 300)}`);
}
