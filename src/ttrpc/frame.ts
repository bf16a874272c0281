import { HEADER_BYTES, MAX_MESSAGE_BYTES } from './limits.js';

/**
 * ttrpc framing (containerd/ttrpc channel.go): every message is a 10-byte header (payload
 * length u32, stream id u32, type u8, flags u8, big-endian) and then the payload, at most
 * MAX_MESSAGE_BYTES. Client-initiated streams have odd ids.
 */

/** Frame types; ttrpc ignores others for future compatibility, and so do we. */
export const FrameType = { Request: 1, Response: 2, Data: 3 } as const;

/** Data-frame flags (for streaming methods, which the Task API has none of). */
export const FrameFlag = { RemoteClosed: 0x1, RemoteOpen: 0x2, NoData: 0x4 } as const;

export interface FrameHeader {
  readonly length: number;
  readonly streamId: number;
  readonly type: number;
  readonly flags: number;
}

export interface Frame extends FrameHeader {
  readonly payload: Buffer;
}

/**
 * What the decoder found: a whole frame, or a frame it skipped without keeping its payload,
 * because the header announced more than MAX_MESSAGE_BYTES or a type it does not know. ttrpc
 * answers the first RESOURCE_EXHAUSTED on its stream and ignores the second.
 */
export type Decoded =
  | { readonly kind: 'frame'; readonly frame: Frame }
  | { readonly kind: 'skipped'; readonly header: FrameHeader; readonly reason: 'oversized' | 'unknown type' };

/** Encodes one frame; throws a RangeError for a payload over MAX_MESSAGE_BYTES. */
export function encodeFrame(streamId: number, type: number, payload: Uint8Array, flags = 0): Buffer {
  if (payload.length > MAX_MESSAGE_BYTES) {
    throw new RangeError(`ttrpc message of ${payload.length} bytes exceeds the maximum of ${MAX_MESSAGE_BYTES}`);
  }
  const frame = Buffer.allocUnsafe(HEADER_BYTES + payload.length);
  frame.writeUInt32BE(payload.length, 0);
  frame.writeUInt32BE(streamId >>> 0, 4);
  frame.writeUInt8(type, 8);
  frame.writeUInt8(flags, 9);
  frame.set(payload, HEADER_BYTES);
  return frame;
}

function knownType(type: number): boolean {
  return type === FrameType.Request || type === FrameType.Response || type === FrameType.Data;
}

/**
 * Splits a byte stream into frames, whatever the chunks: a frame split over several chunks,
 * several frames in one. It holds at most one frame in progress: its header bytes, and the
 * parts of its payload until the payload is whole. A payload it skips (oversized, unknown type)
 * is counted off as it goes by, never kept, so a header announcing 4 GiB costs nothing.
 */
export class FrameDecoder {
  readonly #maxPayload: number;
  readonly #header = Buffer.alloc(HEADER_BYTES);
  #headerFill = 0;
  /** The header of the frame whose payload is arriving, if any. */
  #current: FrameHeader | undefined;
  #skipping = false;
  #parts: Buffer[] = [];
  /** Payload bytes of the current frame received (kept or skipped). */
  #received = 0;

  constructor(maxPayload = MAX_MESSAGE_BYTES) {
    this.#maxPayload = maxPayload;
  }

  /** Bytes held of the frame in progress: its header and payload so far (none for one it skips). */
  get buffered(): number {
    if (this.#current === undefined) return this.#headerFill;
    return this.#skipping ? 0 : HEADER_BYTES + this.#received;
  }

  /** True between a frame's first byte and its last. */
  get midFrame(): boolean {
    return this.#headerFill > 0 || this.#current !== undefined;
  }

  /** Takes the next chunk of the stream; returns what it completed, in order. */
  push(chunk: Buffer): Decoded[] {
    const out: Decoded[] = [];
    let at = 0;
    while (at < chunk.length) {
      if (this.#current === undefined) {
        const take = Math.min(HEADER_BYTES - this.#headerFill, chunk.length - at);
        chunk.copy(this.#header, this.#headerFill, at, at + take);
        this.#headerFill += take;
        at += take;
        if (this.#headerFill < HEADER_BYTES) break;
        this.#headerFill = 0;
        const header: FrameHeader = {
          length: this.#header.readUInt32BE(0),
          streamId: this.#header.readUInt32BE(4),
          type: this.#header.readUInt8(8),
          flags: this.#header.readUInt8(9),
        };
        const reason = header.length > this.#maxPayload ? 'oversized' : knownType(header.type) ? undefined : 'unknown type';
        if (reason !== undefined) out.push({ kind: 'skipped', header, reason });
        this.#current = header;
        this.#skipping = reason !== undefined;
        this.#received = 0;
      }
      const current = this.#current;
      const take = Math.min(current.length - this.#received, chunk.length - at);
      this.#received += take;
      const whole = this.#received === current.length;
      // A part kept past this chunk is copied: a view would keep the whole chunk alive.
      if (!this.#skipping && take > 0) this.#parts.push(whole ? chunk.subarray(at, at + take) : Buffer.from(chunk.subarray(at, at + take)));
      at += take;
      if (!whole) break;
      if (!this.#skipping) {
        const payload = this.#parts.length === 1 ? (this.#parts[0] as Buffer) : Buffer.concat(this.#parts, current.length);
        out.push({ kind: 'frame', frame: { ...current, payload } });
      }
      this.#parts = [];
      this.#current = undefined;
      this.#skipping = false;
      this.#received = 0;
    }
    return out;
  }
}
