/**
 * HPACK (RFC 7541), the header compression of HTTP/2: a complete decoder and a small
 * stateless encoder.
 *
 * Header names and values are byte strings; they are exposed as latin1 strings, one char
 * per byte, the way Node's own HTTP/2 stack does. An entry's size in the dynamic table is
 * therefore `name.length + value.length + 32`.
 */
import { huffmanDecode, huffmanDecodeCapacity } from './huffman.js';

/** A header field: name (lowercase in HTTP/2, not checked here) and value. */
export type Header = [name: string, value: string];

/**
 * A malformed header block. The decoder's state is undefined afterwards: the connection
 * must end with a COMPRESSION_ERROR (RFC 9113 section 4.3).
 */
export class HpackError extends Error {
  override readonly name = 'HpackError';
}

/** Appendix A: the static table, index 1 to 61. */
export const STATIC_TABLE: readonly (readonly [name: string, value: string])[] = [
  [':authority', ''],
  [':method', 'GET'],
  [':method', 'POST'],
  [':path', '/'],
  [':path', '/index.html'],
  [':scheme', 'http'],
  [':scheme', 'https'],
  [':status', '200'],
  [':status', '204'],
  [':status', '206'],
  [':status', '304'],
  [':status', '400'],
  [':status', '404'],
  [':status', '500'],
  ['accept-charset', ''],
  ['accept-encoding', 'gzip, deflate'],
  ['accept-language', ''],
  ['accept-ranges', ''],
  ['accept', ''],
  ['access-control-allow-origin', ''],
  ['age', ''],
  ['allow', ''],
  ['authorization', ''],
  ['cache-control', ''],
  ['content-disposition', ''],
  ['content-encoding', ''],
  ['content-language', ''],
  ['content-length', ''],
  ['content-location', ''],
  ['content-range', ''],
  ['content-type', ''],
  ['cookie', ''],
  ['date', ''],
  ['etag', ''],
  ['expect', ''],
  ['expires', ''],
  ['from', ''],
  ['host', ''],
  ['if-match', ''],
  ['if-modified-since', ''],
  ['if-none-match', ''],
  ['if-range', ''],
  ['if-unmodified-since', ''],
  ['last-modified', ''],
  ['link', ''],
  ['location', ''],
  ['max-forwards', ''],
  ['proxy-authenticate', ''],
  ['proxy-authorization', ''],
  ['range', ''],
  ['referer', ''],
  ['refresh', ''],
  ['retry-after', ''],
  ['server', ''],
  ['set-cookie', ''],
  ['strict-transport-security', ''],
  ['transfer-encoding', ''],
  ['user-agent', ''],
  ['vary', ''],
  ['via', ''],
  ['www-authenticate', ''],
];

const STATIC_COUNT = 61;
/** Static names and values by HPACK index (slot 0 unused), for branch-free lookups. */
const STATIC_NAMES: string[] = ['', ...STATIC_TABLE.map((e) => e[0])];
const STATIC_VALUES: string[] = ['', ...STATIC_TABLE.map((e) => e[1])];

/** The per-entry overhead of the dynamic table (section 4.1). */
const ENTRY_OVERHEAD = 32;
/** Largest integer accepted in a header block; anything larger cannot be meaningful. */
const MAX_INTEGER = 0x7fffffff;
/** Strings up to this length are built in JavaScript, which beats a call into native code. */
const SHORT_STRING = 12;

function latin1(buf: Buffer, start: number, end: number): string {
  const len = end - start;
  if (len > SHORT_STRING) return buf.toString('latin1', start, end);
  switch (len) {
    case 0:
      return '';
    case 1:
      return String.fromCharCode(buf[start] as number);
    case 2:
      return String.fromCharCode(buf[start] as number, buf[start + 1] as number);
    default: {
      let s = '';
      for (let i = start; i < end; i++) s += String.fromCharCode(buf[i] as number);
      return s;
    }
  }
}

/** Output of Huffman decoding, shared by all decoders: decoding is synchronous. */
let scratch: Buffer = Buffer.allocUnsafeSlow(1024);

/** Huffman-decodes `buf[start, end)` to a string. */
function huffmanString(buf: Buffer, start: number, end: number): string {
  const need = huffmanDecodeCapacity(end - start);
  if (scratch.length < need) scratch = Buffer.allocUnsafeSlow(Math.max(need, 2 * scratch.length));
  const n = huffmanDecode(buf, start, end, scratch);
  if (n < 0) throw new HpackError('invalid Huffman-coded string (EOS or bad padding)');
  return latin1(scratch, 0, n);
}

