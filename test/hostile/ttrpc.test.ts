/**
 * Hostile and broken peers on a ttrpc socket (src/ttrpc/server.ts), against a server in a
 * process of its own (test/support/ttrpc-test-server.ts): garbage, oversized frames, floods
 * from peers that never read, frames left half-sent, thousands of idle connections. After each,
 * the server must still answer a fresh client within FRESH_CALL_MS (test/support/ttrpc-attack.ts) and the long-lived client
 * (containerd's connection, holding a call the whole time) at once; its RSS must have stayed
 * under RSS_BOUND_MIB all along, and its descriptors must be back to the baseline once the
 * attacker is gone.
 */
import assert from 'node:assert/strict';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { GRPC_CODES } from '../../src/base/errors.js';
import { TtrpcClient, TtrpcError } from '../../src/ttrpc/client.js';
import { MAX_MESSAGE_BYTES } from '../../src/ttrpc/limits.js';
import { type ManagedProcess, makeTempDir, removeTree, spawnLogged, stopProcess, tailFile, waitForSocket } from '../support/processes.js';
import { fdCount } from '../support/resources.js';
import { type AttackTarget, freshEcho, underAttack } from '../support/ttrpc-attack.js';
import { RawTtrpc, TEST_SERVICE, floodWithoutReading, frameHeader, requestFrame } from '../support/ttrpc-peer.js';
import { openMany } from '../support/raw-socket.js';

/** The server's RSS bound during every attack; idle it is about 60 MiB. */
/** A fresh client's Echo is answered within this while an attack runs, and after it (the goal). */
/** The connection bound the server sets with this machine's descriptor limit (src/transport/limits.ts). */
const CONNECTION_BOUND = 256;
/** Connections an attacker opens at once. */
const CONNECT_BATCH = 250;
const MiB = 1024 * 1024;

const serverMain = path.join(path.dirname(fileURLToPath(import.meta.url)), '..', 'support', 'ttrpc-test-server.js');

/** Opens `count` raw ttrpc connections, CONNECT_BATCH at a time, each sent `first(i)` if any. */
function openTtrpc(socketPath: string, count: number, first: (i: number) => Buffer | undefined): Promise<RawTtrpc[]> {
  return openMany(() => RawTtrpc.connect(socketPath, { keepResponses: false }), count, first, CONNECT_BATCH);
}

