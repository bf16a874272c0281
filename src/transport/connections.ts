import type http2 from 'node:http2';
import type { Socket } from 'node:net';
import type { Logger } from 'pino';
import { CONNECTION_PING_MS, CONNECTION_PING_TIMEOUT_MS, CONNECTION_SWEEP_MS, HANDSHAKE_MS } from './limits.js';

/** Why the table ended a connection (the log line counts each). */
type EndReason = 'no handshake in time' | 'no answer to PING' | 'evicted for a new connection' | 'refused: every connection carries a call';

/** The client's connection preface (RFC 9113 section 3.4): 24 bytes. */
const PREFACE_LENGTH = 24;

/** The table logs what it ended at most this often, as counts by reason. */
const LOG_EVERY_MS = 10_000;

/** One accepted connection, as the table sees it. */
class Connection {
  /** The HTTP/2 session node made for it once its preface came (when it was injected). */
  session: http2.ServerHttp2Session | undefined;
  /** The peer's preface and SETTINGS came. */
  handshaken = false;
  /** Calls in flight on it: open streams whose request has arrived whole. */
  calls = 0;
  /** When the peer last sent bytes, or a stream opened or closed (ms since the epoch). */
  lastActive: number;
  /** The socket's bytesRead when last looked at. */
  bytesSeen = 0;
  /** When the PING waiting for an answer went out; 0 when none does. */
  pingSentAt = 0;

  constructor(
    readonly socket: Socket,
    readonly acceptedAt: number,
  ) {
    this.lastActive = acceptedAt;
  }

  /** What the log says of it. */
  describe(now: number): Record<string, unknown> {
    return { handshaken: this.handshaken, ageMs: now - this.acceptedAt, idleMs: now - this.lastActive, bytesRead: this.socket.bytesRead };
  }
}

/**
 * The connections accepted on the listening socket, each tracked from accept to close, so
 * that no peer can keep containerd out by holding slots:
 * - a connection is forgotten the moment its socket closes; a peer that half-closes (sends
 *   FIN) is closed on our side at once, HTTP/2 has no use for half a connection;
 * - a connection that has not completed the HTTP/2 handshake within HANDSHAKE_MS is closed;
 * - a connection that carries no call and has been quiet for CONNECTION_PING_MS gets a
 *   PING, and is closed when nothing comes back within CONNECTION_PING_TIMEOUT_MS (any byte
 *   counts as an answer);
 * - when the table is full, a new connection takes the place of the longest-quiet one that
 *   carries no call (a stream whose request has not arrived whole is no call); a connection
 *   with a call in flight (containerd's, holding its Waits) is never the one closed. Only
 *   when every connection carries a call is the new one refused.
 * Per connection the table keeps a few numbers; it buffers nothing.
 */
export class ConnectionTable {
  readonly #limit: number;
  readonly #log: Logger;
  readonly #inject: (socket: Socket) => void;
  /** In order of acceptance. */
  readonly #connections = new Set<Connection>();
  /** The connection being injected: node makes its session synchronously, in the injection. */
  #arriving: Connection | undefined;
  readonly #ended = new Map<EndReason, number>();
  #loggedAt = 0;
  #closed = false;
  readonly #sweep: NodeJS.Timeout;

