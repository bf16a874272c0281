import { abortError } from '../errors.js';
import type { CallSignal, ExitInfo } from './types.js';

type Waiter = (exit: ExitInfo) => void;

/**
 * The exit-waiter store of one sandbox. The exit is set once; every waiter, present or
 * late, gets that same value. A waiter whose signal aborts is removed at once, so abandoned
 * Waits leave nothing behind (no closure, no listener).
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
    for (const waiter of this.#waiters) waiter(exit);
    this.#waiters.clear();
    return true;
  }

  /** Resolves with the exit; rejects with the abort reason when `signal` fires first. */
  wait(signal?: CallSignal): Promise<ExitInfo> {
    const exit = this.#exit;
    if (exit !== undefined) return Promise.resolve(exit);
    if (signal?.aborted === true) return Promise.reject(abortError(signal));
    return new Promise<ExitInfo>((resolve, reject) => {
      const onAbort = (): void => {
        this.#waiters.delete(waiter);
        reject(abortError(signal as CallSignal));
      };
      const waiter: Waiter = (value) => {
        signal?.removeEventListener('abort', onAbort);
        resolve(value);
      };
      this.#waiters.add(waiter);
      signal?.addEventListener('abort', onAbort, { once: true });
    });
  }
}
