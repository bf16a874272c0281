// The container holder's records: the pid file it writes before answering (both pids with
// the start times that make them trustworthy after a restart), and the decision whether a
// container's other processes must be killed when its init ends (a pid namespace that is not
// its own, as the runc shim's ShouldKillAllOnExit). And how a waiter learns of the exit when
// inotify gives it no watch: from the holder's control socket alone (a stand-in holder here).
import assert from 'node:assert/strict';
import { type FSWatcher } from 'node:fs';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { type Server, type Socket, createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import { ContainerHolder, hasPoststartHooks, parseHolderRecord, sharesPidNamespace } from '../../src/runtime/container-holder.js';
import { processStartTime } from '../../src/runtime/proc.js';

describe('parseHolderRecord', () => {
  test('reads both pids and their start times', () => {
    assert.deepEqual(parseHolderRecord('5686 1524434 5696 1524438\n'), { holderPid: 5686, holderStart: '1524434', pid: 5696, pidStart: '1524438' });
    assert.deepEqual(parseHolderRecord('1 0 2 3'), { holderPid: 1, holderStart: '0', pid: 2, pidStart: '3' });
  });

  test('refuses a torn, empty or foreign file', () => {
    for (const text of ['', '5686 1524434 5696\n', '5686 1524434 5696 x\n', '0 1 2 3\n', '-1 1 2 3\n', '5686  1524434 5696 1524438\n', '1 2 3 4\n5\n']) {
      assert.equal(parseHolderRecord(text), undefined, JSON.stringify(text));
    }
  });
});

describe('hasPoststartHooks', () => {
  test('no hooks, or none run at start: the holder may start the container itself', () => {
    assert.equal(hasPoststartHooks({}), false);
    assert.equal(hasPoststartHooks({ hooks: {} }), false);
    assert.equal(hasPoststartHooks({ hooks: { poststart: [] } }), false);
    assert.equal(hasPoststartHooks({ hooks: { createRuntime: [{ path: '/bin/true' }], poststop: [{ path: '/bin/true' }] } }), false);
  });

  test('poststart hooks, or a config it cannot read: runc start it is', () => {
    assert.equal(hasPoststartHooks({ hooks: { poststart: [{ path: '/bin/true' }] } }), true);
    assert.equal(hasPoststartHooks({ hooks: { poststart: 'x' } }), true);
    assert.equal(hasPoststartHooks({ hooks: 'x' }), true);
    assert.equal(hasPoststartHooks(null), true);
  });
});

describe('sharesPidNamespace', () => {
  test('a pid namespace of its own: the kernel ends the rest with the init', () => {
    assert.equal(sharesPidNamespace({ linux: { namespaces: [{ type: 'mount' }, { type: 'pid' }] } }), false);
    assert.equal(sharesPidNamespace({ linux: { namespaces: [{ type: 'pid', path: '' }] } }), false);
  });

  test("a pod's shared namespace (joined by path) or the host's: the holder kills the rest", () => {
    assert.equal(sharesPidNamespace({ linux: { namespaces: [{ type: 'pid', path: '/proc/42/ns/pid' }] } }), true);
    assert.equal(sharesPidNamespace({ linux: { namespaces: [{ type: 'network' }] } }), true);
    assert.equal(sharesPidNamespace({ linux: {} }), true);
    assert.equal(sharesPidNamespace({}), true);
    assert.equal(sharesPidNamespace(null), true);
  });
});

/**
 * A stand-in for a holder: its control socket in a directory, this process as the holder's
 * pid; each `wait` connection is kept until the test ends it.
 */
async function fakeHolder(): Promise<{ dir: string; holder: ContainerHolder; waits: Socket[]; nextWait: () => Promise<Socket>; close: () => Promise<void> }> {
  const dir = await mkdtemp(join(tmpdir(), 'tsbox-holder-u-'));
  const waits: Socket[] = [];
  let waiting: ((s: Socket) => void) | undefined;
  const server: Server = createServer((socket) => {
    socket.setEncoding('utf8');
    socket.once('data', (line: string) => {
      assert.equal(line, 'wait\n');
      waits.push(socket);
      waiting?.(socket);
    });
  });
  await new Promise<void>((resolve) => server.listen(join(dir, 'ctl'), resolve));
  const start = await processStartTime(process.pid);
  assert.ok(start !== undefined);
  const holder = new ContainerHolder(dir, { holderPid: process.pid, holderStart: start, pid: process.pid, pidStart: start });
  return {
    dir,
    holder,
    waits,
    nextWait: () => new Promise((resolve) => (waiting = resolve)),
    close: async () => {
      for (const w of waits) w.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
      await rm(dir, { recursive: true, force: true });
    },
  };
}

const noWatches = (): FSWatcher => {
  throw Object.assign(new Error('ENOSPC: System limit for number of file watchers reached'), { code: 'ENOSPC' });
};

describe('waitExit without an inotify watch', () => {
  test('the exit is read when the holder ends its control connection, and the lost watch is reported', async () => {
    const h = await fakeHolder();
    try {
      const lost: Error[] = [];
      const first = h.nextWait();
      const exit = h.holder.waitExit(undefined, { watchDir: noWatches, onWatchLost: (err) => lost.push(err) });
      const conn = await first;
      await writeFile(join(h.dir, 'exit'), '3 1700000000 5\n');
      conn.destroy();
      assert.deepEqual(await exit, { status: 3, exitedAt: { seconds: 1700000000, nanos: 5 }, reason: 'exited with code 3' });
      assert.equal(lost.length, 1);
      assert.match(lost[0]?.message ?? '', /ENOSPC/);
    } finally {
      await h.close();
    }
  });

  test('a control connection that ends while the holder lives is made again; the exit is not reported as 255', async () => {
    const h = await fakeHolder();
    try {
      let settled = false;
      const first = h.nextWait();
      const exit = h.holder.waitExit(undefined, { watchDir: noWatches }).finally(() => (settled = true));
      const conn = await first;
      // The holder (this process) lives and has written no exit: the waiter asks again.
      const again = h.nextWait();
      conn.destroy();
      const second = await again;
      assert.equal(settled, false, 'the wait ended although the holder lives');
      await writeFile(join(h.dir, 'exit'), '137 1700000001 0\n');
      second.destroy();
      assert.equal((await exit).status, 137);
    } finally {
      await h.close();
    }
  });
});

describe("waitExit: the holder's OOM lines", () => {
  test('each "oom N" line is told, however the lines are cut; other lines are not', async () => {
    const h = await fakeHolder();
    try {
      const told: number[] = [];
      const first = h.nextWait();
      const exit = h.holder.waitExit(undefined, { watchDir: noWatches, onOom: (kills) => told.push(kills) });
      const conn = await first;
      for (const piece of ['oo', 'm 1\noom', ' 2\nsomething else\n', 'oom 3', '\n']) {
        await new Promise<void>((resolve) => conn.write(piece, () => resolve()));
      }
      await writeFile(join(h.dir, 'exit'), '0 1700000002 0\n');
      conn.end();
      assert.equal((await exit).status, 0);
      assert.deepEqual(told, [1, 2, 3]);
    } finally {
      await h.close();
    }
  });

  test('a peer that says more than a line is dropped; the wait goes on on a new connection', async () => {
    const h = await fakeHolder();
    try {
      const told: number[] = [];
      const first = h.nextWait();
      const exit = h.holder.waitExit(undefined, { watchDir: noWatches, onOom: (kills) => told.push(kills) });
      const conn = await first;
      const again = h.nextWait();
      conn.write('x'.repeat(8192));
      const second = await again;
      second.write('oom 4\n');
      await writeFile(join(h.dir, 'exit'), '1 1700000003 0\n');
      second.end();
      assert.equal((await exit).status, 1);
      assert.deepEqual(told, [4]);
    } finally {
      await h.close();
    }
  });
});
