// supervised.ts with real processes: a process is named by its pid with its start time, so a
// record whose start time is not the running process's signals nothing; ending a process goes
// from SIGTERM to SIGKILL only for one that ignores SIGTERM, and takes its process group along;
// the records a supervisor leaves (its exit file) are read back as exited, running or lost.
import assert from 'node:assert/strict';
import { type ChildProcess, spawn } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { after, describe, test } from 'node:test';
import { boundOf } from '../../src/runtime/bound.js';
import { endProcess, isRunning, processIdOf, readExitRecord, signalIfRunning, superviseAgain, untilGone } from '../../src/runtime/supervised.js';
import { isTsboxError } from '../../src/base/errors.js';

const started: ChildProcess[] = [];
after(() => {
  for (const child of started) if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
});

/** A process of its own group (detached) that runs `script` in sh, with its pid and first line once running. */
async function run(script: string): Promise<{ child: ChildProcess; pid: number; said: string }> {
  const child = spawn('sh', ['-c', script], { detached: true, stdio: ['ignore', 'pipe', 'ignore'] });
  started.push(child);
  // The script says "ready" once its traps are set.
  const said = await new Promise<string>((resolve, reject) => {
    child.stdout?.once('data', (chunk: Buffer) => resolve(chunk.toString().trim()));
    child.once('error', reject);
  });
  return { child, pid: child.pid ?? 0, said };
}

const never = (): AbortSignal => new AbortController().signal;

describe('supervised processes, by pid and start time', () => {
  test('a record with another start time is not the process: nothing is signalled', async () => {
    const { child, pid } = await run('echo ready; exec sleep 1000');
    const id = await processIdOf(pid);
    assert.ok(id !== undefined && id.start !== '');
    assert.equal(await isRunning(id), true);
    const other = { pid, start: String(Number(id.start) + 1) };
    assert.equal(await isRunning(other), false);
    assert.equal(await signalIfRunning(other, 'SIGKILL'), false);
    assert.equal(await isRunning(id), true, 'the process the record does not name still runs');
    assert.equal(await signalIfRunning(id, 'SIGKILL'), true);
    await new Promise((resolve) => child.once('exit', resolve));
    assert.equal(await isRunning(id), false);
    assert.equal(await signalIfRunning(id, 'SIGKILL'), false, 'gone: nothing to signal');
  });

  test('a gentle end: SIGTERM alone for a process that takes it', async () => {
    const { pid } = await run('trap "exit 0" TERM; echo ready; while :; do sleep 0.05; done');
    const id = await processIdOf(pid);
    assert.ok(id !== undefined);
    let stubborn = false;
    assert.equal(await endProcess(id, boundOf(10_000, never()), { gentle: true, onStubborn: () => (stubborn = true) }), true);
    assert.equal(stubborn, false);
    assert.equal(await isRunning(id), false);
  });

  test('a gentle end comes to SIGKILL, with the group, for a process that ignores SIGTERM', async () => {
    // The shell ignores SIGTERM and so does its child (inherited); the child is in its group.
    const { pid, said } = await run('trap "" TERM; sleep 1000 & echo "ready $!"; wait');
    const id = await processIdOf(pid);
    const member = await processIdOf(Number(said.split(' ')[1]));
    assert.ok(id !== undefined && member !== undefined);
    let stubborn = false;
    assert.equal(await endProcess(id, boundOf(400, never()), { gentle: true, group: true, onStubborn: () => (stubborn = true) }), true);
    assert.equal(stubborn, true, 'SIGTERM was ignored: told, then SIGKILL');
    assert.equal(await isRunning(id), false);
    assert.equal(await untilGone(member, boundOf(5_000, never())), true, 'its group went with it');
  });

  test('a wait for its end returns once it has ended, with an event given as its wake (what the wake saves is timed in test/unit/bound.test.ts)', async () => {
    const { child, pid } = await run('echo ready; exec sleep 1000');
    const id = await processIdOf(pid);
    assert.ok(id !== undefined);
    const ended = new Promise((resolve) => child.once('exit', resolve));
    const gone = untilGone(id, boundOf(60_000, never()), ended);
    child.kill('SIGKILL');
    assert.equal(await gone, true);
  });

  test("a supervisor's records read back: exited, running, lost", async () => {
    const dir = await mkdtemp(path.join(tmpdir(), 'tsbox-supervised-'));
    try {
      const { child, pid } = await run('echo ready; exec sleep 1000');
      const supervisor = await processIdOf(pid);
      assert.ok(supervisor !== undefined);
      const read = (): ReturnType<typeof readExitRecord> => readExitRecord(dir);
      assert.deepEqual(await superviseAgain(supervisor, read), { kind: 'running' });
      child.kill('SIGKILL');
      await new Promise((resolve) => child.once('exit', resolve));
      assert.deepEqual(await superviseAgain(supervisor, read), { kind: 'lost' }, 'gone without an exit record');
      await writeFile(path.join(dir, 'exit'), '137 1700000000 5\n');
      const found = await superviseAgain(supervisor, read);
      assert.equal(found.kind, 'exited');
      assert.equal(found.kind === 'exited' ? found.exit.status : -1, 137);
      await writeFile(path.join(dir, 'exit'), '1370 garbage');
      await assert.rejects(read(), (err: unknown) => isTsboxError(err) && err.kind === 'Internal' && err.message.includes(path.join(dir, 'exit')));
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });
});
