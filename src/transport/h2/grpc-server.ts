import { createServer as createNetServer, type Server as NetServer, type Socket } from 'node:net';
import { HpackDecoder, HpackEncoder, type Header } from './hpack.js';
import {
  DEFAULT_MAX_FRAME,
  DEFAULT_WINDOW,
  ErrorCode,
  FRAME_HEADER_LENGTH,
  Flag,
  FrameType,
  MAX_WINDOW,
  PREFACE,
  Setting,
  frame,
  goAwayFrame,
  rstStreamFrame,
  settingsFrame,
  windowUpdateFrame,
} from './frames.js';

/**
 * A gRPC server for unary calls over HTTP/2 cleartext, written directly on the socket. It
 * replaces a general-purpose HTTP/2 stack on the hot path: a call costs a few small objects
 * and one write per batch of responses, and a pending call (a Wait held for a pod's whole
 * life) is just its stream entry.
 */

/** gRPC status codes used here. */
export const GrpcCode = {
  Ok: 0,
  Cancelled: 1,
  InvalidArgument: 3,
  DeadlineExceeded: 4,
  ResourceExhausted: 8,
  Unimplemented: 12,
  Internal: 13,
  Unavailable: 14,
} as const;

/** A function, or an object whose callCancelled() is called (no closure per call). */
export type CancelListener = (() => void) | { callCancelled(): void };

const notify = (listener: CancelListener): void => {
  if (typeof listener === 'function') listener();
  else listener.callCancelled();
};

/** One unary call as the handler sees it. */
export interface GrpcCall {
  /** The method path, e.g. /containerd.services.sandbox.v1.Controller/Status. */
  readonly method: string;
  /** The request message, without gRPC framing; only while the handler is first called. */
  readonly message: Buffer;
  /** Absolute deadline in ms since the epoch, or Infinity. */
  readonly deadline: number;
  /** A request header (lowercase name); only while the handler is first called. */
  header(name: string): string | undefined;
  /** Calls `listener` once if the client cancels or the connection goes away before an answer. */
  onCancel(listener: CancelListener): void;
  offCancel(listener: CancelListener): void;
  respond(message: Uint8Array): void;
  fail(code: number, message: string): void;
}

export interface GrpcServerOptions {
  /** Largest request message accepted (SPEC.md section 1: containerd sends up to 16 MiB). */
  readonly maxMessageBytes: number;
  /** Called with connection-level failures, for the log. */
  readonly onConnectionError?: (err: Error) => void;
}

const RESPONSE_HEADERS: Header[] = [
  [':status', '200'],
  ['content-type', 'application/grpc'],
];
// Advertised receive windows: big enough that a 16 MiB Create needs few updates.
const STREAM_WINDOW = 4 << 20;
const CONNECTION_WINDOW = MAX_WINDOW;
const MAX_FRAME_RECEIVED = 1 << 20;
// Request header blocks are small (a gRPC call sends about ten fields); a bigger one is refused.
const MAX_HEADER_BLOCK = 64 << 10;
// Error messages go out in a header block: long ones are cut.
const MAX_ERROR_MESSAGE = 4096;

const NO_HEADERS: Header[] = [];
const EMPTY = Buffer.alloc(0);
/** The chunks of a stream whose request is complete: nothing is added to it any more. */
const NO_CHUNKS: Buffer[] = [];
const TIMEOUT_UNITS: Readonly<Record<string, number>> = { H: 3_600_000, M: 60_000, S: 1000, m: 1, u: 1e-3, n: 1e-6 };

/** grpc-timeout (e.g. "100m") to an absolute deadline in ms. */
function deadlineOf(timeout: string | undefined): number {
  if (timeout === undefined) return Infinity;
  const match = /^(\d{1,8})([HMSmun])$/.exec(timeout);
  if (match === null) return Infinity;
  return Date.now() + Number(match[1]) * (TIMEOUT_UNITS[match[2] as string] as number);
}

