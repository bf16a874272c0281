import { createServer as createNetServer, type Server as NetServer, type Socket } from 'node:net';
import type { Logger } from 'pino';
import { GRPC_CODES, TsboxError, messageOf } from '../base/errors.js';
import { Request, Response } from '../gen/ttrpc/request.js';
import { LISTEN_BACKLOG, MAX_TIMER_MS, maxConnections } from '../transport/limits.js';
import { listenUnixSocket } from '../transport/socket.js';
import { toStatus, type Status } from '../transport/status.js';
import { FrameDecoder, FrameType, encodeFrame, type Decoded, type Frame } from './frame.js';
import { writeBounded } from './peer.js';
import {
  FRAME_ARRIVAL_MS,
  MAX_CALLS,
  MAX_CALLS_PER_CONNECTION,
  MAX_MESSAGE_BYTES,
  MAX_PARTIAL_FRAME_BYTES,
  SWEEP_MS,
} from './limits.js';

/** What a handler knows about its call. */
export interface TtrpcCallContext {
  readonly service: string;
  readonly method: string;
  /** The request's metadata, key to values (containerd's namespace: containerd-namespace-ttrpc). */
  readonly metadata: ReadonlyMap<string, readonly string[]>;
  /**
   * Fires once, with a TsboxError as its reason: DeadlineExceeded when the request's
   * timeout_nano passes, Cancelled when the connection closes, Unavailable when the server
   * shuts down. The caller has its answer by then (or no connection to take one): the handler
   * should stop what it waits for.
   */
  readonly signal: AbortSignal;
}

/** Serves one method: the request's payload in, the response's payload out; throws a TsboxError. */
export type TtrpcHandler = (payload: Buffer, ctx: TtrpcCallContext) => Promise<Uint8Array>;

/** A unary method as ts-proto's generated service definitions describe it (path "/service/Method"). */
export interface TtrpcMethod<Req, Res> {
  readonly path: string;
  readonly requestDeserialize: (bytes: Buffer) => Req;
  readonly responseSerialize: (value: Res) => Buffer;
}

/** Splits a generated path "/containerd.task.v3.Task/Wait" into service and method. */
export function splitPath(path: string): { service: string; method: string } {
  const match = /^\/([^/]+)\/([^/]+)$/.exec(path);
  if (match === null) throw new TypeError(`not a method path: ${path}`);
  return { service: match[1] as string, method: match[2] as string };
}

export interface TtrpcServerOptions {
  readonly logger: Logger;
  /** Connections at once; defaults to the gRPC side's bound (src/transport/limits.ts). */
  readonly maxConnections?: number;
}

/** One call in flight: from its request to its handler settling. */
interface Call {
  readonly streamId: number;
  readonly controller: AbortController;
  timer: NodeJS.Timeout | undefined;
  /** The caller got its answer (from the handler, or at the deadline or shutdown). */
  answered: boolean;
}

/** A connection the server was handed (serveConnection), as the handlers of its peer's own requests see it. */
export interface HandedConnection {
  /** Ends the calls of these stream ids, unanswered: the peer says nobody waits for them. */
  abort(streamIds: readonly number[], reason: TsboxError): void;
  /** Closes the connection once the answer to the request in hand is written. */
  end(): void;
}

/**
 * A request the peer of a handed connection makes of its own (not a call it passes on), answered
 * at once: undefined for OK, or the error it is answered with.
 */
export type OwnRequestHandler = (payload: Uint8Array, connection: HandedConnection) => TsboxError | undefined;

/** What the owner of a handed connection decides of it (TtrpcServer.serveConnection). */
export interface HandedOptions {
  /** The peer's own requests, by `service/method`: served on this connection only. */
  readonly own: ReadonlyMap<string, OwnRequestHandler>;
}

/** One accepted connection. */
class Connection {
  readonly decoder = new FrameDecoder();
  readonly calls = new Map<number, Call>();
  lastStreamId = 0;
  /** When the peer last sent bytes or was answered (ms since the epoch). */
  lastActive: number;
  /** When the frame in progress began; 0 between frames. */
  frameStartedAt = 0;
  /** Reading is paused until the peer reads its answers. */
  paused = false;

