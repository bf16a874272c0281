// The controller's nine operations over a fake backend and an in-memory store: what each
// RPC answers in each state, the error kinds containerd acts on (SPEC.md sections 3 and 4),
// the exit path (durable before visible, every waiter the same answer) and recovery after
// a restart.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { pino } from 'pino';
import { Controller, UNKNOWN_EXIT_STATUS, type CreateRequest } from '../../src/controller/controller.js';
import type { CallSignal, ExitInfo, HostPlatform, PodContainers, SandboxRecord } from '../../src/controller/types.js';
import { TsboxError, ignoreError, isTsboxError, type ErrorKind } from '../../src/base/errors.js';
import { LinuxContainerResources, PodSandboxConfig } from '../../src/gen/runtime/v1/pod_sandbox_config.js';
import {
  FakeBackend,
  FakeClock,
  Gate,
  KILLED_STATUS,
  MemoryRecordStore,
  TERMINATED_STATUS,
  keyOf,
  makeRecord,
  settle,
  track,
  until,
  waitExit,
} from '../support/fakes.js';

const NS = 'k8s.io';
const ID = 'a3f0c9d2e1b4';
const PLATFORM: HostPlatform = { os: 'linux', architecture: 'amd64', variant: '' };
const STATE_DIR = '/var/lib/tsbox-unit';

function setup(podContainers?: PodContainers): { clock: FakeClock; backend: FakeBackend; store: MemoryRecordStore; controller: Controller } {
  const clock = new FakeClock();
  const backend = new FakeBackend(clock);
  const store = new MemoryRecordStore();
  const controller = new Controller({
    backend,
    store,
    logger: pino({ level: 'silent' }),
    platform: PLATFORM,
    stateDir: STATE_DIR,
    clock: clock.now,
    schedule: (delayMs, callback) => clock.schedule(delayMs, callback),
    ...(podContainers !== undefined && { podContainers }),
  });
  return { clock, backend, store, controller };
}

function createRequest(fields: Partial<CreateRequest> = {}): CreateRequest {
  return { netnsPath: '', options: undefined, spec: undefined, extensions: {}, labels: {}, annotations: {}, ...fields };
}

/** A signal that never fires: the call has no deadline. */
const noDeadline = (): AbortSignal => new AbortController().signal;
/** What Start and Status say when the backend gave no task endpoint (never started). */
const NO_ENDPOINT = { address: '', version: 0 } as const;
/** A task endpoint a record from before a restart holds. */
const recordedEndpoint = { address: 'ttrpc+unix:///run/containerd/s/0123abcd', version: 2 } as const;

/** An assert.rejects/throws validator: a TsboxError of `kind`. */
function errorOf(kind: ErrorKind, message?: RegExp): (err: unknown) => boolean {
  return (err) => {
    assert.ok(isTsboxError(err), `expected a TsboxError, got ${String(err)}`);
    assert.equal(err.kind, kind, `kind of "${err.message}"`);
    if (message !== undefined) assert.match(err.message, message);
    return true;
  };
}

/**
 * Gives calls that should finish by themselves a bounded time to do so, then aborts their
 * signals so that a call that hangs ends (rejected) instead of keeping the test waiting.
 */
async function giveUpAfter(
  calls: readonly { readonly settled: boolean }[],
  signals: readonly AbortController[],
  timeoutMs = 1000,
): Promise<void> {
  const allSettled = (): boolean => calls.every((c) => c.settled);
  // Calls still running after the bound are aborted below; that is what the deadline is for.
  await until(allSettled, 'calls finish by themselves', timeoutMs).then(
    () => undefined,
    () => undefined,
  );
  for (const signal of signals) signal.abort(new TsboxError('DeadlineExceeded', 'test gave up'));
  await until(allSettled, 'calls end once their signals fire');
}

async function createAndStart(
  controller: Controller,
  namespace = NS,
  id = ID,
): Promise<{ pid: number; createdAt: { seconds: number; nanos: number } }> {
  await controller.create(namespace, id, createRequest());
  return controller.start(namespace, id);
}

describe('Create', () => {
  test('registers the sandbox durably without running anything', async () => {
    const { backend, store, controller } = setup();
    await controller.create(NS, ID, createRequest({ labels: { app: 'web' }, annotations: { note: 'x' } }));

    assert.equal(backend.startCalls.length, 0);
    const record = store.current(NS, ID);
    assert.equal(record?.state, 'created');
    assert.deepEqual(record?.labels, { app: 'web' });
    assert.deepEqual(record?.annotations, { note: 'x' });
    assert.deepEqual(controller.status(NS, ID, false), { state: 'SANDBOX_UNKNOWN', pid: 0, ...NO_ENDPOINT });
  });

  test('a duplicate (namespace, id) is ALREADY_EXISTS and leaves the first untouched', async () => {
    const { store, controller } = setup();
    await controller.create(NS, ID, createRequest({ labels: { first: '1' } }));
    await assert.rejects(controller.create(NS, ID, createRequest({ labels: { second: '2' } })), errorOf('AlreadyExists'));
    assert.equal(store.savedFor(NS, ID).length, 1);
    assert.deepEqual(store.current(NS, ID)?.labels, { first: '1' });
  });

  test('two concurrent Creates of one id: exactly one succeeds', async () => {
    const { controller } = setup();
    const results = await Promise.allSettled([
      controller.create(NS, ID, createRequest()),
      controller.create(NS, ID, createRequest()),
    ]);
    assert.equal(results.filter((r) => r.status === 'fulfilled').length, 1);
    const rejected = results.find((r) => r.status === 'rejected');
    assert.ok(rejected !== undefined && rejected.status === 'rejected');
    errorOf('AlreadyExists')(rejected.reason);
  });

  test('the same id in two namespaces is two independent sandboxes', async () => {
    const { controller } = setup();
    await controller.create('k8s.io', ID, createRequest());
    await controller.create('default', ID, createRequest());
    await controller.start('k8s.io', ID);
    assert.equal(controller.status('k8s.io', ID, false).state, 'SANDBOX_READY');
    assert.equal(controller.status('default', ID, false).state, 'SANDBOX_UNKNOWN');
    await controller.shutdown('k8s.io', ID, noDeadline());
    assert.equal(controller.status('default', ID, false).state, 'SANDBOX_UNKNOWN');
  });

  test('a Create the store cannot save fails and leaves no trace; a retry succeeds', async () => {
    const { store, controller } = setup();
    store.failSaves({ times: 1 });
    await assert.rejects(controller.create(NS, ID, createRequest()), /disk full/);
    assert.throws(() => controller.status(NS, ID, false), errorOf('NotFound'));
    assert.equal(controller.size, 0);
    await controller.create(NS, ID, createRequest());
    assert.equal(controller.status(NS, ID, false).state, 'SANDBOX_UNKNOWN');
  });

  test('a malformed OCI spec is INVALID_ARGUMENT and nothing is registered', async () => {
    const { store, controller } = setup();
    const spec = { typeUrl: 'types.containerd.io/opencontainers/runtime-spec/1/Spec', value: Buffer.from('{"process":') };
    await assert.rejects(controller.create(NS, ID, createRequest({ spec })), errorOf('InvalidArgument'));
    assert.equal(store.saved.length, 0);
    assert.throws(() => controller.status(NS, ID, false), errorOf('NotFound'));
  });

  test('after Shutdown the id can be created again, as a fresh sandbox', async () => {
    const { backend, controller } = setup();
    await createAndStart(controller);
    await controller.shutdown(NS, ID, noDeadline());
    await controller.create(NS, ID, createRequest());
    assert.deepEqual(controller.status(NS, ID, false), { state: 'SANDBOX_UNKNOWN', pid: 0, ...NO_ENDPOINT });
    const wait = track(waitExit(controller, NS, ID, noDeadline()));
    await settle();
    assert.equal(wait.settled, false, 'the new sandbox has not exited');
    const started = await controller.start(NS, ID);
    assert.equal(backend.startCalls.length, 2);
    assert.equal(controller.status(NS, ID, false).pid, started.pid);
    await controller.stop(NS, ID, 0, noDeadline());
    await until(() => wait.settled, 'the new sandbox Wait answers');
    assert.equal(wait.value?.status, KILLED_STATUS);
  });
});

