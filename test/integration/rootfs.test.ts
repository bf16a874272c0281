/**
 * A task's rootfs, mounted for real (root, this host's kernel) through the supervisor's mount
 * helper: what a container would see through `<bundle>/rootfs`, and that nothing stays mounted
 * after an unmount or a failed mount.
 */
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { open, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { after, describe, test } from 'node:test';
import { pino } from 'pino';
import { isTsboxError } from '../../src/base/errors.js';
import type { Mount } from '../../src/gen/containerd/types/mount.js';
import { mountRootfs, unmountRootfs } from '../../src/tasks/rootfs.js';
import { type Helper, HelperService } from '../../src/runtime/helper-service.js';
import { tsboxShim } from '../support/tsbox-daemon.js';

/** The mount points at or below `dir` in this mount namespace, as the kernel lists them. */
function mountsUnder(dir: string): string[] {
  return readFileSync('/proc/self/mountinfo', 'utf8')
    .split('\n')
    .map((line) => (line.split(' ')[4] ?? '').replace(/\\([0-7]{3})/g, (_, oct: string) => String.fromCharCode(parseInt(oct, 8))))
    .filter((p) => p === dir || p.startsWith(`${dir}/`));
}

for (const kind of ['a process per run', 'the helper kept running']) {
  describe(`rootfs mounts on this host, ${kind}`, () => {
    const helper: Helper = kind === 'the helper kept running' ? new HelperService(tsboxShim, pino({ level: 'silent' })) : tsboxShim;
    const scratch = mkdtempSync(path.join(os.tmpdir(), 'tsbox-rootfs-'));
    after(async () => {
      await unmountRootfs(helper, scratch);
      if (typeof helper !== 'string') await helper.close();
      rmSync(scratch, { recursive: true, force: true });
    });

    /** A bundle-like directory: an empty rootfs, and snapshot dirs laid out as the overlayfs snapshotter does. */
    function bundle(name: string): { rootfs: string; snapshot: (id: number) => string } {
      const dir = path.join(scratch, name);
      const rootfs = path.join(dir, 'rootfs');
      mkdirSync(rootfs, { recursive: true });
      const snapshot = (id: number): string => {
        const s = path.join(dir, 'io.containerd.snapshotter.v1.overlayfs', 'snapshots', String(id));
        mkdirSync(path.join(s, 'fs'), { recursive: true });
        mkdirSync(path.join(s, 'work'), { recursive: true });
        return s;
      };
      return { rootfs, snapshot };
    }

    test('an overlay of two layers with an upper dir is seen and written through the rootfs, and leaves no mount after the unmount', async () => {
      const { rootfs, snapshot } = bundle('overlay');
      const [lower1, lower2, upper] = [snapshot(1), snapshot(2), snapshot(3)];
      writeFileSync(path.join(lower1, 'fs', 'base'), 'from layer 1\n');
      writeFileSync(path.join(lower2, 'fs', 'base'), 'from layer 2\n');
      writeFileSync(path.join(lower2, 'fs', 'only2'), 'two\n');
      const mount: Mount = {
        type: 'overlay',
        source: 'overlay',
        target: '',
        // containerd lists the topmost layer first.
        options: ['index=off', `workdir=${upper}/work`, `upperdir=${upper}/fs`, `lowerdir=${lower2}/fs:${lower1}/fs`],
      };
      await mountRootfs(helper, [mount], rootfs);
      assert.deepEqual(mountsUnder(rootfs), [rootfs]);
      assert.equal(readFileSync(path.join(rootfs, 'base'), 'utf8'), 'from layer 2\n');
      assert.equal(readFileSync(path.join(rootfs, 'only2'), 'utf8'), 'two\n');
      writeFileSync(path.join(rootfs, 'written'), 'by the container\n');
      assert.equal(readFileSync(path.join(upper, 'fs', 'written'), 'utf8'), 'by the container\n', 'writes land in the upper dir');
      assert.deepEqual(readdirSync(path.join(lower1, 'fs')), ['base'], 'the layers are untouched');

      assert.deepEqual(await unmountRootfs(helper, rootfs), { detached: [] });
      assert.deepEqual(mountsUnder(rootfs), []);
      assert.deepEqual(readdirSync(rootfs), [], 'the rootfs is the empty directory again');
    });

    test('a read-only bind (a view of one layer) refuses writes with EROFS', async () => {
      const { rootfs, snapshot } = bundle('ro-bind');
      const layer = snapshot(1);
      writeFileSync(path.join(layer, 'fs', 'file'), 'layer\n');
      await mountRootfs(helper, [{ type: 'bind', source: `${layer}/fs`, target: '', options: ['ro', 'rbind'] }], rootfs);
      assert.equal(readFileSync(path.join(rootfs, 'file'), 'utf8'), 'layer\n');
      await assert.rejects(writeFile(path.join(rootfs, 'new'), 'x'), { code: 'EROFS' });
      await assert.rejects(writeFile(path.join(rootfs, 'file'), 'x'), { code: 'EROFS' });
      await unmountRootfs(helper, rootfs);
      assert.deepEqual(mountsUnder(rootfs), []);
    });

    test('an overlay of 60 layers whose lowerdir is longer than a page mounts, with every layer seen', async () => {
      // Long snapshot paths, as under a deep containerd root: the lowerdir option is ~6 KB.
      const { rootfs, snapshot } = bundle(`deep-${'d'.repeat(60)}`);
      const lowers: string[] = [];
      for (let id = 1; id <= 60; id++) {
        const s = snapshot(id);
        writeFileSync(path.join(s, 'fs', `layer-${id}`), `${id}\n`);
        lowers.unshift(`${s}/fs`);
      }
      const upper = snapshot(61);
      const lowerdir = `lowerdir=${lowers.join(':')}`;
      assert.ok(lowerdir.length > 4096, `the lowerdir option is ${lowerdir.length} bytes`);
      await mountRootfs(helper, [{ type: 'overlay', source: 'overlay', target: '', options: ['index=off', `workdir=${upper}/work`, `upperdir=${upper}/fs`, lowerdir] }], rootfs);
      assert.equal(readdirSync(rootfs).length, 60);
      assert.equal(readFileSync(path.join(rootfs, 'layer-1'), 'utf8'), '1\n');
      assert.equal(readFileSync(path.join(rootfs, 'layer-60'), 'utf8'), '60\n');
      await unmountRootfs(helper, rootfs);
      assert.deepEqual(mountsUnder(rootfs), []);
    });

    test('an overlay whose lowerdirs cannot be shortened enough fails naming the length and the limit', async () => {
      const { rootfs, snapshot } = bundle('too-long');
      const upper = snapshot(1);
      // No common parent but the scratch dir: 60 sibling dirs with long names of their own.
      const lowers = Array.from({ length: 60 }, (_, i) => {
        const dir = path.join(scratch, `too-long-${String(i).padStart(2, '0')}-${'x'.repeat(80)}`);
        mkdirSync(dir);
        return dir;
      });
      await assert.rejects(
        mountRootfs(helper, [{ type: 'overlay', source: 'overlay', target: '', options: [`workdir=${upper}/work`, `upperdir=${upper}/fs`, `lowerdir=${lowers.join(':')}`] }], rootfs),
        (err: unknown) => {
          assert.ok(isTsboxError(err, 'Internal'));
          assert.match(err.message, new RegExp(`: mount overlay on ${rootfs}: its data is \\d{4} bytes with the lowerdirs relative to ${scratch}, over the limit of 4095 \\(one page less its NUL\\)$`));
          return true;
        },
      );
      assert.deepEqual(mountsUnder(rootfs), []);
    });

    test('a failure in the second of two mounts leaves nothing mounted, and says which mount and why', async () => {
      const { rootfs, snapshot } = bundle('second-fails');
      const [lower, upper] = [snapshot(1), snapshot(2)];
      mkdirSync(path.join(lower, 'fs', 'data'));
      const missing = path.join(scratch, 'no-such-dir');
      const mounts: Mount[] = [
        { type: 'overlay', source: 'overlay', target: '', options: [`workdir=${upper}/work`, `upperdir=${upper}/fs`, `lowerdir=${lower}/fs`] },
        { type: 'bind', source: missing, target: 'data', options: ['rbind', 'ro'] },
      ];
      await assert.rejects(mountRootfs(helper, mounts, rootfs), (err: unknown) => {
        assert.ok(isTsboxError(err, 'Internal'));
        assert.equal(
          err.message,
          `cannot mount rootfs mount 2 of 2 (bind ${missing} at data) on ${rootfs}/data: mount type bind from ${missing} on ${rootfs}/data (flags 0x5001): No such file or directory (ENOENT)`,
        );
        return true;
      });
      assert.deepEqual(mountsUnder(rootfs), []);
    });

    test('a type tsbox does not mount is refused before anything is mounted', async () => {
      const { rootfs, snapshot } = bundle('bad-type');
      const layer = snapshot(1);
      const mounts: Mount[] = [
        { type: 'bind', source: `${layer}/fs`, target: '', options: ['rbind'] },
        { type: 'ext4', source: '/dev/mapper/thin-1', target: 'data', options: [] },
      ];
      await assert.rejects(mountRootfs(helper, mounts, rootfs), (err: unknown) => isTsboxError(err, 'InvalidArgument') && /type "ext4"/.test(err.message));
      assert.deepEqual(mountsUnder(rootfs), []);
    });

    test('nested and stacked mounts all come down; unmounting a rootfs with nothing mounted, or none at all, is fine', async () => {
      const { rootfs, snapshot } = bundle('nested');
      const layer = snapshot(1);
      mkdirSync(path.join(layer, 'fs', 'run'));
      await mountRootfs(
        helper,
        [
          { type: 'bind', source: `${layer}/fs`, target: '', options: ['rbind'] },
          { type: 'tmpfs', source: 'tmpfs', target: '/run', options: ['nosuid', 'size=1m'] },
        ],
        rootfs,
      );
      assert.deepEqual(mountsUnder(rootfs), [rootfs, `${rootfs}/run`]);
      // One more on top hides /run until it is gone: all come down, none is detached lazily.
      await mountRootfs(helper, [{ type: 'tmpfs', source: 'tmpfs', target: '', options: ['size=1m'] }], rootfs);
      assert.deepEqual(mountsUnder(rootfs), [rootfs, `${rootfs}/run`, rootfs]);
      assert.deepEqual(await unmountRootfs(helper, rootfs), { detached: [] });
      assert.deepEqual(mountsUnder(rootfs), []);
      assert.deepEqual(await unmountRootfs(helper, rootfs), { detached: [] });
      assert.deepEqual(await unmountRootfs(helper, path.join(scratch, 'never-made')), { detached: [] });
    });

    test('a rootfs still held open outside the task is detached lazily and named', async () => {
      const { rootfs, snapshot } = bundle('busy');
      const layer = snapshot(1);
      writeFileSync(path.join(layer, 'fs', 'held'), 'held\n');
      await mountRootfs(helper, [{ type: 'bind', source: `${layer}/fs`, target: '', options: ['rbind'] }], rootfs);
      const held = await open(path.join(rootfs, 'held'));
      try {
        assert.deepEqual(await unmountRootfs(helper, rootfs), { detached: [rootfs] });
        assert.deepEqual(mountsUnder(rootfs), []);
        assert.equal(await held.readFile('utf8'), 'held\n', 'what holds it keeps working');
      } finally {
        await held.close();
      }
    });

    test("the helper's own errors name the call, the type, the target and the errno", async () => {
      const { rootfs } = bundle('helper-errors');
      const run = promisify(execFile);
      const failure = async (args: string[]): Promise<string> => {
        const err =
          typeof helper === 'string'
            ? await run(helper, args).then(
                () => assert.fail(`tsbox-shim ${args.join(' ')} succeeded`),
                (e: unknown) => e as { code: number; stderr: string },
              )
            : await helper.run(args, { timeoutMs: 10_000 }).then((r) => ({ code: r.status, stderr: r.stderr }));
        assert.equal(err.code, 1);
        assert.equal(err.stderr.split('\n').length, 2, 'one line');
        return err.stderr.trim();
      };
      assert.equal(await failure(['mount', rootfs, 'nosuchfs', 'none']), `mount type nosuchfs from none on ${rootfs} (flags 0x0): No such device (ENODEV)`);
      assert.equal(await failure(['mount', path.join(scratch, 'nowhere'), 'tmpfs', 'tmpfs', 'nosuid']), `mount type tmpfs from tmpfs on ${scratch}/nowhere (flags 0x2): No such file or directory (ENOENT)`);
      assert.equal(await failure(['mount', 'rootfs', 'tmpfs', 'tmpfs']), 'mount tmpfs on rootfs: the target is not an absolute path');
      assert.equal(await failure(['umount-all', '/']), 'unmount everything at /: refused, it is /');
      assert.deepEqual(mountsUnder(rootfs), []);
    });
  });
}
