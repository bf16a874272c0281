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
import { HelperService, runHelper } from '../../src/runtime/helper-service.js';
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
  after(async () => {
    for (const s of services) await s.close();
    // What a failed test left mounted goes before the directory does.
    await runHelper(tsboxShim, ['umount-all', scratch], 'unmount the scratch directory', { timeoutMs: 10_000 });
    rmSync(scratch, { recursive: true, force: true });
  });

  test('the serving processes mount and unmount, request after request, in the mount namespace of tsbox', async () => {
    const helper = service();
    const target = path.join(scratch, 'mnt');
    mkdirSync(target);
    let pids: number[] | undefined;
    for (let i = 0; i < 20; i++) {
      const mounted = await helper.run(['mount', target, 'tmpfs', 'tmpfs', 'size=1m'], { timeoutMs: 10_000 });
      assert.deepEqual(mounted, { status: 0, stdout: '', stderr: '' });
      assert.equal(await isMountedAt(target, { below: false }), true, `round ${i}: mounted where tsbox sees it`);
      pids ??= helper.pids;
      assert.deepEqual(helper.pids, pids, 'the same serving processes');
      assert.equal((await helper.run(['umount', target], { timeoutMs: 10_000 })).status, 0);
      assert.equal(await isMountedAt(target, { below: false }), false, `round ${i}: unmounted`);
    }
    assert.equal(pids?.length, 2, 'both started at the first request');
    for (const pid of pids ?? []) assert.deepEqual(childrenOf(pid), [], 'no child left behind by the requests');
  });

  test('requests at once are all served, by the two processes', async () => {
    const helper = service();
    const targets = Array.from({ length: 8 }, (_, i) => path.join(scratch, `at-once-${i}`));
    for (const t of targets) mkdirSync(t);
    const mounted = await Promise.all(targets.map((t) => helper.run(['mount', t, 'tmpfs', 'tmpfs', 'size=1m'], { timeoutMs: 10_000 })));
    assert.deepEqual(mounted.map((r) => r.status), targets.map(() => 0));
    for (const t of targets) assert.equal(await isMountedAt(t, { below: false }), true, t);
    assert.equal(helper.pids.length, 2, `serving processes: ${helper.pids.join(' ')}`);
    const unmounted = await Promise.all(targets.map((t) => helper.run(['umount-all', t], { timeoutMs: 10_000 })));
    assert.deepEqual(unmounted.map((r) => r.status), targets.map(() => 0));
    for (const t of targets) assert.equal(await isMountedAt(t, { below: false }), false, t);
  });

  test("a helper's failure is its status and its one line of stderr, and the next request is served", async () => {
    const helper = service();
    const failed = await helper.run(['mount', path.join(scratch, 'nowhere'), 'tmpfs', 'tmpfs'], { timeoutMs: 10_000 });
    assert.equal(failed.status, 1);
    assert.equal(failed.stderr, `mount type tmpfs from tmpfs on ${scratch}/nowhere (flags 0x0): No such file or directory (ENOENT)\n`);
    const unknown = await helper.run(['lock', path.join(scratch, 'lock')], { timeoutMs: 10_000 });
    assert.equal(unknown.status, 2, 'only mount, umount and umount-all are served');
    assert.match(unknown.stderr, /lock is not a mode it runs/);
    const pids = helper.pids;
    assert.deepEqual(await helper.run(['umount', path.join(scratch, 'not-mounted')], { timeoutMs: 10_000 }), { status: 0, stdout: '', stderr: '' });
    assert.deepEqual(helper.pids, pids);
    await assert.rejects(helper.run(['umount', 'a\0b'], { timeoutMs: 10_000 }), (err: unknown) => isTsboxError(err, 'InvalidArgument'));
  });

  test('killed between requests, it is started again by the next one', async () => {
    const helper = service();
    assert.equal((await helper.run(['umount', path.join(scratch, 'x')], { timeoutMs: 10_000 })).status, 0);
    const [first, second] = helper.pids as [number, number];
    process.kill(first, 'SIGKILL');
    // Once the service has seen it end (its exit reaped): then it no longer lists it.
    while (helper.pids.includes(first)) await new Promise((r) => setTimeout(r, 5));
    assert.equal((await helper.run(['umount', path.join(scratch, 'x')], { timeoutMs: 10_000 })).status, 0);
    assert.equal(helper.pids.length, 2, 'the one that ended is replaced');
    assert.ok(helper.pids.includes(second) && !helper.pids.includes(first), `serving: ${helper.pids.join(' ')}`);
  });

  /** A stand-in that never answers, with a child of its own, as a mount that hangs would leave one. */
  function stuckServer(name: string): { path: string; childOf: (serving: number) => Promise<number> } {
    const file = path.join(scratch, name);
    writeFileSync(file, '#!/bin/sh\nsleep 1000 &\necho $! > "$0.tmp.$$"\nmv "$0.tmp.$$" "$0.child.$$"\nexec sleep 1000\n');
    chmodSync(file, 0o755);
    // Each serving process names its child in a file of its own (by its pid), written whole.
    const childOf = async (serving: number): Promise<number> => {
      const named = path.join(scratch, `${name}.child.${serving}`);
      for (;;) {
        try {
          return Number(readFileSync(named, 'utf8'));
        } catch (err) {
          if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
        }
        await new Promise((r) => setTimeout(r, 5));
      }
    };
    return { path: file, childOf };
  }

  test('a request that outlives its bound fails DeadlineExceeded once its serving process and that one\'s child are gone', async () => {
    const stuck = stuckServer('stuck-bound');
    const helper = service(stuck.path);
    const request = helper.run(['umount', '/x'], { timeoutMs: 3000 });
    // The first serving process takes the first request.
    const [serving, idle] = helper.pids as [number, number];
    const child = await stuck.childOf(serving);
    await assert.rejects(request, (err: unknown) => isTsboxError(err, 'DeadlineExceeded') && /within 3000 ms/.test(err.message));
    assert.ok([undefined, 'Z'].includes(procInfo(child)?.state), "the request's child is gone (dead, if not yet reaped) when it fails");
    await gone(serving);
    assert.deepEqual(helper.pids, [idle], 'the other one serves on');
  });

  test('a cancelled call ends its request the same way; a request waiting for its turn fails on its own bound and ends nothing', async () => {
    const stuck = stuckServer('stuck-cancel');
    const helper = service(stuck.path);
    const controllers = [new AbortController(), new AbortController()];
    // Two requests take the two serving processes, which never answer.
    const held = controllers.map((c) => helper.run(['umount', '/x'], { timeoutMs: 60_000, signal: c.signal }));
    const serving = helper.pids;
    assert.equal(serving.length, 2);
    const children = [await stuck.childOf(serving[0] as number), await stuck.childOf(serving[1] as number)];
    await assert.rejects(helper.run(['umount', '/y'], { timeoutMs: 200 }), (err: unknown) => isTsboxError(err, 'DeadlineExceeded'));
    assert.deepEqual(helper.pids, serving, 'the waiting request ended no serving process');
    const queued = new AbortController();
    const waiting = helper.run(['umount', '/z'], { timeoutMs: 60_000, signal: queued.signal });
    queued.abort(new Error('cancelled while waiting'));
    await assert.rejects(waiting, (err: unknown) => isTsboxError(err, 'Cancelled'));
    assert.deepEqual(helper.pids, serving);
    for (const c of controllers) c.abort(new Error('the call was cancelled'));
    for (const r of held) await assert.rejects(r, (err: unknown) => isTsboxError(err, 'Cancelled'));
    for (const pid of children) assert.ok([undefined, 'Z'].includes(procInfo(pid)?.state), `child ${pid} is gone (dead, if not yet reaped) when its request fails`);
    for (const pid of serving) await gone(pid);
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

  test('closed with a request under way, it answers that request first, then exits; later requests fail Unavailable', async () => {
    const slow = path.join(scratch, 'slow-serve');
    // Reads one request (its count line), answers it a moment later, then serves until EOF as the real one would.
    writeFileSync(slow, `#!/bin/sh\nread count\nsleep 0.3\nprintf '0 2 0\\nok'\nexec ${tsboxShim} serve\n`);
    chmodSync(slow, 0o755);
    const helper = service(slow);
    const request = helper.run(['umount', '/x'], { timeoutMs: 10_000 });
    const pids = helper.pids;
    assert.equal(pids.length, 2);
    const closed = helper.close();
    assert.deepEqual(await request, { status: 0, stdout: 'ok', stderr: '' });
    await closed;
    for (const pid of pids) await gone(pid);
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
    const code = await new Promise<number | null>((resolve) => child.once('close', resolve));
    assert.equal(code, 0);
    assert.equal(Buffer.concat(chunks).toString(), '0 0 0\n'.repeat(50));
  });
});
