/** A call with a deadline, as the shared timer keeps it. */
export interface DeadlineEntry {
  /** Absolute deadline, ms since the epoch. */
  readonly deadline: number;
  /** Where the entry sits in the heap; -1 when it is not in it. Kept by Deadlines. */
  deadlineSlot: number;
  /** Called once the deadline has passed (and the entry is out of the heap). */
  deadlinePassed(): void;
}

/**
 * One timer for every call deadline: a min-heap of calls ordered by deadline, and a single
 * timeout for the earliest. A pod's Wait is pending for its whole life; a Timeout and its
 * callback per call would cost about 200 bytes each, this costs a heap slot.
 */
export class Deadlines {
  readonly #heap: DeadlineEntry[] = [];
  #timer: NodeJS.Timeout | undefined;
  #timerAt = Infinity;

  get size(): number {
    return this.#heap.length;
  }

  add(entry: DeadlineEntry): void {
    if (entry.deadlineSlot !== -1) return;
    entry.deadlineSlot = this.#heap.length;
    this.#heap.push(entry);
    this.#up(entry.deadlineSlot);
    this.#schedule();
  }

  remove(entry: DeadlineEntry): void {
    const slot = entry.deadlineSlot;
    if (slot === -1) return;
    entry.deadlineSlot = -1;
    const last = this.#heap.pop() as DeadlineEntry;
    if (slot < this.#heap.length) {
      this.#heap[slot] = last;
      last.deadlineSlot = slot;
      this.#down(slot);
      this.#up(last.deadlineSlot);
    }
    if (this.#heap.length === 0) this.#cancelTimer();
  }

  /** Stops the timer; the entries stay (for shutdown). */
  close(): void {
    this.#cancelTimer();
  }

  #cancelTimer(): void {
    clearTimeout(this.#timer);
    this.#timer = undefined;
    this.#timerAt = Infinity;
  }

  /** Arms the timer for the earliest deadline, unless it is armed for that one or sooner. */
  #schedule(): void {
    const first = this.#heap[0];
    if (first === undefined || first.deadline >= this.#timerAt) return;
    clearTimeout(this.#timer);
    this.#timerAt = first.deadline;
    this.#timer = setTimeout(() => this.#expire(), Math.max(0, first.deadline - Date.now()));
    this.#timer.unref();
  }

  #expire(): void {
    this.#timer = undefined;
    this.#timerAt = Infinity;
    const now = Date.now();
    for (let first = this.#heap[0]; first !== undefined && first.deadline <= now; first = this.#heap[0]) {
      this.remove(first);
      first.deadlinePassed();
    }
    this.#schedule();
  }

  #up(slot: number): void {
    const heap = this.#heap;
    const entry = heap[slot] as DeadlineEntry;
    while (slot > 0) {
      const parentSlot = (slot - 1) >> 1;
      const parent = heap[parentSlot] as DeadlineEntry;
      if (parent.deadline <= entry.deadline) break;
      heap[slot] = parent;
      parent.deadlineSlot = slot;
      slot = parentSlot;
    }
    heap[slot] = entry;
    entry.deadlineSlot = slot;
  }

  #down(slot: number): void {
    const heap = this.#heap;
    const entry = heap[slot] as DeadlineEntry;
    for (;;) {
      const left = 2 * slot + 1;
      if (left >= heap.length) break;
      const right = left + 1;
      const child = right < heap.length && (heap[right] as DeadlineEntry).deadline < (heap[left] as DeadlineEntry).deadline ? right : left;
      const next = heap[child] as DeadlineEntry;
      if (next.deadline >= entry.deadline) break;
      heap[slot] = next;
      next.deadlineSlot = slot;
      slot = child;
    }
    heap[slot] = entry;
    entry.deadlineSlot = slot;
  }
}
