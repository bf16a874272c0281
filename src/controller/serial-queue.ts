/**
 * Runs the operations given to it one at a time, in order. One per sandbox, so Start, Stop,
 * Shutdown and Update on the same sandbox never interleave.
 */
export class SerialQueue {
  #tail: Promise<unknown> = Promise.resolve();
  #length = 0;

  /** Number of operations queued or running. */
  get length(): number {
    return this.#length;
  }

  run<T>(operation: () => Promise<T>): Promise<T> {
    this.#length++;
    const result = this.#tail.then(operation);
    this.#tail = result.then(
      () => this.#length--,
      () => {
        // The failure is the caller's, through `result`; the queue only moves on.
        this.#length--;
      },
    );
    return result;
  }
}
