/**
 * Hostile and broken peers on a pod's task socket as the pod's process owns it (native/relay.c
 * in native/tsbox-shim.c, relay mode), with a ttrpc server behind the relay as tsbox sits behind
 * it (test/support/ttrpc-test-server.ts --link), each in a process of its own: garbage,
 * oversized frames, floods from peers that never read, frames left half-sent, thousands of idle
 * connections. After each, a fresh client is answered within FRESH_CALL_MS (test/support/ttrpc-attack.ts) and the long-lived
 * client (containerd's connection, holding a call the whole time) at once; the relay's RSS
 * stays under RSS_BOUND_MIB and its descriptors come back to the baseline. A connection that
 * closes with calls held has them ended in the server behind the relay (the relay tells it:
 * ttrpc has no cancel). Then the server behind the relay is killed and started again: the held
 * call is neither failed nor lost, and the long-lived connection is served by the new one.
 */
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { TtrpcClient } from '../../src/ttrpc/client.js';
import { MAX_MESSAGE_BYTES } from '../../src/ttrpc/limits.js';
import { POD_CANCEL, POD_SERVICE } from '../../src/ttrpc/pod-link.js';
import { type ManagedProcess, makeTempDir, removeTree, spawnLogged, stopProcess, tailFile, waitFor } from '../support/processes.js';
import { fdCount } from '../support/resources.js';
import { type AttackTarget, freshEcho, underAttack } from '../support/ttrpc-attack.js';
import { MAX_CONNECTIONS, MAX_PENDING_BYTES, type PodProcess, cancelPayload, startPod } from '../support/pod-relay.js';
import { RawTtrpc, TEST_SERVICE, floodWithoutReading, frameHeader, requestFrame } from '../support/ttrpc-peer.js';
import { openMany } from '../support/raw-socket.js';

/** The relay's RSS bound during every attack; idle the pod's process is about 1 MiB. */
const CONNECT_BATCH = 250;
const MiB = 1024 * 1024;

const support = path.join(path.dirname(fileURLToPath(import.meta.url)), '..', 'support');

