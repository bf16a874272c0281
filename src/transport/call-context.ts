import { TsboxError } from '../errors.js';
import type { AbortListener, CallSignal } from '../controller/types.js';
import { Deadlines, type DeadlineEntry } from './deadlines.js';
import type { GrpcCall } from './h2/grpc-server.js';

/** The metadata key containerd puts its namespace in. */
export const NAMESPACE_KEY = 'containerd-namespace';

/** Tracks the calls in flight so that a shutdown can end them, and their deadlines. */
export class CallRegistry {
  readonly #active = new Set<CallContext>();
  readonly deadlines = new Deadlines();
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

  /** Refuses new calls and aborts the signals of every call in flight with `reason`. */
  close(reason: TsboxError): void {
    this.#closing = reason;
    this.deadlines.close();
    for (const ctx of this.#active) ctx.abort(reason);
  }
}

const callAbort = (listener: AbortListener): void => {
  if (typeof listener === 'function') listener();
  else listener.handleEvent();
};

/**
 * What a handler knows about its call: the namespace and one signal that fires on client
 * cancel, deadline or daemon shutdown. The context is that signal itself (the part of
 * AbortSignal the controller uses, controller/types.ts CallSignal), and it is its own cancel
 * listener and deadline entry: a pod holds one Wait for its whole life, so a pending call
 * costs one object here rather than an AbortController, a Timeout and their closures. The
 * signal is armed (registry entry, cancel listener, deadline) only if a handler asks for it,
 * so calls that never wait pay nothing for it; `dispose` undoes all of that when the call ends.
 */
export class CallContext implements CallSignal, DeadlineEntry {
  /** The call on the wire. */
  protected readonly call: GrpcCall;
  readonly #registry: CallRegistry;
  /** The containerd-namespace metadata value, if any. */
  readonly namespace: string | undefined;
  deadlineSlot = -1;
  #armed = false;
  #reason: TsboxError | undefined;
  /** Abort listeners: almost always one, so the first has its own slot. */
  #listener: AbortListener | undefined;
  #listeners: AbortListener[] | undefined;

  constructor(call: GrpcCall, registry: CallRegistry) {
    this.call = call;
    this.#registry = registry;
    this.namespace = call.header(NAMESPACE_KEY);
  }

  get deadline(): number {
    return this.call.deadline;
  }

  get signal(): CallSignal {
    if (this.#armed) return this;
    this.#armed = true;
    const closing = this.#registry.closing;
    if (closing !== undefined) {
      this.#reason = closing;
      return this;
    }
    this.#registry.add(this);
    this.call.onCancel(this);
    if (Number.isFinite(this.deadline)) this.#registry.deadlines.add(this);
    return this;
  }

  get aborted(): boolean {
    return this.#reason !== undefined;
  }

  get reason(): TsboxError | undefined {
    return this.#reason;
  }

  /** As on AbortSignal: a listener added after the abort is never called. */
  addEventListener(_type: 'abort', listener: AbortListener): void {
    if (this.#reason !== undefined) return;
    if (this.#listener === undefined) this.#listener = listener;
    else (this.#listeners ??= []).push(listener);
  }

  removeEventListener(_type: 'abort', listener: AbortListener): void {
    if (this.#listener === listener) this.#listener = undefined;
    else if (this.#listeners !== undefined) {
      const at = this.#listeners.indexOf(listener);
      if (at !== -1) this.#listeners.splice(at, 1);
    }
  }

  /** The client cancelled the call or its connection went away. */
  callCancelled(): void {
    this.abort(new TsboxError('Cancelled', 'call cancelled by the client'));
  }

  deadlinePassed(): void {
    this.abort(new TsboxError('DeadlineExceeded', 'deadline exceeded'));
  }

  /** Fires the signal once with `reason`; each listener is called once. */
  abort(reason: TsboxError): void {
    if (this.#reason !== undefined) return;
    this.#reason = reason;
    const first = this.#listener;
    const rest = this.#listeners;
    this.#listener = undefined;
    this.#listeners = undefined;
    if (first !== undefined) callAbort(first);
    if (rest !== undefined) for (const listener of rest) callAbort(listener);
  }

  dispose(): void {
    if (!this.#armed) return;
    this.#registry.deadlines.remove(this);
    this.call.offCancel(this);
    this.#registry.delete(this);
  }
}
