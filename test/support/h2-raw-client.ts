/**
 * An HTTP/2 client written frame by frame on a plain socket, for protocol tests of the gRPC
 * server: it sends exactly the bytes a test builds (valid or not), parses every frame the
 * server sends, decodes header blocks, and lets a test wait, with a bounded timeout, for
 * the next frame that matches, for the socket to close, or for a PING round trip (a
 * barrier: the server handles frames in order, so whatever it sent in answer to earlier
 * frames has arrived once the PING ACK has).
 */
import { randomBytes } from 'node:crypto';
import net from 'node:net';
import {
  FRAME_HEADER_LENGTH,
  Flag,
  FrameType,
  PREFACE,
  frame,
  rstStreamFrame,
  settingsFrame,
  windowUpdateFrame,
} from '../../src/transport/h2/frames.js';
import { HpackDecoder, HpackEncoder, type Header } from '../../src/transport/h2/hpack.js';

/** How long any wait lasts before it fails the test. */
export const WAIT_MS = 5000;

/** One frame from the server, with its header block decoded for HEADERS. */
export interface RawFrame {
  readonly type: number;
  readonly flags: number;
  readonly streamId: number;
  readonly payload: Buffer;
  /** HEADERS only: the decoded block (joined with its CONTINUATION frames). */
  readonly headers?: Header[];
  /** HEADERS only: the payload sizes of the HEADERS and CONTINUATION frames as they came. */
  readonly wireSizes?: number[];
}

/** A GOAWAY frame's fields. */
export interface GoAway {
  readonly lastStreamId: number;
  readonly code: number;
  readonly debug: string;
}

/** What the server answered on one stream. */
export interface RawResponse {
  /** The first header block (response headers, or the whole answer if trailers-only). */
  readonly headers: Header[];
  /** The DATA payloads, concatenated (gRPC framing included). */
  readonly body: Buffer;
  /** The trailers block; the same as `headers` for a trailers-only answer. */
  readonly trailers: Header[];
  readonly trailersOnly: boolean;
  /** Every frame of the stream, in order. */
  readonly frames: RawFrame[];
}

export interface RawConnectOptions {
  /** The connection preface to send; false sends none (the test writes it). */
  readonly preface?: Buffer | false;
  /** The client's SETTINGS; false sends no SETTINGS frame. */
  readonly settings?: readonly (readonly [number, number])[] | false;
}

/** The value of a header in a decoded block. */
export function headerValue(headers: readonly Header[], name: string): string | undefined {
  for (const [n, v] of headers) if (n === name) return v;
  return undefined;
}

/** A gRPC length-prefixed message: flag byte, 4-byte length (by default the true one), body. */
export function grpcFrame(message: Uint8Array, options: { compressed?: boolean; declaredLength?: number } = {}): Buffer {
  const out = Buffer.alloc(5 + message.length);
  out[0] = options.compressed === true ? 1 : 0;
  out.writeUInt32BE(options.declaredLength ?? message.length, 1);
  out.set(message, 5);
  return out;
}

/** The request headers of a gRPC call, the way grpc-go and grpc-js send them. */
export function requestHeaders(path: string, extra: readonly Header[] = []): Header[] {
  return [
    [':method', 'POST'],
    [':scheme', 'http'],
    [':path', path],
    [':authority', 'localhost'],
    ['content-type', 'application/grpc'],
    ['te', 'trailers'],
    ...extra,
  ];
}

const FRAME_NAMES = ['DATA', 'HEADERS', 'PRIORITY', 'RST_STREAM', 'SETTINGS', 'PUSH_PROMISE', 'PING', 'GOAWAY', 'WINDOW_UPDATE', 'CONTINUATION'];

/** A short description of a frame, for failure messages. */
export function describeFrame(f: RawFrame): string {
  return `${FRAME_NAMES[f.type] ?? `type ${f.type}`}(stream ${f.streamId}, flags 0x${f.flags.toString(16)}, ${f.payload.length} bytes)`;
}

export class RawH2Client {
  readonly socket: net.Socket;
  readonly encoder = new HpackEncoder();
  /** Every frame received so far, in order. */
  readonly received: RawFrame[] = [];
  /** Frames not yet taken by `next`. */
  #unread: RawFrame[] = [];
  readonly #decoder = new HpackDecoder();
  #buffer: Buffer = Buffer.alloc(0);
  #block: { type: number; flags: number; streamId: number; chunks: Buffer[]; wireSizes: number[] } | undefined;
  #waiters = new Set<() => void>();
  #closed = false;
  /** An error in what the server sent (a frame this client cannot parse). */
  #parseError: Error | undefined;
  readonly closed: Promise<void>;