describe('hostile peers on a pod\'s relay', () => {
  let dir = '';
  let socketPath = '';
  let pod: PodProcess | undefined;
  let backend: ManagedProcess | undefined;
  let longLived: TtrpcClient | undefined;
  let held: Promise<unknown> | undefined;
  let heldSettled = false;
  let baselineFds = 0;

  const relayPid = (): number => {
    assert.ok(pod !== undefined && pod.supervisor.exitInfo() === undefined, `the pod's process is gone\n${tailFile(pod?.relayLog ?? '')}`);
    return pod.supervisor.pid;
  };

  const relayLog = (): string => tailFile(pod?.relayLog ?? '');

  /** Starts the server behind the relay and waits until it serves. */
  async function startBackend(n: number): Promise<ManagedProcess> {
    assert.ok(pod !== undefined);
    const logPath = path.join(dir, `backend-${n}.log`);
    const p = await spawnLogged(process.execPath, [path.join(support, 'ttrpc-test-server.js'), '--link', pod.link], { logPath });
    await waitFor(() => readFileSync(logPath, 'utf8').includes('ready'), { what: 'the server behind the relay is ready', timeoutMs: 10_000, describe: () => tailFile(logPath) });
    return p;
  }

  before(async () => {
    dir = await makeTempDir('tsbox-relay-h-');
    pod = await startPod(dir);
    socketPath = pod.taskSocket;
    backend = await startBackend(1);
    longLived = await TtrpcClient.connect(socketPath);
    held = longLived.call(TEST_SERVICE, 'Hold', Buffer.alloc(0)).finally(() => {
      heldSettled = true;
    });
    held.catch(() => /* checked by the tests */ undefined);
    assert.equal((await longLived.call(TEST_SERVICE, 'Echo', Buffer.from('up'))).toString(), 'up');
    baselineFds = fdCount(relayPid());
  });

  after(async () => {
    longLived?.close();
    if (backend !== undefined) await stopProcess(backend, { graceMs: 5000 });
    if (pod !== undefined) await pod.stop();
    await removeTree(dir);
  });

  const target: AttackTarget = { label: 'relay ', connectionBound: MAX_CONNECTIONS, now: () => ({ socketPath, pid: relayPid(), baselineFds, longLived, heldSettled }) };
  const probe = (): Promise<number> => freshEcho(socketPath);
  const attack = (name: string, run: () => Promise<void>): Promise<void> => underAttack(target, name, run);

  test('garbage and oversized frames: the connection is closed at once', () =>
    attack('garbage', async () => {
      const garbage = Buffer.alloc(64 * 1024);
      for (let i = 0; i < garbage.length; i++) garbage[i] = (i * 7919 + 13) & 0xff;
      const conns = await openMany(() => RawTtrpc.connect(socketPath, { keepResponses: false }), 50, () => garbage, CONNECT_BATCH);
      const big = await openMany(() => RawTtrpc.connect(socketPath, { keepResponses: false }), 20, (i) => Buffer.concat([frameHeader(MAX_MESSAGE_BYTES + 1, 2 * i + 1), Buffer.alloc(64 * 1024)]), CONNECT_BATCH);
      try {
        const closed = await Promise.all([...conns, ...big].map((c) => c.closedWithin(15_000)));
        assert.equal(closed.filter((c) => !c).length, 0, 'connections that broke the protocol stayed open');
        await probe();
      } finally {
        for (const conn of [...conns, ...big]) conn.destroy();
      }
    }));

  test('floods from peers that never read: requests relayed and answered, the flooder paused, others served', () =>
    attack('floods', async () => {
      await floodWithoutReading(socketPath, probe);
    }));

  test('1 000 connections each leaving half of a 1 MiB frame unsent', () =>
    attack('half-sent frames', async () => {
      const conns = await openMany(() => RawTtrpc.connect(socketPath, { keepResponses: false }), 1000, (i) => Buffer.concat([frameHeader(MiB, 2 * i + 1), Buffer.alloc(MiB / 2)]), CONNECT_BATCH);
      try {
        for (let n = 0; n < 3; n++) await probe();
      } finally {
        for (const conn of conns) conn.destroy();
      }
    }));

  test(`3 000 idle connections: at most ${MAX_CONNECTIONS} kept, containerd's connection never the one closed`, () =>
    attack('idle connections', async () => {
      const conns = await openMany(() => RawTtrpc.connect(socketPath, { keepResponses: false }), 3000, () => undefined, CONNECT_BATCH);
      try {
        for (let n = 0; n < 3; n++) await probe();
        const open = conns.filter((c) => !c.closed).length;
        assert.ok(open <= MAX_CONNECTIONS, `${open} idle connections open, more than the bound of ${MAX_CONNECTIONS}`);
      } finally {
        for (const conn of conns) conn.destroy();
      }
    }));

  test(`a client whose held calls fill the relay's ${MAX_PENDING_BYTES / MiB} MiB for calls: it is the one closed when containerd's connection calls, not containerd's`, () =>
    attack('kept bytes', async () => {
      // Held calls of nearly the largest message each, the last sized so that what the relay
      // keeps (the long-lived connection's held call, these, and a small Echo sent after them)
      // comes to 16 bytes short of its bound; once that Echo is answered, every one of these
      // is kept (frames are taken in order), and containerd's next call goes over the bound.
      const hold = (id: number, payloadBytes: number): Buffer => requestFrame(id, TEST_SERVICE, 'Hold', Buffer.alloc(payloadBytes));
      const overhead = hold(1, 0).length;
      const longLivedHold = overhead; // the long-lived connection's Hold, empty as these (the client adds a few bytes of its own: within the 16)
      const frames: Buffer[] = [];
      let kept = 0;
      const largest = MAX_MESSAGE_BYTES - 1024;
      const marker = (id: number): Buffer => requestFrame(id, TEST_SERVICE, 'Echo', Buffer.alloc(0));
      const budget = MAX_PENDING_BYTES - 16 - longLivedHold - marker(1).length;
      // Sized by their encoded length (a payload's length prefix grows with it).
      while (budget - kept > hold(1, largest).length) {
        const f = hold(2 * frames.length + 1, largest);
        frames.push(f);
        kept += f.length;
      }
      let last = hold(2 * frames.length + 1, budget - kept - overhead);
      // The length prefix of the last payload may take a byte or two more than the empty one's.
      for (let trim = 1; kept + last.length > budget; trim++) last = hold(2 * frames.length + 1, budget - kept - overhead - trim);
      frames.push(last);
      kept += last.length;
      assert.equal(kept, budget, 'the held calls come to the budget exactly');
      const markerId = 2 * frames.length + 1;
      const hostile = await RawTtrpc.connect(socketPath);
      try {
        for (const f of frames) await hostile.write(f);
        await hostile.write(marker(markerId));
        await waitFor(() => hostile.response(markerId), {
          what: 'the Echo sent after the held calls answered',
          timeoutMs: 20_000,
          describe: () => `client closed: ${String(hostile.closed)}\n${relayLog()}`,
        });
        assert.equal(hostile.closed, false, 'the client was closed while its calls fitted the bound');
        // containerd's connection calls: over the bound, and the client keeping the most goes.
        const call = Buffer.alloc(256, 'x');
        assert.deepEqual(await longLived?.call(TEST_SERVICE, 'Echo', call, { timeoutMs: 5000 }), call);
        assert.ok(await hostile.closedWithin(5000), 'the client keeping the most bytes of calls stayed open');
      } finally {
        hostile.destroy();
      }
      // Its calls are ended in the server behind the relay; the long-lived connection's stays.
      const left = await longLived?.call(TEST_SERVICE, 'HeldAtMost', Buffer.from('1'), { timeoutMs: 10_000 });
      assert.equal(left?.toString(), '1', 'only the long-lived connection\'s call is held');
    }));

  test('a connection closed with calls held: the server behind the relay ends them, the long-lived connection\'s stays', async () => {
    const client = await TtrpcClient.connect(socketPath);
    const calls = Array.from({ length: 20 }, () => client.call(TEST_SERVICE, 'Hold', Buffer.alloc(0)).then(
        () => 'answered',
        (err: unknown) => (err instanceof Error ? 'ended' : 'thrown a non-error'),
      ),
    );
    // All 20 and the long-lived connection's are held by the server.
    assert.equal((await client.call(TEST_SERVICE, 'Echo', Buffer.from('sent'))).toString(), 'sent');
    const heldNow = Number((await longLived?.call(TEST_SERVICE, 'HeldAtMost', Buffer.from('1000'), { timeoutMs: 5000 }))?.toString());
    assert.equal(heldNow, 21, 'the server holds the 20 calls and the long-lived connection\'s');
    client.close();
    // The client's own close ends its calls whatever the server does; what counts is below.
    await Promise.all(calls);
    // Answered only once the server has ended the 20: a server that kept them would never answer.
    const left = await longLived?.call(TEST_SERVICE, 'HeldAtMost', Buffer.from('1'), { timeoutMs: 10_000 });
    assert.equal(left?.toString(), '1', 'only the long-lived connection\'s call is held');
    assert.equal(heldSettled, false);
  });

  test('a client calling the relay\'s own cancel: closed by the relay, no call of another client ends', async () => {
    const ids = Array.from({ length: 5000 }, (_, i) => 2 * i + 1);
    const conn = await RawTtrpc.connect(socketPath, { keepResponses: false });
    try {
      await conn.write(requestFrame(1, POD_SERVICE, POD_CANCEL, cancelPayload(ids)));
      assert.ok(await conn.closedWithin(5000), 'the connection stayed open');
    } finally {
      conn.destroy();
    }
    const held = await longLived?.call(TEST_SERVICE, 'HeldAtMost', Buffer.from('1000'), { timeoutMs: 5000 });
    assert.equal(held?.toString(), '1', 'the long-lived connection\'s call is still held');
    assert.equal(heldSettled, false);
  });

  test('the server behind the relay killed and started again: the held call is kept, not failed, and calls go on', async () => {
    assert.ok(backend !== undefined);
    await stopProcess(backend, { graceMs: 0 });
    // Meanwhile containerd's connection asks again: the answer waits for the next server.
    const asked = longLived?.call(TEST_SERVICE, 'Echo', Buffer.from('across'), { timeoutMs: 30_000 });
    backend = await startBackend(2);
    assert.equal((await asked)?.toString(), 'across', 'a call made while no server was there is answered by the next');
    assert.equal(heldSettled, false, 'the held call is neither answered nor failed');
    await stopProcess(backend, { graceMs: 5000 });
    backend = await startBackend(3);
    // Answers reach a connection in the order the relay gets them: one from the server that
    // shut down would have come before this one.
    assert.equal((await longLived?.call(TEST_SERVICE, 'Echo', Buffer.from('third'), { timeoutMs: 5000 }))?.toString(), 'third');
    assert.equal(heldSettled, false, 'a server shutting down leaves the relay\'s calls to the next one');
  });
});
