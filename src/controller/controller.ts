import type { Logger } from 'pino';
import { TsboxError, allOrFirstError, messageOf } from '../base/errors.js';
import { LinuxContainerResources } from '../gen/runtime/v1/pod_sandbox_config.js';
import { SerialQueue } from '../base/serial-queue.js';
import { MAX_TIMER_MS, msOf, systemClock, systemSchedule, timestampOf, type Clock, type Schedule } from './clock.js';
import { ExitSignal, type ExitListener } from './exit-signal.js';
import { deriveLaunchSpec, isType, type CreateInput } from './launch-spec.js';
import { resourcesOf, sandboxLimits, type Resources } from './pod-spec.js';
import { podRuntimeSpec, updatedResourcesOf, UPDATED_RESOURCES_KEY, UPDATED_RESOURCES_TYPE } from './runtime-spec.js';
import { protocolState, transition, type SandboxEvent, type SandboxState } from './state-machine.js';
import type {
  CallSignal,
  AnyValue,
  ExitInfo,
  HostPlatform,
  LaunchSpec,
  PodContainers,
  RecordStore,
  RunningSandbox,
  RuntimeBackend,
  SandboxRecord,
  Timestamp,
} from './types.js';
import { NO_POD_CONTAINERS } from './types.js';

/** Create's input, decoded by the transport. */
export interface CreateRequest extends CreateInput {
  readonly labels: Readonly<Record<string, string>>;
  readonly annotations: Readonly<Record<string, string>>;
}

/** Start's answer. */
export interface StartResult {
  readonly pid: number;
  readonly createdAt: Timestamp;
  readonly labels: Readonly<Record<string, string>>;
  /** The task endpoint (SPEC.md section 7); '' and 0 when the backend has none. */
  readonly address: string;
  readonly version: number;
  /** The pod's OCI runtime spec (runtime-spec.ts): containerd 2.3 keeps it for CRI and NRI. */
  readonly spec: Record<string, unknown>;
}

/** Status's answer. */
export interface StatusResult {
  readonly pid: number;
  readonly state: string;
  readonly address: string;
  readonly version: number;
  readonly createdAt?: Timestamp;
  readonly exitedAt?: Timestamp;
  readonly info?: Record<string, string>;
}

/** Update's input: what to replace, named by `fields` (all of them when empty). */
export interface UpdateRequest {
  readonly labels: Readonly<Record<string, string>>;
  readonly extensions: Readonly<Record<string, AnyValue>>;
  readonly annotations?: Readonly<Record<string, string>>;
  readonly fields: readonly string[];
}

const NO_ENDPOINT = { address: '', version: 0 } as const;

/** For callers without a call of their own (recovery, tests): a signal that never fires. */
const NEVER_ABORTED: CallSignal = new AbortController().signal;

/** The status a sandbox reports when its exit cannot be known (containerd's convention). */
export const UNKNOWN_EXIT_STATUS = 255;

/**
 * Named points in the operations where a crash is most harmful. The crash tests make the
 * daemon die at one of them (see `crashAt` in src/config/config.ts); in normal use this is a no-op.
 */
export type CrashPoint =
  | 'create:after-save'
  | 'start:before-spawn'
  | 'start:after-spawn'
  | 'start:after-record'
  | 'stop:after-kill'
  | 'exit:before-save'
  | 'exit:after-save'
  | 'shutdown:after-kill'
  | 'shutdown:before-remove'
  | 'shutdown:after-remove';

export const CRASH_POINTS: readonly CrashPoint[] = [
  'create:after-save',
  'start:before-spawn',
  'start:after-spawn',
  'start:after-record',
  'stop:after-kill',
  'exit:before-save',
  'exit:after-save',
  'shutdown:after-kill',
  'shutdown:before-remove',
  'shutdown:after-remove',
];

export interface ControllerOptions {
  /** Called at each CrashPoint; the daemon's hook dies there when told to. */
  readonly crashPoint?: ((point: CrashPoint) => void) | undefined;
  readonly backend: RuntimeBackend;
  readonly store: RecordStore;
  readonly logger: Logger;
  readonly platform: HostPlatform;
  readonly stateDir: string;
  readonly clock?: Clock;
  /** Timers (a graceful Stop's SIGKILL); injectable for tests. */
  readonly schedule?: Schedule;
  /** CRI's view of a pod's containers, which a Stop waits to settle; none when absent. */
  readonly podContainers?: PodContainers;
}

/** Counts of a recovery, for the start-up summary line. */
export interface RecoverySummary {
  readonly recovered: number;
  readonly running: number;
  readonly exited: number;
  readonly created: number;
  readonly quarantined: number;
  readonly seconds: number;
}

/**
 * One sandbox in memory. `state` is what callers see and changes only through `moveTo`,
 * after the change is durable. `record` is what is (being) written: it changes first, at
 * the moment a write is issued, so every later write carries every earlier change.
 */