  private constructor(socket: net.Socket) {
    this.socket = socket;
    socket.on('data', (chunk: Buffer) => this.#onData(chunk));
    socket.on('error', () => undefined);
    this.closed = new Promise((resolve) =>
      socket.once('close', () => {
        this.#closed = true;
        this.#wake();
        resolve();
      }),
    );
  }

  /** Connects to a unix socket and sends the preface and SETTINGS (both configurable). */
  static async connect(path: string, options: RawConnectOptions = {}): Promise<RawH2Client> {
    const socket = net.connect(path);
    await new Promise<void>((resolve, reject) => {
      socket.once('connect', resolve);
      socket.once('error', reject);
    });
    const client = new RawH2Client(socket);
    const first: Buffer[] = [];
    if (options.preface !== false) first.push(options.preface ?? PREFACE);
    if (options.settings !== false) first.push(settingsFrame(options.settings ?? []));
    if (first.length > 0) await client.write(Buffer.concat(first));
    return client;
  }

  get isClosed(): boolean {
    return this.#closed;
  }

  /** Writes raw bytes; resolves once they are handed to the kernel. */
  write(bytes: Uint8Array): Promise<void> {
    return new Promise((resolve, reject) => {
      this.socket.write(bytes, (err) => (err ? reject(err) : resolve()));
    });
  }

  /** Encodes a header block with this client's encoder. */
  block(headers: readonly Header[]): Buffer {
    return this.encoder.encode(headers);
  }

  /** Sends a gRPC request: HEADERS then one DATA frame with END_STREAM. */
  async request(streamId: number, path: string, body: Uint8Array, extra: readonly Header[] = []): Promise<void> {
    await this.write(
      Buffer.concat([
        frame(FrameType.Headers, Flag.EndHeaders, streamId, this.block(requestHeaders(path, extra))),
        frame(FrameType.Data, Flag.EndStream, streamId, body),
      ]),
    );
  }

  /** Sends a unary call whose message is `message` (gRPC framing added). */
  call(streamId: number, path: string, message: Uint8Array, extra: readonly Header[] = []): Promise<void> {
    return this.request(streamId, path, grpcFrame(message), extra);
  }

  windowUpdate(streamId: number, increment: number): Promise<void> {
    return this.write(windowUpdateFrame(streamId, increment));
  }

  rstStream(streamId: number, code: number): Promise<void> {
    return this.write(rstStreamFrame(streamId, code));
  }

  /**
   * Takes the first unread frame that satisfies `match` (other frames stay unread), waiting
   * for it up to `timeoutMs`.
   */
  next(match: (f: RawFrame) => boolean, what: string, timeoutMs = WAIT_MS): Promise<RawFrame> {
    return this.#until(
      () => {
        const i = this.#unread.findIndex(match);
        if (i < 0) return undefined;
        const [f] = this.#unread.splice(i, 1);
        return f;
      },
      what,
      timeoutMs,
      true,
    );
  }

  /** The next frame of a type (and stream, when given). */
  nextOf(type: number, streamId?: number, timeoutMs = WAIT_MS): Promise<RawFrame> {
    const what = `${FRAME_NAMES[type] ?? type}${streamId === undefined ? '' : ` on stream ${streamId}`}`;
    return this.next((f) => f.type === type && (streamId === undefined || f.streamId === streamId), what, timeoutMs);
  }

  /** Unread frames on one stream, taken. */
  drain(streamId: number): RawFrame[] {
    const taken = this.#unread.filter((f) => f.streamId === streamId);
    this.#unread = this.#unread.filter((f) => f.streamId !== streamId);
    return taken;
  }

  /** The next GOAWAY, decoded. */
  async goAway(timeoutMs = WAIT_MS): Promise<GoAway> {
    const f = await this.nextOf(FrameType.GoAway, 0, timeoutMs);
    return {
      lastStreamId: f.payload.readUInt32BE(0) & 0x7fffffff,
      code: f.payload.readUInt32BE(4),
      debug: f.payload.subarray(8).toString('utf8'),
    };
  }

  /**
   * A PING round trip: resolves once the server has answered a PING sent now, so every frame
   * it sent in answer to what this client wrote before has been received.
   */
  async barrier(timeoutMs = WAIT_MS): Promise<void> {
    const data = randomBytes(8);
    await this.write(frame(FrameType.Ping, 0, 0, data));
    await this.next(
      (f) => f.type === FrameType.Ping && (f.flags & Flag.Ack) !== 0 && f.payload.equals(data),
      'PING ACK',
      timeoutMs,
    );
  }

  /** Waits for the server to close the connection. */
  waitClosed(timeoutMs = WAIT_MS): Promise<void> {
    return this.#until(() => (this.#closed ? true : undefined), 'connection close', timeoutMs, false).then(() => undefined);
  }

