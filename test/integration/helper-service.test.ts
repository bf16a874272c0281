/**
 * The mount helper kept running (`tsbox-shim serve` behind HelperService), with the real
 * binary: one process serves request after request, says each helper's own failure, comes back
 * after it is killed, ends a request that outlives its bound with the request's own child, and
 * refuses a request stream that is not one.
 */
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { chmodSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, describe, test } from 'node:test';
import { pino } from 'pino';
import { isTsboxError } from '../../src/errors.js';
import { HelperService } from '../../src/runtime/helper-service.js';
import { isMountedAt } from '../../src/runtime/mountinfo.js';
import { procInfo } from '../support/host.js';
import { tsboxShim } from '../support/tsbox-daemon.js';

const silent = pino({ level: 'silent' });

/** Resolves once `pid` is gone (or a zombie), polled: a process that is not our child has no exit event. */
async function gone(pid: number): Promise<void> {
  while (procInfo(pid) !== undefined && procInfo(pid)?.state !== 'Z') await new Promise((r) => setTimeout(r, 5));
}

/** The pids whose parent is `pid`. */
function childrenOf(pid: number): number[] {
  const text = readFileSync(`/proc/${pid}/task/${pid}/children`, 'utf8').trim();
  return text === '' ? [] : text.split(' ').map(Number);
}