class Sandbox {
  state: SandboxState;
  record: SandboxRecord;
  /** The running process; undefined when none runs or none could be found after a restart. */
  running: RunningSandbox | undefined;
  /** Set once the exit is being recorded, so it is recorded once. */
  exiting: Promise<void> | undefined;
  readonly exit = new ExitSignal();
  /** Cancels the timer that SIGKILLs the sandbox at `record.killAt`. */
  cancelKill: (() => void) | undefined;
  /** Told when that SIGKILL fails, so that a Stop waiting for the exit hears why. */
  readonly killFailures = new Set<(err: unknown) => void>();

  constructor(
    record: SandboxRecord,
    readonly log: Logger,
  ) {
    this.record = record;
    this.state = record.state;
  }

  /** What to run, as the record says: an Update of the pod's resources changes both at once. */
  get spec(): LaunchSpec {
    return { namespace: this.record.namespace, id: this.record.id, ...this.record.launch };
  }

  moveTo(event: SandboxEvent): SandboxState {
    const from = this.state;
    this.state = transition(from, event);
    this.log.info({ from, to: this.state, event }, 'sandbox state changed');
    return this.state;
  }
}

const keyOf = (namespace: string, id: string): string => `${namespace}\u0000${id}`;

/**
 * The nine operations of the Sandbox Controller API over a table of sandboxes keyed by
 * (namespace, id). Mutations of one sandbox run one at a time (a SerialQueue keyed by it); reads
 * (Status, Wait, Platform, Metrics) never wait for them. An exit is persisted before any
 * waiter sees it.
 */
export class Controller {
  readonly #sandboxes = new Map<string, Sandbox>();
  /** The mutations of each sandbox, in turn. */
  readonly #queue = new SerialQueue();
  readonly #backend: RuntimeBackend;
  readonly #podContainers: PodContainers;
  readonly #store: RecordStore;
  readonly #log: Logger;
  readonly #platform: HostPlatform;
  readonly #clock: Clock;
  readonly #schedule: Schedule;
  readonly #stateDir: string;
  readonly #crash: (point: CrashPoint) => void;

  constructor(options: ControllerOptions) {
    this.#crash = options.crashPoint ?? (() => undefined);
    this.#backend = options.backend;
    this.#store = options.store;
    this.#log = options.logger;
    this.#platform = options.platform;
    this.#clock = options.clock ?? systemClock;
    this.#schedule = options.schedule ?? systemSchedule;
    this.#stateDir = options.stateDir;
    this.#podContainers = options.podContainers ?? NO_POD_CONTAINERS;
  }

  /** Number of sandboxes known. */
  get size(): number {
    return this.#sandboxes.size;
  }

