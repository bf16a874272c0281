// The life of a task's process (src/tasks/task-state.ts): every (kind, state, event) triple,
// its next state or the error kind containerd acts on, written out here as its own table; and
// the status State reports for each state.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { type ErrorKind, isTsboxError } from '../../src/base/errors.js';
import { Status } from '../../src/gen/containerd/v1/types/task.js';
import {
  PROCESS_EVENTS,
  PROCESS_STATES,
  type ProcessEvent,
  type ProcessKind,
  type ProcessState,
  hasEnded,
  protocolStatus,
  transition,
} from '../../src/tasks/task-state.js';

/** A next state, a refusal (its kind), or 'internal': an event that cannot come in that state. */
type Expected = ProcessState | ErrorKind | 'internal';

const NF: ErrorKind = 'NotFound';
const FP: ErrorKind = 'FailedPrecondition';
const X = 'internal';

/**
 * One row per event, one column per state, in PROCESS_STATES' order:
 * creating, created, starting, running, paused, exited, ended-unstarted, deleted.
 */
const INIT: Record<ProcessEvent, readonly Expected[]> = {
  created: ['created', X, X, X, X, X, X, X],
  'create-failed': ['deleted', X, X, X, X, X, X, X],
  // Start again of a started process answers as the first (a replay), even after its exit.
  start: [NF, 'starting', FP, 'running', 'paused', 'exited', FP, NF],
  started: [X, X, 'running', X, X, X, 'exited', X],
  'start-failed': [X, X, 'created', X, X, X, 'ended-unstarted', X],
  exit: ['ended-unstarted', 'ended-unstarted', 'ended-unstarted', 'exited', 'exited', X, X, 'deleted'],
  kill: [NF, 'created', 'starting', 'running', 'paused', NF, NF, NF],
  exec: [NF, 'created', 'starting', 'running', 'paused', FP, FP, NF],
  'start-exec': [NF, FP, FP, 'running', 'paused', FP, FP, NF],
  pause: [NF, FP, FP, 'paused', 'paused', FP, FP, NF],
  resume: [NF, FP, FP, 'running', 'running', FP, FP, NF],
  delete: [NF, 'deleted', FP, FP, FP, 'deleted', 'deleted', NF],
};

const EXEC: Record<ProcessEvent, readonly Expected[]> = {
  created: [X, X, X, X, X, X, X, X],
  'create-failed': [X, X, X, X, X, X, X, X],
  start: [X, 'starting', FP, 'running', X, 'exited', FP, NF],
  started: [X, X, 'running', X, X, X, X, X],
  'start-failed': [X, X, X, X, X, X, X, X],
  exit: [X, 'ended-unstarted', 'ended-unstarted', 'exited', X, X, X, 'deleted'],
  // Never started: FailedPrecondition, as containerd's client expects.
  kill: [X, FP, FP, 'running', X, NF, NF, NF],
  exec: [X, X, X, X, X, X, X, X],
  'start-exec': [X, X, X, X, X, X, X, X],
  pause: [X, X, X, X, X, X, X, X],
  resume: [X, X, X, X, X, X, X, X],
  delete: [X, 'deleted', FP, FP, X, 'deleted', 'deleted', NF],
};

function actual(kind: ProcessKind, state: ProcessState, event: ProcessEvent): { next: ProcessState } | { kind: ErrorKind; message: string } {
  try {
    return { next: transition(kind, state, event, 'process p1') };
  } catch (err) {
    assert.ok(isTsboxError(err), `a TsboxError, got ${String(err)}`);
    return { kind: err.kind, message: err.message };
  }
}