describe('the mount helper kept running', () => {
  const scratch = mkdtempSync(path.join(os.tmpdir(), 'tsbox-helper-service-'));
  const services: HelperService[] = [];
  const service = (binary = tsboxShim): HelperService => {
    const s = new HelperService(binary, silent);
    services.push(s);
    return s;
  };
  after(() => {
    for (const s of services) s.close();
    rmSync(scratch, { recursive: true, force: true });
  });

  test('one process mounts and unmounts, request after request, in the mount namespace of tsbox', async () => {
    const helper = service();
    const target = path.join(scratch, 'mnt');
    mkdirSync(target);
    let pid: number | undefined;
    for (let i = 0; i < 20; i++) {
      const mounted = await helper.run(['mount', target, 'tmpfs', 'tmpfs', 'size=1m'], { timeoutMs: 10_000 });
      assert.deepEqual(mounted, { status: 0, stdout: '', stderr: '' });
      assert.equal(await isMountedAt(target, { below: false }), true, `round ${i}: mounted where tsbox sees it`);
      pid ??= helper.pid;
      assert.equal(helper.pid, pid, 'the same serving process');
      assert.equal((await helper.run(['umount', target], { timeoutMs: 10_000 })).status, 0);
      assert.equal(await isMountedAt(target, { below: false }), false, `round ${i}: unmounted`);
    }
    assert.deepEqual(childrenOf(pid as number), [], 'no child left behind by the requests');
  });

  test("a helper's failure is its status and its one line of stderr, and the next request is served", async () => {
    const helper = service();
    const failed = await helper.run(['mount', path.join(scratch, 'nowhere'), 'tmpfs', 'tmpfs'], { timeoutMs: 10_000 });
    assert.equal(failed.status, 1);
    assert.equal(failed.stderr, `mount type tmpfs from tmpfs on ${scratch}/nowhere (flags 0x0): No such file or directory (ENOENT)\n`);
    const unknown = await helper.run(['lock', path.join(scratch, 'lock')], { timeoutMs: 10_000 });
    assert.equal(unknown.status, 2, 'only mount, umount and umount-all are served');
    assert.match(unknown.stderr, /lock is not a mode it runs/);
    const pid = helper.pid;
    assert.deepEqual(await helper.run(['umount', path.join(scratch, 'not-mounted')], { timeoutMs: 10_000 }), { status: 0, stdout: '', stderr: '' });
    assert.equal(helper.pid, pid);
    await assert.rejects(helper.run(['umount', 'a\0b'], { timeoutMs: 10_000 }), (err: unknown) => isTsboxError(err, 'InvalidArgument'));
  });

  test('killed between requests, it is started again by the next one', async () => {
    const helper = service();
    assert.equal((await helper.run(['umount', path.join(scratch, 'x')], { timeoutMs: 10_000 })).status, 0);
    const first = helper.pid as number;
    process.kill(first, 'SIGKILL');
    // Once the service has seen it end (its exit reaped): then it no longer names a pid.
    while (helper.pid !== undefined) await new Promise((r) => setTimeout(r, 5));
    assert.equal((await helper.run(['umount', path.join(scratch, 'x')], { timeoutMs: 10_000 })).status, 0);
    assert.notEqual(helper.pid, first);
  });

  test('a request that outlives its bound fails DeadlineExceeded and ends the serving process with its child; a call cancelled the same', async () => {
    // A stand-in that reads the request and never answers, with a child of its own, as a mount
    // that hangs would leave one.
    const stuck = path.join(scratch, 'stuck-serve');
    writeFileSync(stuck, '#!/bin/sh\nsleep 1000 &\necho $! > "$0.child"\nexec sleep 1000\n');
    chmodSync(stuck, 0o755);
    const helper = service(stuck);
    await assert.rejects(helper.run(['umount', '/x'], { timeoutMs: 300 }), (err: unknown) => isTsboxError(err, 'DeadlineExceeded') && /within 300 ms/.test(err.message));
    const child = Number(readFileSync(`${stuck}.child`, 'utf8'));
    await gone(child);
    const controller = new AbortController();
    const cancelled = helper.run(['umount', '/x'], { timeoutMs: 60_000, signal: controller.signal });
    const serving = helper.pid as number;
    controller.abort(new Error('the call was cancelled'));
    await assert.rejects(cancelled);
    await gone(serving);
  });

  test('a serving process that dies during a request fails that request, saying how it ended', async () => {
    const dying = path.join(scratch, 'dying-serve');
    writeFileSync(dying, '#!/bin/sh\nread line\necho "cannot go on" >&2\nexit 3\n');
    chmodSync(dying, 0o755);
    const helper = service(dying);
    await assert.rejects(helper.run(['umount', '/x'], { timeoutMs: 10_000 }), (err: unknown) => isTsboxError(err, 'Internal') && /ended \(code 3\): cannot go on/.test(err.message));
    const missing = service(path.join(scratch, 'no-such-binary'));
    await assert.rejects(missing.run(['umount', '/x'], { timeoutMs: 10_000 }), (err: unknown) => isTsboxError(err, 'Internal') && /ENOENT/.test(err.message));
  });

  test('closed, it exits; the end of its stdin (tsbox gone, however) ends it', async () => {
    const helper = service();
    assert.equal((await helper.run(['umount', path.join(scratch, 'x')], { timeoutMs: 10_000 })).status, 0);
    const pid = helper.pid as number;
    helper.close();
    await gone(pid);
    await assert.rejects(helper.run(['umount', '/x'], { timeoutMs: 10_000 }), (err: unknown) => isTsboxError(err, 'Unavailable'));
  });

  test('a request stream that is not one is refused with its reason, exit 2', () => {
    const cases: [Buffer, RegExp][] = [
      [Buffer.from('x\n'), /must begin with its argument count/],
      [Buffer.from('0\n'), /must begin with its argument count/],
      [Buffer.from('5000\n'), /must begin with its argument count \(1 to 4096\)/],
      [Buffer.from('2\numount\0'), /argument 2 of 2: missing \(end of file\)/],
      [Buffer.concat([Buffer.from('1\n'), Buffer.alloc(5 << 20, 0x61), Buffer.from([0])]), /argument 1 of 1: the request is too large/],
    ];
    for (const [input, reason] of cases) {
      const run = spawnSync(tsboxShim, ['serve'], { input, encoding: 'utf8' });
      assert.equal(run.status, 2, `${JSON.stringify(input.subarray(0, 12).toString())}: ${run.stderr}`);
      assert.match(run.stderr, reason);
    }
  });

  test('requests written back to back are answered one by one, in order, by one process', async () => {
    const child = spawn(tsboxShim, ['serve'], { stdio: ['pipe', 'pipe', 'inherit'] });
    const chunks: Buffer[] = [];
    child.stdout.on('data', (c: Buffer) => chunks.push(c));
    for (let i = 0; i < 50; i++) child.stdin.write(Buffer.from(`2\numount-all\0${scratch}/none-${i}\0`));
    child.stdin.end();
    const code = await new Promise<number | null>((resolve) => child.once('exit', resolve));
    assert.equal(code, 0);
    assert.equal(Buffer.concat(chunks).toString(), '0 0 0\n'.repeat(50));
  });
});
