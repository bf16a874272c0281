import { setTimeout as sleep } from 'node:timers/promises';
import type { CallSignal } from '../controller/types.js';
import { abortError } from '../base/errors.js';

/**
 * How long a clean-up may wait for the kernel: until `deadline` (epoch ms), and only while
 * `signal` (the call's) has not fired. `ms` is the bound as configured, for messages.
 */
export interface Bound {
  readonly deadline: number;
  readonly ms: number;
  readonly signal: CallSignal;
}

export function boundOf(ms: number, signal: CallSignal): Bound {
  return { deadline: Date.now() + ms, ms, signal };
}

/**
 * Checks `done` at once, then at growing intervals (5 ms up to 50 ms), until it is true
 * (returns true) or the deadline has passed (returns false, after one last check). Rejects
 * with the call's abort error when its signal fires first.
 */
export async function pollUntil(done: () => Promise<boolean>, bound: Bound): Promise<boolean> {
  for (let interval = 5; ; interval = Math.min(50, interval * 2)) {
    if (bound.signal.aborted) throw abortError(bound.signal);
    if (await done()) return true;
    const left = bound.deadline - Date.now();
    if (left <= 0) return false;
    try {
      await sleep(Math.min(interval, left), undefined, { signal: bound.signal });
    } catch {
      // The only way this sleep fails is the signal firing: the call's error says why.
      throw abortError(bound.signal);
    }
  }
}