  constructor(
    readonly socket: Socket,
    now: number,
    /**
     * A connection the server was handed (a link to a pod's process, which relays containerd's
     * calls): it is never evicted, and at shutdown its calls get no answer, so that its peer
     * keeps them for the next server instead of passing its callers a failure. Undefined for a
     * connection accepted on a socket of the server's own.
     */
    readonly handed?: HandedOptions,
  ) {
    this.lastActive = now;
  }
}

const OK: Status = { code: 0, message: '' };

/**
 * A ttrpc server on a unix socket (containerd/ttrpc's protocol; ttrpc/frame.ts for the framing):
 * handlers registered by service and method, every call served concurrently with its own
 * AbortSignal, answers as ttrpc Responses carrying google.rpc.Status codes. Unknown methods are
 * UNIMPLEMENTED; stream ids must be odd and increasing, as ttrpc's server checks.
 *
 * Bounded against broken and hostile peers (limits.ts): connections (the longest-idle one
 * carrying no call makes room for a new one), calls per connection and in all, bytes of frames
 * in progress (the largest holder is closed), a deadline for a frame to arrive whole, and
 * answers queued for a peer that does not read (reading it stops until they drain). A
 * connection is never closed for being idle: containerd's ttrpc client does not redial, and
 * a task whose connection closes is taken for dead (research/task-api-v3.md §1.1).
 */
export class TtrpcServer {
  readonly #log: Logger;
  readonly #handlers = new Map<string, TtrpcHandler>();
  readonly #connections = new Set<Connection>();
  readonly #maxConnections: number;
  readonly #listener: NetServer;
  #sweep: NodeJS.Timeout | undefined;
  #socket: { remove(): Promise<void> } | undefined;
  #calls = 0;
  #partialBytes = 0;
  #closing: TsboxError | undefined;
  /** Resolves the drain in close() when the last call settles. */
  #drained: (() => void) | undefined;

  constructor(options: TtrpcServerOptions) {
    this.#log = options.logger.child({ component: 'ttrpc' });
    this.#maxConnections = options.maxConnections ?? maxConnections();
    this.#listener = createNetServer((socket) => this.#accept(socket));
  }

  /** Connections open now. */
  get connectionCount(): number {
    return this.#connections.size;
  }

  /** Calls whose handler has not settled yet. */
  get callsInFlight(): number {
    return this.#calls;
  }