describe('Start', () => {
  test('returns the pid and the start time, and Status reports them', async () => {
    const { clock, backend, store, controller } = setup();
    await controller.create(NS, ID, createRequest());
    clock.advance(1500);
    const started = await controller.start(NS, ID);

    const sandbox = backend.sandbox(NS, ID);
    assert.equal(started.pid, sandbox.pid);
    assert.deepEqual(started.createdAt, clock.now());
    assert.deepEqual(started.labels, {}, 'no selinux_label unless labelling is meant');
    const endpoint = backend.endpoint({ namespace: NS, id: ID });
    assert.deepEqual({ address: started.address, version: started.version }, endpoint, 'the task endpoint containerd runs containers at');
    assert.deepEqual(controller.status(NS, ID, false), { state: 'SANDBOX_READY', pid: sandbox.pid, createdAt: started.createdAt, ...endpoint });
    assert.deepEqual(store.current(NS, ID)?.endpoint, endpoint, 'recorded, so Status gives the same after a restart');
    const record = store.current(NS, ID);
    assert.equal(record?.state, 'running');
    assert.equal(record?.pid, sandbox.pid);
    assert.deepEqual(record?.startedAt, started.createdAt);
  });

  test('the running record is written once the process runs, before Start answers', async () => {
    const { backend, store, controller } = setup();
    await controller.create(NS, ID, createRequest());
    backend.startGate = new Gate();
    const start = controller.start(NS, ID);
    await until(() => backend.startCalls.length === 1, 'backend.start called');
    // Nothing is written before the process exists: a process a crash leaves behind is
    // found through the supervisor's pid file at recovery (see the recover tests).
    const statesAtStart = store.savedFor(NS, ID).map((r) => r.state);
    backend.startGate.open();
    await start;
    assert.deepEqual(statesAtStart, ['created']);
    assert.deepEqual(
      store.savedFor(NS, ID).map((r) => r.state),
      ['created', 'running'],
    );
    await assert.rejects(controller.start(NS, ID), errorOf('FailedPrecondition'));
    assert.equal(controller.status(NS, ID, false).state, 'SANDBOX_READY');
  });

  test('while Start runs, Status is SANDBOX_UNKNOWN without created_at', async () => {
    const { backend, controller } = setup();
    await controller.create(NS, ID, createRequest());
    backend.startGate = new Gate();
    const start = controller.start(NS, ID);
    await until(() => backend.startCalls.length === 1, 'backend.start called');
    assert.deepEqual(controller.status(NS, ID, false), { state: 'SANDBOX_UNKNOWN', pid: 0, ...NO_ENDPOINT });
    backend.startGate.open();
    await start;
  });

  test('of an unknown sandbox is NOT_FOUND', async () => {
    const { controller } = setup();
    await assert.rejects(controller.start(NS, ID), errorOf('NotFound'));
  });

  test('a second Start is FAILED_PRECONDITION and changes nothing', async () => {
    const { backend, store, controller } = setup();
    const first = await createAndStart(controller);
    const savesBefore = store.saved.length;
    const statusBefore = controller.status(NS, ID, true);

    await assert.rejects(controller.start(NS, ID), errorOf('FailedPrecondition'));

    assert.equal(backend.startCalls.length, 1);
    assert.equal(backend.sandbox(NS, ID).signals.length, 0, 'the running sandbox was not touched');
    assert.equal(backend.releaseCount(NS, ID), 0);
    assert.equal(store.saved.length, savesBefore);
    assert.deepEqual(controller.status(NS, ID, true), statusBefore);
    assert.equal(controller.status(NS, ID, false).pid, first.pid);
  });

  test('two concurrent Starts: exactly one succeeds, the other is FAILED_PRECONDITION', async () => {
    const { backend, controller } = setup();
    await controller.create(NS, ID, createRequest());
    const results = await Promise.allSettled([controller.start(NS, ID), controller.start(NS, ID)]);
    const fulfilled = results.filter((r) => r.status === 'fulfilled');
    const rejected = results.filter((r) => r.status === 'rejected');
    assert.equal(fulfilled.length, 1);
    assert.equal(rejected.length, 1);
    errorOf('FailedPrecondition')(rejected[0]?.reason);
    assert.equal(backend.startCalls.length, 1);
    assert.equal(controller.status(NS, ID, false).state, 'SANDBOX_READY');
  });

  test('a failed Start cleans up by itself: released, back to created, a later Start succeeds', async () => {
    const { backend, store, controller } = setup();
    await controller.create(NS, ID, createRequest());
    backend.failNextStart(new TsboxError('Internal', 'cannot spawn'));

    await assert.rejects(controller.start(NS, ID), errorOf('Internal', /cannot spawn/));

    assert.equal(backend.releaseCount(NS, ID), 1, 'what the attempt held was released');
    assert.deepEqual(controller.status(NS, ID, false), { state: 'SANDBOX_UNKNOWN', pid: 0, ...NO_ENDPOINT }, 'no created_at, no pid');
    const record = store.current(NS, ID);
    assert.equal(record?.state, 'created');
    assert.equal(record?.startedAt, undefined);
    assert.equal(record?.pid, undefined);

    const started = await controller.start(NS, ID);
    assert.equal(controller.status(NS, ID, false).state, 'SANDBOX_READY');
    assert.equal(controller.status(NS, ID, false).pid, started.pid);
  });

  test('a Start whose running record cannot be saved kills what it started and stays created', async () => {
    const { backend, store, controller } = setup();
    await controller.create(NS, ID, createRequest());
    store.failSaves({ when: (r) => r.state === 'running', times: 1 });

    await assert.rejects(controller.start(NS, ID), /disk full/);

    const orphan = backend.sandbox(NS, ID);
    assert.deepEqual(orphan.signals, ['SIGKILL'], 'the started process was killed');
    assert.ok(orphan.exited !== undefined);
    assert.equal(backend.releaseCount(NS, ID), 1);
    assert.equal(controller.status(NS, ID, false).state, 'SANDBOX_UNKNOWN');
    assert.equal(store.current(NS, ID)?.state, 'created');

    await controller.start(NS, ID);
    assert.equal(controller.status(NS, ID, false).state, 'SANDBOX_READY');
  });

  test('a pod (CRI) whose Start fails is forgotten after the cleanup: CRI never calls Shutdown for it', async () => {
    const { backend, store, controller } = setup();
    const options = { typeUrl: 'runtime.v1.PodSandboxConfig', value: PodSandboxConfig.encode(PodSandboxConfig.fromPartial({ metadata: { name: 'p', uid: 'u', namespace: 'default' } })).finish() };
    await controller.create(NS, ID, createRequest({ options }));
    backend.failNextStart(new TsboxError('FailedPrecondition', 'no such controller'));
    await assert.rejects(controller.start(NS, ID), errorOf('FailedPrecondition', /no such controller/));
    assert.ok(backend.releaseCount(NS, ID) >= 1, 'released after the failed start');
    assert.equal(store.current(NS, ID), undefined, 'no record left');
    assert.throws(() => controller.status(NS, ID, false), errorOf('NotFound'));
    await controller.create(NS, ID, createRequest({ options }));
  });

  test('a Start whose running record cannot be saved leaves nothing running', async () => {
    const { backend, store, controller } = setup();
    await controller.create(NS, ID, createRequest());
    store.failSaves({ when: (r) => r.state === 'running', times: 1 });
    await assert.rejects(controller.start(NS, ID), /disk full/);
    assert.equal(backend.startCalls.length, 1);
    assert.ok(backend.releaseCount(NS, ID) >= 1, 'released after the failed start');
    assert.equal(controller.status(NS, ID, false).state, 'SANDBOX_UNKNOWN');
    assert.equal(store.current(NS, ID)?.state, 'created');
    await controller.start(NS, ID);
    assert.equal(controller.status(NS, ID, false).state, 'SANDBOX_READY');
  });

  test('of a sandbox stopped before it ever ran is FAILED_PRECONDITION', async () => {
    const { backend, controller } = setup();
    await controller.create(NS, ID, createRequest());
    await controller.stop(NS, ID, 0, noDeadline());
    await assert.rejects(controller.start(NS, ID), errorOf('FailedPrecondition'));
    assert.equal(backend.startCalls.length, 0);
  });
});

