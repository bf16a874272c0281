/**
 * HTTP/2 frames and HPACK header blocks built byte by byte, for tests that play a broken or
 * hostile peer (RFC 9113, RFC 7541): frames any peer could send, valid or not, and a small
 * reader that splits what the server sends into frames. No Huffman coding, no decoding of the
 * server's header blocks (tests that need the answer's headers use node:http2).
 */
import type net from 'node:net';
import { RawSocket } from './raw-socket.js';

export const PREFACE = Buffer.from('PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n', 'latin1');

export const FrameType = {
  DATA: 0,
  HEADERS: 1,
  PRIORITY: 2,
  RST_STREAM: 3,
  SETTINGS: 4,
  PUSH_PROMISE: 5,
  PING: 6,
  GOAWAY: 7,
  WINDOW_UPDATE: 8,
  CONTINUATION: 9,
} as const;

export const Flag = { END_STREAM: 0x1, ACK: 0x1, END_HEADERS: 0x4, PADDED: 0x8, PRIORITY: 0x20 } as const;

export const Setting = {
  HEADER_TABLE_SIZE: 1,
  ENABLE_PUSH: 2,
  MAX_CONCURRENT_STREAMS: 3,
  INITIAL_WINDOW_SIZE: 4,
  MAX_FRAME_SIZE: 5,
  MAX_HEADER_LIST_SIZE: 6,
} as const;

/** One frame: 9-byte header (24-bit length, type, flags, 31-bit stream id), then the payload. */
export function frame(type: number, flags: number, streamId: number, payload: Uint8Array = Buffer.alloc(0), declaredLength = payload.length): Buffer {
  const out = Buffer.alloc(9 + payload.length);
  out.writeUIntBE(declaredLength, 0, 3);
  out[3] = type;
  out[4] = flags;
  out.writeUInt32BE(streamId & 0x7fffffff, 5);
  out.set(payload, 9);
  return out;
}

export function settingsFrame(pairs: readonly (readonly [number, number])[] = []): Buffer {
  const payload = Buffer.alloc(6 * pairs.length);
  pairs.forEach(([id, value], i) => {
    payload.writeUInt16BE(id, 6 * i);
    payload.writeUInt32BE(value, 6 * i + 2);
  });
  return frame(FrameType.SETTINGS, 0, 0, payload);
}

export function pingFrame(data = Buffer.alloc(8)): Buffer {
  return frame(FrameType.PING, 0, 0, data);
}

export function rstStreamFrame(streamId: number, code = 8 /* CANCEL */): Buffer {
  const payload = Buffer.alloc(4);
  payload.writeUInt32BE(code);
  return frame(FrameType.RST_STREAM, 0, streamId, payload);
}

export function windowUpdateFrame(streamId: number, increment: number): Buffer {
  const payload = Buffer.alloc(4);
  payload.writeUInt32BE(increment);
  return frame(FrameType.WINDOW_UPDATE, 0, streamId, payload);
}

/** A gRPC length-prefixed message: flag byte, 4-byte length (the true one unless given), body. */
export function grpcMessage(message: Uint8Array, declaredLength = message.length): Buffer {
  const out = Buffer.alloc(5 + message.length);
  out.writeUInt32BE(declaredLength, 1);
  out.set(message, 5);
  return out;
}

// ---------------------------------------------------------------------------------------------
// HPACK (RFC 7541), encoding only

/** An integer with an N-bit prefix; `first` holds the pattern bits above the prefix. */
export function hpackInt(value: number, prefixBits: number, first = 0): Buffer {
  const max = (1 << prefixBits) - 1;
  if (value < max) return Buffer.from([first | value]);
  const bytes = [first | max];
  let rest = value - max;
  while (rest >= 128) {
    bytes.push((rest % 128) + 128);
    rest = Math.floor(rest / 128);
  }
  bytes.push(rest);
  return Buffer.from(bytes);
}

function hpackString(s: string): Buffer {
  const bytes = Buffer.from(s, 'latin1');
  return Buffer.concat([hpackInt(bytes.length, 7), bytes]);
}

/** A literal field with a literal name; `index` adds it to the dynamic table. */
export function hpackLiteral(name: string, value: string, index = false): Buffer {
  return Buffer.concat([Buffer.from([index ? 0x40 : 0x00]), hpackString(name), hpackString(value)]);
}