  /** Serves `service`/`method` with `handler`; registering one twice is a bug. */
  register(service: string, method: string, handler: TtrpcHandler): void {
    const key = `${service}/${method}`;
    if (this.#handlers.has(key)) throw new Error(`ttrpc: ${key} is already registered`);
    this.#handlers.set(key, handler);
  }

  /** Serves a generated method with a typed handler; a request that does not decode is INVALID_ARGUMENT. */
  registerMethod<Req, Res>(definition: TtrpcMethod<Req, Res>, handle: (request: Req, ctx: TtrpcCallContext) => Promise<Res>): void {
    const { service, method } = splitPath(definition.path);
    this.register(service, method, async (payload, ctx) => {
      let request: Req;
      try {
        request = definition.requestDeserialize(payload);
      } catch (err) {
        throw new TsboxError('InvalidArgument', `cannot decode the ${method} request: ${messageOf(err)}`, { cause: err });
      }
      return definition.responseSerialize(await handle(request, ctx));
    });
  }

  /** Binds the socket at `path` (replacing a stale one, refusing a live one) with `mode`. */
  async listen(path: string, mode: number): Promise<void> {
    this.#socket = await listenUnixSocket(this.#listener, path, mode, LISTEN_BACKLOG);
    this.#listener.on('error', (err) => this.#log.error({ err }, 'listening socket error'));
    this.#sweep = setInterval(() => this.#checkFrames(), SWEEP_MS);
    this.#sweep.unref();
    this.#log.info({ socket: path, mode: mode.toString(8), maxConnections: this.#maxConnections }, 'listening');
  }

  /**
   * Stops accepting connections, answers calls in flight and new requests UNAVAILABLE (and
   * aborts their signals), waits up to `drainMs` for the handlers to settle, then closes every
   * connection and removes the socket.
   */
  async close(drainMs: number): Promise<void> {
    this.#closing = new TsboxError('Unavailable', 'the server is shutting down');
    const listenerClosed = new Promise<void>((resolve) => this.#listener.close(() => resolve()));
    if (this.#sweep !== undefined) clearInterval(this.#sweep);
    for (const connection of this.#connections) {
      // A relay keeps its calls for the next tsbox: they get no answer from this one.
      for (const call of connection.calls.values()) this.#abort(connection, call, this.#closing, connection.handed === undefined);
    }
    if (this.#calls > 0) {
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, drainMs);
        this.#drained = () => {
          clearTimeout(timer);
          resolve();
        };
      });
      if (this.#calls > 0) this.#log.warn({ inFlight: this.#calls }, 'drain time is over; closing connections');
    }
    for (const connection of this.#connections) connection.socket.destroy();
    await listenerClosed;
    await this.#socket?.remove();
    this.#log.info('ttrpc server closed');
  }

  /**
   * Serves one connection tsbox opened itself to a relay (a pod's process), which relays
   * containerd's calls for one pod: as an accepted one (the same bound on its calls, so that a
   * flood on one pod's socket leaves room for the others'), but never evicted, and left
   * unanswered at shutdown (see Connection.handed). Resolves when it closes.
   */
  serveConnection(socket: Socket, handed: HandedOptions): Promise<void> {
    const closed = new Promise<void>((resolve) => socket.once('close', () => resolve()));
    if (this.#closing !== undefined) socket.destroy();
    else this.#adopt(new Connection(socket, Date.now(), handed));
    return closed;
  }

  #accept(socket: Socket): void {
    const now = Date.now();
    if (this.#closing !== undefined || (this.#connections.size >= this.#maxConnections && !this.#evictIdle())) {
      socket.destroy();
      return;
    }
    this.#adopt(new Connection(socket, now));
  }

  #adopt(connection: Connection): void {
    const socket = connection.socket;
    this.#connections.add(connection);
    socket.on('data', (chunk: Buffer) => this.#onData(connection, chunk));
    // A reset or EPIPE ends the connection; 'close' follows and cleans up.
    socket.on('error', (err) => this.#log.debug({ err }, 'connection error'));
    // ttrpc ends a connection at the peer's EOF: a half-closed connection takes no requests.
    socket.once('end', () => socket.destroy());
    socket.once('close', () => this.#forget(connection));
  }

  /** Closes the longest-idle connection that carries no call; false when there is none. */
  #evictIdle(): boolean {
    let victim: Connection | undefined;
    for (const connection of this.#connections) {
      if (connection.calls.size > 0 || connection.handed !== undefined) continue;
      if (victim === undefined || connection.lastActive < victim.lastActive) victim = connection;
    }
    if (victim === undefined) return false;
    this.#log.debug('closing the longest-idle connection for a new one');
    this.#drop(victim);
    return true;
  }

  /** Ends a connection now, and forgets it at once so that its slot and bytes are free. */
  #drop(connection: Connection): void {
    connection.socket.destroy();
    this.#forget(connection);
  }

  #forget(connection: Connection): void {
    if (!this.#connections.delete(connection)) return;
    this.#partialBytes -= connection.decoder.buffered;
    const gone = new TsboxError('Cancelled', 'the connection closed');
    for (const call of connection.calls.values()) this.#abort(connection, call, gone, false);
  }

  #onData(connection: Connection, chunk: Buffer): void {
    const now = Date.now();
    connection.lastActive = now;
    this.#partialBytes -= connection.decoder.buffered;
    const decoded = connection.decoder.push(chunk);
    this.#partialBytes += connection.decoder.buffered;
    if (!connection.decoder.midFrame) connection.frameStartedAt = 0;
    else if (decoded.length > 0 || connection.frameStartedAt === 0) connection.frameStartedAt = now;
    for (const item of decoded) {
      if (connection.socket.destroyed) return;
      this.#onDecoded(connection, item);
    }
    if (this.#partialBytes > MAX_PARTIAL_FRAME_BYTES) this.#shedPartial();
  }

  #onDecoded(connection: Connection, item: Decoded): void {
    if (item.kind === 'skipped') {
      if (item.reason === 'oversized') {
        const { length, streamId } = item.header;
        this.#answer(connection, streamId, { code: GRPC_CODES.ResourceExhausted, message: `message of ${length} bytes exceeds the maximum of ${MAX_MESSAGE_BYTES}` });
      }
      // Unknown frame types are ignored, for compatibility with later ttrpc versions (as ttrpc does).
      return;
    }
    const frame = item.frame;
    if (frame.streamId % 2 !== 1) {
      this.#answer(connection, frame.streamId, invalid('stream ids of client-initiated streams must be odd'));
    } else if (frame.type === FrameType.Data) {
      this.#answer(connection, frame.streamId, invalid('no stream is open: no method here streams'));
    } else if (frame.type === FrameType.Request) {
      this.#onRequest(connection, frame);
    }
    // A Response frame from a client answers nothing; ttrpc's server ignores it too.
  }

