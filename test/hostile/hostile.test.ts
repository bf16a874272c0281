/**
 * Hostile and broken peers on the socket: the classic HTTP/2 attacks and the ones found
 * against tsbox, each bounded in count and time, against the real daemon (`--backend noop`,
 * so no sandbox process gets in the way). After each case the daemon must still answer
 * Status at once, on the connection it had (as containerd's) and on a new one; its RSS must
 * have stayed under RSS_BOUND_MIB during the attack (sampled all along); and its descriptor
 * count must be back to what it was before, once the attacker is gone.
 */
import assert from 'node:assert/strict';
import http2 from 'node:http2';
import net from 'node:net';
import { after, before, describe, test } from 'node:test';
import { Client, credentials, Metadata, status as GrpcStatus, type ServiceError } from '@grpc/grpc-js';
import { ControllerStatusRequest } from '../../src/gen/containerd/services/sandbox/v1/sandbox.js';
import { SandboxClient, expectCode } from '../support/grpc-client.js';
import {
  CONTROLLER,
  Flag,
  FrameType,
  PREFACE,
  RawConnection,
  Setting,
  frame,
  grpcMessage,
  hpackIndexed,
  hpackLiteral,
  indexedRequestBlock,
  pingFrame,
  requestBlock,
  rstStreamFrame,
  type ServerFrame,
  settingsFrame,
  windowUpdateFrame,
} from '../support/h2-frames.js';
import { openMany } from '../support/raw-socket.js';
import { noopTsbox } from '../support/noop-daemon.js';
import { fdCount, rssMiB, sampler } from '../support/resources.js';
import { type StatusProber, startStatusProber } from '../support/status-prober.js';
import { type SandboxerDaemon, startSandboxerDaemon, waitFor } from '../support/tsbox-daemon.js';

/**
 * The daemon's RSS must stay under this during every attack. Idle it is about 70 MiB; V8
 * keeps the heap an attack made it grow, so the high-water mark climbs over the tier (to
 * about 340 MiB here); without the bounds, single cases held gigabytes.
 */
const RSS_BOUND_MIB = 448;
const NS = 'hostile';
const ID = 'probe';
const MiB = 1024 * 1024;
/** The bound the daemon sets on connections (src/transport/limits.ts, with this machine's fd limit). */
const CONNECTION_BOUND = 256;
/** Connections each attack on the connection table holds, far beyond the bound. */
const HELD_CONNECTIONS = 2000;
/** Connections an attacker opens at once (the listen backlog is 511). */
const CONNECT_BATCH = 250;
/** Short connections one attack opens and drops, and how many of them are in flight at once. */
const SHORT_CONNECTIONS = 20_000;
const SHORT_IN_FLIGHT = 400;
/** A Status on a fresh connection is answered within this while an attack runs (issue's goal). */
const FRESH_STATUS_MS = 1000;
/** Descriptors are back to the baseline within this after the attacker leaves. */
const RELEASE_MS = 5000;

const delay = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

/** Writes `count` copies of what `make(i)` builds, in batches, until done, closed or `ms` passed. */
async function flood(conn: RawConnection, count: number, make: (i: number) => Buffer, ms = 10_000): Promise<number> {
  const stopAt = Date.now() + ms;
  let i = 0;
  while (i < count && !conn.closed && Date.now() < stopAt) {
    const batch: Buffer[] = [];
    for (const end = Math.min(count, i + 2000); i < end; i++) batch.push(make(i));
    await conn.write(Buffer.concat(batch), stopAt - Date.now());
  }
  return i;
}

/** A connection that has sent its preface and SETTINGS (and opened its receive windows). */
async function handshake(path: string, options: { keepFrames?: boolean } = {}): Promise<RawConnection> {
  const conn = await RawConnection.connect(path, options);
  await conn.write(
    Buffer.concat([
      PREFACE,
      settingsFrame([[Setting.INITIAL_WINDOW_SIZE, 2 ** 31 - 1]]),
      frame(FrameType.SETTINGS, Flag.ACK, 0),
      windowUpdateFrame(0, 2 ** 31 - 1 - 65_535),
    ]),
  );
  return conn;
}

const statusBody = grpcMessage(ControllerStatusRequest.encode(ControllerStatusRequest.fromPartial({ sandboxId: ID })).finish());