describe('Status', () => {
  test('of an unknown sandbox is NOT_FOUND', () => {
    const { controller } = setup();
    assert.throws(() => controller.status(NS, ID, false), errorOf('NotFound'));
  });

  test('after an exit: SANDBOX_NOTREADY, pid 0, exited_at = Wait\'s, created_at = Start\'s', async () => {
    const { clock, backend, controller } = setup();
    const started = await createAndStart(controller);
    clock.advance(60_000);
    backend.sandbox(NS, ID).exitWith(2);
    const exit = await waitExit(controller, NS, ID, noDeadline());
    assert.deepEqual(controller.status(NS, ID, false), {
      state: 'SANDBOX_NOTREADY',
      pid: 0,
      createdAt: started.createdAt,
      exitedAt: exit.exitedAt,
      ...backend.endpoint({ namespace: NS, id: ID }),
    });
    assert.deepEqual(exit.exitedAt, clock.now());
  });

  test('info only when verbose, and info["info"] is a JSON object an operator can read', async () => {
    const { backend, controller } = setup();
    const started = await createAndStart(controller);
    assert.equal(controller.status(NS, ID, false).info, undefined);

    const verbose = controller.status(NS, ID, true);
    assert.deepEqual(Object.keys(verbose.info ?? {}), ['info']);
    const info: unknown = JSON.parse(verbose.info?.['info'] ?? 'null');
    assert.ok(typeof info === 'object' && info !== null && !Array.isArray(info), 'info["info"] is a JSON object');
    const facts = info as Record<string, unknown>;
    assert.equal(facts['pid'], started.pid);
    assert.equal(facts['backend'], backend.name);
    assert.equal(facts['stateDir'], STATE_DIR);
    assert.equal(facts['state'], 'running');

    backend.sandbox(NS, ID).exitWith(9, 'out of memory');
    await waitExit(controller, NS, ID, noDeadline());
    const after = JSON.parse(controller.status(NS, ID, true).info?.['info'] ?? 'null') as Record<string, unknown>;
    assert.equal(after['exitStatus'], 9);
    assert.equal(after['exitReason'], 'out of memory');
    assert.equal(after['pid'], 0);
  });

  test('verbose Status of a never-started sandbox is a JSON object too', async () => {
    const { controller } = setup();
    await controller.create(NS, ID, createRequest());
    const info: unknown = JSON.parse(controller.status(NS, ID, true).info?.['info'] ?? 'null');
    assert.ok(typeof info === 'object' && info !== null && !Array.isArray(info));
  });

  test('while an exit is being saved, Status never reports SANDBOX_NOTREADY without exited_at', async () => {
    const { backend, store, controller } = setup();
    await createAndStart(controller);
    store.saveGate = new Gate();
    backend.sandbox(NS, ID).exitWith(1);
    await settle();
    const during = controller.status(NS, ID, false);
    store.saveGate.open();
    await waitExit(controller, NS, ID, noDeadline());
    assert.ok(
      during.state === 'SANDBOX_READY' || during.exitedAt !== undefined,
      `Status said ${JSON.stringify(during)}: NOTREADY with no exited_at (SPEC.md section 3: exited → exited_at = Wait's)`,
    );
  });
});

