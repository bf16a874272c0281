import type http2 from 'node:http2';
import type { Socket } from 'node:net';
import type { Logger } from 'pino';
import { CONNECTION_PING_MS, CONNECTION_PING_TIMEOUT_MS, CONNECTION_SWEEP_MS, FIRST_BYTES_MS, HANDSHAKE_MS, NEW_CLIENT_GRACE_MS } from './limits.js';

/** Why the table ended a connection (the log line counts each). */
type EndReason =
  | 'no handshake in time'
  | 'not HTTP/2'
  | 'ended by node, peer unheard'
  | 'closed by node, no call left'
  | 'evicted for a new connection'
  | 'turned away: every other connection carries a call or is a new client'
  | 'refused: too many connections arriving at once';

/** The client's connection preface (RFC 9113 section 3.4). */
const PREFACE = Buffer.from('PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n', 'latin1');
const FRAME_HEADER_LENGTH = 9;
const SETTINGS_FRAME = 0x4;
const ACK_FLAG = 0x1;
/**
 * The largest first SETTINGS frame accepted: the default SETTINGS_MAX_FRAME_SIZE (RFC 9113
 * section 6.5.2), far above the six settings a client can name. A longer one is a broken peer.
 */
const MAX_FIRST_SETTINGS_LENGTH = 16_384;

/**
 * The table's clock (ms): monotonic, in fractions of a millisecond, so that connections
 * accepted or handshaken within one millisecond still come in the order they did (a flood
 * puts many there). Only differences are used; never 0 once the process runs.
 */
const clock = (): number => performance.now();

/** The table logs what it ended at most this often, as counts by reason. */
const LOG_EVERY_MS = 10_000;

/** How a connection's handshake bytes look so far. */
type HandshakeProgress = 'incomplete' | 'complete' | 'not HTTP/2';

/**
 * Whether `head` (the first bytes of a connection) holds the client preface followed by a
 * whole SETTINGS frame, the first frame the client must send (RFC 9113 section 3.4). Bytes
 * that cannot become that are 'not HTTP/2' as soon as they arrive.
 */
export function handshakeProgress(head: Buffer): HandshakeProgress {
  const prefaceBytes = Math.min(head.length, PREFACE.length);
  if (!head.subarray(0, prefaceBytes).equals(PREFACE.subarray(0, prefaceBytes))) return 'not HTTP/2';
  if (head.length < PREFACE.length + FRAME_HEADER_LENGTH) return 'incomplete';
  const at = PREFACE.length;
  const length = head.readUIntBE(at, 3);
  const type = head[at + 3] as number;
  const flags = head[at + 4] as number;
  const streamId = head.readUInt32BE(at + 5) & 0x7fffffff;
  if (type !== SETTINGS_FRAME || (flags & ACK_FLAG) !== 0 || streamId !== 0 || length % 6 !== 0 || length > MAX_FIRST_SETTINGS_LENGTH) {
    return 'not HTTP/2';
  }
  return head.length >= at + FRAME_HEADER_LENGTH + length ? 'complete' : 'incomplete';
}

/** One accepted connection, as the table sees it. */
class Connection {
  /** The HTTP/2 session node made for it once its handshake came (when it was handed over). */
  session: http2.ServerHttp2Session | undefined;
  /** When its preface and first SETTINGS frame had come; 0 until then. */
  handshakenAt = 0;
  /** It was handed to grpc-js (one turn after its handshake came). */
  handedOver = false;
  /** It has had its first chance to be read, and holds a place in the table (see ConnectionTable). */
  seated = false;
  /** It was due a place but had sent nothing yet, and waits for its first bytes (see ConnectionTable). */
  waiting = false;
  /** Calls in flight on it: open streams whose request has arrived whole. */
  calls = 0;
  /** It has carried a whole call: a client, not just a connection. */
  called = false;
  /**
   * When it was accepted, or when its last call ended (with its handshake, its place in the
   * eviction order: see since()). Bytes without a call do not move it.
   */
  turn: number;
  /** When the PING checking that node still serves it went out; 0 when none is out. */
  pingSentAt = 0;
  /** When it last carried a call or answered a PING (on the table's clock). */
  lastHeard: number;

