import type { Timestamp } from './types.js';

/** Where the time comes from; injectable for tests. */
export type Clock = () => Timestamp;

/** The wall clock, as a protobuf Timestamp (millisecond precision). */
export const systemClock: Clock = () => {
  const ms = Date.now();
  return { seconds: Math.floor(ms / 1000), nanos: (ms % 1000) * 1_000_000 };
};