/** A field from the tables: 1-61 static, 62 the newest dynamic entry. */
export function hpackIndexed(index: number): Buffer {
  return hpackInt(index, 7, 0x80);
}

export const CONTROLLER = '/containerd.services.sandbox.v1.Controller';

/** The request headers of a gRPC call as a literal block (added to the dynamic table when `index`). */
export function requestBlock(path: string, namespace: string, index = false, contentType = 'application/grpc'): Buffer {
  return Buffer.concat([
    hpackIndexed(3), // :method POST
    hpackIndexed(6), // :scheme http
    hpackLiteral(':path', path, index),
    hpackLiteral(':authority', 'localhost', index),
    hpackLiteral('content-type', contentType, index),
    hpackLiteral('te', 'trailers', index),
    hpackLiteral('containerd-namespace', namespace, index),
  ]);
}

/**
 * The same request headers again, once `requestBlock(..., true)` has put them in the dynamic
 * table and nothing was added after: seven bytes.
 */
export function indexedRequestBlock(): Buffer {
  // Entries were added in order :path … containerd-namespace, so the newest (62) is the last.
  return Buffer.concat([hpackIndexed(3), hpackIndexed(6), ...[66, 65, 64, 63, 62].map(hpackIndexed)]);
}

// ---------------------------------------------------------------------------------------------
// Raw connections

/** A frame the server sent. */
export interface ServerFrame {
  readonly type: number;
  readonly flags: number;
  readonly streamId: number;
  readonly payload: Buffer;
}

/**
 * A raw connection (raw-socket.ts) that parses what the server sends into HTTP/2 frames
 * (after the server's preface, which is a SETTINGS frame).
 */
export class RawConnection extends RawSocket {
  readonly frames: ServerFrame[] = [];
  /** Frames counted by type, kept even when `keepFrames` is false. */
  readonly counts = new Map<number, number>();
  /** Frames with END_STREAM (answers ended), HEADERS or DATA. */
  endedStreams = 0;
  #buffer: Buffer = Buffer.alloc(0);
  readonly #keepFrames: boolean;

  private constructor(socket: net.Socket, keepFrames: boolean) {
    super(socket, (chunk) => this.#parse(chunk));
    this.#keepFrames = keepFrames;
  }

  /** Connects; resolves once connected (or rejects when refused). */
  static async connect(path: string, options: { keepFrames?: boolean } = {}): Promise<RawConnection> {
    return new RawConnection(await RawSocket.open(path), options.keepFrames ?? true);
  }

  #parse(chunk: Buffer): void {
    this.#buffer = this.#buffer.length === 0 ? chunk : Buffer.concat([this.#buffer, chunk]);
    let at = 0;
    while (this.#buffer.length - at >= 9) {
      const length = this.#buffer.readUIntBE(at, 3);
      if (this.#buffer.length - at < 9 + length) break;
      const type = this.#buffer[at + 3] as number;
      const flags = this.#buffer[at + 4] as number;
      const streamId = this.#buffer.readUInt32BE(at + 5) & 0x7fffffff;
      this.counts.set(type, (this.counts.get(type) ?? 0) + 1);
      if ((type === FrameType.HEADERS || type === FrameType.DATA) && (flags & Flag.END_STREAM) !== 0) this.endedStreams++;
      if (this.#keepFrames) {
        this.frames.push({ type, flags, streamId, payload: Buffer.from(this.#buffer.subarray(at + 9, at + 9 + length)) });
      }
      at += 9 + length;
    }
    this.#buffer = this.#buffer.subarray(at);
  }

  /** The GOAWAY the server sent, if any: its error code. */
  goawayCode(): number | undefined {
    const goaway = this.frames.find((f) => f.type === FrameType.GOAWAY);
    return goaway === undefined ? undefined : goaway.payload.readUInt32BE(4);
  }

  /** The settings of the server's first SETTINGS frame. */
  serverSettings(): Map<number, number> {
    const settings = new Map<number, number>();
    const first = this.frames.find((f) => f.type === FrameType.SETTINGS && (f.flags & Flag.ACK) === 0);
    if (first === undefined) return settings;
    for (let at = 0; at + 6 <= first.payload.length; at += 6) {
      settings.set(first.payload.readUInt16BE(at), first.payload.readUInt32BE(at + 2));
    }
    return settings;
  }
}