  constructor(
    readonly socket: Socket,
    readonly acceptedAt: number,
    /** The table's loop generation when it was accepted (see ConnectionTable.#generation). */
    readonly acceptedGeneration: number,
  ) {
    this.turn = acceptedAt;
    this.lastHeard = acceptedAt;
  }

  /**
   * Eviction rank, lowest first:
   * 0. it sent bytes, but not a whole handshake;
   * 1. handshaken, and neither handshaken nor ended a call within NEW_CLIENT_GRACE_MS;
   * 2. it sent nothing yet (a client whose process is busy looks like this for a while);
   * 3. a client within its grace: handshaken, or ended a call, less than NEW_CLIENT_GRACE_MS ago.
   * None for one with a call in flight.
   */
  rank(now: number): number | undefined {
    if (this.calls > 0) return undefined;
    if (this.handshakenAt === 0) return this.socket.bytesRead > 0 ? 0 : 2;
    return now - this.since() < NEW_CLIENT_GRACE_MS ? 3 : 1;
  }

  /**
   * Its place in the order within a rank, oldest first: its turn, or its handshake when that
   * came later (a client that waited to write is as new as its handshake, not as its accept).
   */
  since(): number {
    return Math.max(this.handshakenAt, this.turn);
  }

  /** What the log says of it. */
  describe(now: number): Record<string, unknown> {
    return {
      seated: this.seated,
      handshaken: this.handshakenAt !== 0,
      called: this.called,
      ageMs: now - this.acceptedAt,
      turnMs: now - this.turn,
      bytesRead: this.socket.bytesRead,
    };
  }
}

/**
 * The connections accepted on the listening socket, each tracked from accept to close, so
 * that no peer can keep containerd out by holding slots, and no client loses its connection
 * for being slow:
 * - a connection is forgotten the moment its socket closes; a peer that half-closes (sends
 *   FIN) is closed on our side at once, HTTP/2 has no use for half a connection;
 * - until the client's preface and first SETTINGS frame have come, the table reads the
 *   connection itself, and it costs only a socket: bytes that are not the preface close it at
 *   once, and it is closed when the handshake has not come within HANDSHAKE_MS. Then it is
 *   handed to grpc-js;
 * - node stops reading a connection it ended with a protocol error, so the peer's close never
 *   reaches it. A connection with no call that has been quiet for CONNECTION_PING_MS is sent a
 *   PING: one node cannot even send within CONNECTION_PING_TIMEOUT_MS is one node has ended,
 *   and it is closed. A PING that went out and is not answered proves nothing (the client may
 *   be busy, or paused for GC): that connection is left to grpc-js's keepalive, like any other;
 * - node also closes sessions itself (a frame it could not send, a GOAWAY from the peer): it
 *   has sent its GOAWAY, takes no new call, cancels a PING at once, and waits for the streams
 *   left, which may never end when the peer is gone and unheard. Such a connection is closed
 *   once it carries no call and has been quiet for CONNECTION_PING_MS;
 * - a connection is judged only once it has had its chance to be read: nothing is known of it
 *   until a later event-loop turn has read what it sent (libuv accepts one connection a turn
 *   today, older versions all the kernel had queued, thousands in a flood). So a connection
 *   first *arrives*: it holds no place and cannot be evicted, and arriving ones are bounded
 *   apart (`maxArriving`, the depth of the kernel's queue), past which a new one is refused as
 *   the kernel would. Two turns after its accept (see #generation) it is *seated*: those that
 *   closed or sent something else are gone by then, and the rest take a place;
 * - the table holds `limit` seated connections. When one is seated over the limit, the one that
 *   goes is the lowest by rank (Connection.rank: a partial handshake first, a new client in its
 *   grace last), the new one included, then the oldest turn (accepted, handshaken, or ended its
 *   last call, longest ago): other bytes do not make a connection younger, and a client that
 *   waited to write is as new as its handshake. A connection with a
 *   call in flight (containerd's, holding its Waits) is never the one closed. A new one that has
 *   sent nothing yet and would be the one to go is not judged yet: it waits, without a place,
 *   for its first bytes, up to FIRST_BYTES_MS after its accept (a client's handshake may come
 *   a moment after its connect). So a client that sends its handshake at once is turned away
 *   only when every other seated connection carries a call or is a newer client in its grace.
 * Per connection the table keeps a few numbers, and the first bytes until the handshake.
 */
