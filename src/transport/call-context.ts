import type { ServerUnaryCall } from '@grpc/grpc-js';
import { TsboxError } from '../base/errors.js';
import { DEADLINE_MARGIN_MS, MAX_TIMER_MS } from './limits.js';

/** The metadata key containerd puts its namespace in. */
export const NAMESPACE_KEY = 'containerd-namespace';

/** Tracks the calls whose signal is armed, so that a shutdown can abort them. */
export class CallRegistry {
  readonly #active = new Set<CallContext>();
  #closing: TsboxError | undefined;

  get closing(): TsboxError | undefined {
    return this.#closing;
  }

  add(ctx: CallContext): void {
    this.#active.add(ctx);
  }

  delete(ctx: CallContext): void {
    this.#active.delete(ctx);
  }

  /** Refuses new calls and aborts the signal of every call in flight with `reason`. */
  close(reason: TsboxError): void {
    this.#closing = reason;
    for (const ctx of [...this.#active]) ctx.abort(reason);
  }
}

/**
 * What a handler knows about its call: the namespace it was sent with and one AbortSignal
 * that fires on client cancel, deadline or daemon shutdown, with a TsboxError as its reason
 * (Cancelled, DeadlineExceeded, Unavailable). grpc-js reports a cancel or a connection lost
 * as the call's 'cancelled' event, but does not stop a handler at the deadline: the context
 * keeps its own timer for that, due a little before the deadline (DEADLINE_MARGIN_MS), so
 * that the answer reaches containerd before its own copy of the deadline passes; a cancel
 * that comes after that point is taken for the deadline. The signal is armed only when a
 * handler asks for it, so a call that never waits pays nothing; `dispose` (when the call is
 * answered) removes the listener, the timer and the registry entry.
 */
export class CallContext {
  readonly #call: ServerUnaryCall<unknown, unknown>;
  readonly #registry: CallRegistry;
  #controller: AbortController | undefined;
  #timer: NodeJS.Timeout | undefined;
  /** When the call is given up as past its deadline: a little before the deadline itself. */
  #giveUpAt = Infinity;
  readonly #onCancelled = (): void => {
    this.abort(
      Date.now() >= this.#giveUpAt
        ? new TsboxError('DeadlineExceeded', 'deadline exceeded')
        : new TsboxError('Cancelled', 'call cancelled by the client'),
    );
  };

  constructor(call: ServerUnaryCall<unknown, unknown>, registry: CallRegistry) {
    this.#call = call;
    this.#registry = registry;
  }

  /** The containerd-namespace metadata value, if any. */
  get namespace(): string | undefined {
    const value = this.#call.metadata.get(NAMESPACE_KEY)[0];
    return typeof value === 'string' ? value : undefined;
  }

  get signal(): AbortSignal {
    if (this.#controller !== undefined) return this.#controller.signal;
    const controller = new AbortController();
    this.#controller = controller;
    const closing = this.#registry.closing;
    if (closing !== undefined) {
      controller.abort(closing);
      return controller.signal;
    }
    if (this.#call.cancelled) {
      this.#onCancelled();
      return controller.signal;
    }
    this.#registry.add(this);
    this.#call.on('cancelled', this.#onCancelled);
    const deadline = this.#call.getDeadline();
    const deadlineMs = deadline instanceof Date ? deadline.getTime() : deadline;
    if (Number.isFinite(deadlineMs)) {
      this.#giveUpAt = deadlineMs - Math.min(DEADLINE_MARGIN_MS, Math.max(0, deadlineMs - Date.now()) / 10);
      this.#armTimer();
    }
    return controller.signal;
  }

  /** A timer holds at most 2^31-1 ms: a later deadline re-arms it until it is due. */
  #armTimer(): void {
    const left = this.#giveUpAt - Date.now();
    if (left <= 0) {
      this.#timer = undefined;
      this.abort(new TsboxError('DeadlineExceeded', 'deadline exceeded'));
      return;
    }
    this.#timer = setTimeout(() => this.#armTimer(), Math.min(left, MAX_TIMER_MS));
  }

  /** Fires the signal once with `reason`. */
  abort(reason: TsboxError): void {
    const controller = this.#controller;
    if (controller === undefined || controller.signal.aborted) return;
    this.dispose();
    controller.abort(reason);
  }

  /** Undoes what arming the signal set up; the call is over. */
  dispose(): void {
    if (this.#controller === undefined) return;
    if (this.#timer !== undefined) clearTimeout(this.#timer);
    this.#timer = undefined;
    this.#call.off('cancelled', this.#onCancelled);
    this.#registry.delete(this);
  }
}
