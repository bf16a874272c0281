// The sandbox life cycle: every (state, event) pair, allowed or rejected, and the state
// string Status reports for each state (SPEC.md section 3).
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import {
  protocolState,
  transition,
  type SandboxEvent,
  type SandboxState,
} from '../../src/controller/state-machine.js';
import { isTsboxError } from '../../src/base/errors.js';

const STATES: readonly SandboxState[] = ['created', 'starting', 'running', 'exited', 'removed'];
const EVENTS: readonly SandboxEvent[] = ['start', 'started', 'start-failed', 'exit', 'stop-unstarted', 'remove'];

/** The whole table of allowed transitions; every pair not listed is rejected. */
const ALLOWED: readonly (readonly [SandboxState, SandboxEvent, SandboxState])[] = [
  ['created', 'start', 'starting'],
  ['starting', 'started', 'running'],
  ['starting', 'start-failed', 'created'],
  ['running', 'exit', 'exited'],
  ['created', 'stop-unstarted', 'exited'],
  ['created', 'remove', 'removed'],
  ['running', 'remove', 'removed'],
  ['exited', 'remove', 'removed'],
];

const allowed = (state: SandboxState, event: SandboxEvent): SandboxState | undefined =>
  ALLOWED.find(([from, on]) => from === state && on === event)?.[2];

describe('transition', () => {
  for (const [from, event, to] of ALLOWED) {
    test(`${from} --${event}--> ${to}`, () => {
      assert.equal(transition(from, event), to);
    });
  }

  for (const state of STATES) {
    for (const event of EVENTS) {
      if (allowed(state, event) !== undefined) continue;
      test(`${state} rejects ${event} with FailedPrecondition`, () => {
        assert.throws(
          () => transition(state, event),
          (err) => {
            assert.ok(isTsboxError(err, 'FailedPrecondition'), `expected FailedPrecondition, got ${String(err)}`);
            assert.match(err.message, new RegExp(state), 'the message names the current state');
            return true;
          },
        );
      });
    }
  }

  test('a second Start is refused in every state but created', () => {
    const refused = STATES.filter((s) => s !== 'created');
    for (const state of refused) assert.throws(() => transition(state, 'start'), (err) => isTsboxError(err, 'FailedPrecondition'));
  });

  test('nothing leaves removed, and exited only goes to removed', () => {
    for (const event of EVENTS) {
      assert.throws(() => transition('removed', event));
      if (event !== 'remove') assert.throws(() => transition('exited', event));
    }
  });

  test('a whole life: create, start, run, exit, remove', () => {
    let state: SandboxState = 'created';
    for (const event of ['start', 'started', 'exit', 'remove'] as const) state = transition(state, event);
    assert.equal(state, 'removed');
  });

  test('a failed start can be retried', () => {
    let state: SandboxState = 'created';
    for (const event of ['start', 'start-failed', 'start', 'started'] as const) state = transition(state, event);
    assert.equal(state, 'running');
  });
});

describe('protocolState', () => {
  test('is exactly the strings containerd knows', () => {
    assert.equal(protocolState('created'), 'SANDBOX_UNKNOWN');
    assert.equal(protocolState('starting'), 'SANDBOX_UNKNOWN');
    assert.equal(protocolState('running'), 'SANDBOX_READY');
    assert.equal(protocolState('exited'), 'SANDBOX_NOTREADY');
    assert.equal(protocolState('removed'), 'SANDBOX_NOTREADY');
  });
});