  /** Reads one stream's whole answer: up to its END_STREAM. Fails on RST_STREAM. */
  async response(streamId: number, timeoutMs = WAIT_MS): Promise<RawResponse> {
    const frames: RawFrame[] = [];
    const deadline = Date.now() + timeoutMs;
    const nextOnStream = (): Promise<RawFrame> =>
      this.next((f) => f.streamId === streamId, `frames of stream ${streamId}`, Math.max(1, deadline - Date.now()));
    const first = await nextOnStream();
    frames.push(first);
    if (first.type !== FrameType.Headers || first.headers === undefined) {
      throw new Error(`stream ${streamId}: expected HEADERS first, got ${describeFrame(first)}`);
    }
    if ((first.flags & Flag.EndStream) !== 0) {
      return { headers: first.headers, body: Buffer.alloc(0), trailers: first.headers, trailersOnly: true, frames };
    }
    const data: Buffer[] = [];
    for (;;) {
      const f = await nextOnStream();
      frames.push(f);
      if (f.type === FrameType.Data) {
        data.push(f.payload);
        if ((f.flags & Flag.EndStream) !== 0) throw new Error(`stream ${streamId}: DATA ended the stream without trailers`);
      } else if (f.type === FrameType.Headers && f.headers !== undefined) {
        if ((f.flags & Flag.EndStream) === 0) throw new Error(`stream ${streamId}: second HEADERS without END_STREAM`);
        return { headers: first.headers, body: Buffer.concat(data), trailers: f.headers, trailersOnly: false, frames };
      } else if (f.type === FrameType.RstStream) {
        throw new Error(`stream ${streamId}: RST_STREAM ${f.payload.readUInt32BE(0)} before the trailers`);
      } else {
        throw new Error(`stream ${streamId}: unexpected ${describeFrame(f)}`);
      }
    }
  }

  /** Ends the connection (no GOAWAY) and waits for the close. */
  async close(): Promise<void> {
    if (!this.#closed) this.socket.destroy();
    await this.closed;
  }

  #until<T>(poll: () => T | undefined, what: string, timeoutMs: number, failOnClose: boolean): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      const check = (): boolean => {
        const value = poll();
        if (value !== undefined) {
          done();
          resolve(value);
          return true;
        }
        if (this.#parseError !== undefined) {
          done();
          reject(this.#parseError);
          return true;
        }
        if (failOnClose && this.#closed) {
          done();
          reject(new Error(`connection closed while waiting for ${what}; received: ${this.#summary()}`));
          return true;
        }
        return false;
      };
      const waiter = (): void => void check();
      const timer = setTimeout(() => {
        done();
        reject(new Error(`timed out after ${timeoutMs} ms waiting for ${what}; received: ${this.#summary()}`));
      }, timeoutMs);
      const done = (): void => {
        clearTimeout(timer);
        this.#waiters.delete(waiter);
      };
      if (!check()) this.#waiters.add(waiter);
    });
  }

  #summary(): string {
    const shown = this.received.slice(-12).map(describeFrame).join(', ');
    return this.received.length > 12 ? `... ${shown}` : shown || 'nothing';
  }

  #wake(): void {
    for (const waiter of [...this.#waiters]) waiter();
  }

  #onData(chunk: Buffer): void {
    this.#buffer = this.#buffer.length === 0 ? chunk : Buffer.concat([this.#buffer, chunk]);
    let offset = 0;
    while (this.#buffer.length - offset >= FRAME_HEADER_LENGTH) {
      const length = this.#buffer.readUIntBE(offset, 3);
      if (this.#buffer.length - offset < FRAME_HEADER_LENGTH + length) break;
      const type = this.#buffer[offset + 3] as number;
      const flags = this.#buffer[offset + 4] as number;
      const streamId = this.#buffer.readUInt32BE(offset + 5) & 0x7fffffff;
      const payload = Buffer.from(this.#buffer.subarray(offset + FRAME_HEADER_LENGTH, offset + FRAME_HEADER_LENGTH + length));
      offset += FRAME_HEADER_LENGTH + length;
      this.#onFrame(type, flags, streamId, payload);
    }
    this.#buffer = Buffer.from(this.#buffer.subarray(offset));
    this.#wake();
  }

  #onFrame(type: number, flags: number, streamId: number, payload: Buffer): void {
    if (type === FrameType.Headers || type === FrameType.Continuation) {
      let fragment = payload;
      if (type === FrameType.Headers) {
        let start = 0;
        let end = payload.length;
        if ((flags & Flag.Padded) !== 0) {
          end -= payload[0] ?? 0;
          start = 1;
        }
        if ((flags & Flag.Priority) !== 0) start += 5;
        fragment = payload.subarray(start, end);
        this.#block = { type, flags, streamId, chunks: [], wireSizes: [] };
      }
      const block = this.#block;
      if (block === undefined || block.streamId !== streamId) {
        this.#parseError = new Error(`server sent a CONTINUATION out of place on stream ${streamId}`);
        return;
      }
      block.chunks.push(fragment);
      block.wireSizes.push(payload.length);
      if ((flags & Flag.EndHeaders) === 0) return;
      this.#block = undefined;
      const headers = this.#decoder.decode(Buffer.concat(block.chunks));
      this.#push({
        type: FrameType.Headers,
        flags: block.flags | Flag.EndHeaders,
        streamId,
        payload: Buffer.concat(block.chunks),
        headers,
        wireSizes: block.wireSizes,
      });
      return;
    }
    this.#push({ type, flags, streamId, payload });
  }

  #push(f: RawFrame): void {
    this.received.push(f);
    this.#unread.push(f);
  }
}