  #find(namespace: string, id: string): Sandbox {
    const sandbox = this.#sandboxes.get(keyOf(namespace, id));
    if (sandbox === undefined) throw new TsboxError('NotFound', `sandbox ${id} not found in namespace ${namespace}`);
    return sandbox;
  }

  /** Runs `operation` after the mutations of `sandbox` queued before it. */
  #inTurn<T>(sandbox: Sandbox, operation: () => Promise<T>): Promise<T> {
    return this.#queue.run(keyOf(sandbox.record.namespace, sandbox.record.id), operation);
  }

  #childLog(namespace: string, id: string): Logger {
    return this.#log.child({ ns: namespace, id });
  }

  /**
   * Applies `changes` to the sandbox's record and writes it. The record changes before the
   * write is issued and writes of one sandbox land in the order issued, so a write never
   * undoes an earlier one (an Update racing an exit keeps the exit).
   */
  #write(sandbox: Sandbox, changes: Partial<SandboxRecord>): Promise<void> {
    sandbox.record = { ...sandbox.record, ...changes };
    return this.#store.save(sandbox.record);
  }

  /** Registers a sandbox; nothing runs. Durable when it returns. */
  async create(namespace: string, id: string, request: CreateRequest): Promise<void> {
    const key = keyOf(namespace, id);
    if (this.#sandboxes.has(key)) {
      throw new TsboxError('AlreadyExists', `sandbox ${id} already exists in namespace ${namespace}`);
    }
    const spec = deriveLaunchSpec(namespace, id, request);
    const { namespace: _ns, id: _id, ...launch } = spec;
    const record: SandboxRecord = {
      version: 1,
      namespace,
      id,
      state: 'created',
      registeredAt: this.#clock(),
      launch,
      labels: { ...request.labels },
      annotations: { ...request.annotations },
      extensions: encodeExtensions(request.extensions),
    };
    const sandbox = new Sandbox(record, this.#childLog(namespace, id));
    // In the table before the write, so a concurrent Create of the same id fails at once
    // and a Start queues behind the write.
    this.#sandboxes.set(key, sandbox);
    await this.#inTurn(sandbox, async () => {
      try {
        await this.#store.save(record);
      } catch (err) {
        this.#sandboxes.delete(key);
        throw err;
      }
      this.#crash('create:after-save');
      sandbox.log.info({ state: 'created' }, 'sandbox created');
    });
  }

  /** Runs the sandbox. On any failure nothing of the attempt remains and it stays created. */
  async start(namespace: string, id: string, signal: CallSignal = NEVER_ABORTED): Promise<StartResult> {
    const sandbox = this.#find(namespace, id);
    return this.#inTurn(sandbox, async () => {
      this.#ensureKnown(sandbox);
      // 'starting' is not written: a process a crash leaves behind before the 'running'
      // record is found through the supervisor's pid file at recovery and removed.
      sandbox.moveTo('start');
      let running: RunningSandbox | undefined;
      try {
        this.#crash('start:before-spawn');
        const t0 = performance.now();
        running = await this.#backend.start(sandbox.spec, signal);
        this.#crash('start:after-spawn');
        const t1 = performance.now();
        const startedAt = this.#clock();
        const endpoint = this.#backend.endpoint(sandbox.spec);
        await this.#write(sandbox, { state: 'running', startedAt, pid: running.pid, backend: running.handle, endpoint });
        sandbox.moveTo('started');
        sandbox.log.debug({ runMs: roundMs(t1 - t0), recordMs: roundMs(performance.now() - t1) }, 'sandbox started');
        this.#crash('start:after-record');
      } catch (err) {
        await this.#undoStart(sandbox, running, err, signal);
        // CRI forgets a pod whose Start failed and never calls Shutdown for it (SPEC.md
        // section 3): its record would stay for good. Other clients may Start it again.
        if (sandbox.spec.pod !== undefined) {
          await this.#remove(sandbox, signal.aborted ? NEVER_ABORTED : signal).catch((e: unknown) => sandbox.log.warn({ err: e }, 'cannot forget the pod after its failed start'));
        }
        throw err;
      }
      this.#watch(sandbox, running);
      const { address, version } = sandbox.record.endpoint ?? NO_ENDPOINT;
      const spec = this.#runtimeSpec(sandbox, running);
      return { pid: running.pid, createdAt: sandbox.record.startedAt as Timestamp, labels: {}, address, version, spec };
    });
  }

  /**
   * Ends what a failed Start started, within the kill bound and the call's signal (a Start
   * ended by its own signal is still cleaned up, within the bound). What cannot be ended is
   * logged; Shutdown ends it (abandon).
   */
  async #undoStart(sandbox: Sandbox, running: RunningSandbox | undefined, cause: unknown, signal: CallSignal): Promise<void> {
    sandbox.log.warn({ err: cause }, 'start failed; cleaning up');
    const cleanup = signal.aborted ? NEVER_ABORTED : signal;
    if (running !== undefined) {
      await this.#backend.kill(running, cleanup).catch((err: unknown) => sandbox.log.error({ err }, 'cannot end what the failed start started; Shutdown will try again'));
    }
    await this.#backend.release(sandbox.spec, cleanup).catch((err: unknown) => sandbox.log.error({ err }, 'release after a failed start failed'));
    await this.#backend
      .teardown(sandbox.spec, 'shutdown')
      .catch((err: unknown) => sandbox.log.warn({ err }, 'removing the pod files after a failed start failed'));
    const { startedAt: _s, pid: _p, backend: _b, endpoint: _e, ...rest } = sandbox.record;
    sandbox.record = { ...rest, state: 'created' };
    try {
      await this.#store.save(sandbox.record);
    } catch (err) {
      sandbox.log.error({ err }, 'cannot record the failed start; recovery will clean up');
    }
    sandbox.moveTo('start-failed');
  }

  #watch(sandbox: Sandbox, running: RunningSandbox): void {
    sandbox.running = running;
    running.onExit((exit) => {
      void this.#recordExit(sandbox, exit);
    });
  }

  /**
   * Records an exit once: durable first, then the sandbox's resources released, then
   * visible (Status NOTREADY) and every waiter woken, in that order (SPEC.md section 6).
   */
  #recordExit(sandbox: Sandbox, exit: ExitInfo): Promise<void> {
    if (sandbox.state !== 'running') return Promise.resolve();
    sandbox.exiting ??= (async () => {
      this.#disarmKill(sandbox);
      this.#crash('exit:before-save');
      try {
        // The Stop's deadline is spent: the record keeps no killAt past the exit.
        const { killAt: _k, ...record } = sandbox.record;
        sandbox.record = record;
        await this.#write(sandbox, { state: 'exited', exit, pid: 0 });
        this.#crash('exit:after-save');
      } catch (err) {
        sandbox.log.error({ err }, 'cannot persist the exit; it is known only until tsbox restarts');
      }
      try {
        await this.#backend.release(sandbox.spec, NEVER_ABORTED);
      } catch (err) {
        sandbox.log.error({ err }, 'releasing the exited sandbox failed; Shutdown will try again');
      }
      sandbox.running = undefined;
      sandbox.moveTo('exit');
      sandbox.log.info({ exitStatus: exit.status, reason: exit.reason }, 'sandbox exited');
      sandbox.exit.resolve(exit);
    })();
    return sandbox.exiting;
  }

  /**
   * A sandbox recorded as running whose process could not be found after a restart: kill
   * whatever is left of it, and record the exit as unknown (255). What cannot be ended
   * fails the call, and the sandbox stays running for the next one.
   */
  async #exitUnknown(sandbox: Sandbox, signal: CallSignal): Promise<void> {
    await this.#backend.abandon(sandbox.spec, signal);
    await this.#recordExit(sandbox, {
      status: UNKNOWN_EXIT_STATUS,
      exitedAt: this.#clock(),
      reason: 'exit status unknown: the sandbox process could not be found after a restart',
    });
  }

  /** Platform of the host. */
  platform(namespace: string, id: string): HostPlatform {
    this.#find(namespace, id);
    return this.#platform;
  }

  /**
   * Stops the sandbox and returns once its exit is recorded (or the signal fires), and once
   * CRI no longer counts any of the pod's containers as running (bounded; see
   * src/containerd/cri-containers.ts). Unknown or already stopped: nothing to do. Never started:
   * counts as exited.
   */
  async stop(namespace: string, id: string, timeoutSeconds: number, signal: CallSignal): Promise<void> {
    const sandbox = this.#sandboxes.get(keyOf(namespace, id));
    if (sandbox === undefined) return;
    const t0 = performance.now();
    const settled = this.#podContainers.settled(namespace, id, signal);
    const times = await this.#stopSandbox(sandbox, timeoutSeconds, signal);
    const t1 = performance.now();
    await settled;
    sandbox.log.debug({ ...times, criMs: roundMs(performance.now() - t1), totalMs: roundMs(performance.now() - t0) }, 'sandbox stop answered');
  }

  /** Stops the sandbox; how long its parts took, for the debug log. */
  async #stopSandbox(sandbox: Sandbox, timeoutSeconds: number, signal: CallSignal): Promise<Record<string, number>> {
    const times: Record<string, number> = {};
    const t0 = performance.now();
    await this.#inTurn(sandbox, async () => {
      if (sandbox.state === 'removed') return;
      const t1 = performance.now();
      times['turnMs'] = roundMs(t1 - t0);
      // Like podsandbox's Stop: the pod's files and mounts go first of all (SPEC.md section 6),
      // begun before the sandbox is signalled and done within the Stop's turn; the kill does not
      // wait for them (they are the host's mounts and files, which the sandbox does not hold),
      // and a failure among them fails the Stop once the sandbox has been signalled.
      const files = this.#backend.teardown(sandbox.spec, 'stop').then(() => {
        times['teardownMs'] = roundMs(performance.now() - t1);
      });
      // Both settle; the signal's own failure, if any, is the one told.
      await allOrFirstError([this.#signalToStop(sandbox, timeoutSeconds, signal), files]);
    });
    const t2 = performance.now();
    times['signalMs'] = roundMs(t2 - t0) - (times['turnMs'] ?? 0);
    if (sandbox.state !== 'removed') await this.#waitExit(sandbox, signal);
    times['exitMs'] = roundMs(performance.now() - t2);
    return times;
  }

  /** What a Stop does to the sandbox in its turn, by its state: record the exit, kill, or terminate and arm the kill. */
  async #signalToStop(sandbox: Sandbox, timeoutSeconds: number, signal: CallSignal): Promise<void> {
    if (sandbox.state === 'created') {
      await this.#exitUnstarted(sandbox, 'stopped before it was started');
    } else if (sandbox.state === 'running' && sandbox.running === undefined) {
      await this.#exitUnknown(sandbox, signal);
    } else if (sandbox.state === 'running' && sandbox.running !== undefined) {
      if (timeoutSeconds === 0) {
        sandbox.log.info('killing sandbox');
        await this.#backend.kill(sandbox.running, signal);
      } else {
        await this.#keepKillDeadline(sandbox, msOf(this.#clock()) + timeoutSeconds * 1000);
        sandbox.log.info({ timeoutSeconds, killAt: new Date(msOf(sandbox.record.killAt ?? this.#clock())).toISOString() }, 'stopping sandbox');
        await this.#backend.terminate(sandbox.running);
      }
      this.#crash('stop:after-kill');
    }
  }

  /**
   * Records a graceful Stop's deadline (the earlier one when a Stop is already under way)
   * before its SIGTERM, and arms the SIGKILL for it: a tsbox restarted meanwhile finds it in
   * the record and enforces it.
   */
  async #keepKillDeadline(sandbox: Sandbox, killAtMs: number): Promise<void> {
    const current = sandbox.record.killAt;
    if (sandbox.exiting === undefined && (current === undefined || msOf(current) > killAtMs)) {
      await this.#write(sandbox, { killAt: timestampOf(killAtMs) });
    }
    this.#armKill(sandbox);
  }

  /** Arms the SIGKILL at `record.killAt` (at once when it has passed). */
  #armKill(sandbox: Sandbox): void {
    this.#disarmKill(sandbox);
    const killAt = sandbox.record.killAt;
    if (killAt === undefined) return;
    const left = msOf(killAt) - msOf(this.#clock());
    sandbox.cancelKill = this.#schedule(Math.min(Math.max(0, left), MAX_TIMER_MS), () => {
      sandbox.cancelKill = undefined;
      // A deadline beyond what one timer holds (24.8 days) takes several.
      if (msOf(killAt) > msOf(this.#clock())) {
        this.#armKill(sandbox);
        return;
      }
      void this.#inTurn(sandbox, async () => {
        const running = sandbox.running;
        if (sandbox.state !== 'running' || running === undefined) return;
        sandbox.log.info('grace period over: killing sandbox');
        await this.#backend.kill(running, NEVER_ABORTED);
      }).catch((err: unknown) => {
        sandbox.log.error({ err }, 'cannot kill the sandbox at the end of its grace period');
        for (const tell of sandbox.killFailures) tell(err);
      });
    });
  }

  #disarmKill(sandbox: Sandbox): void {
    sandbox.cancelKill?.();
    sandbox.cancelKill = undefined;
  }

  /** The exit, or the error of a SIGKILL at the end of a grace period that could not end the sandbox. */
  #waitExit(sandbox: Sandbox, signal: CallSignal): Promise<ExitInfo> {
    return new Promise<ExitInfo>((resolve, reject) => {
      sandbox.killFailures.add(reject);
      void sandbox.exit
        .wait(signal)
        .then(resolve, reject)
        .finally(() => sandbox.killFailures.delete(reject));
    });
  }

  /** A sandbox that never ran is stopped: it counts as exited, status unknown (255). */
  async #exitUnstarted(sandbox: Sandbox, reason: string): Promise<void> {
    transition(sandbox.state, 'stop-unstarted');
    const exit: ExitInfo = { status: UNKNOWN_EXIT_STATUS, exitedAt: this.#clock(), reason };
    const before = sandbox.record;
    try {
      await this.#write(sandbox, { state: 'exited', exit });
    } catch (err) {
      sandbox.record = before;
      throw err;
    }
    sandbox.moveTo('stop-unstarted');
    sandbox.exit.resolve(exit);
  }

  /**
   * Wait: `done` is told once, with the exit (the same every time) or the abort error when
   * `signal` fires first. Throws NotFound at once. No promise: a pod holds a Wait for its
   * whole life.
   */
  listen(namespace: string, id: string, signal: CallSignal, done: ExitListener): void {
    this.#find(namespace, id).exit.listen(done, signal);
  }

  /** The sandbox's state; `info["info"]` (a JSON object) only when verbose. */
  status(namespace: string, id: string, verbose: boolean): StatusResult {
    const sandbox = this.#find(namespace, id);
    const { record, state } = sandbox;
    const exit = state === 'exited' ? sandbox.exit.exit ?? record.exit : undefined;
    const { address, version } = record.endpoint ?? NO_ENDPOINT;
    const result: StatusResult = {
      state: protocolState(state),
      pid: state === 'running' ? record.pid ?? 0 : 0,
      address,
      version,
      ...(record.startedAt === undefined || state === 'starting' ? {} : { createdAt: record.startedAt }),
      ...(exit === undefined ? {} : { exitedAt: exit.exitedAt }),
    };
    if (!verbose) return result;
    return { ...result, info: { info: JSON.stringify(this.#describe(sandbox, exit)) } };
  }

  #runtimeSpec(sandbox: Sandbox, running: RunningSandbox): Record<string, unknown> {
    return podRuntimeSpec(sandbox.spec, this.#backend.placement(sandbox.spec, running), sandbox.record.annotations);
  }

  /**
   * Status's verbose info. containerd 2.3 and later read it as podsandbox's SandboxInfo and
   * write back only that struct's fields (pid, processStatus, runtimeSpec, …), each with its type there; the others reach a client of containerd 2.1 and 2.2 only.
   */
  #describe(sandbox: Sandbox, exit: ExitInfo | undefined): Record<string, unknown> {
    const { record } = sandbox;
    const running = sandbox.state === 'running' ? sandbox.running : undefined;
    // containerd's ProcessStatus words, as podsandbox reports its pause task's.
    const processStatus = running !== undefined ? 'running' : sandbox.state === 'exited' ? 'stopped' : 'created';
    const iso = (t: Timestamp | undefined): string | undefined =>
      t === undefined ? undefined : new Date(t.seconds * 1000 + Math.floor(t.nanos / 1e6)).toISOString();
    return {
      namespace: record.namespace,
      id: record.id,
      state: sandbox.state,
      backend: this.#backend.name,
      pid: sandbox.state === 'running' ? record.pid ?? 0 : 0,
      processStatus,
      ...(running === undefined ? {} : { runtimeSpec: this.#runtimeSpec(sandbox, running) }),
      hostname: record.launch.hostname,
      netnsPath: record.launch.netnsPath,
      command: record.launch.command?.args ?? 'pause',
      stateDir: this.#stateDir,
      registeredAt: iso(record.registeredAt),
      startedAt: iso(record.startedAt),
      exitedAt: iso(exit?.exitedAt),
      exitStatus: exit?.status,
      exitReason: exit?.reason,
      ...(sandbox.running === undefined ? {} : this.#backend.describe(sandbox.running)),
    };
  }

  /**
   * Deletes the sandbox from any state: stops it if it runs (answering its Waits), releases
   * everything, forgets the id. Unknown: nothing to do.
   */
  async shutdown(namespace: string, id: string, signal: CallSignal): Promise<void> {
    const key = keyOf(namespace, id);
    const sandbox = this.#sandboxes.get(key);
    if (sandbox === undefined) return;
    await this.#inTurn(sandbox, () => this.#remove(sandbox, signal));
  }

  /** Shutdown's work, in the sandbox's turn. */
  async #remove(sandbox: Sandbox, signal: CallSignal): Promise<void> {
    const { namespace, id } = sandbox.spec;
    if (sandbox.state === 'removed') return;
    const t0 = performance.now();
    if (sandbox.state === 'running' && sandbox.running === undefined) {
      await this.#exitUnknown(sandbox, signal);
    } else if (sandbox.state === 'running' && sandbox.running !== undefined) {
      sandbox.log.info('shutdown: killing running sandbox');
      await this.#backend.kill(sandbox.running, signal);
      this.#crash('shutdown:after-kill');
      await sandbox.exit.wait(signal);
    } else if (sandbox.state === 'created') {
      // A process a crashed Start left behind goes too.
      await this.#backend.abandon(sandbox.spec, signal);
      await this.#exitUnstarted(sandbox, 'shut down before it was started');
    }
    const t1 = performance.now();
    await this.#backend.release(sandbox.spec, signal);
    const t2 = performance.now();
    await this.#backend.teardown(sandbox.spec, 'shutdown');
    const t3 = performance.now();
    this.#crash('shutdown:before-remove');
    await this.#store.remove(namespace, id);
    this.#crash('shutdown:after-remove');
    sandbox.moveTo('remove');
    this.#sandboxes.delete(keyOf(namespace, id));
    const t4 = performance.now();
    sandbox.log.debug({ endMs: roundMs(t1 - t0), releaseMs: roundMs(t2 - t1), teardownMs: roundMs(t3 - t2), forgetMs: roundMs(t4 - t3) }, 'sandbox removed');
  }

  /** cgroup statistics of the sandbox. */
  async metrics(namespace: string, id: string): Promise<AnyValue> {
    const sandbox = this.#find(namespace, id);
    return this.#backend.metrics(sandbox.spec, sandbox.running);
  }

  /** Applies labels, annotations and extensions. */
  async update(namespace: string, id: string, request: UpdateRequest): Promise<void> {
    const sandbox = this.#find(namespace, id);
    await this.#inTurn(sandbox, async () => {
      this.#ensureKnown(sandbox);
      const all = request.fields.length === 0;
      const wants = (field: string): boolean => all || request.fields.includes(field);
      const changes: { -readonly [K in keyof SandboxRecord]?: SandboxRecord[K] } = {};
      if (wants('labels')) changes.labels = { ...request.labels };
      if (wants('extensions')) changes.extensions = encodeExtensions(request.extensions);
      if (request.annotations !== undefined && wants('annotations')) changes.annotations = { ...request.annotations };
      const limits = limitsFromUpdate(request);
      const pod = sandbox.spec.pod;
      if (limits !== undefined && pod === undefined && limits.strict) {
        throw new TsboxError('FailedPrecondition', `sandbox ${sandbox.record.id} is not a Kubernetes pod: it has no pod resources to update`);
      }
      if (limits !== undefined && pod !== undefined) {
        const next = { ...pod };
        for (const key of ['resources', 'overhead'] as const) {
          const change = limits[key];
          if (change === undefined) continue;
          if (change.value === undefined) delete next[key];
          else next[key] = change.value;
        }
        const before = sandboxLimits(pod);
        const after = sandboxLimits(next);
        const running = sandbox.state === 'running' ? sandbox.running : undefined;
        if (running === undefined && limits.strict) {
          throw new TsboxError('FailedPrecondition', `sandbox ${sandbox.record.id} is not running: there are no limits to update`);
        }
        // containerd 2.3 sends its last resources with every later Update: unchanged, they are not applied again.
        if (running !== undefined && (limits.strict || JSON.stringify(before) !== JSON.stringify(after))) {
          try {
            await this.#backend.updateResources(sandbox.spec, running, after ?? {});
          } catch (err) {
            // The kernel refused one: what was written before it goes back to the pod's limits.
            await this.#backend
              .updateResources(sandbox.spec, running, before ?? {})
              .catch((e: unknown) => sandbox.log.error({ err: e }, "cannot put the pod's former limits back after a refused update"));
            throw err;
          }
        }
        changes.launch = { ...sandbox.record.launch, pod: next };
      }
      await this.#write(sandbox, changes);
      sandbox.log.info({ fields: Object.keys(changes) }, 'sandbox updated');
    });
  }

  #ensureKnown(sandbox: Sandbox): void {
    if (sandbox.state === 'removed') {
      throw new TsboxError('NotFound', `sandbox ${sandbox.record.id} not found in namespace ${sandbox.record.namespace}`);
    }
  }

  /**
   * Rebuilds the table from the records on disk before the socket accepts calls: running
   * sandboxes are watched again, exits seen while tsbox was down are recorded, a Start that
   * never answered is undone. At most `concurrency` sandboxes are recovered at once.
   */
  async recover(concurrency: number): Promise<RecoverySummary> {
    const begin = process.hrtime.bigint();
    const { records, quarantined } = await this.#store.loadAll();
    const counts = { running: 0, exited: 0, created: 0 };
    let next = 0;
    const worker = async (): Promise<void> => {
      while (next < records.length) {
        const record = records[next++] as SandboxRecord;
        try {
          const state = await this.#recoverOne(record);
          counts[state]++;
        } catch (err) {
          this.#childLog(record.namespace, record.id).error({ err }, 'cannot recover sandbox');
        }
      }
    };
    await Promise.all(Array.from({ length: Math.max(1, Math.min(concurrency, records.length)) }, worker));
    for (const q of quarantined) if (q.leftover) await this.#dropQuarantined(q.namespace, q.id);
    const seconds = Number(process.hrtime.bigint() - begin) / 1e9;
    return { recovered: this.#sandboxes.size, ...counts, quarantined: quarantined.length, seconds };
  }

  /** A sandbox whose record was unreadable: no process of it may run without a record. */
  async #dropQuarantined(namespace: string, id: string): Promise<void> {
    const spec: LaunchSpec = { namespace, id };
    try {
      await this.#backend.abandon(spec, NEVER_ABORTED);
      await this.#backend.release(spec, NEVER_ABORTED);
      await this.#backend.teardown(spec, 'shutdown');
      await this.#store.remove(namespace, id);
    } catch (err) {
      this.#childLog(namespace, id).error({ err }, 'cannot clean up after a quarantined record');
    }
  }

  async #recoverOne(record: SandboxRecord): Promise<'running' | 'exited' | 'created'> {
    const { namespace, id } = record;
    const log = this.#childLog(namespace, id);
    const sandbox = new Sandbox(record, log);
    const spec = sandbox.spec;
    this.#sandboxes.set(keyOf(namespace, id), sandbox);
    switch (record.state) {
      case 'created':
      case 'starting': {
        // tsbox may have died inside a Start, which then never answered: undo it, its pod
        // files and /dev/shm mount included, so that a new Start begins from nothing.
        sandbox.state = 'created';
        try {
          await this.#backend.abandon(spec, NEVER_ABORTED);
          await this.#backend.release(spec, NEVER_ABORTED);
          await this.#backend.teardown(spec, 'stop');
        } catch (err) {
          log.error({ err }, 'cannot check for a process left by an unanswered Start; Shutdown will try again');
        }
        if (record.state === 'starting') {
          const { startedAt: _s, pid: _p, backend: _b, endpoint: _e, ...rest } = record;
          sandbox.record = { ...rest, state: 'created' };
          await this.#store.save(sandbox.record);
        }
        return 'created';
      }
      case 'exited': {
        const exit = record.exit ?? { status: UNKNOWN_EXIT_STATUS, exitedAt: this.#clock(), reason: 'exit not recorded' };
        // A crash between recording the exit and releasing may have left its cgroup.
        await this.#backend.release(spec, NEVER_ABORTED).catch((err: unknown) => log.error({ err }, 'releasing the exited sandbox failed; Shutdown will try again'));
        sandbox.exit.resolve(exit);
        return 'exited';
      }
      case 'running': {
        let found;
        try {
          found = await this.#backend.recover(spec, record.backend);
        } catch (err) {
          // Stop and Shutdown record it as exited with 255 (SPEC.md section 6).
          log.error({ err }, 'cannot confirm the running sandbox; it is reported running until stopped');
          return 'running';
        }
        if (found.kind === 'running') {
          if (found.sandbox.pid !== record.pid || JSON.stringify(found.sandbox.handle) !== JSON.stringify(record.backend)) {
            // The backend corrected what the record said (e.g. a pid without its start time).
            await this.#write(sandbox, { pid: found.sandbox.pid, backend: found.sandbox.handle });
          }
          this.#watch(sandbox, found.sandbox);
          // A graceful Stop was under way: its SIGKILL comes at the recorded deadline.
          this.#armKill(sandbox);
          log.info({ pid: found.sandbox.pid, killAt: record.killAt === undefined ? undefined : new Date(msOf(record.killAt)).toISOString() }, 'recovered: sandbox still running');
          return 'running';
        }
        log.info({ exitStatus: found.exit.status, reason: found.exit.reason }, 'recovered: sandbox exited while tsbox was away');
        await this.#recordExit(sandbox, found.exit);
        return 'exited';
      }
    }
  }

  /** Ends watching (daemon shutdown); sandboxes keep running. */
  close(): void {
    for (const sandbox of this.#sandboxes.values()) this.#disarmKill(sandbox);
    this.#backend.close();
  }
}

const RESOURCES_TYPE = 'runtime.v1.LinuxContainerResources';

/** What an Update changes of a pod's limits; `{ value: undefined }` clears one. */
interface LimitsChange {
  readonly resources?: { readonly value: Resources | undefined };
  readonly overhead?: { readonly value: Resources | undefined };
  /** Asked for by name: refused for a sandbox with no limits to change. */
  readonly strict: boolean;
}

/**
 * New pod limits carried by an Update, named by `fields` or sent with no fields at all:
 * `sandbox.extensions["resources"]`, a CRI LinuxContainerResources ("resources" or
 * "extensions.resources"); or containerd 2.3's `extensions["updated-resources"]`
 * (UpdatePodSandboxResources: the pod's resources and overhead, JSON), which containerd sends
 * again with every later Update of the sandbox's extensions, whatever its state.
 */
function limitsFromUpdate(request: UpdateRequest): LimitsChange | undefined {
  const names = (...fields: string[]): boolean => request.fields.length === 0 || request.fields.some((f) => fields.includes(f));
  const updated = request.extensions[UPDATED_RESOURCES_KEY];
  if (updated !== undefined && names('extensions', `extensions.${UPDATED_RESOURCES_KEY}`)) {
    if (!isType(updated.typeUrl, UPDATED_RESOURCES_TYPE)) {
      throw new TsboxError('InvalidArgument', `extensions["${UPDATED_RESOURCES_KEY}"] must be a ${UPDATED_RESOURCES_TYPE}, not ${JSON.stringify(updated.typeUrl)}`);
    }
    const { resources, overhead } = updatedResourcesOf(updated.value);
    return { resources: { value: resources }, overhead: { value: overhead }, strict: false };
  }
  const value = resourcesFromExtension(request);
  return value === undefined ? undefined : { resources: value, strict: true };
}

function resourcesFromExtension(request: UpdateRequest): { value: Resources | undefined } | undefined {
  const named = request.fields.length === 0 || request.fields.some((f) => f === 'resources' || f === 'extensions.resources' || f === 'extensions');
  const any = request.extensions['resources'];
  if (!named || any === undefined) return undefined;
  if (!isType(any.typeUrl, RESOURCES_TYPE)) {
    throw new TsboxError('InvalidArgument', `extensions["resources"] must be a ${RESOURCES_TYPE}, not ${JSON.stringify(any.typeUrl)}`);
  }
  let decoded;
  try {
    decoded = LinuxContainerResources.decode(any.value);
  } catch (err) {
    throw new TsboxError('InvalidArgument', `extensions["resources"]: malformed ${RESOURCES_TYPE}: ${messageOf(err)}`);
  }
  return { value: resourcesOf(decoded) };
}

function encodeExtensions(
  extensions: Readonly<Record<string, AnyValue>>,
): Record<string, { typeUrl: string; value: string }> {
  const out: Record<string, { typeUrl: string; value: string }> = {};
  for (const [name, any] of Object.entries(extensions)) {
    out[name] = { typeUrl: any.typeUrl, value: Buffer.from(any.value).toString('base64') };
  }
  return out;
}

/** A duration in ms to a tenth, for the debug log. */
function roundMs(ms: number): number {
  return Math.round(ms * 10) / 10;
}