describe('Stop', () => {
  test('Stop(0) kills at once and returns only after the exit is recorded', async () => {
    const { backend, store, controller } = setup();
    await createAndStart(controller);
    store.saveGate = new Gate();
    const stop = track(controller.stop(NS, ID, 0, noDeadline()));
    await settle();
    assert.deepEqual(backend.sandbox(NS, ID).signals, ['SIGKILL']);
    assert.equal(stop.settled, false, 'Stop returned before the exit was saved');

    store.saveGate.open();
    await until(() => stop.settled, 'Stop returns');
    assert.equal(stop.error, undefined);
    const record = store.current(NS, ID);
    assert.equal(record?.state, 'exited');
    assert.equal(record?.exit?.status, KILLED_STATUS);
    assert.equal(controller.status(NS, ID, false).state, 'SANDBOX_NOTREADY');
    const exit = await waitExit(controller, NS, ID, noDeadline());
    assert.equal(exit.status, KILLED_STATUS);
  });

  test("Stop whose pod files cannot be removed still kills the sandbox, then fails with the files' error; a Stop again succeeds", async () => {
    const { backend, controller } = setup();
    await createAndStart(controller);
    backend.stopTeardownError = new TsboxError('Internal', 'umount /dev/shm: device or resource busy');
    await assert.rejects(controller.stop(NS, ID, 0, noDeadline()), /umount \/dev\/shm: device or resource busy/);
    assert.deepEqual(backend.sandbox(NS, ID).signals, ['SIGKILL'], 'the sandbox was killed all the same');
    assert.equal((await waitExit(controller, NS, ID, noDeadline())).status, KILLED_STATUS);
    backend.stopTeardownError = undefined;
    await controller.stop(NS, ID, 0, noDeadline());
    assert.deepEqual(backend.teardowns, [`${keyOf(NS, ID)} stop`, `${keyOf(NS, ID)} stop`], 'the files were tried again');
  });

  test('Stop answers only once CRI no longer counts a container of the pod as running', async () => {
    const asked: { namespace: string; id: string; signal: CallSignal }[] = [];
    const criDone = new Gate();
    const podContainers: PodContainers = {
      async settled(namespace, id, signal) {
        asked.push({ namespace, id, signal });
        await criDone.wait();
      },
      close: () => undefined,
    };
    const { controller } = setup(podContainers);
    await createAndStart(controller);
    const signal = noDeadline();
    const stop = track(controller.stop(NS, ID, 0, signal));
    await until(() => controller.status(NS, ID, false).state === 'SANDBOX_NOTREADY', 'the sandbox exits');
    await settle();
    assert.equal(stop.settled, false, 'Stop answered while CRI still counted a container as running');
    assert.deepEqual(asked.map(({ namespace, id }) => ({ namespace, id })), [{ namespace: NS, id: ID }]);
    assert.equal(asked[0]?.signal, signal, 'the wait ends with the call');

    criDone.open();
    await until(() => stop.settled, 'Stop answers');
    assert.equal(stop.error, undefined);
  });

  test('Stop(N) sends SIGTERM first', async () => {
    const { backend, controller } = setup();
    await createAndStart(controller);
    await controller.stop(NS, ID, 10, noDeadline());
    assert.deepEqual(backend.sandbox(NS, ID).signals, ['SIGTERM']);
    assert.equal((await waitExit(controller, NS, ID, noDeadline())).status, TERMINATED_STATUS);
  });

  test('Stop(N) of a sandbox ignoring SIGTERM waits out the grace period, then SIGKILL', async () => {
    const { clock, backend, controller } = setup();
    backend.ignoreTerm = true;
    await createAndStart(controller);
    const stop = track(controller.stop(NS, ID, 5, noDeadline()));
    await settle();
    assert.deepEqual(backend.sandbox(NS, ID).signals, ['SIGTERM']);
    clock.advance(4999);
    await settle();
    assert.equal(stop.settled, false, 'Stop returned while the sandbox still runs');
    assert.equal(controller.status(NS, ID, false).state, 'SANDBOX_READY');

    clock.advance(1);
    await until(() => stop.settled, 'Stop returns after SIGKILL');
    assert.equal(stop.error, undefined);
    assert.deepEqual(backend.sandbox(NS, ID).signals, ['SIGTERM', 'SIGKILL']);
    assert.equal((await waitExit(controller, NS, ID, noDeadline())).status, KILLED_STATUS);
  });

  test('Stop ends with the caller\'s deadline and changes nothing else', async () => {
    const { clock, backend, controller } = setup();
    backend.ignoreTerm = true;
    await createAndStart(controller);
    const deadline = new AbortController();
    const stop = controller.stop(NS, ID, 30, deadline.signal);
    const waiter = track(waitExit(controller, NS, ID, noDeadline()));
    await settle();
    const reason = new TsboxError('DeadlineExceeded', 'deadline exceeded');
    deadline.abort(reason);
    await assert.rejects(stop, (err) => err === reason);
    assert.equal(controller.status(NS, ID, false).state, 'SANDBOX_READY');
    assert.equal(waiter.settled, false);

    clock.advance(30_000);
    await until(() => waiter.settled, 'Wait answers once the sandbox is killed');
    assert.equal(waiter.value?.status, KILLED_STATUS);
  });

  test('Stop of a never-started sandbox: OK, it counts as exited with 255 and Wait answers at once', async () => {
    const { backend, store, controller } = setup();
    await controller.create(NS, ID, createRequest());
    await controller.stop(NS, ID, 0, noDeadline());

    assert.equal(backend.startCalls.length, 0);
    assert.equal(backend.kills.length, 0);
    const exit = await waitExit(controller, NS, ID, noDeadline());
    assert.equal(exit.status, UNKNOWN_EXIT_STATUS);
    assert.deepEqual(controller.status(NS, ID, false), { state: 'SANDBOX_NOTREADY', pid: 0, exitedAt: exit.exitedAt, ...NO_ENDPOINT });
    const record = store.current(NS, ID);
    assert.equal(record?.state, 'exited');
    assert.deepEqual(record?.exit, exit);
  });

  test('Stop of a never-started sandbox answers a Wait that was already pending', async () => {
    const { controller } = setup();
    await controller.create(NS, ID, createRequest());
    const waiter = waitExit(controller, NS, ID, noDeadline());
    await controller.stop(NS, ID, 0, noDeadline());
    assert.equal((await waiter).status, UNKNOWN_EXIT_STATUS);
  });

  test('Stop of a never-started sandbox whose exit cannot be saved can be retried', async () => {
    const { store, controller } = setup();
    await controller.create(NS, ID, createRequest());
    store.failSaves({ times: 1 });
    await assert.rejects(controller.stop(NS, ID, 0, noDeadline()), /disk full/);

    const retry = new AbortController();
    const stop = track(controller.stop(NS, ID, 0, retry.signal));
    const waiter = new AbortController();
    const wait = track(waitExit(controller, NS, ID, waiter.signal));
    await giveUpAfter([stop, wait], [retry, waiter]);
    assert.equal(stop.error, undefined, 'a retried Stop (store healthy again) hangs until its deadline');
    assert.equal(wait.error, undefined, 'Wait hangs although Status says the sandbox is not ready');
    assert.equal(wait.value?.status, UNKNOWN_EXIT_STATUS);
  });

  test('Stop of an unknown sandbox is OK', async () => {
    const { store, controller } = setup();
    await controller.stop(NS, 'nope', 0, noDeadline());
    assert.equal(store.saved.length, 0);
  });

  test('Stop of an already stopped sandbox is OK and changes nothing', async () => {
    const { backend, store, controller } = setup();
    await createAndStart(controller);
    await controller.stop(NS, ID, 0, noDeadline());
    const saves = store.saved.length;
    const status = controller.status(NS, ID, true);
    await controller.stop(NS, ID, 0, noDeadline());
    await controller.stop(NS, ID, 3, noDeadline());
    assert.equal(backend.kills.length, 1);
    assert.equal(store.saved.length, saves);
    assert.deepEqual(controller.status(NS, ID, true), status);
  });
});

describe('a graceful Stop\'s deadline', () => {
  test('is written to the record before the SIGTERM and cleared once the exit is recorded', async () => {
    const { clock, backend, store, controller } = setup();
    backend.ignoreTerm = true;
    await createAndStart(controller);
    const stop = track(controller.stop(NS, ID, 5, noDeadline()));
    await settle();
    assert.deepEqual(store.current(NS, ID)?.killAt, { seconds: Math.floor(clock.ms / 1000) + 5, nanos: (clock.ms % 1000) * 1_000_000 });
    clock.advance(5000);
    await until(() => stop.settled, 'Stop returns after the SIGKILL');
    assert.equal(store.current(NS, ID)?.state, 'exited');
    assert.equal(store.current(NS, ID)?.killAt, undefined);
  });

  test('a second Stop never moves a deadline later', async () => {
    const { clock, backend, store, controller } = setup();
    backend.ignoreTerm = true;
    await createAndStart(controller);
    void controller.stop(NS, ID, 5, noDeadline()).catch(ignoreError('this Stop is only how the deadline is set'));
    await settle();
    const first = store.current(NS, ID)?.killAt;
    void controller.stop(NS, ID, 60, noDeadline()).catch(ignoreError('this Stop is only how the deadline is set'));
    await settle();
    assert.deepEqual(store.current(NS, ID)?.killAt, first);
    clock.advance(5000);
    assert.equal((await waitExit(controller, NS, ID, noDeadline())).status, KILLED_STATUS);
  });

  test('is enforced by a controller restarted during the grace period, at the recorded time', async () => {
    const { backend, store, controller } = setup();
    backend.ignoreTerm = true;
    await createAndStart(controller);
    void controller.stop(NS, ID, 30, noDeadline()).catch(ignoreError('this Stop is only how the deadline is set'));
    await settle();
    const killAt = store.current(NS, ID)?.killAt;
    assert.ok(killAt !== undefined);
    controller.close();

    // The new controller starts 10 s after the Stop: 20 s are left.
    const clock = new FakeClock(killAt.seconds * 1000 + Math.floor(killAt.nanos / 1e6) - 20_000);
    const after = new FakeBackend(clock);
    after.ignoreTerm = true;
    const restarted = new Controller({
      backend: after,
      store,
      logger: pino({ level: 'silent' }),
      platform: PLATFORM,
      stateDir: STATE_DIR,
      clock: clock.now,
      schedule: (delayMs, callback) => clock.schedule(delayMs, callback),
    });
    await restarted.recover(1);
    const waiter = track(waitExit(restarted, NS, ID, noDeadline()));
    clock.advance(19_999);
    await settle();
    assert.equal(waiter.settled, false, 'killed before the deadline');
    clock.advance(1);
    await until(() => waiter.settled, 'the SIGKILL at the deadline');
    assert.equal(waiter.value?.status, KILLED_STATUS);
    assert.deepEqual(after.sandbox(NS, ID).signals, ['SIGKILL']);
  });

  test('a SIGKILL at the deadline that cannot end the sandbox fails the Stop waiting for it, with its error', async () => {
    const { clock, backend, controller } = setup();
    backend.ignoreTerm = true;
    await createAndStart(controller);
    const stop = track(controller.stop(NS, ID, 5, noDeadline()));
    await settle();
    backend.killError = new TsboxError('Internal', 'cgroup v1 /tsbox/x still holds 1 process(es): pids 42');
    clock.advance(5000);
    await until(() => stop.settled, 'Stop answers once the SIGKILL failed');
    assert.equal(stop.error, backend.killError);
    assert.equal(controller.status(NS, ID, false).state, 'SANDBOX_READY');
    backend.killError = undefined;
    await controller.stop(NS, ID, 0, noDeadline());
    assert.equal((await waitExit(controller, NS, ID, noDeadline())).status, KILLED_STATUS);
  });
});