export class ConnectionTable {
  readonly #limit: number;
  readonly #maxArriving: number;
  readonly #firstBytesMs: number;
  readonly #log: Logger;
  readonly #inject: (socket: Socket) => void;
  /** Every connection open, arriving or seated, in order of acceptance. */
  readonly #connections = new Set<Connection>();
  /** The seated ones: those the limit counts and eviction chooses from. */
  readonly #seated = new Set<Connection>();
  /** The arriving ones in order of acceptance, from #arrivalsHead on (closed ones are skipped when seating). */
  #arrivals: Connection[] = [];
  #arrivalsHead = 0;
  /** The connection being injected: node makes its session synchronously, in the injection. */
  #arriving: Connection | undefined;
  readonly #ended = new Map<EndReason, number>();
  #loggedAt = 0;
  #closed = false;
  readonly #sweep: NodeJS.Timeout;
  /**
   * Event-loop turns counted while connections arrive: a connection accepted in generation g
   * has had its bytes read (if it sent any) once the count reaches g + 2 (accepted in one
   * poll phase, its first read in the next, the count moves on after each). Then it is seated.
   */
  #generation = 0;
  #countUntil = 0;
  #counting = false;

  /**
   * `http2Server` is the server behind `inject` (grpc-js's connection injector): the table
   * learns each connection's session from it. `limit` bounds the seated connections,
   * `maxArriving` the ones accepted and not read yet; `firstBytesMs` (FIRST_BYTES_MS unless
   * given) is how long a newcomer that would be turned away may wait for its first bytes.
   */
  constructor(options: { http2Server: http2.Http2Server; inject: (socket: Socket) => void; limit: number; maxArriving: number; firstBytesMs?: number; log: Logger }) {
    this.#limit = options.limit;
    this.#maxArriving = options.maxArriving;
    this.#firstBytesMs = options.firstBytesMs ?? FIRST_BYTES_MS;
    this.#log = options.log;
    this.#inject = options.inject;
    options.http2Server.on('session', (session: http2.ServerHttp2Session) => this.#attach(session));
    this.#sweep = setInterval(() => this.#check(), CONNECTION_SWEEP_MS);
    this.#sweep.unref();
  }

  /** Connections open now, arriving or seated. */
  get size(): number {
    return this.#connections.size;
  }

  /** Takes a connection the listening socket accepted (see the class for how it finds a place). */
  accept(socket: Socket): void {
    const now = clock();
    if (this.#closed) {
      socket.destroy();
      return;
    }
    if (this.#connections.size - this.#seated.size >= this.#maxArriving) {
      socket.destroy();
      this.#count('refused: too many connections arriving at once', now);
      return;
    }
    const connection = new Connection(socket, now, this.#generation);
    this.#connections.add(connection);
    this.#arrivals.push(connection);
    this.#countTurns(this.#generation + 2);
    socket.once('close', () => {
      this.#connections.delete(connection);
      this.#seated.delete(connection);
    });
    socket.once('end', () => socket.destroy());
    // A reset ends in 'close' like anything else; the session adds its own handling later.
    socket.on('error', () => undefined);
    this.#awaitHandshake(connection);
  }

  /**
   * Reads the first bytes of a connection until the preface and the first SETTINGS frame have
   * come, then hands them back to the socket and the socket to grpc-js (node's session reads
   * what the socket holds). Until then the connection costs a socket, not an HTTP/2 session:
   * peers that connect and send nothing, too little or something else are cheap to hold and
   * to close.
   */
  #awaitHandshake(connection: Connection): void {
    const socket = connection.socket;
    let head: Buffer = Buffer.alloc(0);
    let progress: HandshakeProgress = 'incomplete';
    const onReadable = (): void => {
      for (let chunk: Buffer | null; progress !== 'not HTTP/2' && (chunk = socket.read() as Buffer | null) !== null; ) {
        head = head.length === 0 ? chunk : Buffer.concat([head, chunk]);
        if (progress === 'incomplete') {
          progress = handshakeProgress(head);
          // One turn later, so that a peer that sent its bytes and left (its end comes right
          // after them) is gone before it costs a session. Reading goes on until then: a
          // socket hands node what it holds but not an end it has already read, so an end read
          // here must close it here.
          if (progress === 'complete') {
            connection.handshakenAt = clock();
            setImmediate(() => {
              socket.off('readable', onReadable);
              this.#handOver(connection, head);
            });
          }
        }
      }
      if (progress === 'not HTTP/2') {
        socket.off('readable', onReadable);
        this.#endFor(connection, 'not HTTP/2', clock());
      } else if (connection.waiting && head.length > 0) {
        this.#seat(connection, clock());
      }
    };
    socket.on('readable', onReadable);
  }

  #handOver(connection: Connection, head: Buffer): void {
    const socket = connection.socket;
    if (socket.destroyed || !this.#connections.has(connection)) return;
    socket.unshift(head);
    connection.handedOver = true;
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
    this.#flushLog(clock(), true);
  }

  #attach(session: http2.ServerHttp2Session): void {
    const connection = this.#arriving;
    if (connection === undefined) return;
    connection.session = session;
    session.on('stream', (stream: http2.ServerHttp2Stream) => {
      // A stream is a call once its request has arrived whole (containerd sends headers and
      // message in one write); one whose request never ends holds no call worth keeping.
      const called = (): void => {
        if (stream.destroyed) return;
        connection.calls++;
        connection.called = true;
        connection.lastHeard = clock();
        stream.once('close', () => {
          connection.calls--;
          connection.turn = connection.lastHeard = clock();
        });
      };
      if (stream.endAfterHeaders || stream.readableEnded) called();
      else stream.once('end', called);
    });
  }

