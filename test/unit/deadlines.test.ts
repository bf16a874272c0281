// The shared deadline timer of the transport (src/transport/deadlines.ts): every call with a
// grpc-timeout is aborted once its deadline has passed, never before and never twice; a call
// that ended first is never aborted; one timer serves them all.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { Deadlines, type DeadlineEntry } from '../../src/transport/deadlines.js';

class Entry implements DeadlineEntry {
  deadlineSlot = -1;
  firedAt: number | undefined;
  fired = 0;
  constructor(
    readonly name: string,
    readonly deadline: number,
    private readonly log: string[],
  ) {}
  deadlinePassed(): void {
    this.fired++;
    this.firedAt = Date.now();
    this.log.push(this.name);
  }
}

const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

describe('Deadlines', () => {
  test('calls fire in deadline order, once each, not before their deadline; removed ones never', async () => {
    const deadlines = new Deadlines();
    const log: string[] = [];
    const now = Date.now();
    // Added out of order, with ties.
    const offsets = [120, 40, 80, 40, 10, 200, 60, 160, 20, 100];
    const entries = offsets.map((ms, i) => new Entry(`e${i}`, now + ms, log));
    for (const entry of entries) deadlines.add(entry);
    deadlines.add(entries[0] as Entry); // twice: still once
    const removed = [entries[2], entries[7], entries[4]] as Entry[];
    for (const entry of removed) deadlines.remove(entry);
    deadlines.remove(entries[4] as Entry); // twice: harmless
    assert.equal(deadlines.size, offsets.length - removed.length);

    await sleep(260);
    const expected = entries.filter((e) => !removed.includes(e)).map((e) => e.name);
    assert.deepEqual([...log].sort(), expected.sort(), 'every entry not removed fired');
    for (let i = 1; i < log.length; i++) {
      const before = entries.find((e) => e.name === log[i - 1]) as Entry;
      const after = entries.find((e) => e.name === log[i]) as Entry;
      assert.ok(before.deadline <= after.deadline, `${before.name} fired before ${after.name}`);
    }
    for (const entry of entries) {
      if (removed.includes(entry)) {
        assert.equal(entry.fired, 0, `${entry.name} was removed and must not fire`);
      } else {
        assert.equal(entry.fired, 1, `${entry.name} fires exactly once`);
        assert.ok((entry.firedAt as number) >= entry.deadline, `${entry.name} fired ${entry.deadline - (entry.firedAt as number)} ms early`);
        assert.equal(entry.deadlineSlot, -1);
      }
    }
    assert.equal(deadlines.size, 0);
  });

  test('thousands of random adds and removes keep the heap ordered: due entries fire earliest first', async () => {
    const deadlines = new Deadlines();
    const log: string[] = [];
    const now = Date.now();
    let seed = 7;
    const random = (): number => {
      seed = (seed * 1103515245 + 12345) % 2147483648;
      return seed / 2147483648;
    };
    const live = new Set<Entry>();
    for (let i = 0; i < 5000; i++) {
      const entry = new Entry(`r${i}`, now + 30 + Math.floor(random() * 60), log);
      deadlines.add(entry);
      live.add(entry);
      if (random() < 0.4) {
        const victim = [...live][Math.floor(random() * live.size)] as Entry;
        deadlines.remove(victim);
        live.delete(victim);
      }
    }
    assert.equal(deadlines.size, live.size);
    await sleep(150);
    assert.equal(log.length, live.size, 'every live entry fired, no removed one');
    const byName = new Map([...live].map((e) => [e.name, e]));
    for (let i = 1; i < log.length; i++) {
      assert.ok(
        (byName.get(log[i - 1] as string) as Entry).deadline <= (byName.get(log[i] as string) as Entry).deadline,
        'fired in deadline order',
      );
    }
  });

  test('an entry added with an earlier deadline than the armed timer fires on time', async () => {
    const deadlines = new Deadlines();
    const log: string[] = [];
    const late = new Entry('late', Date.now() + 10_000, log);
    deadlines.add(late);
    const soon = new Entry('soon', Date.now() + 20, log);
    deadlines.add(soon);
    await sleep(80);
    assert.deepEqual(log, ['soon']);
    deadlines.remove(late);
    assert.equal(deadlines.size, 0);
  });
});
