// pollUntil: a bounded wait for something no event tells for sure (a process that is not our
// child, gone). An event that likely ends it (a pod's link closing as its process ends) wakes
// it at once instead of at the poll's next turn, which is what a pod's teardown waits on; the
// poll goes on after a wake that did not end it. Timers are the test's (node:test's mock
// timers): nothing here depends on how fast the machine is.
import assert from 'node:assert/strict';
import { setImmediate as turn } from 'node:timers/promises';
import { afterEach, beforeEach, describe, mock, test } from 'node:test';
import { boundOf, pollUntil } from '../../src/runtime/bound.js';
import { isTsboxError } from '../../src/base/errors.js';

/** Lets every promise that can settle without a timer settle (immediates are not mocked). */
async function settleAll(): Promise<void> {
  for (let i = 0; i < 10; i++) await turn();
}

/** A promise and whether it has settled yet. */
function watch<T>(promise: Promise<T>): { readonly settled: () => boolean; readonly promise: Promise<T> } {
  let settled = false;
  const watched = promise.finally(() => {
    settled = true;
  });
  return { settled: () => settled, promise: watched };
}

describe('pollUntil', () => {
  beforeEach(() => mock.timers.enable({ apis: ['setTimeout'] }));
  afterEach(() => mock.timers.reset());

  test('a wake checks again at once: no timer has to fire', async () => {
    let gone = false;
    let checks = 0;
    let wake!: () => void;
    const woken = new Promise<void>((resolve) => (wake = resolve));
    const waiting = watch(pollUntil(() => Promise.resolve((checks++, gone)), boundOf(60_000, new AbortController().signal), woken));
    await settleAll();
    assert.equal(waiting.settled(), false);
    assert.equal(checks, 1, 'checked once at the start, then sleeping');
    gone = true;
    wake();
    await settleAll();
    assert.equal(waiting.settled(), true, 'the wake ended the wait without any timer firing');
    assert.equal(await waiting.promise, true);
    assert.equal(checks, 2);
  });

  test('after a wake that did not end it, the poll goes on from its shortest interval', async () => {
    let gone = false;
    let wake!: () => void;
    const woken = new Promise<void>((resolve) => (wake = resolve));
    const waiting = watch(pollUntil(() => Promise.resolve(gone), boundOf(60_000, new AbortController().signal), woken));
    await settleAll();
    // Three turns of the poll (5, 10, 20 ms) before the wake: its interval has grown.
    for (const ms of [5, 10, 20]) {
      mock.timers.tick(ms);
      await settleAll();
    }
    wake();
    await settleAll();
    assert.equal(waiting.settled(), false, 'the wake found it not done: still waiting');
    gone = true;
    mock.timers.tick(4);
    await settleAll();
    assert.equal(waiting.settled(), false);
    mock.timers.tick(1);
    await settleAll();
    assert.equal(waiting.settled(), true, 'checked again 5 ms after the wake, not 40');
    assert.equal(await waiting.promise, true);
  });

  test("the call's signal ends it with the call's error, also while a wake is pending", async () => {
    const call = new AbortController();
    const waiting = pollUntil(() => Promise.resolve(false), boundOf(60_000, call.signal), new Promise(() => undefined));
    await settleAll();
    call.abort(new Error('deadline of the call'));
    await assert.rejects(waiting, (err: unknown) => isTsboxError(err) || (err as Error).message.includes('deadline'));
  });

  test('a bound already past gives false after one last check', async () => {
    let checks = 0;
    const bound = { ...boundOf(10, new AbortController().signal), deadline: Date.now() - 1 };
    assert.equal(await pollUntil(() => Promise.resolve((checks++, false)), bound, new Promise(() => undefined)), false);
    assert.equal(checks, 1);
  });
});