describe('hostile peers on the socket', () => {
  let daemon: SandboxerDaemon | undefined;
  let client: SandboxClient | undefined;
  let prober: StatusProber | undefined;
  let baselineFds = 0;

  const d = (): SandboxerDaemon => {
    assert.ok(daemon !== undefined, 'daemon not started');
    return daemon;
  };
  const pid = (): number => {
    const p = d().pid;
    assert.ok(p !== undefined, `the daemon is gone\n${d().logTail()}`);
    return p;
  };

  before(async () => {
    daemon = await startSandboxerDaemon(noopTsbox);
    client = new SandboxClient(daemon.socketPath, NS);
    await client.create({ sandboxId: ID });
    await client.start({ sandboxId: ID });
    assert.equal((await client.status({ sandboxId: ID })).state, 'SANDBOX_READY');
    prober = await startStatusProber(daemon.socketPath, NS, ID, FRESH_STATUS_MS);
    baselineFds = fdCount(pid());
  });

  after(async () => {
    await prober?.close();
    client?.close();
    await daemon?.teardown();
  });

  /**
   * The call's answer; when it fails, the failure says whether the daemon is gone (it may have
   * died a moment before its exit is seen here) and ends with the daemon's log.
   */
  async function servedOrWhyNot<T>(name: string, call: () => Promise<T> | undefined): Promise<T | undefined> {
    try {
      return await call();
    } catch (err) {
      const exit = await Promise.race([d().exited(), delay(2000).then(() => undefined)]);
      const how = exit === undefined ? 'the daemon still runs' : `the daemon exited (code ${exit.code}, signal ${exit.signal})`;
      throw new Error(`${name}: a Status after the attack failed (${err instanceof Error ? err.message : String(err)}); ${how}\n${d().logTail(80)}`, { cause: err });
    }
  }

  /** Runs one attack with the sampler on, then checks the daemon is as it was. */
  async function attack(name: string, run: (socketPath: string) => Promise<void>): Promise<void> {
    const p = pid();
    const samples = sampler(p);
    let maxRss = 0;
    try {
      await run(d().socketPath);
    } finally {
      // The sampler stops whatever happened; a failure of the attack itself is the one reported.
      const stopped = samples.stop();
      maxRss = stopped.maxRss;
      process.stdout.write(`# ${name}: max RSS ${maxRss.toFixed(0)} MiB, max descriptors ${stopped.maxFds} (baseline ${baselineFds})\n`);
    }
    assert.ok(maxRss < RSS_BOUND_MIB, `${name}: RSS reached ${maxRss.toFixed(0)} MiB (bound ${RSS_BOUND_MIB} MiB)`);
    assert.equal(d().pid, p, `${name}: the daemon died\n${d().logTail()}`);
    // The connection the daemon already had (containerd's) is served at once.
    assert.equal((await servedOrWhyNot(name, () => client?.status({ sandboxId: ID }, { timeoutMs: 5000 })))?.state, 'SANDBOX_READY');
    // Every connection of the attacker is gone within keepalive time plus timeout (20 s),
    // even one that node ended with a GOAWAY and no longer reads (src/transport/limits.ts).
    await waitFor(() => fdCount(p) <= baselineFds, {
      what: `${name}: the daemon's descriptors back to ${baselineFds} (now ${fdCount(p)})`,
      timeoutMs: 30_000,
      intervalMs: 100,
    });
    const fresh = new SandboxClient(d().socketPath, NS, { ownConnection: true });
    try {
      assert.equal((await servedOrWhyNot(name, () => fresh.status({ sandboxId: ID }, { timeoutMs: 5000 })))?.state, 'SANDBOX_READY');
    } finally {
      fresh.close();
    }
  }

  test('the server advertises its stream, header-list and frame limits', async () => {
    const conn = await handshake(d().socketPath);
    try {
      assert.ok(await conn.until(() => conn.frames.some((f) => f.type === FrameType.SETTINGS), 5000), 'no SETTINGS from the server');
      const settings = conn.serverSettings();
      assert.equal(settings.get(Setting.MAX_CONCURRENT_STREAMS), 8192);
      assert.equal(settings.get(Setting.MAX_HEADER_LIST_SIZE), 8192);
    } finally {
      conn.destroy();
    }
  });

  test('HEADERS without END_HEADERS, then a flood of empty CONTINUATION frames', () =>
    attack('continuation flood', async (path) => {
      const conn = await handshake(path, { keepFrames: false });
      const headers = frame(FrameType.HEADERS, 0, 1, requestBlock(`${CONTROLLER}/Status`, NS));
      await conn.write(headers);
      const empty = frame(FrameType.CONTINUATION, 0, 1);
      await flood(conn, 2_000_000, () => empty, 10_000);
      assert.ok(await conn.closedWithin(10_000), 'the server kept a header block open through 2 million CONTINUATION frames');
      conn.destroy();
    }));

  test('thousands of streams held open with large HPACK-compressed header blocks', () =>
    attack('large header blocks', async (path) => {
      const conns: RawConnection[] = [];
      try {
        // Four connections of 3 000 streams each: more than all of them together may hold. Each
        // block decodes to about 7.5 KiB from 16 bytes on the wire.
        for (let c = 0; c < 4; c++) {
          const conn = await handshake(path, { keepFrames: false });
          conns.push(conn);
          const big = 'x'.repeat(3500);
          const first = Buffer.concat([requestBlock(`${CONTROLLER}/Status`, NS, true), hpackLiteral('x-big', big, true)]);
          // After the big entry (62), the request fields are 63..67.
          const again = Buffer.concat([hpackIndexed(3), hpackIndexed(6), ...[67, 66, 65, 64, 63].map(hpackIndexed), hpackIndexed(62), hpackIndexed(62)]);
          await conn.write(frame(FrameType.HEADERS, Flag.END_HEADERS, 1, first));
          await flood(conn, 3000, (i) => frame(FrameType.HEADERS, Flag.END_HEADERS, 3 + 2 * i, again), 10_000);
        }
        await delay(1000);
      } finally {
        for (const conn of conns) conn.destroy();
      }
    }));

  test('many streams each sending a 16 MiB body they never end', () =>
    attack('unended bodies', async (path) => {
      const body = Buffer.alloc(16 * MiB - 64, 0x61);
      const prefix = Buffer.alloc(5);
      prefix.writeUInt32BE(16 * MiB - 64, 1);
      let shed = 0;
      for (let round = 0; round < 3; round++) {
        const session = http2.connect(`http://localhost`, { createConnection: () => net.connect(path) });
        session.on('error', () => undefined);
        const closed = new Promise<void>((resolve) => session.once('close', resolve));
        for (let i = 0; i < 32; i++) {
          const stream = session.request(
            { ':method': 'POST', ':path': `${CONTROLLER}/Create`, 'content-type': 'application/grpc', te: 'trailers', 'containerd-namespace': NS },
            { endStream: false },
          );
          stream.on('error', () => undefined);
          stream.write(prefix);
          stream.write(body);
        }
        const wasShed = await Promise.race([closed.then(() => true), delay(15_000).then(() => false)]);
        if (wasShed) shed++;
        session.destroy();
      }
      assert.equal(shed, 3, 'the server should close a connection holding 32 unended 16 MiB requests');
    }));

  test('a client that sends bad requests and never reads the answers', () =>
    attack('never reads', async (path) => {
      const conn = await handshake(path, { keepFrames: false });
      conn.pause();
      await conn.write(frame(FrameType.HEADERS, Flag.END_HEADERS | Flag.END_STREAM, 1, requestBlock('/no.such/Method', NS, true)));
      const block = indexedRequestBlock();
      const sent = await flood(conn, 400_000, (i) => frame(FrameType.HEADERS, Flag.END_HEADERS | Flag.END_STREAM, 3 + 2 * i, block), 15_000);
      // The server stops taking requests whose answers it cannot send: it closes the connection,
      // or it stops reading it, so the flood stalls short of its count with bytes left unsent.
      const pushedBack = conn.closed || (sent < 400_000 && conn.socket.writableLength > 0);
      conn.destroy();
      assert.ok(pushedBack, `the server read all ${sent} requests of a peer that never read an answer`);
    }));

  test('1 500 connections, each dribbling a partial 1 MiB frame', () =>
    attack('dribbled frames', async (path) => {
      const conns: RawConnection[] = [];
      try {
        for (let i = 0; i < 1500; i++) {
          try {
            const conn = await handshake(path, { keepFrames: false });
            conns.push(conn);
            await conn.write(frame(FrameType.DATA, 0, 1, Buffer.alloc(0), 1024 * 1024).subarray(0, 9));
          } catch {
            // Refused at connect: the bound below counts the ones that stayed open.
          }
        }
        for (let round = 0; round < 10; round++) {
          for (const conn of conns) void conn.write(Buffer.from([0]));
          await delay(100);
        }
        const open = conns.filter((c) => !c.closed).length;
        assert.ok(open <= CONNECTION_BOUND, `${open} dribbling connections still open, more than the bound of ${CONNECTION_BOUND}`);
      } finally {
        for (const conn of conns) conn.destroy();
      }
    }));

  test('RST_STREAM flood and rapid reset', () =>
    attack('rapid reset', async (path) => {
      const conn = await handshake(path, { keepFrames: true });
      await conn.write(frame(FrameType.HEADERS, Flag.END_HEADERS, 1, requestBlock(`${CONTROLLER}/Status`, NS, true)));
      await conn.write(rstStreamFrame(1));
      const block = indexedRequestBlock();
      await flood(conn, 200_000, (i) => Buffer.concat([frame(FrameType.HEADERS, Flag.END_HEADERS, 3 + 2 * i, block), rstStreamFrame(3 + 2 * i)]), 15_000);
      assert.ok(await conn.closedWithin(10_000), 'the server kept serving a connection that reset 200 000 streams');
      conn.destroy();
      // RST_STREAM for streams that were never opened.
      const idle = await handshake(path, { keepFrames: false });
      await flood(idle, 100_000, (i) => rstStreamFrame(1001 + 2 * i), 5000);
      assert.ok(await idle.closedWithin(10_000), 'RST_STREAM on idle streams is a connection error');
      idle.destroy();
    }));

  test('requests reset in the write that brings their headers: an unknown method, a wrong content-type, a known method', () =>
    attack('reset with their headers', async (path) => {
      // node announces a stream a tick after it read its headers, so each of these streams is
      // gone by the time the server sees it. Answering a gone stream throws in node: once, an
      // unknown method in such a write ended the daemon.
      const kinds = [
        requestBlock('/no.such/Method', NS),
        requestBlock(`${CONTROLLER}/Status`, NS, false, 'text/plain'),
        requestBlock(`${CONTROLLER}/Status`, NS),
      ];
      for (const block of kinds) {
        const conn = await handshake(path, { keepFrames: true });
        // One write each: node reads a write at a time, and one read holding a request and its
        // reset is the case (a read holding many of them, node sorts out before announcing).
        for (let i = 0; i < 50; i++) await conn.write(Buffer.concat([frame(FrameType.HEADERS, Flag.END_HEADERS | Flag.END_STREAM, 1 + 2 * i, block), rstStreamFrame(1 + 2 * i)]));
        const mark = Buffer.from('resetend');
        await conn.write(pingFrame(mark));
        // The PING's answer comes once the server has read everything before it.
        const answered = await conn.until(() => conn.frames.some((f) => f.type === FrameType.PING && f.payload.equals(mark)), 5000);
        conn.destroy();
        assert.ok(answered, `the server did not answer a PING sent after the reset requests\n${d().logTail()}`);
      }
    }));

  test('PING and SETTINGS floods from a peer that does not read', () =>
    attack('ping and settings floods', async (path) => {
      for (const make of [() => pingFrame(), () => settingsFrame([[Setting.HEADER_TABLE_SIZE, 4096]])]) {
        const conn = await handshake(path, { keepFrames: false });
        conn.pause();
        await flood(conn, 1_000_000, make, 10_000);
        assert.ok(await conn.closedWithin(10_000), 'the server answered a flood from a peer that does not read');
        conn.destroy();
      }
    }));

  test('200 000 streams, one after the other, over 20 connections', () =>
    attack('200 000 streams', async (path) => {
      let answered = 0;
      for (let c = 0; c < 20; c++) {
        const conn = await handshake(path, { keepFrames: false });
        try {
          await conn.write(
            Buffer.concat([frame(FrameType.HEADERS, Flag.END_HEADERS, 1, requestBlock(`${CONTROLLER}/Status`, NS, true)), frame(FrameType.DATA, Flag.END_STREAM, 1, statusBody)]),
          );
          const block = indexedRequestBlock();
          for (let batch = 0; batch < 10; batch++) {
            const frames: Buffer[] = [];
            for (let i = 0; i < 1000; i++) {
              const id = 3 + 2 * (batch * 1000 + i);
              frames.push(frame(FrameType.HEADERS, Flag.END_HEADERS, id, block), frame(FrameType.DATA, Flag.END_STREAM, id, statusBody));
            }
            await conn.write(Buffer.concat(frames));
            const want = 1 + (batch + 1) * 1000;
            assert.ok(await conn.until(() => conn.endedStreams >= want, 20_000), `connection ${c}: ${conn.endedStreams} of ${want} answers`);
          }
          answered += conn.endedStreams - 1;
        } finally {
          conn.destroy();
        }
      }
      assert.equal(answered, 200_000);
    }));

  test('thousands of idle and slow connections', () =>
    attack('idle and slow connections', async (path) => {
      const conns: RawConnection[] = [];
      const samples = sampler(pid());
      let maxFds = 0;
      try {
        for (let i = 0; i < 3000; i++) {
          try {
            conns.push(await RawConnection.connect(path, { keepFrames: false }));
          } catch {
            // Refused at connect.
          }
        }
        // Half of them send their preface a byte at a time.
        for (let at = 0; at < 8; at++) {
          conns.forEach((conn, i) => {
            if (i % 2 === 0) void conn.write(PREFACE.subarray(at, at + 1));
          });
          await delay(150);
        }
        // containerd's connection is still served while they hold on.
        assert.equal((await client?.status({ sandboxId: ID }, { timeoutMs: 5000 }))?.state, 'SANDBOX_READY');
        const open = conns.filter((c) => !c.closed).length;
        assert.ok(open <= CONNECTION_BOUND, `${open} connections open, more than the bound of ${CONNECTION_BOUND}`);
      } finally {
        for (const conn of conns) conn.destroy();
        maxFds = samples.stop().maxFds;
      }
      assert.ok(maxFds <= baselineFds + CONNECTION_BOUND + 8, `the daemon held ${maxFds} descriptors (baseline ${baselineFds})`);
    }));

  test('oversized frames and messages', () =>
    attack('oversized', async (path) => {
      // A frame longer than the 16 KiB max frame size the server allows.
      const conn = await handshake(path, { keepFrames: true });
      await conn.write(frame(FrameType.HEADERS, Flag.END_HEADERS, 1, requestBlock(`${CONTROLLER}/Status`, NS)));
      await conn.write(frame(FrameType.DATA, 0, 1, Buffer.alloc(20_000)));
      // node sends GOAWAY, then no longer reads the connection; keepalive closes it later.
      assert.ok(await conn.until(() => conn.goawayCode() !== undefined, 5000), 'a 20 000-byte frame should end the connection');
      assert.equal(conn.goawayCode(), 6 /* FRAME_SIZE_ERROR */);
      conn.destroy();
      // A message over 16 MiB: RESOURCE_EXHAUSTED, and the channel serves the next call.
      const raw = new Client(`unix:${path}`, credentials.createInsecure(), { 'grpc.max_send_message_length': 64 * MiB });
      try {
        const metadata = new Metadata();
        metadata.set('containerd-namespace', NS);
        const call = (request: Buffer): Promise<unknown> =>
          new Promise((resolve, reject) => {
            raw.makeUnaryRequest(
              `${CONTROLLER}/Status`,
              (b: Buffer) => b,
              (b: Buffer) => b,
              request,
              metadata,
              { deadline: Date.now() + 10_000 },
              (err: ServiceError | null, value?: Buffer) => (err === null ? resolve(value) : reject(err)),
            );
          });
        await expectCode(call(Buffer.alloc(17 * MiB)), GrpcStatus.RESOURCE_EXHAUSTED);
        // A request that does not decode is INVALID_ARGUMENT (SPEC.md section 4), not INTERNAL.
        await expectCode(call(Buffer.from([0x0a, 0xff])), GrpcStatus.INVALID_ARGUMENT, 'malformed Status request');
      } finally {
        raw.close();
      }
    }));

  test('garbage before and after the connection preface', () =>
    attack('garbage', async (path) => {
      const garbage = Buffer.alloc(64 * 1024);
      for (let i = 0; i < garbage.length; i++) garbage[i] = (i * 7919) & 0xff;
      const cases: Buffer[] = [
        garbage,
        Buffer.from('GET / HTTP/1.1\r\nHost: x\r\n\r\n'),
        Buffer.concat([PREFACE, garbage]),
        Buffer.concat([PREFACE, settingsFrame(), frame(0xee, 0, 0, Buffer.alloc(10)), garbage]),
      ];
      for (const bytes of cases) {
        for (let n = 0; n < 50; n++) {
          const conn = await RawConnection.connect(path, { keepFrames: true });
          await conn.write(bytes);
          // Closed at once, or ended with a GOAWAY (and closed by keepalive later).
          assert.ok(await conn.until(() => conn.closed || conn.goawayCode() !== undefined, 5000), 'the server kept serving a connection that sent garbage');
          conn.destroy();
        }
      }
    }));

  // ---------------------------------------------------------------------------------------
  // Connections that take a slot and never become a client: containerd must still get in.

  /** Opens `count` raw connections, at most `inFlight` at a time, each then sent `first(i)`. */
  function openRaw(path: string, count: number, first: (i: number) => Buffer | undefined, inFlight = CONNECT_BATCH): Promise<RawConnection[]> {
    return openMany(() => RawConnection.connect(path, { keepFrames: false }), count, first, inFlight);
  }

  /**
   * Runs an attack on the connection table while a long-lived client (containerd's
   * connection) holds a Wait. `run` may call `probe` whenever the attack is in place: a Status
   * on a fresh connection, made from a process of its own as containerd makes it (the
   * prober), which must be answered within FRESH_STATUS_MS. When `run` returns
   * the attacker has left: the daemon's descriptors must be back to the baseline within
   * RELEASE_MS, its RSS bounded all along, and the Wait still pending on the connection it was
   * sent on, answered when the sandbox stops.
   */
  async function connectionAttack(name: string, run: (path: string, probe: () => Promise<void>) => Promise<void>): Promise<void> {
    const p = pid();
    const watcher = client as SandboxClient;
    const waitId = `wait-${name.replace(/[^a-z0-9]+/g, '-')}`;
    await watcher.create({ sandboxId: waitId });
    await watcher.start({ sandboxId: waitId });
    const waited = watcher.wait({ sandboxId: waitId }).then(
      (response) => ({ response, error: undefined }),
      (error: unknown) => ({ response: undefined, error }),
    );
    // Calls go out in order on one connection: once this is answered, the Wait is in flight.
    assert.equal((await watcher.status({ sandboxId: waitId }, { timeoutMs: 5000 })).state, 'SANDBOX_READY');

    const probes: string[] = [];
    let probed = 0;
    let slowestMs = 0;
    const probe = async (): Promise<void> => {
      probed++;
      const { ms, state, error } = await (prober as StatusProber).probe();
      slowestMs = Math.max(slowestMs, ms);
      if (error !== undefined) probes.push(`${error} after ${ms.toFixed(0)} ms`);
      else if (state !== 'SANDBOX_READY') probes.push(`state ${state}`);
    };

    const samples = sampler(p);
    let left = 0;
    let releaseMs = Number.NaN;
    let fdsAfter = 0;
    let stopped = { maxRss: 0, maxFds: 0 };
    try {
      await run(d().socketPath, probe);
      left = performance.now();
      try {
        await waitFor(() => fdCount(p) <= baselineFds, { what: 'descriptors back to the baseline', timeoutMs: RELEASE_MS, intervalMs: 20 });
        releaseMs = performance.now() - left;
      } catch {
        // Reported below with the count it stayed at.
      }
      fdsAfter = fdCount(p);
    } finally {
      stopped = samples.stop();
      process.stdout.write(
        `# ${name}: fresh Status slowest ${slowestMs.toFixed(0)} ms, failed ${probes.length} of ${probed}${probes.length > 0 ? ` (${probes[0]})` : ''}; ` +
          `descriptors ${fdsAfter} (baseline ${baselineFds}) ${Number.isNaN(releaseMs) ? `not back within ${RELEASE_MS} ms` : `back in ${releaseMs.toFixed(0)} ms`}; ` +
          `RSS ${rssMiB(p).toFixed(0)} MiB (max ${stopped.maxRss.toFixed(0)}), max descriptors ${stopped.maxFds}\n`,
      );
    }
    assert.equal(d().pid, p, `${name}: the daemon died\n${d().logTail()}`);
    assert.deepEqual(probes, [], `${name}: a Status on a fresh connection was not answered within ${FRESH_STATUS_MS} ms`);
    assert.ok(slowestMs < FRESH_STATUS_MS, `${name}: a fresh Status took ${slowestMs.toFixed(0)} ms`);
    assert.ok(!Number.isNaN(releaseMs), `${name}: ${fdsAfter} descriptors ${RELEASE_MS} ms after the attacker left (baseline ${baselineFds})`);
    assert.ok(stopped.maxRss < RSS_BOUND_MIB, `${name}: RSS reached ${stopped.maxRss.toFixed(0)} MiB (bound ${RSS_BOUND_MIB} MiB)`);
    // The Wait rode out the attack on its connection: stopping the sandbox answers it.
    await watcher.stop({ sandboxId: waitId, timeoutSecs: 0 }, { timeoutMs: 5000 });
    const { response, error } = await waited;
    assert.equal(error, undefined, `${name}: the Wait on the long-lived connection failed: ${String(error)}`);
    assert.equal(response?.exitStatus, noopTsbox.stopExitStatus);
    await watcher.shutdown({ sandboxId: waitId }, { timeoutMs: 5000 });
  }

  /** Holds connections made by `first` while a fresh Status is tried, then drops them all. */
  const holdAndProbe =
    (first: (i: number) => Buffer | undefined) =>
    async (path: string, probe: () => Promise<void>): Promise<void> => {
      const conns = await openRaw(path, HELD_CONNECTIONS, first);
      try {
        for (let n = 0; n < 3; n++) await probe();
      } finally {
        for (const conn of conns) conn.destroy();
      }
    };

  const HANDSHAKE = Buffer.concat([PREFACE, settingsFrame(), frame(FrameType.SETTINGS, Flag.ACK, 0)]);
  /**
   * A Status request's headers, then the first half of a 16 KiB DATA frame (the largest the
   * server allows) carrying the start of a 16 KiB message: a request that never arrives whole.
   */
  const HALF_A_LARGE_FRAME = Buffer.concat([
    frame(FrameType.HEADERS, Flag.END_HEADERS, 1, requestBlock(`${CONTROLLER}/Status`, NS)),
    frame(FrameType.DATA, 0, 1, grpcMessage(Buffer.alloc(8192 - 5), 16_384 - 5), 16_384),
  ]);

  test('2 000 connections idle after the HTTP/2 handshake', () => connectionAttack('idle after handshake', holdAndProbe(() => HANDSHAKE)));

  test('2 000 connections that send nothing', () => connectionAttack('silent', holdAndProbe(() => undefined)));

  test('2 000 connections that send half the preface', () => connectionAttack('half preface', holdAndProbe(() => PREFACE.subarray(0, 12))));

  test('2 000 connections that send half a large frame', () =>
    connectionAttack('half a large frame', holdAndProbe(() => Buffer.concat([HANDSHAKE, HALF_A_LARGE_FRAME]))));

  test('2 000 connections that announce a DATA frame longer than what follows, then close', () =>
    connectionAttack('short DATA frame, closed', async (path, probe) => {
      const conns = await openRaw(path, HELD_CONNECTIONS, () =>
        Buffer.concat([HANDSHAKE, frame(FrameType.DATA, 0, 1, Buffer.alloc(100), 1024 * 1024)]),
      );
      for (const conn of conns) conn.destroy();
      // What they left behind must not keep a new client out.
      for (let n = 0; n < 3; n++) await probe();
    }));

  test('20 000 short connections dropped in mixed half-finished states', () =>
    connectionAttack('20 000 short connections', async (path, probe) => {
      const states: ((i: number) => Buffer | undefined)[] = [
        () => undefined,
        () => PREFACE.subarray(0, 12),
        () => PREFACE,
        () => HANDSHAKE,
        () => Buffer.concat([HANDSHAKE, HALF_A_LARGE_FRAME]),
        () => Buffer.concat([HANDSHAKE, frame(FrameType.DATA, 0, 1, Buffer.alloc(100), 1024 * 1024)]),
        (i) => Buffer.alloc(64, i & 0xff),
      ];
      /** Connections the attacker half-closed: the daemon must close its side too. */
      const halfClosed: RawConnection[] = [];
      let probing = true;
      const probes = (async () => {
        while (probing) await probe();
      })();
      try {
        for (let start = 0; start < SHORT_CONNECTIONS; start += SHORT_IN_FLIGHT) {
          const conns = await openRaw(path, SHORT_IN_FLIGHT, (i) => states[(start + i) % states.length]?.(start + i), SHORT_IN_FLIGHT);
          conns.forEach((conn, i) => {
            if (i % 2 === 0) conn.destroy();
            else {
              conn.socket.end();
              halfClosed.push(conn);
            }
          });
        }
      } finally {
        probing = false;
        await probes;
      }
      await probe();
      try {
        await waitFor(() => halfClosed.every((c) => c.closed), {
          what: `the daemon closing half-closed connections (${halfClosed.filter((c) => !c.closed).length} of ${halfClosed.length} open)`,
          timeoutMs: RELEASE_MS,
          intervalMs: 20,
        });
      } finally {
        for (const conn of halfClosed) conn.destroy();
      }
    }));

  test('a trailing HEADERS with END_STREAM on an open stream ends the request: the call is answered', async () => {
    const session = http2.connect('http://localhost', { createConnection: () => net.connect(d().socketPath) });
    session.on('error', () => undefined);
    try {
      const stream = session.request(
        { ':method': 'POST', ':path': `${CONTROLLER}/Status`, 'content-type': 'application/grpc', te: 'trailers', 'containerd-namespace': NS },
        { endStream: false, waitForTrailers: true },
      );
      stream.on('wantTrailers', () => stream.sendTrailers({ 'x-trailer': 'end' }));
      const trailers = new Promise<http2.IncomingHttpHeaders>((resolve) => stream.once('trailers', resolve));
      const chunks: Buffer[] = [];
      stream.on('data', (chunk: Buffer) => chunks.push(chunk));
      stream.end(statusBody);
      const answer = await Promise.race([trailers, delay(5000).then(() => undefined)]);
      assert.ok(answer !== undefined, 'the call hung after its request ended with trailers');
      assert.equal(answer['grpc-status'], '0');
      assert.ok(Buffer.concat(chunks).length > 5, 'the Status answer came with a message');
    } finally {
      session.destroy();
    }
  });

  test('a grpc-timeout beyond 24.8 days is no deadline: the Wait stays pending, and the connection serves the next call', async () => {
    const conn = await handshake(d().socketPath, { keepFrames: true });
    try {
      const waitBody = grpcMessage(Buffer.concat([Buffer.from([0x0a, ID.length]), Buffer.from(ID)]));
      const block = Buffer.concat([requestBlock(`${CONTROLLER}/Wait`, NS), hpackLiteral('grpc-timeout', '2592000S')]);
      await conn.write(Buffer.concat([frame(FrameType.HEADERS, Flag.END_HEADERS, 1, block), frame(FrameType.DATA, Flag.END_STREAM, 1, waitBody)]));
      // One PING round trip, then half a second: an answer to the Wait would have come by then.
      await conn.write(pingFrame(Buffer.from('barrier1')));
      assert.ok(await conn.until(() => conn.frames.some((f) => f.type === FrameType.PING && (f.flags & Flag.ACK) !== 0), 5000), 'no PING ACK');
      await delay(500);
      const onWait = (): ServerFrame[] => conn.frames.filter((f) => f.streamId === 1);
      const ended = (f: ServerFrame): boolean => (f.type === FrameType.HEADERS || f.type === FrameType.DATA) && (f.flags & Flag.END_STREAM) !== 0;
      const framesSeen = (): string => JSON.stringify(conn.frames.map((f) => ({ type: f.type, flags: f.flags, stream: f.streamId })));
      // Neither answered, nor reset, nor cut off with the connection.
      assert.ok(!onWait().some(ended), `the Wait with a 30-day deadline was answered at once: ${framesSeen()}`);
      assert.ok(!onWait().some((f) => f.type === FrameType.RST_STREAM), `the Wait's stream was reset: ${framesSeen()}`);
      assert.equal(conn.goawayCode(), undefined, `the server sent GOAWAY: ${framesSeen()}`);
      assert.equal(conn.closed, false, 'the server closed the connection');
      // A Status on the same connection is answered: a message, then trailers ending the stream.
      const statusBlock = requestBlock(`${CONTROLLER}/Status`, NS);
      await conn.write(Buffer.concat([frame(FrameType.HEADERS, Flag.END_HEADERS, 3, statusBlock), frame(FrameType.DATA, Flag.END_STREAM, 3, statusBody)]));
      const onStatus = (): ServerFrame[] => conn.frames.filter((f) => f.streamId === 3);
      assert.ok(await conn.until(() => onStatus().some(ended), 5000), `no answer to Status on the connection holding the Wait: ${framesSeen()}`);
      const answer = onStatus();
      assert.ok(!answer.some((f) => f.type === FrameType.RST_STREAM), `the Status stream was reset: ${framesSeen()}`);
      assert.ok(
        answer.some((f) => f.type === FrameType.DATA && f.payload.length > 5),
        `the Status answer came without a message: ${framesSeen()}`,
      );
      assert.ok(
        answer.findIndex(ended) === answer.length - 1 && answer[answer.length - 1]?.type === FrameType.HEADERS,
        `the Status answer did not end with trailers: ${framesSeen()}`,
      );
      // And the Wait is still pending on the connection, which is still open.
      assert.ok(!onWait().some((f) => ended(f) || f.type === FrameType.RST_STREAM), `the Wait ended: ${framesSeen()}`);
      assert.equal(conn.goawayCode(), undefined, `the server sent GOAWAY: ${framesSeen()}`);
      assert.equal(conn.closed, false, 'the server closed the connection');
    } finally {
      conn.destroy();
    }
  });
});