describe('the transition function of a task process', () => {
  for (const [kind, table] of [['init', INIT], ['exec', EXEC]] as const) {
    test(`${kind}: every state × event, as the table says`, () => {
      assert.deepEqual(Object.keys(table).sort(), [...PROCESS_EVENTS].sort(), 'a row for every event');
      for (const event of PROCESS_EVENTS) {
        const row = table[event];
        assert.equal(row.length, PROCESS_STATES.length, `${event}: a column for every state`);
        PROCESS_STATES.forEach((state, i) => {
          const want = row[i] as Expected;
          const got = actual(kind, state, event);
          const what = `${kind} ${state} --${event}-->`;
          if (want === X) {
            assert.ok('kind' in got && got.kind === 'Internal', `${what}: cannot happen (Internal), got ${JSON.stringify(got)}`);
          } else if ((PROCESS_STATES as readonly string[]).includes(want)) {
            assert.deepEqual(got, { next: want }, what);
          } else {
            assert.ok('kind' in got, `${what}: refused with ${want}, got ${JSON.stringify(got)}`);
            assert.equal(got.kind, want, what);
            assert.match(got.message, /^process p1 /, `${what}: the message names the process`);
          }
        });
      }
    });
  }

  test('the answers containerd acts on, as the Task API gave them before the state machine', () => {
    const code = (kind: ProcessKind, state: ProcessState, event: ProcessEvent): string => {
      const got = actual(kind, state, event);
      return 'next' in got ? `-> ${got.next}` : got.kind;
    };
    // Start of a running process: the same answer (a replay); of one that ended unstarted: refused.
    assert.equal(code('init', 'running', 'start'), '-> running');
    assert.equal(code('init', 'exited', 'start'), '-> exited');
    assert.equal(code('init', 'ended-unstarted', 'start'), 'FailedPrecondition');
    // Delete of a running (or paused) process: FailedPrecondition.
    assert.equal(code('init', 'running', 'delete'), 'FailedPrecondition');
    assert.equal(code('init', 'paused', 'delete'), 'FailedPrecondition');
    assert.equal(code('exec', 'running', 'delete'), 'FailedPrecondition');
    // Kill of an exited process: NotFound; of an exec never started: FailedPrecondition.
    assert.equal(code('init', 'exited', 'kill'), 'NotFound');
    assert.equal(code('exec', 'exited', 'kill'), 'NotFound');
    assert.equal(code('exec', 'created', 'kill'), 'FailedPrecondition');
    // A created container's init is signalled (runc delete --force and CRI's stop of a created container).
    assert.equal(code('init', 'created', 'kill'), '-> created');
    // Exec in a container whose init exited, and an exec's start in one that does not run: FailedPrecondition.
    assert.equal(code('init', 'exited', 'exec'), 'FailedPrecondition');
    assert.equal(code('init', 'created', 'start-exec'), 'FailedPrecondition');
    assert.equal(code('init', 'exited', 'start-exec'), 'FailedPrecondition');
    // Pause of a container that does not run: FailedPrecondition.
    assert.equal(code('init', 'created', 'pause'), 'FailedPrecondition');
    // Deleted: gone for every call.
    for (const event of ['start', 'kill', 'delete'] as const) assert.equal(code('init', 'deleted', event), 'NotFound');
  });

  test('an exit seen before the holder answered a start: the process ran (exited), or a failed start leaves it ended unstarted', () => {
    let state = transition('init', 'created', 'start', 'process p1');
    state = transition('init', state, 'exit', 'process p1');
    assert.equal(state, 'ended-unstarted');
    assert.equal(transition('init', state, 'started', 'process p1'), 'exited');
    assert.equal(transition('init', state, 'start-failed', 'process p1'), 'ended-unstarted');
  });

  test('a life: created, started, paused, resumed, exited, deleted', () => {
    const events: ProcessEvent[] = ['created', 'start', 'started', 'pause', 'resume', 'exit', 'delete'];
    const seen: ProcessState[] = [];
    let state: ProcessState = 'creating';
    for (const event of events) seen.push((state = transition('init', state, event, 'process p1')));
    assert.deepEqual(seen, ['created', 'starting', 'running', 'paused', 'running', 'exited', 'deleted']);
  });
});

describe('what State reports', () => {
  test('the status of each state, and of a running exec in a paused container', () => {
    const want: Record<ProcessState, Status> = {
      creating: Status.CREATED,
      created: Status.CREATED,
      starting: Status.CREATED,
      running: Status.RUNNING,
      paused: Status.PAUSED,
      exited: Status.STOPPED,
      'ended-unstarted': Status.STOPPED,
      deleted: Status.STOPPED,
    };
    for (const state of PROCESS_STATES) assert.equal(protocolStatus(state, 'running'), want[state], state);
    assert.equal(protocolStatus('running', 'paused'), Status.PAUSED, 'frozen with its container');
    assert.equal(protocolStatus('exited', 'paused'), Status.STOPPED);
  });

  test('the exit is known in exited and ended-unstarted only', () => {
    assert.deepEqual(
      PROCESS_STATES.filter((s) => hasEnded(s)),
      ['exited', 'ended-unstarted'],
    );
  });
});
