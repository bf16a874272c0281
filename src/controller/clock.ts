import type { Timestamp } from './types.js';

/** Where the time comes from; injectable for tests. */
export type Clock = () => Timestamp;

/** The wall clock, as a protobuf Timestamp (millisecond precision). */
export const systemClock: Clock = () => timestampOf(Date.now());

/** Runs `callback` after `delayMs` (at most MAX_TIMER_MS); returns what cancels it. Injectable for tests. */
export type Schedule = (delayMs: number, callback: () => void) => () => void;

export const systemSchedule: Schedule = (delayMs, callback) => {
  const timer = setTimeout(callback, delayMs);
  return () => clearTimeout(timer);
};

/** The longest delay setTimeout honours (it fires at once beyond it). */
export const MAX_TIMER_MS = 2 ** 31 - 1;

/** Milliseconds since the epoch of a Timestamp. */
export function msOf(t: Timestamp): number {
  return t.seconds * 1000 + Math.floor(t.nanos / 1e6);
}

/** A Timestamp of milliseconds since the epoch. */
export function timestampOf(ms: number): Timestamp {
  const seconds = Math.floor(ms / 1000);
  return { seconds, nanos: (ms - seconds * 1000) * 1_000_000 };
}
