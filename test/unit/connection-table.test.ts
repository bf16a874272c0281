// The connection table in front of grpc-js under crowds of connections larger than it: a
// client among them, or one that has just made its handshake, must not be the one closed for
// connections that sent nothing. Real unix sockets in a temp dir, a table of 16.
import assert from 'node:assert/strict';
import http2 from 'node:http2';
import { mkdtempSync, rmSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { pino } from 'pino';
import { ConnectionTable } from '../../src/transport/connections.js';
import { Flag, FrameType, PREFACE, frame, requestBlock, settingsFrame } from '../support/h2-frames.js';

const LIMIT = 16;
const BURST = 600;
const HANDSHAKE = Buffer.concat([PREFACE, settingsFrame(), frame(FrameType.SETTINGS, Flag.ACK, 0)]);

/** A client socket and what became of it: whether the server sent it anything, whether it closed. */
interface Peer {
  readonly socket: net.Socket;
  readonly answered: Promise<void>;
  readonly closed: Promise<void>;
  isClosed: boolean;
}

function connect(file: string, first?: Buffer): Peer {
  const socket = net.connect(file);
  socket.on('error', () => undefined);
  if (first !== undefined) socket.write(first);
  const peer: Peer = {
    socket,
    answered: new Promise((resolve) => socket.once('data', () => resolve())),
    closed: new Promise((resolve) =>
      socket.once('close', () => {
        peer.isClosed = true;
        resolve();
      }),
    ),
    isClosed: false,
  };
  return peer;
}

/** A table of LIMIT in front of node's HTTP/2 server, on a listening unix socket at `file`. */
function tableAt(file: string, firstBytesMs?: number) {
  const http2Server = http2.createServer();
  const table = new ConnectionTable({
    http2Server,
    inject: (socket) => http2Server.emit('connection', socket),
    limit: LIMIT,
    maxArriving: 4096,
    ...(firstBytesMs === undefined ? {} : { firstBytesMs }),
    log: pino({ level: 'silent' }),
  });
  const listener = net.createServer((socket) => table.accept(socket));
  return {
    http2Server,
    table,
    listen: () => new Promise<void>((resolve) => listener.listen({ path: file, backlog: 4096 }, resolve)),
    close: async (): Promise<void> => {
      table.close();
      await new Promise((resolve) => listener.close(resolve));
    },
  };
}

describe('the connection table under crowds of connections', () => {
  const dir = mkdtempSync(path.join(tmpdir(), 'connection-table-'));
  const file = path.join(dir, 's.sock');
  const { table, listen, close } = tableAt(file);
  const peers: Peer[] = [];

  before(listen);
  after(async () => {
    for (const peer of peers) peer.socket.destroy();
    await close();
    rmSync(dir, { recursive: true, force: true });
  });

  /** Opens `count` silent connections at once (all queued before the server accepts one), `client` in the middle. */
  function burst(count: number, client?: Buffer): { crowd: Peer[]; client: Peer | undefined } {
    const crowd: Peer[] = [];
    let sender: Peer | undefined;
    for (let i = 0; i < count; i++) {
      if (i === count / 2 && client !== undefined) sender = connect(file, client);
      crowd.push(connect(file));
    }
    peers.push(...crowd, ...(sender === undefined ? [] : [sender]));
    return { crowd, client: sender };
  }

  /** Resolves once all but `left` of `crowd` are closed. */
  async function crowdDownTo(crowd: Peer[], left: number): Promise<void> {
    while (crowd.filter((p) => !p.isClosed).length > left) await Promise.race(crowd.filter((p) => !p.isClosed).map((p) => p.closed));
  }

  test('a client in the middle of a crowd queued at once, larger than the table, is served; the crowd is cut to the table', async () => {
    const { crowd, client } = burst(BURST, HANDSHAKE);
    assert.ok(client !== undefined);
    // Handed to the HTTP/2 server: it sends its SETTINGS.
    await client.answered;
    await crowdDownTo(crowd, LIMIT - 1);
    assert.equal(client.isClosed, false, 'the client was closed');
    assert.equal(table.size, LIMIT);
    for (const peer of [...crowd, client]) peer.socket.destroy();
    await Promise.all([...crowd, client].map((p) => p.closed));
  });

  test('a client that has just made its handshake is not evicted for a connection that sends nothing', async () => {
    // Every place but one taken by a connection with a call in flight (nobody answers here).
    const busy: Peer[] = [];
    for (let i = 0; i < LIMIT - 1; i++) {
      const call = frame(FrameType.HEADERS, Flag.END_HEADERS | Flag.END_STREAM, 1, requestBlock('/x.Y/Z', 'ns'));
      const peer = connect(file, Buffer.concat([HANDSHAKE, call]));
      await peer.answered;
      busy.push(peer);
    }
    peers.push(...busy);
    const client = connect(file, HANDSHAKE);
    peers.push(client);
    await client.answered;
    assert.equal(table.size, LIMIT);
    // A newcomer that shows nothing is the one to go: the others carry calls, the client is new.
    const silent = connect(file);
    peers.push(silent);
    await silent.closed;
    assert.equal(client.isClosed, false, 'the client was evicted for a connection that sent nothing');
    assert.equal(busy.filter((p) => p.isClosed).length, 0, 'a connection with a call in flight was evicted');
    for (const peer of [...busy, client]) peer.socket.destroy();
    await Promise.all([...busy, client].map((p) => p.closed));
  });

  // A hang here would be a connection closed that should not be: the bound turns it into a failure.
  test('a client that waited for its first bytes is, once handshaken, younger than clients that handshook while it waited', { timeout: 60_000 }, async () => {
    // A table of its own whose newcomers may wait a minute for their first bytes: what this
    // test orders is the handshakes, not a clock.
    const ownFile = path.join(dir, 'waiting.sock');
    const own = tableAt(ownFile, 60_000);
    await own.listen();
    const mine: Peer[] = [];
    // The table counts a call when node's session announces its stream (as the server does).
    let calls = 0;
    let allCalls: () => void = () => undefined;
    const callsCounted = new Promise<void>((resolve) => (allCalls = resolve));
    own.http2Server.on('stream', () => {
      if (++calls === LIMIT - 1) allCalls();
    });
    try {
      // Every place but one taken by a connection with a call in flight (nobody answers here).
      for (let i = 0; i < LIMIT - 1; i++) {
        const call = frame(FrameType.HEADERS, Flag.END_HEADERS | Flag.END_STREAM, 1, requestBlock('/x.Y/Z', 'ns'));
        const peer = connect(ownFile, Buffer.concat([HANDSHAKE, call]));
        mine.push(peer);
        await peer.answered;
      }
      await callsCounted;
      const first = connect(ownFile, HANDSHAKE);
      mine.push(first);
      await first.answered;
      // The client connects and is slow to write: no place for it yet, it waits.
      const client = connect(ownFile);
      mine.push(client);
      // Another connection makes its handshake meanwhile and takes the last place from `first`.
      const second = connect(ownFile, HANDSHAKE);
      mine.push(second);
      await Promise.all([second.answered, first.closed]);
      assert.equal(client.isClosed, false);
      // Now the client's handshake: `second` handshook before it, and is the one to go.
      client.socket.write(HANDSHAKE);
      const gone = await Promise.race([client.closed.then(() => 'the client'), second.closed.then(() => 'the connection that handshook before it')]);
      assert.equal(gone, 'the connection that handshook before it', 'the client was turned away for the time it waited to write');
      await client.answered;
      assert.equal(client.isClosed, false);
    } finally {
      for (const peer of mine) peer.socket.destroy();
      await Promise.all(mine.map((p) => p.closed));
      await own.close();
    }
  });

  test('a connection node is closing, whose peer said GOAWAY and left a request unfinished, is closed', async () => {
    const goaway = Buffer.alloc(8); // last stream 0, NO_ERROR
    const peer = connect(
      file,
      Buffer.concat([HANDSHAKE, frame(FrameType.HEADERS, Flag.END_HEADERS, 1, requestBlock('/x.Y/Z', 'ns')), frame(FrameType.GOAWAY, 0, 0, goaway)]),
    );
    peers.push(peer);
    await peer.answered;
    // node closes its session and waits for the stream, which never ends; the peer stays.
    const closed = await Promise.race([peer.closed.then(() => true), new Promise<false>((resolve) => setTimeout(() => resolve(false), 5000).unref())]);
    assert.ok(closed, 'the connection was still open 5 s later');
  });
});
