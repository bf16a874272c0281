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

const FIRST_INTERVAL_MS = 5;
const LAST_INTERVAL_MS = 50;

/** Sleeps `ms`; 'woken' when `wake` settles first; rejects with the call's error when its signal fires. */
function pause(ms: number, signal: CallSignal, wake: Promise<unknown> | undefined): Promise<'slept' | 'woken'> {
  return new Promise((resolve, reject) => {
    const end = (): void => {
      clearTimeout(timer);
      signal.removeEventListener('abort', aborted);
    };
    const aborted = (): void => {
      end();
      reject(abortError(signal));
    };
    const timer = setTimeout(() => {
      end();
      resolve('slept');
    }, ms);
    signal.addEventListener('abort', aborted, { once: true });
    const woken = (): void => {
      end();
      resolve('woken');
    };
    // A wake that fails wakes all the same: done() says what holds.
    wake?.then(woken, woken);
  });
}

/**
 * Checks `done` at once, then at growing intervals (5 ms up to 50 ms), until it is true
 * (returns true) or the deadline has passed (returns false, after one last check). Rejects
 * with the call's abort error when its signal fires first. `wake`, an event that likely makes
 * `done` true (a process's end told as it happens), checks it again at once when it settles,
 * then from 5 ms again: the poll stays for what no event tells.
 */
export async function pollUntil(done: () => Promise<boolean>, bound: Bound, wake?: Promise<unknown>): Promise<boolean> {
  let pending = wake;
  for (let interval = FIRST_INTERVAL_MS; ; interval = Math.min(LAST_INTERVAL_MS, interval * 2)) {
    if (bound.signal.aborted) throw abortError(bound.signal);
    if (await done()) return true;
    const left = bound.deadline - Date.now();
    if (left <= 0) return false;
    if ((await pause(Math.min(interval, left), bound.signal, pending)) === 'woken') {
      pending = undefined;
      interval = FIRST_INTERVAL_MS / 2;
    }
  }
}