/** grpc-message is percent-encoded (gRPC over HTTP/2 protocol). */
function encodeGrpcMessage(message: string): string {
  return /^[\x20-\x24\x26-\x7e]*$/.test(message)
    ? message
    : Array.from(Buffer.from(message, 'utf8'), (b) =>
        b >= 0x20 && b <= 0x7e && b !== 0x25 ? String.fromCharCode(b) : `%${b.toString(16).toUpperCase().padStart(2, '0')}`,
      ).join('');
}

class Stream implements GrpcCall {
  method = '';
  deadline = Infinity;
  message: Buffer = EMPTY;
  headers: Header[] = NO_HEADERS;
  chunks: Buffer[] = [];
  size = 0;
  /** The client sent END_STREAM. */
  remoteClosed = false;
  /** We answered (or the stream was reset): nothing more goes out. */
  answered = false;
  tooLarge = false;
  sendWindow: number;
  recvConsumed = 0;
  /** Response bytes waiting for flow-control window, then the trailers frame. */
  pending: Buffer | undefined;
  pendingTrailers: Buffer | undefined;
  /** Cancel listeners: at most one in practice (the call's context). */
  #cancel: CancelListener | CancelListener[] | undefined;

  constructor(
    readonly id: number,
    readonly connection: Connection,
  ) {
    this.sendWindow = connection.peerInitialWindow;
  }

  header(name: string): string | undefined {
    for (const [n, v] of this.headers) if (n === name) return v;
    return undefined;
  }

  onCancel(listener: CancelListener): void {
    const current = this.#cancel;
    if (current === undefined) this.#cancel = listener;
    else if (Array.isArray(current)) current.push(listener);
    else this.#cancel = [current, listener];
  }

  offCancel(listener: CancelListener): void {
    const current = this.#cancel;
    if (current === listener) this.#cancel = undefined;
    else if (Array.isArray(current)) {
      const i = current.indexOf(listener);
      if (i >= 0) current.splice(i, 1);
    }
  }

  cancelled(): void {
    if (this.answered) return;
    this.answered = true;
    const listeners = this.#cancel;
    this.#cancel = undefined;
    if (Array.isArray(listeners)) for (const l of listeners) notify(l);
    else if (listeners !== undefined) notify(listeners);
  }

  respond(message: Uint8Array): void {
    if (this.answered) return;
    this.answered = true;
    this.connection.sendResponse(this, message);
  }

  fail(code: number, message: string): void {
    if (this.answered) return;
    this.answered = true;
    this.connection.sendTrailersOnly(this, code, message);
  }
}

class Connection {
  readonly #decoder = new HpackDecoder();
  readonly #encoder = new HpackEncoder();
  readonly #responseHeaders: Buffer;
  readonly #okTrailers: Buffer;
  readonly streams = new Map<number, Stream>();
  peerInitialWindow = DEFAULT_WINDOW;
  #peerMaxFrame = DEFAULT_MAX_FRAME;
  #sendWindow = DEFAULT_WINDOW;
  #recvConsumed = 0;
  #buffer: Buffer | undefined;
  #prefaceSeen = false;
  #lastStreamId = 0;
  #goAwayId: number | undefined;
  /** A header block split over CONTINUATION frames. */
  #block: { streamId: number; chunks: Buffer[]; size: number; endStream: boolean } | undefined;
  #out: Buffer[] = [];
  #flushScheduled = false;
  #blocked = new Set<Stream>();
  closed = false;