  /**
   * `http2Server` is the server behind `inject` (grpc-js's connection injector): the table
   * learns each connection's session from it.
   */
  constructor(options: { http2Server: http2.Http2Server; inject: (socket: Socket) => void; limit: number; log: Logger }) {
    this.#limit = options.limit;
    this.#log = options.log;
    this.#inject = options.inject;
    options.http2Server.on('session', (session: http2.ServerHttp2Session) => this.#attach(session));
    this.#sweep = setInterval(() => this.#check(), CONNECTION_SWEEP_MS);
    this.#sweep.unref();
  }

  /** Connections open now. */
  get size(): number {
    return this.#connections.size;
  }

  /** Takes a connection the listening socket accepted, making room for it if the table is full. */
  accept(socket: Socket): void {
    const now = Date.now();
    if (this.#closed) {
      socket.destroy();
      return;
    }
    if (this.#connections.size >= this.#limit && !this.#evictOne(now)) {
      socket.destroy();
      this.#count('refused: every connection carries a call', now);
      return;
    }
    const connection = new Connection(socket, now);
    this.#connections.add(connection);
    socket.once('close', () => this.#connections.delete(connection));
    socket.once('end', () => socket.destroy());
    this.#awaitPreface(connection);
  }

  /**
   * Reads the first bytes of a connection until the HTTP/2 preface's length has come, then
   * hands them back to the socket and the socket to grpc-js (node's session reads what the
   * socket holds). Until then the connection costs a socket, not an HTTP/2 session: peers that
   * connect and send nothing, or too little, are cheap to hold and to close.
   */
  #awaitPreface(connection: Connection): void {
    const socket = connection.socket;
    const head: Buffer[] = [];
    let length = 0;
    const onReadable = (): void => {
      for (let chunk: Buffer | null; length < PREFACE_LENGTH && (chunk = socket.read() as Buffer | null) !== null; ) {
        head.push(chunk);
        length += chunk.length;
      }
      if (length < PREFACE_LENGTH) return;
      socket.off('readable', onReadable);
      // One turn later, so that a peer that sent its bytes and left (its end comes right after
      // them) is gone before it costs a session.
      setImmediate(() => this.#handOver(connection, Buffer.concat(head, length)));
    };
    socket.on('readable', onReadable);
  }

  #handOver(connection: Connection, head: Buffer): void {
    const socket = connection.socket;
    if (socket.destroyed || !this.#connections.has(connection)) return;
    socket.unshift(head);
    this.#arriving = connection;
    try {
      this.#inject(socket);
    } finally {
      this.#arriving = undefined;
    }
    if (connection.session === undefined) {
      // node makes the session in the injection; if it ever stops, no connection can be watched.
      this.#log.error('node made no HTTP/2 session for an injected connection: closing it');
      this.#end(connection);
    }
  }

  /** Stops the checks and closes every connection still open (the server has shut down). */
  close(): void {
    this.#closed = true;
    clearInterval(this.#sweep);
    for (const connection of this.#connections) this.#end(connection);
    this.#flushLog(Date.now(), true);
  }

  #attach(session: http2.ServerHttp2Session): void {
    const connection = this.#arriving;
    if (connection === undefined) return;
    connection.session = session;
    session.once('remoteSettings', () => {
      connection.handshaken = true;
      connection.lastActive = Date.now();
    });
    session.on('stream', (stream: http2.ServerHttp2Stream) => {
      connection.lastActive = Date.now();
      // A stream is a call once its request has arrived whole (containerd sends headers and
      // message in one write); one whose request never ends holds no call worth keeping.
      const called = (): void => {
        if (stream.destroyed) return;
        connection.calls++;
        stream.once('close', () => {
          connection.calls--;
          connection.lastActive = Date.now();
        });
      };
      if (stream.endAfterHeaders || stream.readableEnded) called();
      else stream.once('end', called);
    });
  }

  /** Closes the longest-quiet connection that carries no call; false when there is none. */
  #evictOne(now: number): boolean {
    let victim: Connection | undefined;
    for (const connection of this.#connections) {
      if (connection.calls > 0) continue;
      if (victim === undefined || connection.lastActive < victim.lastActive) victim = connection;
    }
    if (victim === undefined) return false;
    this.#endFor(victim, 'evicted for a new connection', now);
    return true;
  }

  /** The sweep: handshake deadlines, and PINGs to quiet connections that carry no call. */
  #check(): void {
    const now = Date.now();
    for (const connection of this.#connections) {
      const read = connection.socket.bytesRead;
      if (read !== connection.bytesSeen) {
        connection.bytesSeen = read;
        connection.lastActive = now;
        connection.pingSentAt = 0;
      }
      if (!connection.handshaken) {
        if (now - connection.acceptedAt >= HANDSHAKE_MS) this.#endFor(connection, 'no handshake in time', now);
      } else if (connection.calls > 0) {
        // grpc-js's keepalive watches connections that carry calls.
      } else if (connection.pingSentAt !== 0) {
        if (now - connection.pingSentAt >= CONNECTION_PING_TIMEOUT_MS) this.#endFor(connection, 'no answer to PING', now);
      } else if (now - connection.lastActive >= CONNECTION_PING_MS) {
        this.#ping(connection, now);
      }
    }
    this.#flushLog(now, false);
  }

  #ping(connection: Connection, now: number): void {
    const session = connection.session;
    if (session === undefined || session.destroyed) return;
    connection.pingSentAt = now;
    // The answer is seen as bytes read; a session that ends first reports an error here,
    // and its socket's close removes the connection.
    session.ping(() => undefined);
  }

  #endFor(connection: Connection, reason: EndReason, now: number): void {
    if (this.#log.isLevelEnabled('debug')) this.#log.debug({ reason, ...connection.describe(now) }, 'closing a connection');
    this.#end(connection);
    this.#count(reason, now);
  }

  #end(connection: Connection): void {
    this.#connections.delete(connection);
    connection.session?.destroy();
    connection.socket.destroy();
  }

  #count(reason: EndReason, now: number): void {
    this.#ended.set(reason, (this.#ended.get(reason) ?? 0) + 1);
    this.#flushLog(now, false);
  }

  /** One line for what was ended since the last one, at most every LOG_EVERY_MS (or when `force`). */
  #flushLog(now: number, force: boolean): void {
    if (this.#ended.size === 0 || (!force && now - this.#loggedAt < LOG_EVERY_MS)) return;
    this.#loggedAt = now;
    const ended = Object.fromEntries(this.#ended);
    this.#ended.clear();
    this.#log.info({ ended, open: this.#connections.size, maxConnections: this.#limit }, 'closed connections that held a slot without a call');
  }
}
