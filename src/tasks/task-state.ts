import { TsboxError, type ErrorKind } from '../base/errors.js';
import { Status } from '../gen/containerd/v1/types/task.js';

/**
 * The life of a task's process, the init (the container) or an exec, as one value with one
 * transition function. Each call of the Task API that acts on a process goes through it first,
 * so that what a call answers in each state (the code containerd acts on) is decided here,
 * and each change of a process's life is a transition here.
 *
 * - creating:        init only: Create has written the record and is mounting the rootfs or
 *                    having the holder run `runc create`; the task is not in the table yet,
 *                    so every call about it is NotFound.
 * - created:         init: runc has made the container, nothing runs yet (its init waits in
 *                    `runc init`); exec: the process is recorded (Exec), nothing runs.
 * - starting:        Start is at work: the holder runs `runc start` (init) or `runc exec` (exec).
 * - running:         the process runs.
 * - paused:          init only: the container is frozen (runc pause) until Resume.
 * - exited:          the process ran and its exit is known; Wait answers at once.
 * - ended-unstarted: the exit is known of a process that was never started (an init killed
 *                    while created, an exec whose start failed); a Start is refused.
 * - deleted:         Delete removed it; it is no longer in the table.
 */
export type ProcessState = 'creating' | 'created' | 'starting' | 'running' | 'paused' | 'exited' | 'ended-unstarted' | 'deleted';

/** The init (the container's process, `execId` '') or an exec'd process. */
export type ProcessKind = 'init' | 'exec';

/**
 * What can happen to a process. The calls' events (start, kill, exec, start-exec, pause,
 * resume, delete) are checked before the call does anything; those that change nothing leave
 * the state as it is (a Start of a process started already is a replay: it answers as the first).
 */
export type ProcessEvent =
  | 'created' // init: the holder answered `runc create`
  | 'create-failed' // init: Create failed and undid what it did
  | 'start' // Start begins (of a process started already: a replay)
  | 'started' // the process runs (the holder answered)
  | 'start-failed' // init: `runc start` failed; the container is still created
  | 'exit' // the process's end is known (from its holder, or told when it cannot be)
  | 'kill' // Kill of this one process
  | 'exec' // init: an exec is recorded in its container
  | 'start-exec' // init: an exec of its container starts
  | 'pause' // init: Pause (runc decides on a container paused already, as before)
  | 'resume' // init: Resume (runc decides on a container that is not paused, as before)
  | 'delete'; // Delete

export const PROCESS_STATES: readonly ProcessState[] = ['creating', 'created', 'starting', 'running', 'paused', 'exited', 'ended-unstarted', 'deleted'];
export const PROCESS_EVENTS: readonly ProcessEvent[] = ['created', 'create-failed', 'start', 'started', 'start-failed', 'exit', 'kill', 'exec', 'start-exec', 'pause', 'resume', 'delete'];

/** A refusal: the kind containerd acts on, and what the message says after the process's name. */
interface Refusal {
  readonly kind: ErrorKind;
  readonly says: string;
}

type Outcome = ProcessState | Refusal;
type Table = Readonly<Record<ProcessEvent, Readonly<Partial<Record<ProcessState, Outcome>>>>>;

const refuse = (kind: ErrorKind, says: string): Refusal => ({ kind, says });
const GONE = refuse('NotFound', 'not found');
/** Creating: not in the table yet, so no call finds it. */
const NOT_YET = refuse('NotFound', 'not found');
const FINISHED = refuse('NotFound', 'has already finished');
const EXITED = refuse('FailedPrecondition', 'has already exited');
const STARTING = refuse('FailedPrecondition', 'is starting');
const NOT_RUNNING = refuse('FailedPrecondition', 'is not running');
const RUNNING_NO_DELETE = refuse('FailedPrecondition', 'cannot be deleted: it is running');

/**
 * The init's table: for each event, the next state by current state, or the refusal. A state
 * not listed under an event is an internal error (an event that cannot come there).
 */