describe('Wait', () => {
  test('of an unknown sandbox is NOT_FOUND', async () => {
    const { controller } = setup();
    await assert.rejects(async () => waitExit(controller, NS, ID, noDeadline()), errorOf('NotFound'));
  });

  test('many concurrent waiters and late waiters all get the identical answer', async () => {
    const { clock, backend, controller } = setup();
    await createAndStart(controller);
    const waiters = Array.from({ length: 50 }, () => waitExit(controller, NS, ID, noDeadline()));
    clock.advance(2000);
    backend.sandbox(NS, ID).exitWith(3, 'crashed');
    const answers = await Promise.all(waiters);
    const first = answers[0] as ExitInfo;
    assert.equal(first.status, 3);
    assert.deepEqual(first.exitedAt, clock.now());
    for (const answer of answers) assert.deepEqual(answer, first);

    clock.advance(10_000);
    for (let i = 0; i < 3; i++) assert.deepEqual(await waitExit(controller, NS, ID, noDeadline()), first);
  });

  test('a sandbox exiting by itself wakes every Wait and turns NOTREADY without a Stop', async () => {
    const { backend, store, controller } = setup();
    await createAndStart(controller);
    const a = track(waitExit(controller, NS, ID, noDeadline()));
    const b = track(waitExit(controller, NS, ID, noDeadline()));
    await settle();
    assert.equal(a.settled || b.settled, false, 'Wait answered while the sandbox runs');

    backend.sandbox(NS, ID).exitWith(0, 'exited');
    await until(() => a.settled && b.settled, 'waiters woken');
    assert.equal(a.value?.status, 0);
    assert.deepEqual(a.value, b.value);
    assert.equal(controller.status(NS, ID, false).state, 'SANDBOX_NOTREADY');
    assert.equal(controller.status(NS, ID, false).pid, 0);
    assert.equal(backend.releaseCount(NS, ID), 1, 'what the sandbox held is released');
    assert.equal(store.current(NS, ID)?.pid, 0);
  });

  test('the exit is saved before any waiter sees it', async () => {
    const { backend, store, controller } = setup();
    await createAndStart(controller);
    let savedWhenWoken: SandboxRecord | undefined;
    const waiter = waitExit(controller, NS, ID, noDeadline()).then((exit) => {
      savedWhenWoken = store.savedFor(NS, ID).at(-1);
      return exit;
    });
    store.saveGate = new Gate();
    backend.sandbox(NS, ID).exitWith(7);
    await settle();
    assert.equal(store.savedFor(NS, ID).at(-1)?.state, 'running', 'the save is still held');
    store.saveGate.open();
    const exit = await waiter;
    assert.equal(savedWhenWoken?.state, 'exited');
    assert.deepEqual(savedWhenWoken?.exit, exit);
  });

  test('a waiter whose signal aborts rejects with its reason; the others still get the exit', async () => {
    const { backend, controller } = setup();
    await createAndStart(controller);
    const cancelled = new AbortController();
    const victim = waitExit(controller, NS, ID, cancelled.signal);
    const others = [waitExit(controller, NS, ID, noDeadline()), waitExit(controller, NS, ID, noDeadline())];
    const reason = new TsboxError('Cancelled', 'call cancelled by the client');
    cancelled.abort(reason);
    await assert.rejects(victim, (err) => err === reason);

    assert.equal(controller.status(NS, ID, false).state, 'SANDBOX_READY', 'the cancel changed nothing');
    assert.equal(backend.kills.length, 0);
    backend.sandbox(NS, ID).exitWith(4);
    for (const exit of await Promise.all(others)) assert.equal(exit.status, 4);
  });

  test('a Wait with an already aborted signal rejects at once with its reason', async () => {
    const { controller } = setup();
    await createAndStart(controller);
    const reason = new TsboxError('Unavailable', 'tsbox is shutting down');
    await assert.rejects(waitExit(controller, NS, ID, AbortSignal.abort(reason)), (err) => err === reason);
  });
});

describe('Shutdown', () => {
  /** Every operation that must be NOT_FOUND after Shutdown, and those that must be OK. */
  async function assertForgotten(controller: Controller): Promise<void> {
    assert.throws(() => controller.status(NS, ID, false), errorOf('NotFound'), 'Status');
    await assert.rejects(async () => waitExit(controller, NS, ID, noDeadline()), errorOf('NotFound'), 'Wait');
    await assert.rejects(controller.start(NS, ID), errorOf('NotFound'), 'Start');
    assert.throws(() => controller.platform(NS, ID), errorOf('NotFound'), 'Platform');
    await assert.rejects(controller.metrics(NS, ID), errorOf('NotFound'), 'Metrics');
    await assert.rejects(
      controller.update(NS, ID, { labels: {}, extensions: {}, fields: [] }),
      errorOf('NotFound'),
      'Update',
    );
    await controller.stop(NS, ID, 0, noDeadline());
    await controller.shutdown(NS, ID, noDeadline());
    assert.equal(controller.size, 0);
  }

  test('of a created sandbox forgets it', async () => {
    const { backend, store, controller } = setup();
    await controller.create(NS, ID, createRequest());
    await controller.shutdown(NS, ID, noDeadline());
    assert.equal(backend.startCalls.length, 0);
    assert.ok(backend.releaseCount(NS, ID) >= 1);
    assert.deepEqual(store.removed, [keyOf(NS, ID)]);
    assert.equal(store.current(NS, ID), undefined);
    await assertForgotten(controller);
  });

  test('of a running sandbox kills it, answers its Waits, releases it and forgets it', async () => {
    const { backend, store, controller } = setup();
    await createAndStart(controller);
    const waiter = waitExit(controller, NS, ID, noDeadline());
    await controller.shutdown(NS, ID, noDeadline());
    assert.deepEqual(backend.sandbox(NS, ID).signals, ['SIGKILL']);
    assert.equal((await waiter).status, KILLED_STATUS);
    assert.ok(backend.releaseCount(NS, ID) >= 1);
    assert.equal(store.current(NS, ID), undefined);
    await assertForgotten(controller);
  });

  test('of an exited sandbox forgets it', async () => {
    const { backend, store, controller } = setup();
    await createAndStart(controller);
    backend.sandbox(NS, ID).exitWith(0);
    await waitExit(controller, NS, ID, noDeadline());
    await controller.shutdown(NS, ID, noDeadline());
    assert.deepEqual(backend.sandbox(NS, ID).signals, [], 'an exited sandbox is not signalled');
    assert.equal(store.current(NS, ID), undefined);
    await assertForgotten(controller);
  });

  test('of a created sandbox answers its pending Waits with 255', async () => {
    const { controller } = setup();
    await controller.create(NS, ID, createRequest());
    const waiter = waitExit(controller, NS, ID, noDeadline());
    await controller.shutdown(NS, ID, noDeadline());
    assert.equal((await waiter).status, UNKNOWN_EXIT_STATUS);
  });

  test('of an unknown sandbox is OK', async () => {
    const { store, controller } = setup();
    await controller.shutdown(NS, 'nope', noDeadline());
    assert.equal(store.removed.length, 0);
  });

  test('racing a Wait: the waiter gets the exit status, later Waits NOT_FOUND', async () => {
    const { controller } = setup();
    await createAndStart(controller);
    const waiter = waitExit(controller, NS, ID, noDeadline());
    const shutdown = controller.shutdown(NS, ID, noDeadline());
    const exit = await waiter;
    assert.equal(exit.status, KILLED_STATUS);
    await shutdown;
    await assert.rejects(async () => waitExit(controller, NS, ID, noDeadline()), errorOf('NotFound'));
  });

  test('racing a Stop (Stop first): both succeed, one kill, the sandbox is gone', async () => {
    const { backend, controller } = setup();
    await createAndStart(controller);
    await Promise.all([controller.stop(NS, ID, 0, noDeadline()), controller.shutdown(NS, ID, noDeadline())]);
    assert.deepEqual(backend.sandbox(NS, ID).signals, ['SIGKILL']);
    assert.throws(() => controller.status(NS, ID, false), errorOf('NotFound'));
  });

  test('racing a Stop (Shutdown first): both succeed, the sandbox is gone', async () => {
    const { backend, controller } = setup();
    await createAndStart(controller);
    await Promise.all([controller.shutdown(NS, ID, noDeadline()), controller.stop(NS, ID, 0, noDeadline())]);
    assert.deepEqual(backend.sandbox(NS, ID).signals, ['SIGKILL']);
    assert.throws(() => controller.status(NS, ID, false), errorOf('NotFound'));
  });

  test('during a Start waits for it, then removes the sandbox it started', async () => {
    const { backend, store, controller } = setup();
    await controller.create(NS, ID, createRequest());
    backend.startGate = new Gate();
    const start = controller.start(NS, ID);
    const shutdown = track(controller.shutdown(NS, ID, noDeadline()));
    await until(() => backend.startCalls.length === 1, 'backend.start called');
    assert.equal(shutdown.settled, false);
    backend.startGate.open();
    await start;
    await until(() => shutdown.settled, 'Shutdown finishes');
    assert.equal(shutdown.error, undefined);
    assert.deepEqual(backend.sandbox(NS, ID).signals, ['SIGKILL'], 'the sandbox it started was killed');
    assert.equal(store.current(NS, ID), undefined);
    assert.throws(() => controller.status(NS, ID, false), errorOf('NotFound'));
  });
});

