// In-memory stand-ins for the controller's collaborators (src/controller/types.ts): a
// runtime backend whose sandboxes exit when a test says so, a record store that keeps
// every record it was asked to save, and a clock whose time and timers move only when a
// test advances them. Nothing here touches processes, files or real time.
import type { Controller } from '../../src/controller/controller.js';
import type {
  AnyValue,
  CallSignal,
  ExitInfo,
  LaunchSpec,
  LoadedRecords,
  Recovered,
  RecordStore,
  RunningSandbox,
  RuntimeBackend,
  SandboxPlacement,
  SandboxRecord,
  TaskEndpoint,
  TeardownStage,
  Timestamp,
} from '../../src/controller/types.js';
import type { Resources } from '../../src/controller/pod-spec.js';

/** Exit status of a process killed by SIGKILL. */
export const KILLED_STATUS = 137;
/** Exit status of a process ended by SIGTERM. */
export const TERMINATED_STATUS = 143;

/** The key the controller and the store use for a sandbox. */
export const keyOf = (namespace: string, id: string): string => `${namespace}/${id}`;

/** A promise whose resolution a test controls: `open()` lets every `wait()` through. */
export class Gate {
  #open = false;
  #release: (() => void) | undefined;
  readonly #opened: Promise<void>;

  constructor() {
    this.#opened = new Promise<void>((resolve) => {
      this.#release = resolve;
    });
  }

  get isOpen(): boolean {
    return this.#open;
  }

  wait(): Promise<void> {
    return this.#opened;
  }

  open(): void {
    this.#open = true;
    this.#release?.();
  }
}

interface Timer {
  readonly at: number;
  readonly callback: () => void;
  cancelled: boolean;
}

/**
 * Time that moves only when the test says so. `now` is a controller Clock; `schedule`
 * registers a callback that `advance` runs once its time has come.
 */
export class FakeClock {
  #ms: number;
  readonly #timers: Timer[] = [];

  constructor(startMs = Date.UTC(2025, 0, 2, 3, 4, 5)) {
    this.#ms = startMs;
  }

  get ms(): number {
    return this.#ms;
  }