  /** Counts event-loop turns (#generation) until the count reaches `until`, at least, seating arrivals as it goes. */
  #countTurns(until: number): void {
    this.#countUntil = Math.max(this.#countUntil, until);
    if (this.#counting) return;
    this.#counting = true;
    const turn = (): void => {
      this.#generation++;
      this.#seatArrivals();
      if (this.#generation < this.#countUntil) setImmediate(turn);
      else this.#counting = false;
    };
    setImmediate(turn);
  }

  /** Seats the arrivals that have had their first read (see the class), making room as it goes. */
  #seatArrivals(): void {
    const arrivals = this.#arrivals;
    const now = clock();
    let at = this.#arrivalsHead;
    for (let connection: Connection | undefined; (connection = arrivals[at]) !== undefined && connection.acceptedGeneration + 2 <= this.#generation; at++) {
      if (this.#connections.has(connection)) this.#seat(connection, now);
    }
    if (at === arrivals.length) {
      this.#arrivals = [];
      this.#arrivalsHead = 0;
    } else {
      this.#arrivalsHead = at;
    }
  }

  /**
   * Gives the connection its place, making room when the table is over its limit. One that has
   * sent nothing yet and would be the one to go waits instead, for its first bytes or until
   * FIRST_BYTES_MS after its accept: a client's handshake may be a moment behind its connect.
   */
  #seat(connection: Connection, now: number): void {
    connection.waiting = false;
    connection.seated = true;
    this.#seated.add(connection);
    if (this.#seated.size <= this.#limit) return;
    const victim = this.#victim(connection, now);
    if (victim === connection && connection.socket.bytesRead === 0 && now - connection.acceptedAt < this.#firstBytesMs) {
      connection.seated = false;
      connection.waiting = true;
      this.#seated.delete(connection);
      return;
    }
    this.#endFor(victim, victim === connection ? 'turned away: every other connection carries a call or is a new client' : 'evicted for a new connection', now);
  }

  /**
   * The seated connection first in the eviction order (see the class), `seating` (the
   * one just seated, which never carries a call yet) included.
   */
  #victim(seating: Connection, now: number): Connection {
    let victim = seating;
    let victimRank = seating.rank(now) ?? Number.POSITIVE_INFINITY;
    for (const connection of this.#seated) {
      const rank = connection.rank(now);
      if (rank === undefined || rank > victimRank || (rank === victimRank && connection.since() >= victim.since())) continue;
      victim = connection;
      victimRank = rank;
    }
    return victim;
  }