describe('Platform, Metrics, Update', () => {
  test('Platform answers the host platform; unknown is NOT_FOUND', async () => {
    const { controller } = setup();
    assert.throws(() => controller.platform(NS, ID), errorOf('NotFound'));
    await controller.create(NS, ID, createRequest());
    assert.deepEqual(controller.platform(NS, ID), PLATFORM);
  });

  test('Metrics passes the backend\'s answer through, with the running sandbox', async () => {
    const { backend, controller } = setup();
    await createAndStart(controller);
    const answer = { typeUrl: 'io.containerd.cgroups.v2.Metrics', value: new Uint8Array([1, 2, 3]) };
    backend.metricsAnswer = answer;
    assert.deepEqual(await controller.metrics(NS, ID), answer);
    assert.equal(backend.metricsCalls.at(-1), backend.sandbox(NS, ID));

    backend.metricsAnswer = new TsboxError('Unimplemented', 'no cgroup');
    await assert.rejects(controller.metrics(NS, ID), errorOf('Unimplemented'));
  });

  test('Metrics of an unknown sandbox is NOT_FOUND', async () => {
    const { backend, controller } = setup();
    await assert.rejects(controller.metrics(NS, ID), errorOf('NotFound'));
    assert.equal(backend.metricsCalls.length, 0);
  });

  test('Update applies labels and saves them; unknown is NOT_FOUND', async () => {
    const { store, controller } = setup();
    await assert.rejects(controller.update(NS, ID, { labels: { a: '1' }, extensions: {}, fields: [] }), errorOf('NotFound'));
    await controller.create(NS, ID, createRequest({ labels: { old: 'x' } }));
    await controller.update(NS, ID, { labels: { team: 'blue' }, extensions: {}, fields: ['labels'] });
    const record = store.current(NS, ID);
    assert.deepEqual(record?.labels, { team: 'blue' });
    assert.equal(record?.state, 'created', 'Update does not change the state');
  });

  test('Update with named fields changes only those', async () => {
    const { store, controller } = setup();
    const ext = { typeUrl: 'example.com/Thing', value: new Uint8Array([9]) };
    await controller.create(NS, ID, createRequest({ labels: { keep: 'me' }, extensions: { thing: ext } }));
    await controller.update(NS, ID, {
      labels: { ignored: 'yes' },
      extensions: {},
      annotations: { note: 'hi' },
      fields: ['annotations'],
    });
    const record = store.current(NS, ID);
    assert.deepEqual(record?.labels, { keep: 'me' });
    assert.deepEqual(record?.annotations, { note: 'hi' });
    assert.deepEqual(record?.extensions, { thing: { typeUrl: 'example.com/Thing', value: Buffer.from([9]).toString('base64') } });
  });

  test('an Update racing an exit does not lose the recorded exit, also after a restart', async () => {
    const { backend, store, controller } = setup();
    await createAndStart(controller);
    store.saveGate = new Gate();
    backend.sandbox(NS, ID).exitWith(1, 'crashed');
    const update = controller.update(NS, ID, { labels: { team: 'blue' }, extensions: {}, fields: ['labels'] });
    await settle();
    store.saveGate.open();
    await update;
    const exit = await waitExit(controller, NS, ID, noDeadline());
    assert.equal(exit.status, 1);

    const saved = store.current(NS, ID);
    assert.equal(saved?.state, 'exited');
    assert.deepEqual(saved?.exit, exit, 'the record on disk says exited but has lost how');

    const after = new Controller({
      backend: new FakeBackend(),
      store,
      logger: pino({ level: 'silent' }),
      platform: PLATFORM,
      stateDir: STATE_DIR,
    });
    await after.recover(1);
    assert.deepEqual(await waitExit(after, NS, ID, noDeadline()), exit, 'Wait after a restart gives another answer');
  });

  test('Update of a running sandbox keeps it running', async () => {
    const { store, controller } = setup();
    const started = await createAndStart(controller);
    await controller.update(NS, ID, { labels: { a: 'b' }, extensions: {}, fields: [] });
    assert.equal(store.current(NS, ID)?.state, 'running');
    assert.equal(store.current(NS, ID)?.pid, started.pid);
    assert.equal(controller.status(NS, ID, false).state, 'SANDBOX_READY');
  });
});

