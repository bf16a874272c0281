import { abortError, type TsboxError } from '../base/errors.js';
import type { CallSignal, ExitInfo } from './types.js';

/**
 * Told once: the exit, or the abort error when the waiter's signal fired first. A function,
 * or an object (the transport's pending call itself, so that a Wait holds no closure).
 */
export type ExitListener =
  | ((err: TsboxError | undefined, exit: ExitInfo | undefined) => void)
  | { exitKnown(err: TsboxError | undefined, exit: ExitInfo | undefined): void };

const tell = (listener: ExitListener, err: TsboxError | undefined, exit: ExitInfo | undefined): void => {
  if (typeof listener === 'function') listener(err, exit);
  else listener.exitKnown(err, exit);
};

/** A pending waiter; it is its own abort listener (no closure per waiter). */
class Waiter {
  constructor(
    readonly owner: ExitSignal,
    readonly done: ExitListener,
    readonly signal: CallSignal | undefined,
  ) {}

  /** The signal fired first. */
  handleEvent(): void {
    if (!this.owner.forget(this)) return;
    tell(this.done, abortError(this.signal as CallSignal), undefined);
  }
}

/**
 * The exit-waiter store of one sandbox. The exit is set once; every waiter, present or
 * late, gets that same value. A waiter whose signal aborts is removed at once, so abandoned
 * Waits leave nothing behind (no closure, no listener). A pending waiter is one small object,
 * which is also its abort listener: a pod holds a Wait for its whole life.
 */
export class ExitSignal {
  #exit: ExitInfo | undefined;
  readonly #waiters = new Set<Waiter>();

  /** The recorded exit, if any. */
  get exit(): ExitInfo | undefined {
    return this.#exit;
  }

  /** Number of pending waiters (for tests and metrics). */
  get pending(): number {
    return this.#waiters.size;
  }

  /** Records the exit and wakes every waiter. Later calls are ignored: an exit is final. */
  resolve(exit: ExitInfo): boolean {
    if (this.#exit !== undefined) return false;
    this.#exit = exit;
    const waiters = [...this.#waiters];
    this.#waiters.clear();
    for (const waiter of waiters) {
      waiter.signal?.removeEventListener('abort', waiter);
      tell(waiter.done, undefined, exit);
    }
    return true;
  }

  /** Takes a waiter out; false if it was not pending (already woken). */
  forget(waiter: Waiter): boolean {
    return this.#waiters.delete(waiter);
  }

  /**
   * Calls `done` once with the exit (at once if it is known), or with the abort reason when
   * `signal` fires first.
   */
  listen(done: ExitListener, signal?: CallSignal): void {
    const exit = this.#exit;
    if (exit !== undefined) {
      tell(done, undefined, exit);
      return;
    }
    if (signal?.aborted === true) {
      tell(done, abortError(signal), undefined);
      return;
    }
    const waiter = new Waiter(this, done, signal);
    this.#waiters.add(waiter);
    signal?.addEventListener('abort', waiter, { once: true });
  }

  /** Resolves with the exit; rejects with the abort reason when `signal` fires first. */
  wait(signal?: CallSignal): Promise<ExitInfo> {
    return new Promise<ExitInfo>((resolve, reject) => {
      this.listen((err, exit) => (err === undefined ? resolve(exit as ExitInfo) : reject(err)), signal);
    });
  }
}
