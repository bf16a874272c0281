import { ignoreError } from './errors.js';

/**
 * Runs the operations queued under one key one at a time, in the order queued; those of
 * different keys run side by side. An operation runs once the one before it has settled,
 * whatever its outcome (that failure went to its own caller). The controller queues the
 * mutations of each sandbox here, the record store the writes of each sandbox directory.
 */
export class SerialQueue<K = string> {
  /** The last operation queued under each key; an entry goes once it settles. */
  readonly #tails = new Map<K, Promise<void>>();

  run<T>(key: K, operation: () => Promise<T>): Promise<T> {
    const current = (this.#tails.get(key) ?? Promise.resolve()).then(operation);
    const tail = current.then(
      () => undefined,
      ignoreError('reported to the caller of this operation; the next one runs regardless'),
    );
    this.#tails.set(key, tail);
    void tail.then(() => {
      if (this.#tails.get(key) === tail) this.#tails.delete(key);
    });
    return current;
  }

  /** Resolves once every operation queued so far has settled. */
  async settled(): Promise<void> {
    await Promise.all(this.#tails.values());
  }
}
