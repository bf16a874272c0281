// The clean-up building blocks: which errors count as "already gone" (and that every other
// one reaches the caller with its path), the queue that orders each sandbox's operations,
// and ending a cgroup's processes within a bound, on cgroup file systems laid out in a temp
// dir with real processes listed in them.
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, describe, test } from 'node:test';
import { TsboxError, errnoOf, isGone, readIfPresent, withPath } from '../../src/base/errors.js';
import { boundOf } from '../../src/runtime/bound.js';
import { CgroupV1, CgroupV2 } from '../../src/runtime/cgroups.js';
import { PodFiles, criDirs } from '../../src/runtime/pod-files.js';
import { processStat } from '../../src/runtime/proc.js';
import { SerialQueue } from '../../src/base/serial-queue.js';

const scratch = mkdtempSync(path.join(os.tmpdir(), 'tsbox-cleanup-unit-'));
after(() => rmSync(scratch, { recursive: true, force: true }));

const never = (): AbortSignal => new AbortController().signal;

/** A real process that runs until killed; resolves with the signal that ended it. */
function sleeper(): { child: ChildProcess; ended: Promise<NodeJS.Signals | null> } {
  const child = spawn('sleep', ['600'], { stdio: 'ignore' });
  const ended = new Promise<NodeJS.Signals | null>((resolve) => child.once('exit', (_code, signal) => resolve(signal)));
  return { child, ended };
}

describe('errno helpers', () => {
  test('errnoOf reads the code of a system error and nothing else', () => {
    assert.equal(errnoOf(Object.assign(new Error('x'), { code: 'EACCES' })), 'EACCES');
    assert.equal(errnoOf(new Error('no code')), undefined);
    assert.equal(errnoOf(null), undefined);
    assert.equal(errnoOf('ENOENT'), undefined);
  });

  test('isGone: ENOENT and ESRCH only, and the codes a caller names', () => {
    const err = (code: string): Error => Object.assign(new Error(code), { code });
    assert.equal(isGone(err('ENOENT')), true);
    assert.equal(isGone(err('ESRCH')), true);
    for (const code of ['EACCES', 'EPERM', 'EISDIR', 'EIO', 'ENOTDIR', 'EBUSY']) assert.equal(isGone(err(code)), false, code);
    assert.equal(isGone(err('ENOTDIR'), ['ENOTDIR']), true);
    assert.equal(isGone(new Error('no code')), false);
  });

  test('withPath names the path and keeps the cause; a TsboxError passes through', () => {
    const cause = Object.assign(new Error('EACCES: permission denied'), { code: 'EACCES' });
    const wrapped = withPath(cause, '/sys/fs/cgroup/x/cgroup.procs', 'read');
    assert.ok(wrapped instanceof TsboxError);
    assert.equal(wrapped.message, 'cannot read /sys/fs/cgroup/x/cgroup.procs: EACCES: permission denied (/sys/fs/cgroup/x/cgroup.procs)');
    assert.equal(wrapped.cause, cause);
    const own = new TsboxError('NotFound', 'n');
    assert.equal(withPath(own, '/p'), own);
  });

  test('readIfPresent: the text, undefined when absent, and any other failure with its path', async () => {
    const file = path.join(scratch, 'present');
    writeFileSync(file, 'text');
    assert.equal(await readIfPresent(file), 'text');
    assert.equal(await readIfPresent(path.join(scratch, 'absent')), undefined);
    // A directory where a file is read: EISDIR is no "gone".
    await assert.rejects(readIfPresent(scratch), (err: unknown) => err instanceof TsboxError && errnoOf(err.cause) === 'EISDIR' && err.message.includes(scratch));
    // Below a file: ENOTDIR is a failure unless the caller says it means gone.
    await assert.rejects(readIfPresent(path.join(file, 'below')), (err: unknown) => errnoOf((err as Error).cause) === 'ENOTDIR');
    assert.equal(await readIfPresent(path.join(file, 'below'), ['ENOTDIR']), undefined);
  });

  test('processStat: a process that does not exist is undefined', async () => {
    assert.equal(await processStat(2 ** 22 + 1), undefined);
    assert.equal((await processStat(process.pid))?.parent, process.ppid);
  });

  test('PodFiles: a directory whose mark cannot be checked fails Stop with the path instead of passing for "not ours"', async () => {
    const root = path.join(scratch, 'containerd-root');
    const id = 'loop';
    const sandboxes = path.join(root, 'io.containerd.grpc.v1.cri', 'sandboxes');
    mkdirSync(sandboxes, { recursive: true });
    symlinkSync(id, path.join(sandboxes, id)); // a link to itself: ELOOP
    const files = new PodFiles(criDirs(root, path.join(scratch, 'containerd-state')), '/nonexistent-helper');
    await assert.rejects(files.unmount(id), (err: unknown) => err instanceof TsboxError && errnoOf(err.cause) === 'ELOOP' && err.message.includes(path.join(sandboxes, id, '.tsbox')));
  });
});