  /** The current time as a protobuf Timestamp (usable as the controller's Clock). */
  readonly now = (): Timestamp => ({ seconds: Math.floor(this.#ms / 1000), nanos: (this.#ms % 1000) * 1_000_000 });

  /** Runs `callback` when the clock has been advanced by `delayMs`; returns a cancel function. */
  schedule(delayMs: number, callback: () => void): () => void {
    const timer: Timer = { at: this.#ms + delayMs, callback, cancelled: false };
    this.#timers.push(timer);
    return () => {
      timer.cancelled = true;
    };
  }

  /** Number of timers still waiting to fire. */
  get pendingTimers(): number {
    return this.#timers.filter((t) => !t.cancelled).length;
  }

  /** Moves time forward by `ms`, firing every timer that falls due, in order. */
  advance(ms: number): void {
    const target = this.#ms + ms;
    for (;;) {
      this.#timers.sort((a, b) => a.at - b.at);
      const index = this.#timers.findIndex((t) => !t.cancelled && t.at <= target);
      if (index < 0) break;
      const [timer] = this.#timers.splice(index, 1);
      if (timer === undefined) break;
      this.#ms = Math.max(this.#ms, timer.at);
      timer.callback();
    }
    for (let i = this.#timers.length - 1; i >= 0; i--) if (this.#timers[i]?.cancelled === true) this.#timers.splice(i, 1);
    this.#ms = target;
  }
}

/** A signal the fake backend delivered. */
export type FakeSignal = 'SIGTERM' | 'SIGKILL';

/** A sandbox of the fake backend: it runs until a test (or a kill) makes it exit. */
export class FakeSandbox implements RunningSandbox {
  readonly pid: number;
  readonly handle: { readonly fakePid: number };
  readonly spec: LaunchSpec;
  /** Every signal delivered to it, in order. */
  readonly signals: FakeSignal[] = [];
  /** When true, SIGTERM does nothing and only SIGKILL (after the grace period) ends it. */
  ignoreTerm: boolean;
  #exit: ExitInfo | undefined;
  #listeners: ((exit: ExitInfo) => void)[] = [];
  readonly #clock: FakeClock;

  constructor(spec: LaunchSpec, pid: number, clock: FakeClock, ignoreTerm: boolean) {
    this.spec = spec;
    this.pid = pid;
    this.handle = { fakePid: pid };
    this.#clock = clock;
    this.ignoreTerm = ignoreTerm;
  }

  /** The exit, once it happened. */
  get exited(): ExitInfo | undefined {
    return this.#exit;
  }

  /** Number of exit listeners registered and not yet called. */
  get listeners(): number {
    return this.#listeners.length;
  }

  onExit(listener: (exit: ExitInfo) => void): void {
    if (this.#exit !== undefined) listener(this.#exit);
    else this.#listeners.push(listener);
  }

  /**
   * Makes the process exit with `status` (as if it ended by itself). Listeners run
   * synchronously, as a real 'exit' event handler would. False if it had already exited.
   */
  exitWith(status: number, reason = `exited with status ${status}`): boolean {
    if (this.#exit !== undefined) return false;
    const exit: ExitInfo = { status, exitedAt: this.#clock.now(), reason };
    this.#exit = exit;
    const listeners = this.#listeners;
    this.#listeners = [];
    for (const listener of listeners) listener(exit);
    return true;
  }
}

/** What recover() answers for one sandbox. */
export type FakeRecovery =
  | { readonly kind: 'running'; readonly ignoreTerm?: boolean }
  | { readonly kind: 'exited'; readonly exit: ExitInfo }
  | { readonly kind: 'error'; readonly error: Error };

/** One terminate() (SIGTERM) or kill() (SIGKILL) call. */
export interface KillCall {
  readonly key: string;
  readonly signal: FakeSignal;
}

/**
 * A RuntimeBackend fully in memory. Start failures are queued with `failNextStart`;
 * sandboxes exit when the test calls `exitWith`, or when signalled: kill() ends them with
 * 137, terminate() with 143 unless they ignore TERM (the controller keeps the grace period).
 * When `killError` is set, kill() throws it and the sandbox keeps running.
 */
export class FakeBackend implements RuntimeBackend {
  readonly name = 'fake';
  readonly clock: FakeClock;
  /** Every sandbox started or recovered, in order. */
  readonly sandboxes: FakeSandbox[] = [];
  /** Specs of every start() call, including failed ones. */
  readonly startCalls: LaunchSpec[] = [];
  readonly kills: KillCall[] = [];
  /** Keys of every abandon() call. */
  readonly abandoned: string[] = [];
  /** Keys of every release() call. */
  readonly released: string[] = [];
  /** Every teardown() call, as "<key> <stage>". */
  readonly teardowns: string[] = [];
  /** Every updateResources() call. */
  readonly resourceUpdates: { key: string; limits: Resources }[] = [];
  /** Keys and handles of every recover() call. */
  readonly recoverCalls: { key: string; handle: unknown }[] = [];
  /** The `sandbox` argument of every metrics() call. */
  readonly metricsCalls: (RunningSandbox | undefined)[] = [];
  closeCalls = 0;
  /** New sandboxes ignore SIGTERM when true. */
  ignoreTerm = false;
  /** What metrics() answers (or throws). */
  metricsAnswer: AnyValue | Error = { typeUrl: 'io.containerd.cgroups.v2.Metrics', value: new Uint8Array([8, 1]) };
  /** When set, start() waits for it before answering. */
  startGate: Gate | undefined;
  /** When set, release() throws it. */
  releaseError: Error | undefined;
  /** When set, abandon() throws it. */
  abandonError: Error | undefined;
  /** When set, teardown() at Stop ('stop') throws it. */
  stopTeardownError: Error | undefined;
  /** When set, kill() throws it (processes that outlive SIGKILL) and the sandbox keeps running. */
  killError: Error | undefined;
  readonly #startFailures: Error[] = [];
  readonly #recoveries = new Map<string, FakeRecovery>();
  #nextPid = 4000;

  constructor(clock: FakeClock = new FakeClock()) {
    this.clock = clock;
  }

  /** Makes the next start() throw `error` (queued: call it twice for two failures). */
  failNextStart(error: Error = new Error('fake start failure')): void {
    this.#startFailures.push(error);
  }

  /** Decides what recover() answers for (namespace, id); unset means 'running'. */
  setRecovery(namespace: string, id: string, recovery: FakeRecovery): void {
    this.#recoveries.set(keyOf(namespace, id), recovery);
  }

  /** The newest sandbox started or recovered for (namespace, id). */
  sandbox(namespace: string, id: string): FakeSandbox {
    const key = keyOf(namespace, id);
    for (let i = this.sandboxes.length - 1; i >= 0; i--) {
      const sandbox = this.sandboxes[i];
      if (sandbox !== undefined && keyOf(sandbox.spec.namespace, sandbox.spec.id) === key) return sandbox;
    }
    throw new Error(`no fake sandbox for ${key}`);
  }

  /** How many times release() was called for (namespace, id). */
  releaseCount(namespace: string, id: string): number {
    const key = keyOf(namespace, id);
    return this.released.filter((k) => k === key).length;
  }

  async start(spec: LaunchSpec): Promise<RunningSandbox> {
    this.startCalls.push(spec);
    if (this.startGate !== undefined) await this.startGate.wait();
    const failure = this.#startFailures.shift();
    if (failure !== undefined) throw failure;
    const sandbox = new FakeSandbox(spec, this.#nextPid++, this.clock, this.ignoreTerm);
    this.sandboxes.push(sandbox);
    return sandbox;
  }

  recover(spec: LaunchSpec, handle: unknown): Promise<Recovered> {
    const key = keyOf(spec.namespace, spec.id);
    this.recoverCalls.push({ key, handle });
    const recovery = this.#recoveries.get(key) ?? { kind: 'running' };
    switch (recovery.kind) {
      case 'error':
        return Promise.reject(recovery.error);
      case 'exited':
        return Promise.resolve({ kind: 'exited', exit: recovery.exit });
      case 'running': {
        const pid =
          typeof handle === 'object' && handle !== null && typeof (handle as { fakePid?: unknown }).fakePid === 'number'
            ? (handle as { fakePid: number }).fakePid
            : this.#nextPid++;
        const sandbox = new FakeSandbox(spec, pid, this.clock, recovery.ignoreTerm ?? this.ignoreTerm);
        this.sandboxes.push(sandbox);
        return Promise.resolve({ kind: 'running', sandbox });
      }
    }
  }

  /** A version-2 endpoint named after the sandbox, as the process backend gives. */
  endpoint(spec: LaunchSpec): TaskEndpoint {
    return { address: `ttrpc+unix:///run/fake/${spec.namespace}/${spec.id}`, version: 2 };
  }

  teardown(spec: LaunchSpec, stage: TeardownStage): Promise<void> {
    this.teardowns.push(`${keyOf(spec.namespace, spec.id)} ${stage}`);
    if (stage === 'stop' && this.stopTeardownError !== undefined) return Promise.reject(this.stopTeardownError);
    return Promise.resolve();
  }

  #resourceFailure: Error | undefined;

  /** The next updateResources() is recorded, then fails with `err` (a kernel's refusal). */
  failNextResourceUpdate(err: Error): void {
    this.#resourceFailure = err;
  }

  updateResources(spec: LaunchSpec, _sandbox: RunningSandbox, limits: Resources): Promise<void> {
    this.resourceUpdates.push({ key: keyOf(spec.namespace, spec.id), limits });
    const failure = this.#resourceFailure;
    this.#resourceFailure = undefined;
    return failure === undefined ? Promise.resolve() : Promise.reject(failure);
  }

  abandon(spec: LaunchSpec, _signal: CallSignal): Promise<void> {
    this.abandoned.push(keyOf(spec.namespace, spec.id));
    if (this.abandonError !== undefined) return Promise.reject(this.abandonError);
    return Promise.resolve();
  }

  terminate(running: RunningSandbox): Promise<void> {
    const sandbox = this.#signalled(running, 'SIGTERM');
    if (sandbox.exited === undefined && !sandbox.ignoreTerm) sandbox.exitWith(TERMINATED_STATUS, 'terminated');
    return Promise.resolve();
  }

  kill(running: RunningSandbox, _signal: CallSignal): Promise<void> {
    if (this.killError !== undefined) return Promise.reject(this.killError);
    const sandbox = this.#signalled(running, 'SIGKILL');
    if (sandbox.exited === undefined) sandbox.exitWith(KILLED_STATUS, 'killed');
    return Promise.resolve();
  }

  #signalled(running: RunningSandbox, signal: FakeSignal): FakeSandbox {
    if (!(running instanceof FakeSandbox)) throw new Error('kill() got a sandbox this backend did not start');
    this.kills.push({ key: keyOf(running.spec.namespace, running.spec.id), signal });
    if (running.exited === undefined) running.signals.push(signal);
    return running;
  }

  release(spec: LaunchSpec, _signal: CallSignal): Promise<void> {
    this.released.push(keyOf(spec.namespace, spec.id));
    if (this.releaseError !== undefined) return Promise.reject(this.releaseError);
    return Promise.resolve();
  }

  metrics(_spec: LaunchSpec, sandbox: RunningSandbox | undefined): Promise<AnyValue> {
    this.metricsCalls.push(sandbox);
    const answer = this.metricsAnswer;
    return answer instanceof Error ? Promise.reject(answer) : Promise.resolve(answer);
  }

  describe(sandbox: RunningSandbox): Record<string, unknown> {
    return { fakePid: sandbox.pid };
  }

  /** A pid and a mount namespace of its own, and a cgroup named after the sandbox. */
  placement(spec: LaunchSpec, sandbox: RunningSandbox): SandboxPlacement {
    return { namespaces: [{ type: 'mount', path: `/proc/${sandbox.pid}/ns/mnt` }], cgroupsPath: `/fake/${spec.id}`, args: ['fake-pause'] };
  }

  close(): void {
    this.closeCalls++;
  }
}

/**
 * A RecordStore in memory. `saved` keeps a copy of every record ever saved, in order, so
 * a test can tell what was durable at any moment. Saves can be made to fail
 * (`failSaves`) or to wait for a gate (`saveGate`).
 */
export class MemoryRecordStore implements RecordStore {
  /** The current record of each sandbox, by keyOf(namespace, id). */
  readonly records = new Map<string, SandboxRecord>();
  /** Every record successfully saved, in order. */
  readonly saved: SandboxRecord[] = [];
  /** Keys of every successful remove(). */
  readonly removed: string[] = [];
  /** Returned by loadAll() as the sandboxes whose records were quarantined. */
  quarantined: { namespace: string; id: string; leftover: boolean }[] = [];
  /** When set, every save waits for it first. */
  saveGate: Gate | undefined;
  /** When set, remove() throws it. */
  removeError: Error | undefined;
  /** When set, loadAll() throws it. */
  loadError: Error | undefined;
  #failSave: ((record: SandboxRecord) => boolean) | undefined;
  #saveError: Error = new Error('fake store: disk full');

  /**
   * Makes saves fail while `when(record)` is true (every save when omitted). `times` limits
   * how many saves fail; after that, saves succeed again.
   */
  failSaves(options: { when?: (record: SandboxRecord) => boolean; times?: number; error?: Error } = {}): void {
    let left = options.times ?? Number.POSITIVE_INFINITY;
    const when = options.when ?? (() => true);
    if (options.error !== undefined) this.#saveError = options.error;
    this.#failSave = (record) => {
      if (left <= 0 || !when(record)) return false;
      left--;
      return true;
    };
  }

  /** Makes saves succeed again. */
  healSaves(): void {
    this.#failSave = undefined;
  }

  /** Puts a record in place as if an earlier tsbox had saved it. */
  seed(record: SandboxRecord): void {
    this.records.set(keyOf(record.namespace, record.id), structuredClone(record));
  }

  /** Every record saved for (namespace, id), in order. */
  savedFor(namespace: string, id: string): SandboxRecord[] {
    return this.saved.filter((r) => r.namespace === namespace && r.id === id);
  }

  /** The current record of (namespace, id). */
  current(namespace: string, id: string): SandboxRecord | undefined {
    return this.records.get(keyOf(namespace, id));
  }

  async save(record: SandboxRecord): Promise<void> {
    if (this.saveGate !== undefined) await this.saveGate.wait();
    if (this.#failSave?.(record) === true) throw this.#saveError;
    const copy = structuredClone(record);
    this.records.set(keyOf(record.namespace, record.id), copy);
    this.saved.push(copy);
  }

  remove(namespace: string, id: string): Promise<void> {
    if (this.removeError !== undefined) return Promise.reject(this.removeError);
    const key = keyOf(namespace, id);
    this.records.delete(key);
    this.removed.push(key);
    return Promise.resolve();
  }

  loadAll(): Promise<LoadedRecords> {
    if (this.loadError !== undefined) return Promise.reject(this.loadError);
    return Promise.resolve({
      records: [...this.records.values()].map((r) => structuredClone(r)),
      quarantined: this.quarantined.map((q) => ({ ...q })),
    });
  }
}

/** A version 1 record, filled with plausible values, for seeding a store. */
export function makeRecord(
  fields: Pick<SandboxRecord, 'namespace' | 'id' | 'state'> & Partial<SandboxRecord>,
): SandboxRecord {
  return {
    version: 1,
    registeredAt: { seconds: 1_700_000_000, nanos: 0 },
    launch: {},
    labels: {},
    annotations: {},
    extensions: {},
    ...fields,
  };
}

/**
 * Resolves once `condition()` is true, checking after each turn of the event loop; rejects
 * with `message` when it is still false after `timeoutMs`.
 */
export async function until(condition: () => boolean, message: string, timeoutMs = 2000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!condition()) {
    if (Date.now() > deadline) throw new Error(`timed out: ${message}`);
    await new Promise<void>((resolve) => setImmediate(resolve));
  }
}

/** Lets every promise callback already queued run (several microtask and I/O turns). */
export async function settle(turns = 5): Promise<void> {
  for (let i = 0; i < turns; i++) await new Promise<void>((resolve) => setImmediate(resolve));
}

/**
 * A Wait as the transport makes it (Controller.listen), as a promise: resolves with the exit,
 * rejects with NotFound or with the abort reason.
 */
export function waitExit(controller: Pick<Controller, 'listen'>, namespace: string, id: string, signal: CallSignal): Promise<ExitInfo> {
  return new Promise<ExitInfo>((resolve, reject) => {
    controller.listen(namespace, id, signal, (err, exit) => (err === undefined ? resolve(exit as ExitInfo) : reject(err)));
  });
}

/** Follows a promise without awaiting it, so a test can see whether it has settled yet. */
export function track<T>(promise: Promise<T>): { readonly settled: boolean; readonly value: T | undefined; readonly error: unknown } {
  const state: { settled: boolean; value: T | undefined; error: unknown } = { settled: false, value: undefined, error: undefined };
  promise.then(
    (value) => {
      state.settled = true;
      state.value = value;
    },
    (error: unknown) => {
      state.settled = true;
      state.error = error;
    },
  );
  return state;
}