describe('recover', () => {
  function restarted(store: MemoryRecordStore): { backend: FakeBackend; controller: Controller; clock: FakeClock } {
    const clock = new FakeClock(Date.UTC(2025, 5, 1));
    const backend = new FakeBackend(clock);
    const controller = new Controller({
      backend,
      store,
      logger: pino({ level: 'silent' }),
      platform: PLATFORM,
      stateDir: STATE_DIR,
      clock: clock.now,
    });
    return { backend, controller, clock };
  }

  const startedAt = { seconds: 1_700_000_100, nanos: 5 };

  test('a created record comes back created and can be started', async () => {
    const store = new MemoryRecordStore();
    store.seed(makeRecord({ namespace: NS, id: ID, state: 'created' }));
    const { backend, controller } = restarted(store);
    const summary = await controller.recover(4);
    assert.equal(summary.recovered, 1);
    assert.equal(summary.created, 1);
    assert.deepEqual(controller.status(NS, ID, false), { state: 'SANDBOX_UNKNOWN', pid: 0, ...NO_ENDPOINT });
    // A created record may hide a Start that never answered: its leftovers are looked for.
    assert.deepEqual(backend.abandoned, [keyOf(NS, ID)]);
    await controller.start(NS, ID);
    assert.equal(controller.status(NS, ID, false).state, 'SANDBOX_READY');
  });

  test('a Start that never answered is undone: abandoned, released, its pod files torn down, back to created', async () => {
    const store = new MemoryRecordStore();
    store.seed(makeRecord({ namespace: NS, id: ID, state: 'starting' }));
    const { backend, controller } = restarted(store);
    const summary = await controller.recover(4);
    assert.equal(summary.created, 1);
    assert.deepEqual(backend.abandoned, [keyOf(NS, ID)]);
    assert.equal(backend.releaseCount(NS, ID), 1);
    assert.deepEqual(backend.teardowns, [`${keyOf(NS, ID)} stop`], 'the /dev/shm mount and pod files of the attempt go');
    assert.equal(store.current(NS, ID)?.state, 'created');
    assert.deepEqual(controller.status(NS, ID, false), { state: 'SANDBOX_UNKNOWN', pid: 0, ...NO_ENDPOINT });
    await controller.start(NS, ID);
    assert.equal(controller.status(NS, ID, false).state, 'SANDBOX_READY');
  });

  test('a running sandbox is watched again and its later exit is reported', async () => {
    const store = new MemoryRecordStore();
    store.seed(makeRecord({ namespace: NS, id: ID, state: 'running', pid: 4321, startedAt, backend: { fakePid: 4321 }, endpoint: recordedEndpoint }));
    const { backend, controller } = restarted(store);
    const summary = await controller.recover(4);
    assert.equal(summary.running, 1);
    assert.deepEqual(backend.recoverCalls, [{ key: keyOf(NS, ID), handle: { fakePid: 4321 } }]);
    assert.deepEqual(controller.status(NS, ID, false), { state: 'SANDBOX_READY', pid: 4321, createdAt: startedAt, ...recordedEndpoint });

    const waiter = waitExit(controller, NS, ID, noDeadline());
    backend.sandbox(NS, ID).exitWith(6, 'crashed');
    const exit = await waiter;
    assert.equal(exit.status, 6);
    assert.equal(store.current(NS, ID)?.state, 'exited');
    assert.equal(store.current(NS, ID)?.exit?.status, 6);
    assert.equal(controller.status(NS, ID, false).state, 'SANDBOX_NOTREADY');
  });

  test('a recovered running sandbox can be stopped', async () => {
    const store = new MemoryRecordStore();
    store.seed(makeRecord({ namespace: NS, id: ID, state: 'running', pid: 77, startedAt, backend: { fakePid: 77 } }));
    const { backend, controller } = restarted(store);
    await controller.recover(1);
    await controller.stop(NS, ID, 0, noDeadline());
    assert.deepEqual(backend.sandbox(NS, ID).signals, ['SIGKILL']);
    assert.equal((await waitExit(controller, NS, ID, noDeadline())).status, KILLED_STATUS);
  });

  test('a running record whose sandbox exited while tsbox was away: the real exit is recorded', async () => {
    const store = new MemoryRecordStore();
    store.seed(makeRecord({ namespace: NS, id: ID, state: 'running', pid: 55, startedAt, backend: { fakePid: 55 } }));
    const { backend, controller } = restarted(store);
    const away: ExitInfo = { status: 42, exitedAt: { seconds: 1_700_000_500, nanos: 0 }, reason: 'exited with status 42' };
    backend.setRecovery(NS, ID, { kind: 'exited', exit: away });
    const summary = await controller.recover(4);
    assert.equal(summary.exited, 1);
    assert.deepEqual(store.current(NS, ID)?.exit, away);
    assert.equal(store.current(NS, ID)?.state, 'exited');
    assert.equal(backend.releaseCount(NS, ID), 1);
    assert.deepEqual(await waitExit(controller, NS, ID, noDeadline()), away);
    assert.deepEqual(controller.status(NS, ID, false), {
      state: 'SANDBOX_NOTREADY',
      pid: 0,
      createdAt: startedAt,
      exitedAt: away.exitedAt,
      ...NO_ENDPOINT,
    });
  });

  test('an exited record: Wait answers at once with the recorded exit', async () => {
    const store = new MemoryRecordStore();
    const recorded: ExitInfo = { status: 137, exitedAt: { seconds: 1_700_000_900, nanos: 123 }, reason: 'killed' };
    store.seed(makeRecord({ namespace: NS, id: ID, state: 'exited', pid: 0, startedAt, exit: recorded }));
    const { backend, controller } = restarted(store);
    const summary = await controller.recover(4);
    assert.equal(summary.exited, 1);
    assert.equal(backend.recoverCalls.length, 0);
    assert.deepEqual(await waitExit(controller, NS, ID, noDeadline()), recorded);
    assert.deepEqual(await waitExit(controller, NS, ID, noDeadline()), recorded);
    assert.equal(controller.status(NS, ID, false).state, 'SANDBOX_NOTREADY');
    assert.deepEqual(controller.status(NS, ID, false).exitedAt, recorded.exitedAt);
  });

  test('many records in every state, with the store\'s quarantine count, in one summary', async () => {
    const store = new MemoryRecordStore();
    store.quarantined = [
      { namespace: NS, id: 'torn1', leftover: true },
      { namespace: NS, id: 'torn2', leftover: true },
    ];
    store.seed(makeRecord({ namespace: NS, id: 'c1', state: 'created' }));
    store.seed(makeRecord({ namespace: NS, id: 's1', state: 'starting' }));
    store.seed(makeRecord({ namespace: NS, id: 'r1', state: 'running', pid: 1, startedAt }));
    store.seed(makeRecord({ namespace: 'default', id: 'r1', state: 'running', pid: 2, startedAt }));
    store.seed(
      makeRecord({
        namespace: NS,
        id: 'e1',
        state: 'exited',
        exit: { status: 0, exitedAt: { seconds: 1_700_000_000, nanos: 0 }, reason: 'done' },
      }),
    );
    const { controller } = restarted(store);
    const summary = await controller.recover(2);
    assert.deepEqual(
      { recovered: summary.recovered, running: summary.running, exited: summary.exited, created: summary.created, quarantined: summary.quarantined },
      { recovered: 5, running: 2, exited: 1, created: 2, quarantined: 2 },
    );
  });

  test('a quarantined sandbox is not served: its leftovers are abandoned, released and removed', async () => {
    const store = new MemoryRecordStore();
    store.quarantined = [{ namespace: NS, id: 'torn', leftover: true }];
    store.seed(makeRecord({ namespace: NS, id: ID, state: 'created' }));
    const { backend, controller } = restarted(store);
    const summary = await controller.recover(4);
    assert.equal(summary.quarantined, 1);
    assert.equal(summary.recovered, 1);
    assert.ok(backend.abandoned.includes(keyOf(NS, 'torn')));
    assert.equal(backend.releaseCount(NS, 'torn'), 1);
    assert.deepEqual(store.removed, [keyOf(NS, 'torn')]);
    assert.throws(() => controller.status(NS, 'torn', false), errorOf('NotFound'));
    assert.equal(controller.status(NS, ID, false).state, 'SANDBOX_UNKNOWN');
  });

  test('a Start that never answered and cannot be undone at recovery can still be shut down', async () => {
    const store = new MemoryRecordStore();
    store.seed(makeRecord({ namespace: NS, id: ID, state: 'starting' }));
    const { backend, controller } = restarted(store);
    backend.abandonError = new Error('cannot reach the supervisor');
    await controller.recover(1);
    backend.abandonError = undefined;

    // SPEC.md section 3: Shutdown deletes the sandbox from any state.
    await assert.doesNotReject(controller.shutdown(NS, ID, noDeadline()), 'Shutdown fails for ever');
    assert.throws(() => controller.status(NS, ID, false), errorOf('NotFound'));
  });

  test('a store that cannot be read makes recovery fail instead of serving an empty table', async () => {
    const store = new MemoryRecordStore();
    store.seed(makeRecord({ namespace: NS, id: ID, state: 'created' }));
    store.loadError = new Error('EIO');
    const { controller } = restarted(store);
    await assert.rejects(controller.recover(4), /EIO/);
  });

  test('a running record whose sandbox cannot be confirmed can still be stopped and waited for', async () => {
    const store = new MemoryRecordStore();
    store.seed(makeRecord({ namespace: NS, id: ID, state: 'running', pid: 99, startedAt, backend: { fakePid: 99 } }));
    const { backend, controller } = restarted(store);
    backend.setRecovery(NS, ID, { kind: 'error', error: new Error('supervisor not reachable') });
    await controller.recover(1);

    // SPEC.md section 6: Stop of a sandbox in an unknown state records the exit (255 "now")
    // when no process can be found, so Stop returns and Wait answers.
    const stopSignal = new AbortController();
    const waitSignal = new AbortController();
    const stop = track(controller.stop(NS, ID, 0, stopSignal.signal));
    const wait = track(waitExit(controller, NS, ID, waitSignal.signal));
    await giveUpAfter([stop, wait], [stopSignal, waitSignal]);
    assert.equal(stop.error, undefined, 'Stop hangs until its deadline');
    assert.equal(wait.error, undefined, 'Wait never answers');
    assert.equal(wait.value?.status, UNKNOWN_EXIT_STATUS);
  });
});