describe('SerialQueue', () => {
  test('runs one key\'s operations in order, other keys alongside, and goes on after a failure', async () => {
    const queue = new SerialQueue();
    const events: string[] = [];
    let releaseA: () => void = () => undefined;
    const a1 = queue.run('a', () => new Promise<void>((resolve) => (releaseA = () => (events.push('a1'), resolve()))));
    const a2 = queue.run('a', () => Promise.reject(new Error('a2 failed')));
    const a3 = queue.run('a', () => (events.push('a3'), Promise.resolve(3)));
    const b1 = queue.run('b', () => (events.push('b1'), Promise.resolve(1)));
    assert.equal(await b1, 1);
    assert.deepEqual(events, ['b1'], 'b waits for nothing of a; a2 and a3 wait for a1');
    releaseA();
    await a1;
    await assert.rejects(a2, /a2 failed/);
    assert.equal(await a3, 3);
    assert.deepEqual(events, ['b1', 'a1', 'a3']);
    await queue.settled();
  });
});

describe('ending a cgroup\'s processes', () => {
  const cgroup = '/tsbox/ns@id';

  test('v2 without cgroup.kill (before 5.14): freezes, SIGKILLs each process, thaws, and names what is left at the bound', async () => {
    const root = mkdtempSync(path.join(scratch, 'v2-'));
    const dir = path.join(root, cgroup);
    mkdirSync(dir, { recursive: true });
    const { child, ended } = sleeper();
    // A fake cgroupfs: the list does not change when the process dies, so the bound is hit.
    writeFileSync(path.join(dir, 'cgroup.procs'), `${child.pid}\n`);
    writeFileSync(path.join(dir, 'cgroup.freeze'), '0');
    writeFileSync(path.join(dir, 'cgroup.events'), 'populated 1\nfrozen 1\n');
    const began = Date.now();
    await assert.rejects(
      new CgroupV2(root).kill(cgroup, boundOf(300, never())),
      (err: unknown) =>
        err instanceof TsboxError && err.message === `cgroup v2 ${cgroup} still holds 1 process(es) 300 ms after they were killed (kill_timeout_ms): pids ${child.pid}`,
    );
    const took = Date.now() - began;
    assert.ok(took >= 290 && took < 2000, `the bound was 300 ms, it took ${took} ms`);
    assert.equal(await ended, 'SIGKILL');
    assert.equal(readFileSync(path.join(dir, 'cgroup.freeze'), 'utf8'), '0', 'left frozen');
  });

  test('v2 with cgroup.kill: one write kills the tree, no freeze; an empty cgroup is not touched', async () => {
    const root = mkdtempSync(path.join(scratch, 'v2-'));
    const dir = path.join(root, cgroup);
    mkdirSync(path.join(dir, 'child'), { recursive: true });
    writeFileSync(path.join(dir, 'cgroup.kill'), '');
    writeFileSync(path.join(dir, 'cgroup.freeze'), 'untouched');
    writeFileSync(path.join(dir, 'cgroup.procs'), '');
    writeFileSync(path.join(dir, 'child', 'cgroup.procs'), '');
    const manager = new CgroupV2(root);
    await manager.kill(cgroup, boundOf(300, never()));
    assert.equal(readFileSync(path.join(dir, 'cgroup.kill'), 'utf8'), '', 'nothing to kill');
    const { child, ended } = sleeper();
    writeFileSync(path.join(dir, 'child', 'cgroup.procs'), `${child.pid}\n`);
    // The fake's list never empties: the bound is hit, after the one write.
    await assert.rejects(manager.kill(cgroup, boundOf(200, never())), new RegExp(`pids ${child.pid}$`));
    assert.equal(readFileSync(path.join(dir, 'cgroup.kill'), 'utf8'), '1');
    assert.equal(readFileSync(path.join(dir, 'cgroup.freeze'), 'utf8'), 'untouched', 'no freeze is needed with cgroup.kill');
    assert.equal(await ended, 'SIGKILL');
  });

  test('v2: pids below the sandbox\'s cgroup count too; a gone cgroup has none', async () => {
    const root = mkdtempSync(path.join(scratch, 'v2-'));
    const dir = path.join(root, cgroup);
    mkdirSync(path.join(dir, 'held'), { recursive: true });
    writeFileSync(path.join(dir, 'cgroup.procs'), '11\n');
    writeFileSync(path.join(dir, 'held', 'cgroup.procs'), '12\n13\n');
    const manager = new CgroupV2(root);
    assert.deepEqual((await manager.pids(cgroup)).sort(), [11, 12, 13]);
    assert.deepEqual(await manager.pids('/tsbox/ns@gone'), []);
  });

  test('v2: a controller that cannot be enabled fails the cgroup\'s creation, naming the file', async () => {
    const root = mkdtempSync(path.join(scratch, 'v2-'));
    writeFileSync(path.join(root, 'cgroup.controllers'), 'cpu memory pids\n');
    mkdirSync(path.join(root, 'cgroup.subtree_control')); // EISDIR when written
    await assert.rejects(
      new CgroupV2(root).create(cgroup, undefined),
      (err: unknown) => err instanceof TsboxError && err.kind === 'FailedPrecondition' && err.message.includes(path.join(root, 'cgroup.subtree_control')),
    );
  });

  test('v1: freezes through the freezer hierarchy, SIGKILLs each process, thaws, and names what is left at the bound', async () => {
    const hierarchies = new Map<string, string>();
    for (const c of ['memory', 'cpuacct', 'freezer']) hierarchies.set(c, mkdtempSync(path.join(scratch, `v1-${c}-`)));
    const { child, ended } = sleeper();
    for (const [c, mount] of hierarchies) {
      mkdirSync(path.join(mount, cgroup), { recursive: true });
      writeFileSync(path.join(mount, cgroup, 'cgroup.procs'), c === 'memory' ? `${child.pid}\n` : '');
    }
    const state = path.join(hierarchies.get('freezer') ?? '', cgroup, 'freezer.state');
    writeFileSync(state, 'THAWED');
    await assert.rejects(new CgroupV1(hierarchies).kill(cgroup, boundOf(300, never())), (err: unknown) =>
      (err as Error).message.startsWith(`cgroup v1 ${cgroup} still holds 1 process(es) 300 ms after they were killed (kill_timeout_ms): pids ${child.pid}`),
    );
    assert.equal(await ended, 'SIGKILL');
    assert.equal(readFileSync(state, 'utf8'), 'THAWED', 'left frozen');
  });

  test('a wait for the cgroup to empty ends with the call\'s error when its signal fires', async () => {
    const root = mkdtempSync(path.join(scratch, 'v2-'));
    mkdirSync(path.join(root, cgroup), { recursive: true });
    writeFileSync(path.join(root, cgroup, 'cgroup.procs'), `${2 ** 22 + 3}\n`); // no such process: listed forever
    const call = new AbortController();
    const reason = new TsboxError('DeadlineExceeded', 'deadline exceeded');
    setTimeout(() => call.abort(reason), 50);
    await assert.rejects(new CgroupV2(root).kill(cgroup, boundOf(60_000, call.signal)), (err: unknown) => err === reason);
  });
});