/*
 * A cache of short decoded strings, keyed by their bytes on the wire (Huffman-coded or
 * not), shared by all decoders. gRPC clients send the same few strings over and over
 * (paths, content types, user agents, metadata), and a hit costs two short loops instead
 * of Huffman decoding and a native string allocation. Direct-mapped: a slot holds the last
 * string that hashed to it.
 */
const CACHE_SLOTS = 1024;
/** Longest cached string, in wire bytes. */
const CACHE_MAX = 64;
const cacheBytes = new Uint8Array(CACHE_SLOTS * CACHE_MAX);
/** Per slot: 2 * wire length + Huffman bit, or -1 when empty. */
const cacheTags = new Int32Array(CACHE_SLOTS).fill(-1);
const cacheStrings: string[] = new Array<string>(CACHE_SLOTS).fill('');

/** The string at `buf[start, end)` (at most CACHE_MAX bytes), through the cache. */
function cachedString(buf: Buffer, start: number, end: number, huffman: number): string {
  const len = end - start;
  const tag = 2 * len + huffman;
  // The hash samples a few bytes: the full comparison below decides, a collision only
  // costs a miss. Strings that differ share a prefix more often than an ending.
  let h = Math.imul(tag, 0x9e3779b1);
  if (len > 0) {
    h = Math.imul(h ^ (buf[start] as number) ^ ((buf[start + (len >>> 1)] as number) << 8), 0x01000193);
    h = Math.imul(h ^ (buf[end - 1] as number) ^ ((buf[end - 1 - (len >>> 2)] as number) << 8), 0x01000193);
    if (len > 3) h = Math.imul(h ^ (buf[end - 2] as number) ^ ((buf[end - 3] as number) << 8), 0x01000193);
  }
  const slot = (h ^ (h >>> 16)) & (CACHE_SLOTS - 1);
  const base = slot * CACHE_MAX - start;
  if (cacheTags[slot] === tag) {
    let i = start;
    while (i < end && cacheBytes[base + i] === buf[i]) i++;
    if (i === end) return cacheStrings[slot] as string;
  }
  const s = huffman === 0 ? latin1(buf, start, end) : huffmanString(buf, start, end);
  for (let i = start; i < end; i++) cacheBytes[base + i] = buf[i] as number;
  cacheTags[slot] = tag;
  cacheStrings[slot] = s;
  return s;
}

function asBuffer(block: Uint8Array): Buffer {
  return Buffer.isBuffer(block) ? block : Buffer.from(block.buffer, block.byteOffset, block.byteLength);
}

/**
 * Decodes header blocks of one connection direction; keeps the dynamic table between
 * blocks, so blocks must be decoded in the order they arrive.
 */
export class HpackDecoder {
  /** The SETTINGS_HEADER_TABLE_SIZE we advertised: the peer may not exceed it. */
  readonly #maxLimit: number;
  /** The table's current maximum size, set by the peer with size updates. */
  #limit: number;
  #size = 0;
  // The dynamic table as a ring: the newest entry at #head, older ones before it.
  #names: string[];
  #values: string[];
  #mask: number;
  #head = 0;
  #count = 0;
  /** Read position in the block being decoded. */
  #pos = 0;

  constructor(maxTableSize = 4096) {
    if (!Number.isInteger(maxTableSize) || maxTableSize < 0 || maxTableSize > MAX_INTEGER) {
      throw new RangeError(`invalid HPACK table size ${maxTableSize}`);
    }
    this.#maxLimit = maxTableSize;
    this.#limit = maxTableSize;
    this.#names = new Array<string>(16).fill('');
    this.#values = new Array<string>(16).fill('');
    this.#mask = 15;
  }

  /** Sum of the dynamic table's entry sizes, in octets. */
  get dynamicTableSize(): number {
    return this.#size;
  }

  /** The dynamic table's current maximum size, in octets. */
  get dynamicTableLimit(): number {
    return this.#limit;
  }