describe('hostile peers on a ttrpc socket', () => {
  let dir = '';
  let socketPath = '';
  let logPath = '';
  let server: ManagedProcess | undefined;
  let longLived: TtrpcClient | undefined;
  let held: Promise<unknown> | undefined;
  let heldSettled = false;
  let baselineFds = 0;

  const pid = (): number => {
    assert.ok(server !== undefined && server.exitInfo() === undefined, `the server is gone\n${tailFile(logPath)}`);
    return server.pid;
  };

  before(async () => {
    dir = await makeTempDir('tsbox-ttrpc-h-');
    socketPath = path.join(dir, 'task.sock');
    logPath = path.join(dir, 'server.log');
    server = await spawnLogged(process.execPath, [serverMain, socketPath], { logPath });
    await waitForSocket(server, socketPath, { name: 'ttrpc test server', logTail: () => tailFile(logPath) });
    longLived = await TtrpcClient.connect(socketPath);
    // containerd's connection holds a Wait the whole time: Hold answers only at shutdown.
    held = longLived.call(TEST_SERVICE, 'Hold', Buffer.alloc(0)).finally(() => {
      heldSettled = true;
    });
    held.catch(() => /* checked after the attacks */ undefined);
    assert.equal((await longLived.call(TEST_SERVICE, 'Echo', Buffer.from('up'))).toString(), 'up');
    baselineFds = fdCount(pid());
  });

  after(async () => {
    longLived?.close();
    if (server !== undefined) await stopProcess(server, { graceMs: 5000 });
    await removeTree(dir);
  });

  const target: AttackTarget = { label: '', connectionBound: CONNECTION_BOUND, now: () => ({ socketPath, pid: pid(), baselineFds, longLived, heldSettled }) };
  const probe = (): Promise<number> => freshEcho(socketPath);
  const attack = (name: string, run: () => Promise<void>): Promise<void> => underAttack(target, name, run);

  test('garbage: each connection gets its error answers and is closed once its bogus frame cannot arrive', () =>
    attack('garbage', async () => {
      const garbage = Buffer.alloc(64 * 1024);
      for (let i = 0; i < garbage.length; i++) garbage[i] = (i * 7919 + 13) & 0xff;
      const conns = await openTtrpc(socketPath, 50, () => garbage);
      try {
        // Closed by the frame-arrival deadline (10 s) at the latest.
        const closed = await Promise.all(conns.map((c) => c.closedWithin(15_000)));
        assert.equal(closed.filter((c) => !c).length, 0, 'connections that sent garbage stayed open');
        await probe();
      } finally {
        for (const conn of conns) conn.destroy();
      }
    }));

  test('oversized frames: RESOURCE_EXHAUSTED on their stream without their bytes being kept, and the connection serves on', () =>
    attack('oversized', async () => {
      const conn = await RawTtrpc.connect(socketPath);
      try {
        const length = MAX_MESSAGE_BYTES + 1;
        await conn.write(frameHeader(length, 1));
        assert.ok(await conn.until(() => conn.response(1) !== undefined, 5000), 'no answer to an oversized frame');
        assert.equal(conn.response(1)?.code, GRPC_CODES.ResourceExhausted);
        // Its payload goes by unkept; then the connection takes requests again.
        const junk = Buffer.alloc(MiB, 0x61);
        for (let sent = 0; sent < length; sent += junk.length) await conn.write(junk.subarray(0, Math.min(junk.length, length - sent)));
        await conn.write(requestFrame(3, TEST_SERVICE, 'Echo', Buffer.from('after')));
        assert.ok(await conn.until(() => conn.response(3) !== undefined, 5000), 'no answer after the oversized frame');
        assert.equal(conn.response(3)?.payload.toString(), 'after');
        // 64 connections announcing 4 GiB each and sending 256 KiB of it.
        const big = await openTtrpc(socketPath, 64, (i) => Buffer.concat([frameHeader(0xffffffff, 2 * i + 1), Buffer.alloc(256 * 1024)]));
        await probe();
        for (const c of big) c.destroy();
      } finally {
        conn.destroy();
      }
    }));

  test('floods from peers that never read: requests, even stream ids, unknown frame types', () =>
    attack('floods', async () => {
      await floodWithoutReading(socketPath, probe);
    }));

  test('1 000 connections each leaving half of a 1 MiB frame unsent', () =>
    attack('half-sent frames', async () => {
      const conns = await openTtrpc(socketPath, 1000, (i) => Buffer.concat([frameHeader(MiB, 2 * i + 1), Buffer.alloc(MiB / 2)]));
      try {
        for (let n = 0; n < 3; n++) await probe();
        const open = conns.filter((c) => !c.closed).length;
        assert.ok(open <= CONNECTION_BOUND, `${open} connections holding half a frame are open, more than the bound of ${CONNECTION_BOUND}`);
      } finally {
        for (const conn of conns) conn.destroy();
      }
    }));

  test('3 000 idle connections', () =>
    attack('idle connections', async () => {
      const conns = await openTtrpc(socketPath, 3000, () => undefined);
      try {
        for (let n = 0; n < 3; n++) await probe();
        const open = conns.filter((c) => !c.closed).length;
        assert.ok(open <= CONNECTION_BOUND, `${open} idle connections open, more than the bound of ${CONNECTION_BOUND}`);
      } finally {
        for (const conn of conns) conn.destroy();
      }
    }));

  test("at shutdown the long-lived connection's pending call is answered UNAVAILABLE", async () => {
    assert.ok(server !== undefined && held !== undefined);
    const ended = held.then(
      () => assert.fail('the held call succeeded'),
      (err: unknown) => err,
    );
    await stopProcess(server, { graceMs: 5000 });
    const err = await ended;
    assert.ok(err instanceof TtrpcError && err.code === GRPC_CODES.Unavailable, String(err));
  });
});