  constructor(
    readonly socket: Socket,
    readonly server: GrpcH2Server,
  ) {
    this.#responseHeaders = this.#encoder.encode(RESPONSE_HEADERS);
    this.#okTrailers = this.#encoder.encode([['grpc-status', '0']]);
    socket.setNoDelay(true);
    socket.on('data', (chunk: Buffer) => this.#onData(chunk));
    socket.on('error', (err) => server.options.onConnectionError?.(err));
    socket.on('close', () => this.#onClose());
    this.#send(
      settingsFrame([
        [Setting.InitialWindowSize, STREAM_WINDOW],
        [Setting.MaxFrameSize, MAX_FRAME_RECEIVED],
        [Setting.EnablePush, 0],
        [Setting.MaxHeaderListSize, MAX_HEADER_BLOCK],
      ]),
    );
    this.#send(windowUpdateFrame(0, CONNECTION_WINDOW - DEFAULT_WINDOW));
  }

  #send(buf: Buffer): void {
    if (this.closed) return;
    this.#out.push(buf);
    if (!this.#flushScheduled) {
      this.#flushScheduled = true;
      setImmediate(this.#flush);
    }
  }

  readonly #flush = (): void => {
    this.#flushScheduled = false;
    if (this.closed || this.#out.length === 0) return;
    const out = this.#out;
    this.#out = [];
    this.socket.write(out.length === 1 ? (out[0] as Buffer) : Buffer.concat(out));
  };

  #protocolError(message: string, code: number = ErrorCode.ProtocolError): void {
    this.server.options.onConnectionError?.(new Error(`HTTP/2 ${message}`));
    this.#send(goAwayFrame(this.#lastStreamId, code, message));
    this.#flush();
    this.closed = true;
    this.socket.end();
    this.socket.destroySoon();
  }

