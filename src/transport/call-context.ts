import { TsboxError } from '../errors.js';
import type { CallSignal } from '../controller/types.js';
import type { GrpcCall } from './h2/grpc-server.js';

/** The metadata key containerd puts its namespace in. */
export const NAMESPACE_KEY = 'containerd-namespace';

/** Tracks the calls in flight so that a shutdown can end them. */
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

  /** Refuses new calls and aborts the signals of every call in flight with `reason`. */
  close(reason: TsboxError): void {
    this.#closing = reason;
    for (const ctx of this.#active) ctx.abort(reason);
  }
}

/**
 * What a handler knows about its call: the namespace and one signal that fires on client
 * cancel, deadline or daemon shutdown. The context is that signal itself (the part of
 * AbortSignal the controller uses, controller/types.ts CallSignal): a pod holds one Wait for
 * its whole life, and an AbortController with its listener costs about 1 KiB more. The
 * signal is armed (registry entry, cancel listener, deadline timer) only if a handler asks
 * for it, so calls that never wait pay nothing for it; `dispose` removes all of that when the
 * call ends.
 */
export class CallContext implements CallSignal {
  readonly #call: GrpcCall;
  readonly #registry: CallRegistry;
  /** The containerd-namespace metadata value, if any. */
  readonly namespace: string | undefined;
  #armed = false;
  #reason: TsboxError | undefined;
  /** Abort listeners: almost always one, so the first has its own slot. */
  #listener: (() => void) | undefined;
  #listeners: (() => void)[] | undefined;
  #timer: NodeJS.Timeout | undefined;
  #onCancel: (() => void) | undefined;

  constructor(call: GrpcCall, registry: CallRegistry) {
    this.#call = call;
    this.#registry = registry;
    this.namespace = call.header(NAMESPACE_KEY);
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
    this.#onCancel = () => this.abort(new TsboxError('Cancelled', 'call cancelled by the client'));
    this.#call.onCancel(this.#onCancel);
    const deadline = this.#call.deadline;
    if (Number.isFinite(deadline)) {
      this.#timer = setTimeout(
        () => this.abort(new TsboxError('DeadlineExceeded', 'deadline exceeded')),
        Math.max(0, deadline - Date.now()),
      );
    }
    return this;
  }

  get aborted(): boolean {
    return this.#reason !== undefined;
  }

  get reason(): TsboxError | undefined {
    return this.#reason;
  }

  /** As on AbortSignal: a listener added after the abort is never called. */
  addEventListener(_type: 'abort', listener: () => void): void {
    if (this.#reason !== undefined) return;
    if (this.#listener === undefined) this.#listener = listener;
    else (this.#listeners ??= []).push(listener);
  }

  removeEventListener(_type: 'abort', listener: () => void): void {
    if (this.#listener === listener) this.#listener = undefined;
    else if (this.#listeners !== undefined) {
      const at = this.#listeners.indexOf(listener);
      if (at !== -1) this.#listeners.splice(at, 1);
    }
  }

  /** Fires the signal once with `reason`; each listener is called once. */
  abort(reason: TsboxError): void {
    if (this.#reason !== undefined) return;
    this.#reason = reason;
    const first = this.#listener;
    const rest = this.#listeners;
    this.#listener = undefined;
    this.#listeners = undefined;
    first?.();
    if (rest !== undefined) for (const listener of rest) listener();
  }

  dispose(): void {
    if (!this.#armed) return;
    clearTimeout(this.#timer);
    if (this.#onCancel !== undefined) this.#call.offCancel(this.#onCancel);
    this.#registry.delete(this);
  }
}
