import assert from 'node:assert/strict';
import { TtrpcClient } from '../../src/ttrpc/client.js';
import { fdCount, sampler } from './resources.js';
import { TEST_SERVICE } from './ttrpc-peer.js';
import { waitFor } from './processes.js';

/** How much memory a ttrpc server may reach under any attack of the hostile tier. */
export const RSS_BOUND_MIB = 256;
/** How long a fresh client may wait for its Echo after an attack (and while one runs). */
export const FRESH_CALL_MS = 1000;

/** What an attacked server is at the moment it is looked at. */
export interface AttackState {
  readonly socketPath: string;
  /** The serving process now (a restart would change it: the attack must not cause one). */
  readonly pid: number;
  /** Its descriptors before any attack. */
  readonly baselineFds: number;
  /** The connection held through every attack (containerd's), and whether its held call has ended. */
  readonly longLived: TtrpcClient | undefined;
  readonly heldSettled: boolean;
}

/**
 * The hostile tier's frame for one ttrpc server under attack (tsbox's own, or a pod's relay):
 * the attack runs with the server's memory and descriptors sampled; afterwards its descriptors
 * come back to the baseline, a fresh client is answered within FRESH_CALL_MS, the same process
 * serves, and the long-lived connection is still served with its held call still pending.
 */
export interface AttackTarget {
  /** For the lines the attacks print ("relay " for a pod's relay). */
  readonly label: string;
  /** Connections it may hold at once: its descriptors may grow by that much during an attack. */
  readonly connectionBound: number;
  now(): AttackState;
}

/** A fresh client's Echo; returns how long it took, failing past the target's bound. */
export async function freshEcho(socketPath: string): Promise<number> {
  const started = performance.now();
  const fresh = await TtrpcClient.connect(socketPath);
  try {
    const answer = await fresh.call(TEST_SERVICE, 'Echo', Buffer.from('fresh'), { timeoutMs: FRESH_CALL_MS });
    assert.equal(answer.toString(), 'fresh');
  } finally {
    fresh.close();
  }
  const ms = performance.now() - started;
  assert.ok(ms < FRESH_CALL_MS, `a fresh client waited ${ms.toFixed(0)} ms`);
  return ms;
}

/** Runs one attack with the sampler on, then checks the server is as it was (see AttackTarget). */
export async function underAttack(target: AttackTarget, name: string, run: () => Promise<void>): Promise<void> {
  const before = target.now();
  const p = before.pid;
  const baseline = before.baselineFds;
  const samples = sampler(p);
  let stopped = { maxRss: 0, maxFds: 0 };
  try {
    await run();
  } finally {
    stopped = samples.stop();
  }
  await waitFor(() => fdCount(p) <= baseline, { what: `${name}: descriptors back to ${baseline} (now ${fdCount(p)})`, timeoutMs: 20_000, intervalMs: 50 });
  const ms = await freshEcho(before.socketPath);
  const after = target.now();
  process.stdout.write(`# ${target.label}${name}: max RSS ${stopped.maxRss.toFixed(0)} MiB, max descriptors ${stopped.maxFds} (baseline ${baseline}), fresh Echo after ${ms.toFixed(0)} ms\n`);
  assert.ok(stopped.maxRss < RSS_BOUND_MIB, `${name}: RSS reached ${stopped.maxRss.toFixed(0)} MiB (bound ${RSS_BOUND_MIB})`);
  assert.ok(stopped.maxFds <= baseline + target.connectionBound + 8, `${name}: ${stopped.maxFds} descriptors (baseline ${baseline})`);
  assert.equal(after.pid, p);
  assert.equal(after.heldSettled, false, `${name}: the long-lived connection's pending call ended`);
  assert.equal((await after.longLived?.call(TEST_SERVICE, 'Echo', Buffer.from('still'), { timeoutMs: 5000 }))?.toString(), 'still');
}
