// ExitSignal: the exit of a sandbox is set once and every waiter, present or late, gets
// exactly that value; a waiter whose call ends (cancel, deadline, shutdown) goes away and
// leaves nothing behind. CRI holds one Wait per pod for the pod's whole life, and every
// cancelled Wait must not cost memory (SPEC.md section 3, STYLE.md convention 3).
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { pino } from 'pino';
import { Controller } from '../../src/controller/controller.js';
import { ExitSignal } from '../../src/controller/exit-signal.js';
import type { ExitInfo } from '../../src/controller/types.js';
import { TsboxError, isTsboxError } from '../../src/base/errors.js';
import { FakeBackend, FakeClock, MemoryRecordStore, waitExit } from '../support/fakes.js';

const EXIT: ExitInfo = { status: 137, exitedAt: { seconds: 1_700_000_000, nanos: 42 }, reason: 'killed' };

describe('ExitSignal', () => {
  test('has no exit and no waiters at first', () => {
    const signal = new ExitSignal();
    assert.equal(signal.exit, undefined);
    assert.equal(signal.pending, 0);
  });

  test('wakes every pending waiter with the one exit', async () => {
    const signal = new ExitSignal();
    const waiters = Array.from({ length: 5 }, () => signal.wait());
    assert.equal(signal.pending, 5);
    assert.equal(signal.resolve(EXIT), true);
    assert.equal(signal.pending, 0);
    for (const exit of await Promise.all(waiters)) assert.equal(exit, EXIT);
    assert.equal(signal.exit, EXIT);
  });

  test('an exit is final: a second resolve is ignored', async () => {
    const signal = new ExitSignal();
    signal.resolve(EXIT);
    const other: ExitInfo = { status: 0, exitedAt: { seconds: 1, nanos: 0 }, reason: 'other' };
    assert.equal(signal.resolve(other), false);
    assert.equal(signal.exit, EXIT);
    assert.equal(await signal.wait(), EXIT);
  });

  test('a late waiter gets the same exit at once, without becoming pending', async () => {
    const signal = new ExitSignal();
    signal.resolve(EXIT);
    const late = signal.wait(new AbortController().signal);
    assert.equal(signal.pending, 0);
    assert.equal(await late, EXIT);
  });

  test('a recorded exit wins over an already aborted signal', async () => {
    const signal = new ExitSignal();
    signal.resolve(EXIT);
    assert.equal(await signal.wait(AbortSignal.abort(new TsboxError('Cancelled', 'gone'))), EXIT);
  });

  test('an abort rejects that waiter with the signal\'s reason and leaves the others waiting', async () => {
    const signal = new ExitSignal();
    const controller = new AbortController();
    const victim = signal.wait(controller.signal);
    const survivor = signal.wait(new AbortController().signal);
    const plain = signal.wait();
    assert.equal(signal.pending, 3);

    const reason = new TsboxError('DeadlineExceeded', 'deadline exceeded');
    controller.abort(reason);
    await assert.rejects(victim, (err) => err === reason);
    assert.equal(signal.pending, 2);

    signal.resolve(EXIT);
    assert.equal(await survivor, EXIT);
    assert.equal(await plain, EXIT);
  });

  test('an abort without a TsboxError reason rejects as Cancelled', async () => {
    const signal = new ExitSignal();
    const controller = new AbortController();
    const waiter = signal.wait(controller.signal);
    controller.abort(new Error('some other reason'));
    await assert.rejects(waiter, (err) => isTsboxError(err, 'Cancelled'));
    assert.equal(signal.pending, 0);
  });

  test('an already aborted signal rejects at once and adds no waiter', async () => {
    const signal = new ExitSignal();
    const reason = new TsboxError('Unavailable', 'tsbox is shutting down');
    const waiter = signal.wait(AbortSignal.abort(reason));
    assert.equal(signal.pending, 0);
    await assert.rejects(waiter, (err) => err === reason);
  });

  test('aborting after the exit changes nothing', async () => {
    const signal = new ExitSignal();
    const controller = new AbortController();
    const waiter = signal.wait(controller.signal);
    signal.resolve(EXIT);
    controller.abort(new TsboxError('Cancelled', 'too late'));
    assert.equal(await waiter, EXIT);
  });
});