const INIT: Table = {
  created: { creating: 'created' },
  'create-failed': { creating: 'deleted' },
  start: {
    creating: NOT_YET,
    created: 'starting',
    starting: STARTING,
    running: 'running',
    paused: 'paused',
    exited: 'exited',
    'ended-unstarted': EXITED,
    deleted: GONE,
  },
  // The exit may be told before the holder's answer to start: it ran all the same.
  started: { starting: 'running', 'ended-unstarted': 'exited' },
  'start-failed': { starting: 'created', 'ended-unstarted': 'ended-unstarted' },
  // Deleted before its exit was seen (Delete waits for it a bounded time): the exit changes nothing.
  exit: { creating: 'ended-unstarted', created: 'ended-unstarted', starting: 'ended-unstarted', running: 'exited', paused: 'exited', deleted: 'deleted' },
  // A created init is signalled through its holder as a running one is.
  kill: { creating: NOT_YET, created: 'created', starting: 'starting', running: 'running', paused: 'paused', exited: FINISHED, 'ended-unstarted': FINISHED, deleted: GONE },
  exec: {
    creating: NOT_YET,
    created: 'created',
    starting: 'starting',
    running: 'running',
    paused: 'paused',
    exited: refuse('FailedPrecondition', 'has exited: no exec in it'),
    'ended-unstarted': refuse('FailedPrecondition', 'has exited: no exec in it'),
    deleted: GONE,
  },
  'start-exec': {
    creating: NOT_YET,
    created: refuse('FailedPrecondition', 'is not running: no exec starts in it'),
    starting: refuse('FailedPrecondition', 'is not running: no exec starts in it'),
    running: 'running',
    paused: 'paused',
    exited: refuse('FailedPrecondition', 'is gone: no exec starts in it'),
    'ended-unstarted': refuse('FailedPrecondition', 'is gone: no exec starts in it'),
    deleted: GONE,
  },
  pause: { creating: NOT_YET, created: NOT_RUNNING, starting: NOT_RUNNING, running: 'paused', paused: 'paused', exited: NOT_RUNNING, 'ended-unstarted': NOT_RUNNING, deleted: GONE },
  resume: { creating: NOT_YET, created: NOT_RUNNING, starting: NOT_RUNNING, running: 'running', paused: 'running', exited: NOT_RUNNING, 'ended-unstarted': NOT_RUNNING, deleted: GONE },
  delete: {
    creating: NOT_YET,
    created: 'deleted',
    starting: STARTING,
    running: RUNNING_NO_DELETE,
    paused: RUNNING_NO_DELETE,
    exited: 'deleted',
    'ended-unstarted': 'deleted',
    deleted: GONE,
  },
};

/** An exec's table. Its life begins created (recorded by Exec); it is never creating nor paused. */
const EXEC: Table = {
  created: {},
  'create-failed': {},
  start: { created: 'starting', starting: STARTING, running: 'running', exited: 'exited', 'ended-unstarted': EXITED, deleted: GONE },
  started: { starting: 'running' },
  // A failed start ends the exec (its Waits are answered 255): told as its exit.
  'start-failed': {},
  exit: { created: 'ended-unstarted', starting: 'ended-unstarted', running: 'exited', deleted: 'deleted' },
  // Never started: no process to signal, as containerd's client expects.
  kill: {
    created: refuse('FailedPrecondition', 'has not been started'),
    starting: refuse('FailedPrecondition', 'has not been started'),
    running: 'running',
    exited: FINISHED,
    'ended-unstarted': FINISHED,
    deleted: GONE,
  },
  exec: {},
  'start-exec': {},
  pause: {},
  resume: {},
  delete: { created: 'deleted', starting: STARTING, running: RUNNING_NO_DELETE, exited: 'deleted', 'ended-unstarted': 'deleted', deleted: GONE },
};

/**
 * The one transition function: the state after `event`, or the TsboxError of the refusal,
 * whose message begins with `name` (e.g. "process c1"). An event that cannot come in that
 * state is Internal: a fault of tsbox's, never of the caller's.
 */
export function transition(kind: ProcessKind, state: ProcessState, event: ProcessEvent, name: string): ProcessState {
  const next = (kind === 'init' ? INIT : EXEC)[event][state];
  if (next === undefined) throw new TsboxError('Internal', `${name}: ${event} cannot happen to ${kind === 'init' ? 'an init' : 'an exec'} that is ${state}`);
  if (typeof next === 'string') return next;
  throw new TsboxError(next.kind, `${name} ${next.says}`);
}

/** True once the process's exit is known (Wait answers at once). */
export function hasEnded(state: ProcessState): boolean {
  return state === 'exited' || state === 'ended-unstarted';
}

/** The status State reports for a process in `state` whose container's init is in `init`. */
export function protocolStatus(state: ProcessState, init: ProcessState): Status {
  switch (state) {
    case 'creating':
    case 'created':
    case 'starting':
      return Status.CREATED;
    case 'running':
      // A process of a frozen container is frozen with it.
      return init === 'paused' ? Status.PAUSED : Status.RUNNING;
    case 'paused':
      return Status.PAUSED;
    case 'exited':
    case 'ended-unstarted':
    case 'deleted':
      return Status.STOPPED;
  }
}
