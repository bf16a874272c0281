import { TsboxError } from '../base/errors.js';

/**
 * The life of a sandbox. Each value is spelled as the record on disk spells it.
 * - created:  registered by Create; nothing runs (Status: SANDBOX_UNKNOWN).
 * - starting: Start is running the sandbox; on failure it goes back to created.
 * - running:  its process runs (Status: SANDBOX_READY).
 * - exited:   the exit is recorded and final (Status: SANDBOX_NOTREADY); Wait answers at once.
 * - removed:  Shutdown released it; it is no longer in the controller's table.
 */
export type SandboxState = 'created' | 'starting' | 'running' | 'exited' | 'removed';

/** What can happen to a sandbox. */
export type SandboxEvent =
  | 'start' // Start begins
  | 'started' // the process runs and is recorded
  | 'start-failed' // Start failed and cleaned up
  | 'exit' // the process ended
  | 'stop-unstarted' // Stop of a sandbox that never ran: it counts as exited
  | 'remove'; // Shutdown

const TRANSITIONS: Readonly<Record<SandboxEvent, Partial<Record<SandboxState, SandboxState>>>> = {
  start: { created: 'starting' },
  started: { starting: 'running' },
  'start-failed': { starting: 'created' },
  exit: { running: 'exited' },
  'stop-unstarted': { created: 'exited' },
  remove: { created: 'removed', running: 'removed', exited: 'removed' },
};

/**
 * The one transition function: the next state, or FailedPrecondition when `event` is not
 * allowed in `state` (e.g. a second Start).
 */
export function transition(state: SandboxState, event: SandboxEvent): SandboxState {
  const next = TRANSITIONS[event][state];
  if (next === undefined) {
    throw new TsboxError('FailedPrecondition', `cannot ${event.replace('-', ' ')} a sandbox that is ${state}`);
  }
  return next;
}

/** The state string Status reports (SPEC.md section 3). */
export function protocolState(state: SandboxState): string {
  switch (state) {
    case 'running':
      return 'SANDBOX_READY';
    case 'created':
    case 'starting':
      // podsandbox reports a sandbox that never ran as unknown; CRI reads it as NOTREADY.
      return 'SANDBOX_UNKNOWN';
    case 'exited':
    case 'removed':
      return 'SANDBOX_NOTREADY';
  }
}
