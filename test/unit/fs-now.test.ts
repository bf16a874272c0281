import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { changesAt, changesFor } from '../../src/base/fs-now.js';
import { repoRoot } from '../support/containerd-clients.js';

/** The file system type holding `path`, as coreutils' stat names it ("tmpfs", "ext2/ext3"): not the code under test's statfs. */
function fsTypeOf(path: string): string {
  return execFileSync('stat', ['-f', '-c', '%T', path], { encoding: 'utf8' }).trim();
}

describe('changesFor: changes made at once on a file system held in memory', () => {
  const onShm = mkdtempSync('/dev/shm/tsbox-fs-now-');
  // The checkout's own directory: on the machine's disk, as tsbox's state dir is.
  mkdirSync(join(repoRoot, '.cache'), { recursive: true });
  const onDisk = mkdtempSync(join(repoRoot, '.cache', 'fs-now-'));
  const noError = (err: unknown, path: string): void => assert.fail(`statfs of ${path} failed: ${String(err)}`);
  after(() => {
    rmSync(onShm, { recursive: true, force: true });
    rmSync(onDisk, { recursive: true, force: true });
  });

  it('on a tmpfs, a directory not made yet included, each change is made before the call returns', async () => {
    assert.equal(fsTypeOf('/dev/shm'), 'tmpfs', 'this test needs /dev/shm to be a tmpfs');
    const dir = join(onShm, 'tasks', 'not-yet');
    const fs = changesFor(dir, noError);
    assert.equal(fs.now, true);
    const made = fs.mkdir(join(dir, 'init'), { recursive: true, mode: 0o700 });
    assert.ok(existsSync(join(dir, 'init')), 'mkdir made the directory before its promise was awaited');
    await made;
    const written = fs.writeFile(join(dir, 'task.json.tmp'), '{"id":"a"}', { mode: 0o600 });
    const renamed = fs.rename(join(dir, 'task.json.tmp'), join(dir, 'task.json'));
    assert.equal(readFileSync(join(dir, 'task.json'), 'utf8'), '{"id":"a"}');
    await Promise.all([written, renamed]);
    const removed = fs.rm(dir, { recursive: true, force: true });
    assert.equal(existsSync(dir), false);
    await removed;
  });

  it('at once, a failure is a rejected promise with its errno, not a throw', async () => {
    const fs = changesFor(onShm, noError);
    assert.equal(fs.now, true);
    let promise: Promise<void> | undefined;
    assert.doesNotThrow(() => {
      promise = fs.rename(join(onShm, 'missing'), join(onShm, 'other'));
    });
    await assert.rejects(promise as Promise<void>, (err: NodeJS.ErrnoException) => err.code === 'ENOENT');
  });

  it('on a disk file system the changes go through the pool and still do what they say', async () => {
    const fs = changesFor(join(onDisk, 'a', 'b'), noError);
    assert.ok(!['tmpfs', 'ramfs'].includes(fsTypeOf(onDisk)), `this test needs the checkout on a disk file system (${onDisk}: ${fsTypeOf(onDisk)})`);
    assert.equal(fs.now, false, `${onDisk} is not held in memory`);
    await fs.mkdir(join(onDisk, 'a', 'b'), { recursive: true, mode: 0o700 });
    await fs.writeFile(join(onDisk, 'a', 'b', 'f.tmp'), 'x', { mode: 0o600 });
    await fs.rename(join(onDisk, 'a', 'b', 'f.tmp'), join(onDisk, 'a', 'b', 'f'));
    assert.equal(readFileSync(join(onDisk, 'a', 'b', 'f'), 'utf8'), 'x');
    await fs.rm(join(onDisk, 'a'), { recursive: true, force: true });
    assert.equal(existsSync(join(onDisk, 'a')), false);
  });

  it('a path statfs cannot look at (through a file) is told to the caller, and its changes go through the pool', async () => {
    const file = join(onDisk, 'plain-file');
    await changesFor(onDisk, noError).writeFile(file, '', { mode: 0o600 });
    const told: string[] = [];
    const fs = changesFor(join(file, 'below'), (err, path) => told.push(`${(err as NodeJS.ErrnoException).code} ${path}`));
    assert.deepEqual(told, [`ENOTDIR ${join(file, 'below')}`]);
    assert.equal(fs.now, false);
    await assert.rejects(fs.mkdir(join(file, 'below'), { recursive: true, mode: 0o700 }), (err: NodeJS.ErrnoException) => err.code === 'ENOTDIR');
  });

  it('changesAt: a path at or below a place takes its calls, the first place that holds it; any other path the pool\'s', () => {
    const memory = changesFor(onShm, noError);
    const disk = changesFor(onDisk, noError);
    const places = [
      { dir: '/run/c/tsbox/tasks', calls: memory },
      { dir: '/run/c/tsbox/runc', calls: memory },
      { dir: '/run/c', calls: disk },
    ];
    assert.equal(changesAt('/run/c/tsbox/tasks', places), memory);
    assert.equal(changesAt('/run/c/tsbox/tasks/0123/init', places), memory);
    assert.equal(changesAt('/run/c/tsbox/runc/k8s.io', places), memory);
    assert.equal(changesAt('/run/c/tsbox/tasksX/0123', places), disk, 'a sibling whose name begins alike is not below');
    assert.equal(changesAt('/var/lib/tsbox/tasks/0123', places).now, false, "a task kept in tsbox's own state dir: the pool's");
    assert.equal(changesAt('/run/cc', places).now, false);
  });
});