  /** The dynamic table's entries, newest (index 62) first. */
  dynamicTable(): Header[] {
    const out: Header[] = [];
    for (let i = 0; i < this.#count; i++) {
      const slot = (this.#head - i) & this.#mask;
      out.push([this.#names[slot] as string, this.#values[slot] as string]);
    }
    return out;
  }

  /** Decodes one complete header block (HEADERS plus any CONTINUATION payloads). */
  decode(block: Uint8Array): Header[] {
    const buf = asBuffer(block);
    const end = buf.length;
    const out: Header[] = [];
    this.#pos = 0;
    while (this.#pos < end) {
      const b = buf[this.#pos] as number;
      if (b >= 0x80) {
        // 6.1: indexed header field.
        let index = b & 0x7f;
        this.#pos++;
        if (index === 0x7f) index = this.#integerTail(buf, end, 0x7f);
        if (index <= STATIC_COUNT) {
          if (index === 0) throw new HpackError('index 0 in an indexed header field');
          out.push([STATIC_NAMES[index] as string, STATIC_VALUES[index] as string]);
        } else {
          const slot = this.#slot(index);
          out.push([this.#names[slot] as string, this.#values[slot] as string]);
        }
      } else if (b >= 0x40) {
        // 6.2.1: literal with incremental indexing.
        const name = this.#literalName(buf, end, b, 0x3f);
        const value = this.#string(buf, end);
        this.#insert(name, value);
        out.push([name, value]);
      } else if (b >= 0x20) {
        // 6.3: dynamic table size update, only before the first field (section 4.2).
        if (out.length > 0) throw new HpackError('dynamic table size update after a header field');
        let size = b & 0x1f;
        this.#pos++;
        if (size === 0x1f) size = this.#integerTail(buf, end, 0x1f);
        if (size > this.#maxLimit) {
          throw new HpackError(`dynamic table size ${size} exceeds the advertised ${this.#maxLimit}`);
        }
        this.#limit = size;
        this.#evictTo(size);
      } else {
        // 6.2.2 and 6.2.3: literal without indexing, never indexed (0000 or 0001 prefix).
        // Never-indexed values are sensitive (credentials): they stay out of the cache.
        const name = this.#literalName(buf, end, b, 0x0f);
        out.push([name, this.#string(buf, end, b < 0x10)]);
      }
    }
    return out;
  }

  /** The name of a literal field: an index with the given prefix, else a string after it. */
  #literalName(buf: Buffer, end: number, first: number, prefix: number): string {
    let index = first & prefix;
    this.#pos++;
    if (index === 0) return this.#string(buf, end);
    if (index === prefix) index = this.#integerTail(buf, end, prefix);
    if (index <= STATIC_COUNT) return STATIC_NAMES[index] as string;
    return this.#names[this.#slot(index)] as string;
  }

  /** Ring slot of dynamic index `index` (> 61). */
  #slot(index: number): number {
    const i = index - STATIC_COUNT - 1;
    if (i >= this.#count) throw new HpackError(`index ${index} is beyond the table (${STATIC_COUNT + this.#count} entries)`);
    return (this.#head - i) & this.#mask;
  }

  /**
   * 5.1: the continuation bytes of an integer whose prefix was all ones; #pos is just
   * past the prefix byte.
   */
  #integerTail(buf: Buffer, end: number, prefix: number): number {
    let value = prefix;
    let scale = 1;
    for (;;) {
      if (this.#pos >= end) throw new HpackError('truncated integer');
      const b = buf[this.#pos++] as number;
      value += (b & 0x7f) * scale;
      if (b < 0x80) break;
      scale *= 128;
      if (scale > 2 ** 28) throw new HpackError('integer too long');
    }
    if (value > MAX_INTEGER) throw new HpackError('integer too large');
    return value;
  }

  /** 5.2: a string literal at #pos, raw or Huffman-coded. */
  #string(buf: Buffer, end: number, cache = true): string {
    if (this.#pos >= end) throw new HpackError('truncated header field: string expected');
    const b = buf[this.#pos++] as number;
    let len = b & 0x7f;
    if (len === 0x7f) len = this.#integerTail(buf, end, 0x7f);
    const start = this.#pos;
    if (len > end - start) throw new HpackError('string literal runs past the end of the block');
    this.#pos = start + len;
    if (len <= CACHE_MAX && cache) return cachedString(buf, start, start + len, b >>> 7);
    return b < 0x80 ? latin1(buf, start, start + len) : huffmanString(buf, start, start + len);
  }

  /** 4.4: adds an entry, evicting old ones; an entry larger than the table empties it. */
  #insert(name: string, value: string): void {
    const size = name.length + value.length + ENTRY_OVERHEAD;
    if (size > this.#limit) {
      this.#evictTo(0);
      return;
    }
    this.#evictTo(this.#limit - size);
    if (this.#count > this.#mask) this.#grow();
    this.#head = (this.#head + 1) & this.#mask;
    this.#names[this.#head] = name;
    this.#values[this.#head] = value;
    this.#count++;
    this.#size += size;
  }

  /** Evicts the oldest entries until the table's size is at most `target`. */
  #evictTo(target: number): void {
    while (this.#size > target) {
      const slot = (this.#head - this.#count + 1) & this.#mask;
      this.#size -= (this.#names[slot] as string).length + (this.#values[slot] as string).length + ENTRY_OVERHEAD;
      this.#names[slot] = '';
      this.#values[slot] = '';
      this.#count--;
    }
  }

  /** Doubles the ring, moving the entries to slots 0 (oldest) to count - 1 (newest). */
  #grow(): void {
    const cap = 2 * (this.#mask + 1);
    const names = new Array<string>(cap).fill('');
    const values = new Array<string>(cap).fill('');
    for (let i = 0; i < this.#count; i++) {
      const slot = (this.#head - this.#count + 1 + i) & this.#mask;
      names[i] = this.#names[slot] as string;
      values[i] = this.#values[slot] as string;
    }
    this.#names = names;
    this.#values = values;
    this.#mask = cap - 1;
    this.#head = this.#count - 1;
  }
}

/** A static name's index, and the indexes of its full (name, value) entries. */
interface StaticName {
  readonly index: number;
  readonly values: ReadonlyMap<string, number>;
}

const STATIC_BY_NAME = new Map<string, StaticName>();
STATIC_TABLE.forEach(([name, value], i) => {
  let entry = STATIC_BY_NAME.get(name);
  if (entry === undefined) {
    entry = { index: i + 1, values: new Map<string, number>() };
    STATIC_BY_NAME.set(name, entry);
  }
  const values = entry.values as Map<string, number>;
  if (!values.has(value)) values.set(value, i + 1);
});

/** Writes an HPACK integer with an N-bit prefix (`prefix` = 2^N - 1) over `flags`. */
function writeInteger(out: Buffer, p: number, value: number, prefix: number, flags: number): number {
  if (value < prefix) {
    out[p++] = flags | value;
    return p;
  }
  out[p++] = flags | prefix;
  value -= prefix;
  while (value >= 0x80) {
    out[p++] = (value & 0x7f) | 0x80;
    value = Math.floor(value / 128);
  }
  out[p++] = value;
  return p;
}

/** Strings up to this length are copied in JavaScript, which beats a call into native code. */
const SHORT_WRITE = 40;

/** Writes a raw (non-Huffman) string literal; chars above 0xff are not representable. */
function writeString(out: Buffer, p: number, s: string): number {
  const len = s.length;
  p = writeInteger(out, p, len, 0x7f, 0);
  if (len > SHORT_WRITE) return p + out.write(s, p, len, 'latin1');
  for (let i = 0; i < len; i++) out[p + i] = s.charCodeAt(i);
  return p + len;
}

/** Where blocks are assembled before being copied out at their exact size. */
let encodeScratch: Buffer = Buffer.allocUnsafeSlow(4096);

/**
 * A stateless encoder: fields that match a static entry exactly (like `:status: 200`) are
 * indexed, everything else is a literal without indexing, naming a static entry when it
 * can, with raw strings. It never touches the peer's dynamic table, so its output can be
 * cached and sent on any connection in any order.
 */
export class HpackEncoder {
  /**
   * Encodes a header block into a new buffer (which may be a slice of Node's allocation
   * pool; see `encodeStatic` for blocks kept for long). Names must already be lowercase;
   * values are latin1.
   */
  encode(headers: readonly Header[]): Buffer {
    const count = headers.length;
    let bound = 0;
    for (let i = 0; i < count; i++) {
      const h = headers[i] as Header;
      bound += h[0].length + h[1].length + 12;
    }
    if (encodeScratch.length < bound) encodeScratch = Buffer.allocUnsafeSlow(Math.max(bound, 2 * encodeScratch.length));
    const tmp = encodeScratch;
    let p = 0;
    for (let i = 0; i < count; i++) {
      const h = headers[i] as Header;
      const name = h[0];
      const value = h[1];
      const known = STATIC_BY_NAME.get(name);
      if (known === undefined) {
        tmp[p++] = 0;
        p = writeString(tmp, p, name);
      } else {
        const full = known.values.get(value);
        if (full !== undefined) {
          tmp[p++] = 0x80 | full;
          continue;
        }
        p = writeInteger(tmp, p, known.index, 0x0f, 0);
      }
      p = writeString(tmp, p, value);
    }
    const out = Buffer.allocUnsafe(p);
    if (p > 256) tmp.copy(out, 0, 0, p);
    else for (let i = 0; i < p; i++) out[i] = tmp[i] as number;
    return out;
  }
}

const sharedEncoder = new HpackEncoder();

/**
 * Encodes a constant header block once, to be cached: the same bytes as `encode`, in a
 * buffer of its own (not a slice of Node's shared allocation pool).
 */
export function encodeStatic(headers: readonly Header[]): Buffer {
  const bytes = sharedEncoder.encode(headers);
  const own = Buffer.alloc(bytes.length);
  bytes.copy(own);
  return own;
}
