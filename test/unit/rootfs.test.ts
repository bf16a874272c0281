// A task's rootfs mounts: which containerd mounts tsbox takes, the helper calls it makes for
// them and in what order, and the clean-up after a failure. The helper here is a fake that
// records its arguments; test/integration/rootfs.test.ts mounts for real.
import assert from 'node:assert/strict';
import { chmodSync, mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, describe, test } from 'node:test';
import { isTsboxError } from '../../src/base/errors.js';
import type { Mount } from '../../src/gen/containerd/types/mount.js';
import { checkRootfsMounts, mountArgs, mountRootfs, mountTarget, unmountRootfs } from '../../src/tasks/rootfs.js';

const overlay: Mount = {
  type: 'overlay',
  source: 'overlay',
  target: '',
  options: ['index=off', 'workdir=/s/2/work', 'upperdir=/s/2/fs', 'lowerdir=/s/1/fs'],
};
const roBind: Mount = { type: 'bind', source: '/s/1/fs', target: '', options: ['ro', 'rbind'] };

function refusal(mounts: Mount[], pattern: RegExp): void {
  assert.throws(
    () => checkRootfsMounts(mounts),
    (err: unknown) => isTsboxError(err, 'InvalidArgument') && pattern.test(err.message),
  );
}

describe('rootfs mounts tsbox takes', () => {
  test('what the overlayfs snapshotter hands out (an overlay, a read-only or writable bind) and a tmpfs pass', () => {
    checkRootfsMounts([overlay]);
    checkRootfsMounts([roBind]);
    checkRootfsMounts([{ type: 'bind', source: '/s/1/fs', target: '', options: ['rw', 'rbind'] }]);
    checkRootfsMounts([overlay, { type: 'tmpfs', source: 'tmpfs', target: 'run', options: ['nosuid', 'size=65536k'] }]);
  });

  test('another type is InvalidArgument naming the type and the mount', () => {
    refusal([overlay, { type: 'btrfs', source: '/dev/sdb', target: '', options: [] }], /^rootfs mount 2 of 2 \(btrfs \/dev\/sdb\): type "btrfs" is not one tsbox mounts \(overlay, bind, tmpfs\)$/);
    refusal([{ type: 'erofs', source: '/s/1/layer.erofs', target: '', options: ['ro', 'loop'] }], /type "erofs"/);
    refusal([{ type: 'fuse3.fuse-overlayfs', source: 'overlay', target: '', options: [] }], /type "fuse3.fuse-overlayfs"/);
    refusal([{ type: 'rbind', source: '/s/1/fs', target: '', options: [] }], /type "rbind"/);
  });

  test('options containerd acts on itself are refused, never passed on as data a bind would ignore', () => {
    refusal([{ ...roBind, options: ['ro', 'rbind', 'uidmap=0:1000:65536', 'gidmap=0:1000:65536'] }], /option "uidmap=0:1000:65536" asks for id-mapped mounts/);
    refusal([{ ...overlay, options: [...overlay.options, 'loop'] }], /option "loop" asks for loop devices/);
    refusal([{ ...overlay, options: [...overlay.options, 'X-containerd.mkdir.path=/x'] }], /containerd's own mount options/);
  });

  test('a bind without bind or rbind, a missing source and a NUL byte are refused', () => {
    refusal([{ ...roBind, options: ['ro'] }], /a bind mount needs the option bind or rbind/);
    refusal([{ ...roBind, source: '' }], /has no source/);
    refusal([{ ...overlay, options: ['lowerdir=/a\0b'] }], /NUL byte/);
  });
});

describe('helper arguments', () => {
  test('one mount is TARGET TYPE SOURCE and its options in containerd order', () => {
    assert.deepEqual(mountArgs(overlay, '/b/rootfs'), ['mount', '/b/rootfs', 'overlay', 'overlay', 'index=off', 'workdir=/s/2/work', 'upperdir=/s/2/fs', 'lowerdir=/s/1/fs']);
    assert.deepEqual(mountArgs(roBind, '/b/rootfs'), ['mount', '/b/rootfs', 'bind', '/s/1/fs', 'ro', 'rbind']);
  });

  test('a target is inside the rootfs, whatever its form; empty is the rootfs itself', () => {
    assert.equal(mountTarget('/b/rootfs', overlay), '/b/rootfs');
    assert.equal(mountTarget('/b/rootfs', { ...overlay, target: 'run/secrets' }), '/b/rootfs/run/secrets');
    assert.equal(mountTarget('/b/rootfs', { ...overlay, target: '/run' }), '/b/rootfs/run');
    assert.equal(mountTarget('/b/rootfs', { ...overlay, target: '../../etc' }), '/b/rootfs/etc');
  });
});

describe('mounting with a helper', () => {
  const scratch = mkdtempSync(path.join(os.tmpdir(), 'tsbox-rootfs-unit-'));
  after(() => rmSync(scratch, { recursive: true, force: true }));

  /** A helper that appends its arguments to `calls` and fails (exit 1) when asked to mount `failOn`. */
  function fakeHelper(name: string, failOn: string): { helper: string; calls: () => string[][] } {
    const dir = path.join(scratch, name);
    mkdirSync(path.join(dir, 'rootfs', 'sub'), { recursive: true });
    const log = path.join(dir, 'calls');
    const helper = path.join(dir, 'helper');
    writeFileSync(log, '');
    writeFileSync(
      helper,
      `#!/bin/sh\nprintf '%s\\n' "$*" >> '${log}'\nif [ "$1" = mount ] && [ "$4" = '${failOn}' ]; then echo "mount type $3 from $4 on $2 (flags 0x0): No such file or directory (ENOENT)" >&2; exit 1; fi\n`,
    );
    chmodSync(helper, 0o755);
    return {
      helper,
      calls: () =>
        readFileSync(log, 'utf8')
          .split('\n')
          .filter((l) => l !== '')
          .map((l) => l.split(' ')),
    };
  }

  test('mounts run in order, a nested one at its place in the rootfs', async () => {
    const { helper, calls } = fakeHelper('order', '-');
    const rootfs = path.join(scratch, 'order', 'rootfs');
    await mountRootfs(helper, [roBind, { type: 'tmpfs', source: 'tmpfs', target: 'sub', options: ['size=1m'] }], rootfs);
    assert.deepEqual(calls(), [
      ['mount', rootfs, 'bind', '/s/1/fs', 'ro', 'rbind'],
      ['mount', path.join(rootfs, 'sub'), 'tmpfs', 'tmpfs', 'size=1m'],
    ]);
  });

  test('a refused mount reaches no helper at all', async () => {
    const { helper, calls } = fakeHelper('refused', '-');
    await assert.rejects(mountRootfs(helper, [overlay, { type: 'btrfs', source: '/dev/sdb', target: '', options: [] }], path.join(scratch, 'refused', 'rootfs')), (err: unknown) =>
      isTsboxError(err, 'InvalidArgument'),
    );
    assert.deepEqual(calls(), []);
  });

  test("a failed second mount throws the helper's words, naming the mount, after unmounting the rootfs", async () => {
    const { helper, calls } = fakeHelper('fails', '/missing');
    const rootfs = path.join(scratch, 'fails', 'rootfs');
    await assert.rejects(mountRootfs(helper, [overlay, { ...roBind, source: '/missing', target: 'sub' }], rootfs), (err: unknown) => {
      assert.ok(isTsboxError(err, 'Internal'));
      assert.equal(err.message, `cannot mount rootfs mount 2 of 2 (bind /missing at sub) on ${rootfs}/sub: mount type bind from /missing on ${rootfs}/sub (flags 0x0): No such file or directory (ENOENT)`);
      return true;
    });
    assert.deepEqual(
      calls().map((c) => c.slice(0, 2)),
      [
        ['mount', rootfs],
        ['mount', `${rootfs}/sub`],
        ['umount-all', rootfs],
      ],
    );
  });

  test('a nested target that a symlink sends outside the rootfs is refused, and nothing stays mounted', async () => {
    const { helper, calls } = fakeHelper('escape', '-');
    const rootfs = path.join(scratch, 'escape', 'rootfs');
    // What an image layer could hold: /etc -> the host's /etc.
    symlinkSync('/etc', path.join(rootfs, 'etc'));
    await assert.rejects(mountRootfs(helper, [roBind, { type: 'tmpfs', source: 'tmpfs', target: 'etc', options: [] }], rootfs), (err: unknown) => {
      assert.ok(isTsboxError(err, 'InvalidArgument'));
      assert.match(err.message, /rootfs mount 2 of 2 \(tmpfs tmpfs at etc\): its target .*\/rootfs\/etc resolves to \/etc, outside the rootfs/);
      return true;
    });
    assert.deepEqual(calls().map((c) => c[0]), ['mount', 'umount-all']);
  });

  test('an aborted call stops before the next mount and unmounts the rootfs', async () => {
    const { helper, calls } = fakeHelper('abort', '-');
    const rootfs = path.join(scratch, 'abort', 'rootfs');
    const controller = new AbortController();
    controller.abort();
    await assert.rejects(mountRootfs(helper, [roBind], rootfs, controller.signal), (err: unknown) => isTsboxError(err, 'Cancelled'));
    assert.deepEqual(calls(), [['umount-all', rootfs]]);
  });

  test("unmounting passes on the helper's lazily detached paths", async () => {
    const dir = path.join(scratch, 'detach');
    mkdirSync(dir);
    const helper = path.join(dir, 'helper');
    writeFileSync(helper, `#!/bin/sh\necho "detached $2"\n`);
    chmodSync(helper, 0o755);
    assert.deepEqual(await unmountRootfs(helper, '/b/rootfs'), { detached: ['/b/rootfs'] });
  });

  test('at a Delete, a rootfs with nothing mounted at or below it (its holder unmounted it) starts no helper; one with a mount does', async () => {
    const { helper, calls } = fakeHelper('delete', '-');
    const rootfs = path.join(scratch, 'delete', 'rootfs');
    assert.deepEqual(await unmountRootfs(helper, rootfs, undefined, { helperOnlyWhenMounted: true }), { detached: [] });
    assert.deepEqual(await unmountRootfs(helper, path.join(scratch, 'no-such-bundle', 'rootfs'), undefined, { helperOnlyWhenMounted: true }), { detached: [] });
    assert.deepEqual(calls(), [], 'no helper for nothing mounted');
    // Something mounted below it, as this process's mount table says: /proc is, below "/".
    await unmountRootfs(helper, '/', undefined, { helperOnlyWhenMounted: true });
    assert.deepEqual(calls(), [['umount-all', '/']]);
  });
});
