/**
 * The heap census the churn test counts a daemon's objects with (test/support/heap.ts), on a
 * real Node process: what the program holds is counted; what only V8 keeps for itself (its
 * string table of every name and literal the code has met, compiled code) is not, since that
 * grows as code first runs, not with the pods a daemon has seen.
 */
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { createInterface } from 'node:readline';
import { after, before, describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { type HeapCensus, heapGrowth, heapSnapshotFlags, takeHeapCensus } from '../support/heap.js';

const N = 400;
const child = path.join(path.dirname(fileURLToPath(import.meta.url)), '..', 'support', 'heap-child.js');

const grown = (kind: string, from: HeapCensus, to: HeapCensus): number =>
  heapGrowth(from, to)
    .filter((g) => g.kind === kind)
    .reduce((sum, g) => sum + g.count, 0);
const stringsGrown = (from: HeapCensus, to: HeapCensus): number => grown('string', from, to);

describe('heap census of a Node process', () => {
  const dir = mkdtempSync(path.join(tmpdir(), 'heap-census-'));
  const proc = spawn(process.execPath, [...heapSnapshotFlags(dir), child], { stdio: ['pipe', 'pipe', 'inherit'] });
  const answers = createInterface({ input: proc.stdout })[Symbol.asyncIterator]();
  const pid = (): number => {
    if (proc.pid === undefined) throw new Error('the heap child did not start');
    return proc.pid;
  };
  const run = async (command: string): Promise<void> => {
    proc.stdin.write(`${command}\n`);
    const answer = await answers.next();
    assert.equal(answer.value, 'done', `the heap child's answer to ${command}`);
  };

  before(async () => {
    // Its own start-up compiles what the commands use; the census compares steady states.
    await run('hold 1');
    await run('named 1');
    await run('lazy 1');
  });
  after(async () => {
    proc.stdin.end();
    if (proc.exitCode === null) await once(proc, 'exit');
    rmSync(dir, { recursive: true, force: true });
  });

  test(`${N} strings the program keeps are counted`, async () => {
    const from = await takeHeapCensus(pid(), dir);
    await run(`hold ${N}`);
    const to = await takeHeapCensus(pid(), dir);
    assert.ok(stringsGrown(from, to) >= N, `strings grew by ${stringsGrown(from, to)}, not by the ${N} kept`);
  });

  test(`${N} objects the program keeps, each with a property name of its own, are counted`, async () => {
    const from = await takeHeapCensus(pid(), dir);
    await run(`named ${N}`);
    const to = await takeHeapCensus(pid(), dir);
    assert.ok(grown('object:Object', from, to) >= N, `objects grew by ${grown('object:Object', from, to)}, not by the ${N} kept`);
  });

  test(`the property names of ${N} functions compiled and run once, keeping nothing they made, are not counted`, async () => {
    const from = await takeHeapCensus(pid(), dir);
    await run(`lazy ${N}`);
    const to = await takeHeapCensus(pid(), dir);
    const strings = stringsGrown(from, to);
    assert.ok(strings < N / 4, `strings grew by ${strings} after ${N} functions first ran and kept nothing`);
  });
});
