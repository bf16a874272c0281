/**
 * The mount helper kept running (`tsbox-shim serve` behind HelperService), with the real
 * binary: one process serves request after request, says each helper's own failure, comes back
 * after it is killed, ends a request that outlives its bound with the request's own child, and
 * refuses a request stream that is not one; and starts programs that go on running (spawn).
 */
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { chmodSync, mkdirSync, mkdtempSync, readFileSync, readlinkSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, describe, test } from 'node:test';
import { pino } from 'pino';
import { isTsboxError } from '../../src/base/errors.js';
import { HELPER_SERVERS, HelperService, runHelper, spawnArgs, spawnedAnswer } from '../../src/runtime/helper-service.js';
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
    assert.equal(pids?.length, HELPER_SERVERS, 'all started at the first request');
    for (const pid of pids ?? []) assert.deepEqual(childrenOf(pid), [], 'no child left behind by the requests');
  });

  test('requests at once are all served, by the serving processes', async () => {
    const helper = service();
    const targets = Array.from({ length: 3 * HELPER_SERVERS }, (_, i) => path.join(scratch, `at-once-${i}`));
    for (const t of targets) mkdirSync(t);
    const mounted = await Promise.all(targets.map((t) => helper.run(['mount', t, 'tmpfs', 'tmpfs', 'size=1m'], { timeoutMs: 10_000 })));
    assert.deepEqual(mounted.map((r) => r.status), targets.map(() => 0));
    for (const t of targets) assert.equal(await isMountedAt(t, { below: false }), true, t);
    assert.equal(helper.pids.length, HELPER_SERVERS, `serving processes: ${helper.pids.join(' ')}`);
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
    assert.equal(unknown.status, 2, 'only mount, umount, umount-all and spawn are served');
    assert.match(unknown.stderr, /lock is not a mode it runs/);
    const pids = helper.pids;
    assert.deepEqual(await helper.run(['umount', path.join(scratch, 'not-mounted')], { timeoutMs: 10_000 }), { status: 0, stdout: '', stderr: '' });
    assert.deepEqual(helper.pids, pids);
    await assert.rejects(helper.run(['umount', 'a\0b'], { timeoutMs: 10_000 }), (err: unknown) => isTsboxError(err, 'InvalidArgument'));
  });

  test('killed between requests, it is started again by the next one', async () => {
    const helper = service();
    assert.equal((await helper.run(['umount', path.join(scratch, 'x')], { timeoutMs: 10_000 })).status, 0);
    const [first, ...others] = helper.pids as [number, ...number[]];
    process.kill(first, 'SIGKILL');
    // Once the service has seen it end (its exit reaped): then it no longer lists it.
    while (helper.pids.includes(first)) await new Promise((r) => setTimeout(r, 5));
    assert.equal((await helper.run(['umount', path.join(scratch, 'x')], { timeoutMs: 10_000 })).status, 0);
    assert.equal(helper.pids.length, HELPER_SERVERS, 'the one that ended is replaced');
    assert.ok(others.every((pid) => helper.pids.includes(pid)) && !helper.pids.includes(first), `serving: ${helper.pids.join(' ')}`);
  });

  /** A stand-in that never answers, with a child of its own, as a mount that hangs would leave one. */
  function stuckServer(name: string): { path: string; childOf: (serving: number) => Promise<number> } {
    const file = path.join(scratch, name);
    // It reads its requests and never answers; at the end of its stdin (close) it goes, with its child.
    writeFileSync(file, '#!/bin/sh\nsleep 1000 &\necho $! > "$0.tmp.$$"\nmv "$0.tmp.$$" "$0.child.$$"\ncat > /dev/null\nkill $!\n');
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
    const [serving, ...idle] = helper.pids as [number, ...number[]];
    const child = await stuck.childOf(serving);
    await assert.rejects(request, (err: unknown) => isTsboxError(err, 'DeadlineExceeded') && /within 3000 ms/.test(err.message));
    assert.ok([undefined, 'Z'].includes(procInfo(child)?.state), "the request's child is gone (dead, if not yet reaped) when it fails");
    await gone(serving);
    assert.deepEqual(helper.pids, idle, 'the others serve on');
  });

  test('a cancelled call ends its request the same way; a request waiting for its turn fails on its own bound and ends nothing', async () => {
    const stuck = stuckServer('stuck-cancel');
    const helper = service(stuck.path);
    const controllers = Array.from({ length: HELPER_SERVERS }, () => new AbortController());
    // As many requests as serving processes take them all; they never answer.
    const held = controllers.map((c) => helper.run(['umount', '/x'], { timeoutMs: 60_000, signal: c.signal }));
    const serving = helper.pids;
    assert.equal(serving.length, HELPER_SERVERS);
    const children = await Promise.all(serving.map((pid) => stuck.childOf(pid)));
    await assert.rejects(helper.run(['umount', '/y'], { timeoutMs: 200 }), (err: unknown) => isTsboxError(err, 'DeadlineExceeded'));
    assert.deepEqual(helper.pids, serving, 'the waiting request ended no serving process');
    const queued = new AbortController();
    const waiting = helper.run(['umount', '/z'], { timeoutMs: 60_000, signal: queued.signal });
    queued.abort(new Error('cancelled while waiting'));
    await assert.rejects(waiting, (err: unknown) => isTsboxError(err, 'Cancelled'));
    assert.deepEqual(helper.pids, serving);
    const ended = held.map((r) => assert.rejects(r, (err: unknown) => isTsboxError(err, 'Cancelled')));
    for (const c of controllers) c.abort(new Error('the call was cancelled'));
    await Promise.all(ended);
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
    assert.equal(pids.length, HELPER_SERVERS);
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

  describe('spawn: a program started that goes on running', () => {
    const started: number[] = [];
    after(() => {
      for (const pid of started) {
        try {
          process.kill(pid, 'SIGKILL');
        } catch {
          // already gone
        }
      }
    });

    test("a sandbox supervisor answers, and runs on in a session of its own, no serving process's child, with exactly the environment given", async () => {
      const helper = service();
      const dir = mkdtempSync(path.join(scratch, 'spawned-'));
      const command = ['/bin/sh', '-c', `/usr/bin/env > ${dir}/env.tmp && mv ${dir}/env.tmp ${dir}/env && exec /bin/sleep 1000`];
      const result = await helper.run(spawnArgs({ path: tsboxShim, args: ['--dir', dir, '--', ...command], env: { FOO: 'bar baz', UNSET: undefined } }), { timeoutMs: 10_000 });
      const said = spawnedAnswer(result);
      assert.ok('line' in said, `answered: ${JSON.stringify(result)}`);
      const ok = /^ok (\d+) (\d+)$/.exec(said.line);
      assert.ok(ok !== null, said.line);
      const [supervisor, sandbox] = [Number(ok[1]), Number(ok[2])];
      started.push(sandbox, supervisor);
      assert.equal(result.status, 0, 'it runs on');
      const info = procInfo(supervisor);
      assert.ok(info !== undefined && info.state !== 'Z', 'the supervisor runs after its answer');
      assert.ok(!helper.pids.includes(info.ppid), `its parent ${info.ppid} is no serving process (${helper.pids.join(' ')})`);
      const stat = readFileSync(`/proc/${supervisor}/stat`, 'utf8');
      const session = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[3]);
      assert.equal(session, supervisor, 'it leads a session of its own');
      assert.equal(readlinkSync(`/proc/${supervisor}/cwd`), '/', 'it runs from /');
      let env: string | undefined;
      while (env === undefined) {
        try {
          env = readFileSync(path.join(dir, 'env'), 'utf8');
        } catch (err) {
          if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
          await new Promise((r) => setTimeout(r, 5));
        }
      }
      assert.match(env, /^FOO=bar baz$/m, 'the entry given');
      assert.doesNotMatch(env, /^(UNSET|HOME)=/m, "nothing of tsbox's own environment, no entry without a value");
      // The serving processes end: what they started runs on.
      const pids = helper.pids;
      await helper.close();
      for (const pid of pids) await gone(pid);
      assert.ok(procInfo(supervisor) !== undefined && procInfo(supervisor)?.state !== 'Z', 'the supervisor outlives the serving processes');
    });

    test('a program that cannot be run: status 127 and why; a request that is not a spawn: status 2 and why', async () => {
      const helper = service();
      assert.deepEqual(await helper.run(spawnArgs({ path: '/no/such/program', args: [], env: {} }), { timeoutMs: 10_000 }), {
        status: 127,
        stdout: '',
        stderr: 'cannot run /no/such/program: No such file or directory\n',
      });
      const relative = await helper.run(['spawn', 'sh', '0'], { timeoutMs: 10_000 });
      assert.equal(relative.status, 2);
      assert.match(relative.stderr, /spawn needs an absolute program/);
      const count = await helper.run(['spawn', '/bin/sh', '3', 'A=1'], { timeoutMs: 10_000 });
      assert.equal(count.status, 2);
      assert.match(count.stderr, /3 is not a count of environment entries \(0 to 1\)/);
      assert.deepEqual(spawnedAnswer({ status: 127, stdout: '', stderr: 'cannot run x\n' }), { said: 'cannot run x (status 127)' });
    });

    test('a program that has not answered when its request ends for its bound is ended with it: nothing is left half started', async () => {
      const helper = service();
      const pidFile = path.join(scratch, 'never-answers.pid');
      // It keeps its stdout open and never answers.
      const request = helper.run(spawnArgs({ path: '/bin/sh', args: ['-c', `echo $$ > ${pidFile}.tmp && mv ${pidFile}.tmp ${pidFile} && exec /bin/sleep 1000`], env: {} }), { timeoutMs: 1500 });
      await assert.rejects(request, (err: unknown) => isTsboxError(err, 'DeadlineExceeded'));
      const pid = Number(readFileSync(pidFile, 'utf8'));
      started.push(pid);
      // Its parent (the request's child) was killed with the serving process: PR_SET_PDEATHSIG ends it.
      await gone(pid);
    });

    test('tryRun takes a free serving process but always leaves one to run(), and says undefined rather than wait', async () => {
      const stuck = stuckServer('stuck-try');
      const helper = service(stuck.path);
      const controllers: AbortController[] = [];
      const held: Promise<unknown>[] = [];
      for (;;) {
        const c = new AbortController();
        const r = helper.tryRun(['umount', '/x'], { timeoutMs: 60_000, signal: c.signal });
        if (r === undefined) break;
        controllers.push(c);
        held.push(r);
      }
      assert.equal(held.length, HELPER_SERVERS - 1, 'all but one taken by tryRun');
      // The one left serves run() at once (a mount does not wait behind the starts).
      const last = new AbortController();
      held.push(helper.run(['umount', '/y'], { timeoutMs: 60_000, signal: last.signal }));
      controllers.push(last);
      const children = await Promise.all(helper.pids.map((pid) => stuck.childOf(pid)));
      assert.equal(children.length, HELPER_SERVERS, 'every serving process took a request');
      assert.equal(helper.tryRun(['umount', '/z'], { timeoutMs: 60_000 }), undefined, 'all busy');
      const ended = held.map((r) => assert.rejects(r, (err: unknown) => isTsboxError(err, 'Cancelled')));
      for (const c of controllers) c.abort(new Error('done'));
      await Promise.all(ended);
      const again = helper.tryRun(['umount', '/z'], { timeoutMs: 200 });
      assert.ok(again !== undefined, 'free again (new serving processes)');
      await assert.rejects(again, (err: unknown) => isTsboxError(err, 'DeadlineExceeded'));
    });

    test('a request past what a serving process takes: tryRun says undefined, run() refuses it, and no serving process is lost', async () => {
      const helper = service();
      assert.equal((await helper.run(['umount', path.join(scratch, 'x')], { timeoutMs: 10_000 })).status, 0);
      const pids = helper.pids;
      const env = Object.fromEntries(Array.from({ length: 4100 }, (_, i) => [`V${i}`, 'x']));
      const big = spawnArgs({ path: '/bin/true', args: [], env });
      assert.equal(helper.tryRun(big, { timeoutMs: 10_000 }), undefined);
      await assert.rejects(helper.run(big, { timeoutMs: 10_000 }), (err: unknown) => isTsboxError(err, 'InvalidArgument') && /at most 4096 arguments/.test(err.message));
      const huge = spawnArgs({ path: '/bin/true', args: ['y'.repeat(5 << 20)], env: {} });
      assert.equal(helper.tryRun(huge, { timeoutMs: 10_000 }), undefined);
      assert.deepEqual(helper.pids, pids, 'the serving processes are the same');
      assert.equal((await helper.run(['umount', path.join(scratch, 'x')], { timeoutMs: 10_000 })).status, 0);
    });

    test('a serving process that dies during a spawn takes the program that has not answered with it', async () => {
      const helper = service();
      const pidFile = path.join(scratch, 'orphaned.pid');
      const request = helper.run(spawnArgs({ path: '/bin/sh', args: ['-c', `echo $$ > ${pidFile}.tmp && mv ${pidFile}.tmp ${pidFile} && exec /bin/sleep 1000`], env: {} }), { timeoutMs: 60_000 });
      let pid: number | undefined;
      while (pid === undefined) {
        try {
          pid = Number(readFileSync(pidFile, 'utf8'));
        } catch (err) {
          if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
          await new Promise((r) => setTimeout(r, 5));
        }
      }
      started.push(pid);
      const serving = helper.pids.find((p) => childrenOf(p).length > 0);
      assert.ok(serving !== undefined, 'one serving process has the request');
      process.kill(serving, 'SIGKILL');
      await assert.rejects(request, (err: unknown) => isTsboxError(err, 'Internal') && /ended \(SIGKILL\)/.test(err.message));
      await gone(pid);
    });
  });
});