  /** The sweep: handshake deadlines, and PINGs checking that node still serves quiet connections. */
  #check(): void {
    const now = clock();
    for (const connection of this.#connections) {
      if (connection.waiting) {
        if (now - connection.acceptedAt >= this.#firstBytesMs) this.#seat(connection, now);
      } else if (!connection.handedOver) {
        if (now - connection.acceptedAt >= HANDSHAKE_MS) this.#endFor(connection, 'no handshake in time', now);
      } else if (connection.session?.closed === true) {
        if (connection.calls === 0 && now - connection.lastHeard >= CONNECTION_PING_MS) this.#endFor(connection, 'closed by node, no call left', now);
      } else if (connection.pingSentAt !== 0) {
        if (now - connection.pingSentAt >= CONNECTION_PING_TIMEOUT_MS && this.#pingStuck(connection)) {
          this.#endFor(connection, 'ended by node, peer unheard', now);
        }
      } else if (connection.calls === 0 && now - connection.lastHeard >= CONNECTION_PING_MS) {
        this.#ping(connection, now);
      }
    }
    this.#flushLog(now, false);
  }

  #ping(connection: Connection, now: number): void {
    const session = connection.session;
    if (session === undefined || session.destroyed) return;
    connection.pingSentAt = now;
    // The answer may take as long as the client likes. A session that ends first reports an
    // error here, and its socket's close removes the connection; one that node is closing
    // cancels the PING at once, and the sweep sees to it (#check).
    session.ping((err) => {
      if (err !== null) return;
      connection.pingSentAt = 0;
      connection.lastHeard = clock();
    });
  }

  /**
   * Whether the PING is still in node's queue with nothing in the way: node has ended the
   * session and sends nothing more. (Output waiting for a peer that does not read holds the
   * PING back too; that is the peer's doing, left to keepalive.)
   */
  #pingStuck(connection: Connection): boolean {
    const session = connection.session;
    if (session === undefined || session.destroyed) return false;
    const handle = (connection.socket as unknown as { _handle?: { writeQueueSize?: unknown } | null })._handle;
    const unwritten = typeof handle?.writeQueueSize === 'number' ? handle.writeQueueSize : 0;
    return (session.state.outboundQueueSize ?? 0) > 0 && unwritten === 0;
  }

  #endFor(connection: Connection, reason: EndReason, now: number): void {
    if (this.#log.isLevelEnabled('debug')) this.#log.debug({ reason, ...connection.describe(now) }, 'closing a connection');
    this.#end(connection);
    this.#count(reason, now);
  }

  #end(connection: Connection): void {
    this.#connections.delete(connection);
    this.#seated.delete(connection);
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