  #onData(chunk: Buffer): void {
    let buf = this.#buffer === undefined ? chunk : Buffer.concat([this.#buffer, chunk]);
    this.#buffer = undefined;
    if (!this.#prefaceSeen) {
      const seen = Math.min(buf.length, PREFACE.length);
      if (buf.length < PREFACE.length && buf.equals(PREFACE.subarray(0, seen))) {
        this.#buffer = buf;
        return;
      }
      if (!buf.subarray(0, seen).equals(PREFACE.subarray(0, seen)) || buf.length < PREFACE.length) {
        this.closed = true;
        this.socket.destroy();
        return;
      }
      this.#prefaceSeen = true;
      buf = buf.subarray(PREFACE.length);
    }
    let offset = 0;
    while (!this.closed && buf.length - offset >= FRAME_HEADER_LENGTH) {
      const length = buf.readUIntBE(offset, 3);
      if (length > MAX_FRAME_RECEIVED) {
        this.#protocolError('frame too large', ErrorCode.FrameSizeError);
        return;
      }
      if (buf.length - offset < FRAME_HEADER_LENGTH + length) break;
      const type = buf[offset + 3] as number;
      const flags = buf[offset + 4] as number;
      const streamId = buf.readUInt32BE(offset + 5) & 0x7fffffff;
      const payload = buf.subarray(offset + FRAME_HEADER_LENGTH, offset + FRAME_HEADER_LENGTH + length);
      offset += FRAME_HEADER_LENGTH + length;
      this.#onFrame(type, flags, streamId, payload);
    }
    if (offset < buf.length && !this.closed) this.#buffer = Buffer.from(buf.subarray(offset));
  }

  #onFrame(type: number, flags: number, streamId: number, payload: Buffer): void {
    if (this.#block !== undefined && type !== FrameType.Continuation) {
      this.#protocolError('expected CONTINUATION');
      return;
    }
    switch (type) {
      case FrameType.Data:
        this.#onDataFrame(flags, streamId, payload);
        break;
      case FrameType.Headers:
        this.#onHeaders(flags, streamId, payload);
        break;
      case FrameType.Continuation:
        this.#onContinuation(flags, streamId, payload);
        break;
      case FrameType.RstStream: {
        const stream = this.streams.get(streamId);
        if (stream !== undefined) {
          this.streams.delete(streamId);
          this.#blocked.delete(stream);
          stream.cancelled();
        }
        break;
      }
      case FrameType.Settings:
        this.#onSettings(flags, streamId, payload);
        break;
      case FrameType.Ping:
        if (payload.length !== 8) this.#protocolError('PING of wrong size', ErrorCode.FrameSizeError);
        else if ((flags & Flag.Ack) === 0) this.#send(frame(FrameType.Ping, Flag.Ack, 0, payload));
        break;
      case FrameType.WindowUpdate:
        this.#onWindowUpdate(streamId, payload);
        break;
      case FrameType.GoAway:
        // The client gives up on the connection after an error: so do we.
        if (payload.length >= 8 && payload.readUInt32BE(4) !== ErrorCode.NoError) this.destroy();
        break;
      case FrameType.Priority:
        break;
      case FrameType.PushPromise:
        this.#protocolError('PUSH_PROMISE from a client');
        break;
      default:
        break; // unknown frame types are ignored (RFC 9113 section 4.1)
    }
  }

  #onHeaders(flags: number, streamId: number, payload: Buffer): void {
    if (streamId === 0 || streamId % 2 === 0) {
      this.#protocolError('HEADERS on an invalid stream');
      return;
    }
    let start = 0;
    let end = payload.length;
    if (flags & Flag.Padded) {
      end -= payload[0] ?? 0;
      start = 1;
    }
    if (flags & Flag.Priority) start += 5;
    if (start > end) {
      this.#protocolError('bad padding');
      return;
    }
    const fragment = payload.subarray(start, end);
    const endStream = (flags & Flag.EndStream) !== 0;
    if (flags & Flag.EndHeaders) this.#onHeaderBlock(streamId, fragment, endStream);
    else if (fragment.length > MAX_HEADER_BLOCK) this.#protocolError('header block too large', ErrorCode.EnhanceYourCalm);
    else this.#block = { streamId, chunks: [Buffer.from(fragment)], size: fragment.length, endStream };
  }

  #onContinuation(flags: number, streamId: number, payload: Buffer): void {
    const block = this.#block;
    if (block === undefined || block.streamId !== streamId) {
      this.#protocolError('unexpected CONTINUATION');
      return;
    }
    block.chunks.push(Buffer.from(payload));
    block.size += payload.length;
    if (block.size > MAX_HEADER_BLOCK) {
      this.#protocolError('header block too large', ErrorCode.EnhanceYourCalm);
      return;
    }
    if (flags & Flag.EndHeaders) {
      this.#block = undefined;
      this.#onHeaderBlock(streamId, Buffer.concat(block.chunks), block.endStream);
    }
  }

  #onHeaderBlock(streamId: number, block: Buffer, endStream: boolean): void {
    let headers: Header[];
    try {
      headers = this.#decoder.decode(block);
    } catch (err) {
      this.#protocolError(`header block: ${(err as Error).message}`, ErrorCode.CompressionError);
      return;
    }
    if (this.streams.has(streamId)) return; // trailers from a client: nothing to do in unary calls
    if (streamId <= this.#lastStreamId) {
      this.#protocolError('stream id reused');
      return;
    }
    this.#lastStreamId = streamId;
    if (this.#goAwayId !== undefined && streamId > this.#goAwayId) {
      this.#send(rstStreamFrame(streamId, ErrorCode.RefusedStream));
      return;
    }
    const stream = new Stream(streamId, this);
    stream.headers = headers;
    stream.method = stream.header(':path') ?? '';
    stream.deadline = deadlineOf(stream.header('grpc-timeout'));
    this.streams.set(streamId, stream);
    if (endStream) this.#dispatch(stream);
  }

  #onDataFrame(flags: number, streamId: number, payload: Buffer): void {
    // Flow control counts the whole frame, padding included.
    this.#recvConsumed += payload.length;
    if (this.#recvConsumed >= CONNECTION_WINDOW / 2) {
      this.#send(windowUpdateFrame(0, this.#recvConsumed));
      this.#recvConsumed = 0;
    }
    const stream = this.streams.get(streamId);
    if (stream === undefined || stream.remoteClosed) return;
    let data = payload;
    if (flags & Flag.Padded) {
      const pad = payload[0] ?? 0;
      if (payload.length === 0 || pad >= payload.length) {
        this.#protocolError('DATA padding longer than the frame');
        return;
      }
      data = payload.subarray(1, payload.length - pad);
    }
    stream.recvConsumed += payload.length;
    if (!stream.tooLarge) {
      stream.size += data.length;
      if (stream.size > this.server.options.maxMessageBytes + 5) {
        stream.tooLarge = true;
        stream.chunks = [];
      } else {
        stream.chunks.push(Buffer.from(data));
      }
    }
    const endStream = (flags & Flag.EndStream) !== 0;
    if (!endStream && stream.recvConsumed >= STREAM_WINDOW / 2) {
      this.#send(windowUpdateFrame(streamId, stream.recvConsumed));
      stream.recvConsumed = 0;
    }
    if (endStream) this.#dispatch(stream);
  }

  #dispatch(stream: Stream): void {
    stream.remoteClosed = true;
    if (stream.tooLarge) {
      stream.fail(GrpcCode.ResourceExhausted, `request larger than ${this.server.options.maxMessageBytes} bytes`);
      return;
    }
    const body = stream.chunks.length === 1 ? (stream.chunks[0] as Buffer) : Buffer.concat(stream.chunks);
    stream.chunks = NO_CHUNKS;
    if (body.length < 5) {
      stream.fail(GrpcCode.InvalidArgument, 'malformed request: no gRPC message');
      return;
    }
    if (body[0] !== 0) {
      stream.fail(GrpcCode.Unimplemented, 'compressed messages are not supported');
      return;
    }
    const length = body.readUInt32BE(1);
    if (length !== body.length - 5) {
      stream.fail(GrpcCode.InvalidArgument, 'malformed request: gRPC message length does not match');
      return;
    }
    stream.message = body.subarray(5);
    this.server.handler(stream);
    // A call may stay pending for a pod's whole life: keep only what it still needs.
    stream.headers = NO_HEADERS;
    stream.message = EMPTY;
  }

  #onSettings(flags: number, streamId: number, payload: Buffer): void {
    if (streamId !== 0) {
      this.#protocolError('SETTINGS on a stream');
      return;
    }
    if (payload.length % 6 !== 0 || ((flags & Flag.Ack) !== 0 && payload.length !== 0)) {
      this.#protocolError('SETTINGS of wrong size', ErrorCode.FrameSizeError);
      return;
    }
    if (flags & Flag.Ack) return;
    for (let i = 0; i < payload.length; i += 6) {
      const id = payload.readUInt16BE(i);
      const value = payload.readUInt32BE(i + 2);
      if (id === Setting.InitialWindowSize) {
        if (value > MAX_WINDOW) {
          this.#protocolError('window too large', ErrorCode.FlowControlError);
          return;
        }
        const delta = value - this.peerInitialWindow;
        this.peerInitialWindow = value;
        for (const stream of this.streams.values()) stream.sendWindow += delta;
      } else if (id === Setting.MaxFrameSize) {
        if (value < DEFAULT_MAX_FRAME || value > 0xffffff) {
          this.#protocolError('MAX_FRAME_SIZE out of range');
          return;
        }
        this.#peerMaxFrame = value;
      }
    }
    this.#send(frame(FrameType.Settings, Flag.Ack, 0));
    this.#drainBlocked();
  }

  #onWindowUpdate(streamId: number, payload: Buffer): void {
    if (payload.length !== 4) {
      this.#protocolError('WINDOW_UPDATE of wrong size', ErrorCode.FrameSizeError);
      return;
    }
    const increment = payload.readUInt32BE(0) & 0x7fffffff;
    if (increment === 0) {
      if (streamId === 0) this.#protocolError('WINDOW_UPDATE of 0');
      else this.#send(rstStreamFrame(streamId, ErrorCode.ProtocolError));
      return;
    }
    if (streamId === 0) this.#sendWindow += increment;
    else {
      const stream = this.streams.get(streamId);
      if (stream !== undefined) stream.sendWindow += increment;
    }
    this.#drainBlocked();
  }

  /** A header block as HEADERS plus CONTINUATION frames that fit the peer's max frame size. */
  #sendHeaders(streamId: number, block: Buffer, endStream: boolean): void {
    const end = endStream ? Flag.EndStream : 0;
    if (block.length <= this.#peerMaxFrame) {
      this.#send(frame(FrameType.Headers, Flag.EndHeaders | end, streamId, block));
      return;
    }
    let offset = this.#peerMaxFrame;
    this.#send(frame(FrameType.Headers, end, streamId, block.subarray(0, offset)));
    while (offset < block.length) {
      const next = Math.min(block.length, offset + this.#peerMaxFrame);
      this.#send(frame(FrameType.Continuation, next === block.length ? Flag.EndHeaders : 0, streamId, block.subarray(offset, next)));
      offset = next;
    }
  }

  sendResponse(stream: Stream, message: Uint8Array): void {
    this.#send(frame(FrameType.Headers, Flag.EndHeaders, stream.id, this.#responseHeaders));
    const body = Buffer.allocUnsafe(5 + message.length);
    body[0] = 0;
    body.writeUInt32BE(message.length, 1);
    body.set(message, 5);
    stream.pending = body;
    stream.pendingTrailers = frame(FrameType.Headers, Flag.EndHeaders | Flag.EndStream, stream.id, this.#okTrailers);
    this.#sendPending(stream);
  }

  sendTrailersOnly(stream: Stream, code: number, message: string): void {
    const block = this.#encoder.encode([
      ...RESPONSE_HEADERS,
      ['grpc-status', String(code)],
      ['grpc-message', encodeGrpcMessage(message.length > MAX_ERROR_MESSAGE ? `${message.slice(0, MAX_ERROR_MESSAGE)}…` : message)],
    ]);
    this.#sendHeaders(stream.id, block, true);
    this.#finish(stream);
  }

  /** Sends what flow control allows of a stream's response; the rest waits for WINDOW_UPDATE. */
  #sendPending(stream: Stream): void {
    let body = stream.pending;
    while (body !== undefined && body.length > 0) {
      const n = Math.min(body.length, this.#peerMaxFrame, this.#sendWindow, stream.sendWindow);
      if (n <= 0) {
        stream.pending = body;
        this.#blocked.add(stream);
        return;
      }
      this.#send(frame(FrameType.Data, 0, stream.id, body.subarray(0, n)));
      this.#sendWindow -= n;
      stream.sendWindow -= n;
      body = body.length === n ? undefined : body.subarray(n);
    }
    stream.pending = undefined;
    this.#blocked.delete(stream);
    if (stream.pendingTrailers !== undefined) this.#send(stream.pendingTrailers);
    stream.pendingTrailers = undefined;
    this.#finish(stream);
  }

  #drainBlocked(): void {
    for (const stream of [...this.#blocked]) {
      if (this.#sendWindow <= 0) return;
      this.#sendPending(stream);
    }
  }

  #finish(stream: Stream): void {
    // An answer before the request ended tells the client to stop sending (RFC 9113 8.1).
    if (!stream.remoteClosed) this.#send(rstStreamFrame(stream.id, ErrorCode.NoError));
    this.streams.delete(stream.id);
  }

  /** Refuses new streams; calls in flight go on. */
  goAway(): void {
    if (this.#goAwayId !== undefined) return;
    this.#goAwayId = this.#lastStreamId;
    this.#send(goAwayFrame(this.#lastStreamId, ErrorCode.NoError));
  }

  destroy(): void {
    this.#flush();
    this.closed = true;
    this.socket.destroy();
  }

  #onClose(): void {
    this.closed = true;
    this.server.connections.delete(this);
    const streams = [...this.streams.values()];
    this.streams.clear();
    for (const stream of streams) stream.cancelled();
  }
}

/** Listens on a unix socket and hands every complete unary call to `handler`. */
export class GrpcH2Server {
  readonly connections = new Set<Connection>();
  #net: NetServer | undefined;

  constructor(
    readonly handler: (call: GrpcCall) => void,
    readonly options: GrpcServerOptions,
  ) {}

  listen(path: string): Promise<void> {
    const net = createNetServer((socket) => this.connections.add(new Connection(socket, this)));
    this.#net = net;
    return new Promise((resolve, reject) => {
      net.once('error', reject);
      net.listen(path, () => {
        net.off('error', reject);
        resolve();
      });
    });
  }

  /** Stops listening and sends GOAWAY: no new calls; calls in flight go on. */
  stopAccepting(): void {
    this.#net?.close();
    for (const connection of this.connections) connection.goAway();
  }

  /** Closes every connection; clients see the transport go (UNAVAILABLE). */
  destroy(): void {
    for (const connection of this.connections) connection.destroy();
    this.connections.clear();
  }
}
