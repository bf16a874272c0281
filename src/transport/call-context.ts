import { TsboxError } from '../errors.js';
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
 * What a handler knows about its call: the namespace and one AbortSignal that fires on
 * client cancel, deadline or daemon shutdown. The signal (and its deadline timer) exists
 * only if a handler asks for it, so calls that never wait pay nothing for it; `dispose`
 * removes every listener and timer when the call ends.
 */
export class CallContext {
  readonly #call: GrpcCall;
  readonly #registry: CallRegistry;
  /** The containerd-namespace metadata value, if any. */
  readonly namespace: string | undefined;
  #controller: AbortController | undefined;
  #timer: NodeJS.Timeout | undefined;
  #onCancel: (() => void) | undefined;

  constructor(call: GrpcCall, registry: CallRegistry) {
    this.#call = call;
    this.#registry = registry;
    this.namespace = call.header(NAMESPACE_KEY);
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
    return controller.signal;
  }

  abort(reason: TsboxError): void {
    this.#controller?.abort(reason);
  }

  dispose(): void {
    if (this.#controller === undefined) return;
    clearTimeout(this.#timer);
    if (this.#onCancel !== undefined) this.#call.offCancel(this.#onCancel);
    this.#registry.delete(this);
  }
}