/** Collects garbage until the heap settles; fails clearly when gc is not exposed. */
async function heapAfterGc(): Promise<number> {
  const gc = globalThis.gc;
  if (typeof gc !== 'function') {
    assert.fail('global.gc is not available: run the unit tests with `node --test --expose-gc`');
  }
  for (let i = 0; i < 4; i++) {
    await new Promise<void>((resolve) => setImmediate(resolve));
    gc();
  }
  return process.memoryUsage().heapUsed;
}

const WAITS = 10_000;
/** Far below what 10 000 leaked waiters cost (each keeps a signal and closures, ~2 KiB). */
const HEAP_BOUND = 2 * 1024 * 1024;

/** Starts WAITS waits with their own signals, aborts them all, and waits until all rejected. */
async function abandonWaits(wait: (signal: AbortSignal) => Promise<ExitInfo>): Promise<number> {
  const controllers: AbortController[] = [];
  const outcomes: Promise<boolean>[] = [];
  for (let i = 0; i < WAITS; i++) {
    const controller = new AbortController();
    controllers.push(controller);
    outcomes.push(
      wait(controller.signal).then(
        () => false,
        (err: unknown) => isTsboxError(err, 'Cancelled'),
      ),
    );
  }
  const reason = new TsboxError('Cancelled', 'call cancelled by the client');
  for (const controller of controllers) controller.abort(reason);
  const results = await Promise.all(outcomes);
  return results.filter(Boolean).length;
}

describe('abandoned waits leave nothing behind', () => {
  test(`${WAITS} aborted ExitSignal waits: none pending, heap back near its baseline`, async (t) => {
    const signal = new ExitSignal();

    // Warm up the code paths once, so the baseline does not count compiled code.
    assert.equal(await abandonWaits((s) => signal.wait(s)), WAITS);
    const baseline = await heapAfterGc();

    assert.equal(await abandonWaits((s) => signal.wait(s)), WAITS, 'every wait rejected as cancelled');
    assert.equal(await abandonWaits((s) => signal.wait(s)), WAITS);
    const after = await heapAfterGc();

    assert.equal(signal.pending, 0, 'aborted waiters are gone');
    const grown = after - baseline;
    t.diagnostic(`heap growth: ${(grown / 1024).toFixed(0)} KiB`);
    assert.ok(grown < HEAP_BOUND, `heap grew by ${(grown / 1024).toFixed(0)} KiB after ${2 * WAITS} aborted waits`);

    // The signal still works for a waiter that stays.
    const stays = signal.wait(new AbortController().signal);
    assert.equal(signal.pending, 1);
    signal.resolve(EXIT);
    assert.equal(await stays, EXIT);
  });

  test(`${WAITS} aborted Controller waits on a running sandbox: heap back near its baseline`, async (t) => {
    const clock = new FakeClock();
    const backend = new FakeBackend(clock);
    const controller = new Controller({
      backend,
      store: new MemoryRecordStore(),
      logger: pino({ level: 'silent' }),
      platform: { os: 'linux', architecture: 'amd64', variant: '' },
      stateDir: '/var/lib/tsbox-unit',
      clock: clock.now,
    });
    await controller.create('k8s.io', 'pod1', { netnsPath: '', options: undefined, spec: undefined, extensions: {}, labels: {}, annotations: {} });
    await controller.start('k8s.io', 'pod1');
    const longLived = waitExit(controller, 'k8s.io', 'pod1', new AbortController().signal);
    const wait = (s: AbortSignal): Promise<ExitInfo> => waitExit(controller, 'k8s.io', 'pod1', s);

    assert.equal(await abandonWaits(wait), WAITS);
    const baseline = await heapAfterGc();

    assert.equal(await abandonWaits(wait), WAITS, 'every wait rejected as cancelled');
    assert.equal(await abandonWaits(wait), WAITS);
    const after = await heapAfterGc();

    const grown = after - baseline;
    t.diagnostic(`heap growth: ${(grown / 1024).toFixed(0)} KiB`);
    assert.ok(grown < HEAP_BOUND, `heap grew by ${(grown / 1024).toFixed(0)} KiB after ${2 * WAITS} aborted waits`);

    // The sandbox was never disturbed: it still runs, and its one real waiter gets the exit.
    assert.equal(controller.status('k8s.io', 'pod1', false).state, 'SANDBOX_READY');
    backend.sandbox('k8s.io', 'pod1').exitWith(0);
    assert.equal((await longLived).status, 0);
  });
});