  #onRequest(connection: Connection, frame: Frame): void {
    const streamId = frame.streamId;
    if (streamId <= connection.lastStreamId) {
      this.#answer(connection, streamId, invalid('stream ids must increase'));
      return;
    }
    connection.lastStreamId = streamId;
    let request: Request;
    try {
      request = Request.decode(frame.payload);
    } catch (err) {
      this.#answer(connection, streamId, invalid(`cannot decode the request: ${messageOf(err)}`));
      return;
    }
    const own = connection.handed?.own.get(`${request.service}/${request.method}`);
    if (own !== undefined) {
      this.#onOwnRequest(connection, streamId, request, own);
      return;
    }
    const handler = this.#handlers.get(`${request.service}/${request.method}`);
    if (handler === undefined) {
      this.#answer(connection, streamId, { code: GRPC_CODES.Unimplemented, message: `${request.service}/${request.method} is not implemented` });
    } else if (this.#closing !== undefined) {
      // A relay's requests stay with the relay for the next tsbox.
      if (connection.handed === undefined) this.#answer(connection, streamId, { code: GRPC_CODES.Unavailable, message: this.#closing.message });
    } else if (connection.calls.size >= MAX_CALLS_PER_CONNECTION || this.#calls >= MAX_CALLS) {
      this.#answer(connection, streamId, { code: GRPC_CODES.ResourceExhausted, message: 'too many calls in flight' });
    } else {
      this.#run(connection, streamId, request, handler);
    }
  }

  /** A request of the handed connection's peer of its own, answered at once. */
  #onOwnRequest(connection: Connection, streamId: number, request: Request, handle: OwnRequestHandler): void {
    let ending = false;
    const handed: HandedConnection = {
      abort: (streamIds, reason) => {
        for (const id of streamIds) {
          const call = connection.calls.get(id);
          if (call !== undefined) this.#abort(connection, call, reason, false);
        }
      },
      end: () => {
        ending = true;
      },
    };
    const rpc = `${request.service}/${request.method}`;
    const refused = handle(request.payload, handed);
    this.#answer(connection, streamId, refused === undefined ? OK : toStatus(refused, this.#log, rpc));
    if (ending) connection.socket.end();
  }

  #run(connection: Connection, streamId: number, request: Request, handler: TtrpcHandler): void {
    const call: Call = { streamId, controller: new AbortController(), timer: undefined, answered: false };
    connection.calls.set(streamId, call);
    this.#calls++;
    const metadata = new Map<string, string[]>();
    for (const { key, value } of request.metadata) metadata.set(key, [...(metadata.get(key) ?? []), value]);
    if (request.timeoutNano > 0) this.#armDeadline(connection, call, Date.now() + request.timeoutNano / 1e6);
    const rpc = `${request.service}/${request.method}`;
    const began = this.#log.isLevelEnabled('debug') ? performance.now() : 0;
    const ctx: TtrpcCallContext = { service: request.service, method: request.method, metadata, signal: call.controller.signal };
    let answer: Promise<Status & { payload?: Uint8Array }>;
    try {
      answer = handler(request.payload, ctx).then(
        (payload) => ({ ...OK, payload }),
        (err: unknown) => toStatus(err, this.#log, rpc),
      );
    } catch (err) {
      // A handler that throws instead of rejecting is answered the same way.
      answer = Promise.resolve(toStatus(err, this.#log, rpc));
    }
    void answer.then((status) => {
      if (call.timer !== undefined) clearTimeout(call.timer);
      connection.calls.delete(streamId);
      this.#calls--;
      if (!call.answered && !(connection.handed !== undefined && this.#closing !== undefined)) {
        call.answered = true;
        this.#answer(connection, streamId, status, status.payload);
      }
      if (this.#calls === 0) this.#drained?.();
      if (began > 0) this.#log.debug({ rpc, code: status.code, ms: Math.round((performance.now() - began) * 10) / 10 }, 'ttrpc call');
    });
  }

  /** A timer holds at most 2^31-1 ms: a later deadline re-arms it until it is due. */
  #armDeadline(connection: Connection, call: Call, deadline: number): void {
    const left = deadline - Date.now();
    if (left <= 0) {
      call.timer = undefined;
      this.#abort(connection, call, new TsboxError('DeadlineExceeded', 'deadline exceeded'), true);
      return;
    }
    call.timer = setTimeout(() => this.#armDeadline(connection, call, deadline), Math.min(Math.ceil(left), MAX_TIMER_MS));
  }

  /** Fires a call's signal with `reason`, answering the caller with it when `answer`. */
  #abort(connection: Connection, call: Call, reason: TsboxError, answer: boolean): void {
    if (call.timer !== undefined) clearTimeout(call.timer);
    call.timer = undefined;
    if (answer && !call.answered) {
      call.answered = true;
      this.#answer(connection, call.streamId, toStatus(reason, this.#log, 'abort'));
    }
    if (!call.controller.signal.aborted) call.controller.abort(reason);
  }

  /** Sends a Response; pauses reading while the peer leaves too many answers unread. */
  #answer(connection: Connection, streamId: number, status: Status, payload: Uint8Array = Buffer.alloc(0)): void {
    if (connection.socket.destroyed) return;
    let bytes = Response.encode({ status: { ...status, details: [] }, payload: Buffer.from(payload.buffer, payload.byteOffset, payload.length) }).finish();
    if (bytes.length > MAX_MESSAGE_BYTES) {
      this.#log.error({ streamId, bytes: bytes.length }, 'an answer exceeds the ttrpc message limit');
      bytes = Response.encode({ status: { code: GRPC_CODES.ResourceExhausted, message: 'the answer exceeds the ttrpc message limit', details: [] }, payload: Buffer.alloc(0) }).finish();
    }
    connection.lastActive = Date.now();
    writeBounded(connection, encodeFrame(streamId, FrameType.Response, bytes));
  }

  /** Closes the connection holding the most bytes of frames in progress. */
  #shedPartial(): void {
    let largest: Connection | undefined;
    for (const connection of this.#connections) {
      if (largest === undefined || connection.decoder.buffered > largest.decoder.buffered) largest = connection;
    }
    if (largest === undefined) return;
    this.#log.warn({ bytes: largest.decoder.buffered, total: this.#partialBytes }, 'closing the connection holding the most bytes of unfinished frames');
    this.#drop(largest);
  }

  /** Closes connections whose frame in progress has not arrived whole in time. */
  #checkFrames(): void {
    const now = Date.now();
    for (const connection of this.#connections) {
      // A connection paused for its unread answers is not read: its frame cannot arrive.
      if (!connection.paused && connection.frameStartedAt !== 0 && now - connection.frameStartedAt >= FRAME_ARRIVAL_MS) {
        this.#log.debug({ bufferedBytes: connection.decoder.buffered }, 'closing a connection whose frame did not arrive in time');
        this.#drop(connection);
      }
    }
  }
}

function invalid(message: string): Status {
  return { code: GRPC_CODES.InvalidArgument, message };
}