describe('close', () => {
  test('closes the backend and leaves sandboxes running', async () => {
    const { backend, controller } = setup();
    await createAndStart(controller);
    controller.close();
    assert.equal(backend.closeCalls, 1);
    assert.deepEqual(backend.sandbox(NS, ID).signals, []);
  });
});

describe('the pod\'s OCI spec and containerd 2.3\'s resource updates', () => {
  const podOptions = (linux: Partial<NonNullable<PodSandboxConfig['linux']>> = {}) => ({
    typeUrl: 'runtime.v1.PodSandboxConfig',
    value: PodSandboxConfig.encode(
      PodSandboxConfig.fromPartial({ metadata: { name: 'web', uid: 'u-1', namespace: 'shop' }, hostname: 'web', logDirectory: '/var/log/pods/u-1', linux: { sysctls: { 'net.ipv4.ip_forward': '1' }, ...linux } }),
    ).finish(),
  });
  const updated = (json: unknown) => ({ typeUrl: 'io.containerd.cri.v1/UpdatedResources', value: Buffer.from(JSON.stringify(json)) });

  test('Start returns the pod\'s spec: the backend\'s namespaces and cgroup, the limits with overhead, CRI\'s annotations, sysctls; Status verbose carries it as runtimeSpec', async () => {
    const { backend, controller } = setup();
    await controller.create(NS, ID, createRequest({ options: podOptions({ resources: LinuxContainerResources.fromPartial({ cpuShares: 512, memoryLimitInBytes: 64 << 20 }), overhead: LinuxContainerResources.fromPartial({ memoryLimitInBytes: 8 << 20 }) }), annotations: { team: 'a' } }));
    const started = await controller.start(NS, ID);
    const pid = backend.sandbox(NS, ID).pid;
    const spec = started.spec as { hostname: string; annotations: Record<string, string>; linux: Record<string, unknown>; process: { args: string[] } };
    assert.equal(spec.hostname, 'web');
    assert.deepEqual(spec.process.args, ['fake-pause']);
    assert.deepEqual(spec.linux['namespaces'], [{ type: 'mount', path: `/proc/${pid}/ns/mnt` }]);
    assert.equal(spec.linux['cgroupsPath'], `/fake/${ID}`);
    assert.deepEqual(spec.linux['resources'], { cpu: { shares: 512 }, memory: { limit: 72 << 20 } }, 'the cgroup gets the resources plus the overhead');
    assert.deepEqual(spec.linux['sysctl'], { 'net.ipv4.ip_forward': '1' });
    assert.equal(spec.annotations['team'], 'a');
    assert.equal(spec.annotations['io.kubernetes.cri.container-type'], 'sandbox');
    assert.equal(spec.annotations['io.kubernetes.cri.sandbox-name'], 'web');
    assert.equal(spec.annotations['io.kubernetes.cri.sandbox-namespace'], 'shop');
    assert.equal(spec.annotations['io.kubernetes.cri.sandbox-uid'], 'u-1');
    assert.equal(spec.annotations['io.kubernetes.cri.sandbox-log-directory'], '/var/log/pods/u-1');
    assert.equal(spec.annotations['io.kubernetes.cri.sandbox-memory'], String(64 << 20), 'the pod\'s own memory, as podsandbox annotates it');
    const info = JSON.parse(controller.status(NS, ID, true).info?.['info'] ?? '{}') as Record<string, unknown>;
    assert.deepEqual(info['runtimeSpec'], started.spec);
    assert.equal(info['processStatus'], 'running');
    assert.equal(info['pid'], pid);
  });

  test('an Update with extensions["updated-resources"] applies the new resources plus overhead once; the same again applies nothing; the spec follows', async () => {
    const { backend, controller } = setup();
    await controller.create(NS, ID, createRequest({ options: podOptions({ resources: LinuxContainerResources.fromPartial({ cpuShares: 512 }) }) }));
    await controller.start(NS, ID);
    const extensions = { 'updated-resources': updated({ Overhead: { memory_limit_in_bytes: 1 << 20 }, Resources: { cpu_shares: 1024, memory_limit_in_bytes: 32 << 20, cpu_quota: -1 } }) };
    await controller.update(NS, ID, { labels: {}, extensions, fields: ['extensions'] });
    assert.deepEqual(backend.resourceUpdates, [{ key: `${NS}/${ID}`, limits: { cpuShares: 1024, memoryLimitBytes: 33 << 20 } }]);
    await controller.update(NS, ID, { labels: { seen: 'yes' }, extensions, fields: [] });
    assert.equal(backend.resourceUpdates.length, 1, 'containerd resends its extensions: unchanged limits are not applied again');
    const info = JSON.parse(controller.status(NS, ID, true).info?.['info'] ?? '{}') as { runtimeSpec: { linux: { resources: unknown } } };
    assert.deepEqual(info.runtimeSpec.linux.resources, { cpu: { shares: 1024 }, memory: { limit: 33 << 20 } });
  });

  test('resources the kernel refuses: the error says so, the former limits are written back, the record keeps them', async () => {
    const { backend, store, controller } = setup();
    await controller.create(NS, ID, createRequest({ options: podOptions({ resources: LinuxContainerResources.fromPartial({ cpuShares: 512 }) }) }));
    await controller.start(NS, ID);
    backend.failNextResourceUpdate(new TsboxError('FailedPrecondition', 'cannot set cpuset.cpus = 99: Invalid argument'));
    await assert.rejects(
      controller.update(NS, ID, { labels: {}, extensions: { 'updated-resources': updated({ Resources: { cpu_shares: 1024, cpuset_cpus: '99' } }) }, fields: ['extensions'] }),
      errorOf('FailedPrecondition', /cpuset\.cpus = 99/),
    );
    assert.deepEqual(
      backend.resourceUpdates.map((u) => u.limits),
      [{ cpuShares: 1024, cpusetCpus: '99' }, { cpuShares: 512 }],
      'the new limits, then the former ones again',
    );
    assert.deepEqual(store.current(NS, ID)?.launch.pod?.resources, { cpuShares: 512 });
  });

  test('updated-resources of a pod that no longer runs are kept, not applied; a malformed one is INVALID_ARGUMENT and changes nothing', async () => {
    const { backend, store, controller } = setup();
    await controller.create(NS, ID, createRequest({ options: podOptions() }));
    await controller.start(NS, ID);
    await assert.rejects(
      controller.update(NS, ID, { labels: {}, extensions: { 'updated-resources': { typeUrl: 'io.containerd.cri.v1/UpdatedResources', value: Buffer.from('{"Resources": {"cpu_shares": "many"}}') } }, fields: ['extensions'] }),
      errorOf('InvalidArgument', /updated-resources.*cpu_shares/s),
    );
    await assert.rejects(
      controller.update(NS, ID, { labels: {}, extensions: { 'updated-resources': updated({ Resources: { memory_limit_in_bytes: -5 } }) }, fields: ['extensions'] }),
      errorOf('InvalidArgument', /memory_limit_in_bytes is negative/),
    );
    assert.equal(store.current(NS, ID)?.launch.pod?.resources, undefined, 'nothing recorded');
    await controller.stop(NS, ID, 0, noDeadline());
    await controller.update(NS, ID, { labels: {}, extensions: { 'updated-resources': updated({ Resources: { cpu_shares: 256 } }) }, fields: ['extensions'] });
    assert.deepEqual(backend.resourceUpdates, []);
    assert.deepEqual(store.current(NS, ID)?.launch.pod?.resources, { cpuShares: 256 });
  });
});
