/**
 * The HPACK Huffman code (RFC 7541 section 5.2 and Appendix B).
 *
 * Decoding runs a byte-at-a-time state machine built once at module load: the states are
 * the 256 internal nodes of the code tree, and each (state, input byte) pair maps to one
 * table word holding the next state, the zero to two symbols completed on the way, and a
 * failure flag for the EOS symbol. A string is valid when it ends in a state reached from
 * the root by at most seven 1-bits (padding made of the most significant bits of EOS).
 */

/**
 * Appendix B: code and bit length of each symbol, 0 to 255, then EOS (256). Codes are
 * right-aligned in the number. The code is canonical: within one length, codes increase
 * with the symbol, and each length continues where the previous one left off.
 */
const CODE_TABLE: readonly number[] = [
  /*   0 */ 0x1ff8, 13, 0x7fffd8, 23, 0xfffffe2, 28, 0xfffffe3, 28,
  /*   4 */ 0xfffffe4, 28, 0xfffffe5, 28, 0xfffffe6, 28, 0xfffffe7, 28,
  /*   8 */ 0xfffffe8, 28, 0xffffea, 24, 0x3ffffffc, 30, 0xfffffe9, 28,
  /*  12 */ 0xfffffea, 28, 0x3ffffffd, 30, 0xfffffeb, 28, 0xfffffec, 28,
  /*  16 */ 0xfffffed, 28, 0xfffffee, 28, 0xfffffef, 28, 0xffffff0, 28,
  /*  20 */ 0xffffff1, 28, 0xffffff2, 28, 0x3ffffffe, 30, 0xffffff3, 28,
  /*  24 */ 0xffffff4, 28, 0xffffff5, 28, 0xffffff6, 28, 0xffffff7, 28,
  /*  28 */ 0xffffff8, 28, 0xffffff9, 28, 0xffffffa, 28, 0xffffffb, 28,
  /*  32 */ 0x14, 6, 0x3f8, 10, 0x3f9, 10, 0xffa, 12,
  /*  36 */ 0x1ff9, 13, 0x15, 6, 0xf8, 8, 0x7fa, 11,
  /*  40 */ 0x3fa, 10, 0x3fb, 10, 0xf9, 8, 0x7fb, 11,
  /*  44 */ 0xfa, 8, 0x16, 6, 0x17, 6, 0x18, 6,
  /*  48 */ 0x0, 5, 0x1, 5, 0x2, 5, 0x19, 6,
  /*  52 */ 0x1a, 6, 0x1b, 6, 0x1c, 6, 0x1d, 6,
  /*  56 */ 0x1e, 6, 0x1f, 6, 0x5c, 7, 0xfb, 8,
  /*  60 */ 0x7ffc, 15, 0x20, 6, 0xffb, 12, 0x3fc, 10,
  /*  64 */ 0x1ffa, 13, 0x21, 6, 0x5d, 7, 0x5e, 7,
  /*  68 */ 0x5f, 7, 0x60, 7, 0x61, 7, 0x62, 7,
  /*  72 */ 0x63, 7, 0x64, 7, 0x65, 7, 0x66, 7,
  /*  76 */ 0x67, 7, 0x68, 7, 0x69, 7, 0x6a, 7,
  /*  80 */ 0x6b, 7, 0x6c, 7, 0x6d, 7, 0x6e, 7,
  /*  84 */ 0x6f, 7, 0x70, 7, 0x71, 7, 0x72, 7,
  /*  88 */ 0xfc, 8, 0x73, 7, 0xfd, 8, 0x1ffb, 13,
  /*  92 */ 0x7fff0, 19, 0x1ffc, 13, 0x3ffc, 14, 0x22, 6,
  /*  96 */ 0x7ffd, 15, 0x3, 5, 0x23, 6, 0x4, 5,
  /* 100 */ 0x24, 6, 0x5, 5, 0x25, 6, 0x26, 6,
  /* 104 */ 0x27, 6, 0x6, 5, 0x74, 7, 0x75, 7,
  /* 108 */ 0x28, 6, 0x29, 6, 0x2a, 6, 0x7, 5,
  /* 112 */ 0x2b, 6, 0x76, 7, 0x2c, 6, 0x8, 5,
  /* 116 */ 0x9, 5, 0x2d, 6, 0x77, 7, 0x78, 7,
  /* 120 */ 0x79, 7, 0x7a, 7, 0x7b, 7, 0x7ffe, 15,
  /* 124 */ 0x7fc, 11, 0x3ffd, 14, 0x1ffd, 13, 0xffffffc, 28,
  /* 128 */ 0xfffe6, 20, 0x3fffd2, 22, 0xfffe7, 20, 0xfffe8, 20,
  /* 132 */ 0x3fffd3, 22, 0x3fffd4, 22, 0x3fffd5, 22, 0x7fffd9, 23,
  /* 136 */ 0x3fffd6, 22, 0x7fffda, 23, 0x7fffdb, 23, 0x7fffdc, 23,
  /* 140 */ 0x7fffdd, 23, 0x7fffde, 23, 0xffffeb, 24, 0x7fffdf, 23,
  /* 144 */ 0xffffec, 24, 0xffffed, 24, 0x3fffd7, 22, 0x7fffe0, 23,
  /* 148 */ 0xffffee, 24, 0x7fffe1, 23, 0x7fffe2, 23, 0x7fffe3, 23,
  /* 152 */ 0x7fffe4, 23, 0x1fffdc, 21, 0x3fffd8, 22, 0x7fffe5, 23,
  /* 156 */ 0x3fffd9, 22, 0x7fffe6, 23, 0x7fffe7, 23, 0xffffef, 24,
  /* 160 */ 0x3fffda, 22, 0x1fffdd, 21, 0xfffe9, 20, 0x3fffdb, 22,
  /* 164 */ 0x3fffdc, 22, 0x7fffe8, 23, 0x7fffe9, 23, 0x1fffde, 21,
  /* 168 */ 0x7fffea, 23, 0x3fffdd, 22, 0x3fffde, 22, 0xfffff0, 24,
  /* 172 */ 0x1fffdf, 21, 0x3fffdf, 22, 0x7fffeb, 23, 0x7fffec, 23,
  /* 176 */ 0x1fffe0, 21, 0x1fffe1, 21, 0x3fffe0, 22, 0x1fffe2, 21,
  /* 180 */ 0x7fffed, 23, 0x3fffe1, 22, 0x7fffee, 23, 0x7fffef, 23,
  /* 184 */ 0xfffea, 20, 0x3fffe2, 22, 0x3fffe3, 22, 0x3fffe4, 22,
  /* 188 */ 0x7ffff0, 23, 0x3fffe5, 22, 0x3fffe6, 22, 0x7ffff1, 23,
  /* 192 */ 0x3ffffe0, 26, 0x3ffffe1, 26, 0xfffeb, 20, 0x7fff1, 19,
  /* 196 */ 0x3fffe7, 22, 0x7ffff2, 23, 0x3fffe8, 22, 0x1ffffec, 25,
  /* 200 */ 0x3ffffe2, 26, 0x3ffffe3, 26, 0x3ffffe4, 26, 0x7ffffde, 27,
  /* 204 */ 0x7ffffdf, 27, 0x3ffffe5, 26, 0xfffff1, 24, 0x1ffffed, 25,
  /* 208 */ 0x7fff2, 19, 0x1fffe3, 21, 0x3ffffe6, 26, 0x7ffffe0, 27,
  /* 212 */ 0x7ffffe1, 27, 0x3ffffe7, 26, 0x7ffffe2, 27, 0xfffff2, 24,
  /* 216 */ 0x1fffe4, 21, 0x1fffe5, 21, 0x3ffffe8, 26, 0x3ffffe9, 26,
  /* 220 */ 0xffffffd, 28, 0x7ffffe3, 27, 0x7ffffe4, 27, 0x7ffffe5, 27,
  /* 224 */ 0xfffec, 20, 0xfffff3, 24, 0xfffed, 20, 0x1fffe6, 21,
  /* 228 */ 0x3fffe9, 22, 0x1fffe7, 21, 0x1fffe8, 21, 0x7ffff3, 23,
  /* 232 */ 0x3fffea, 22, 0x3fffeb, 22, 0x1ffffee, 25, 0x1ffffef, 25,
  /* 236 */ 0xfffff4, 24, 0xfffff5, 24, 0x3ffffea, 26, 0x7ffff4, 23,
  /* 240 */ 0x3ffffeb, 26, 0x7ffffe6, 27, 0x3ffffec, 26, 0x3ffffed, 26,
  /* 244 */ 0x7ffffe7, 27, 0x7ffffe8, 27, 0x7ffffe9, 27, 0x7ffffea, 27,
  /* 248 */ 0x7ffffeb, 27, 0xffffffe, 28, 0x7ffffec, 27, 0x7ffffed, 27,
  /* 252 */ 0x7ffffee, 27, 0x7ffffef, 27, 0x7fffff0, 27, 0x3ffffee, 26,
  /* 256 */ 0x3fffffff, 30,
];

/** The end-of-string symbol; never valid inside a string. */
export const EOS = 256;

/** Code of each symbol (0 to 256), right-aligned. */
export const HUFFMAN_CODES: Uint32Array = new Uint32Array(257);
/** Bit length of each symbol's code (5 to 30). */
export const HUFFMAN_LENGTHS: Uint8Array = new Uint8Array(257);
for (let sym = 0; sym <= EOS; sym++) {
  HUFFMAN_CODES[sym] = CODE_TABLE[2 * sym] ?? 0;
  HUFFMAN_LENGTHS[sym] = CODE_TABLE[2 * sym + 1] ?? 0;
}

// Layout of a transition word.
const STATE_MASK = 0xff; // bits 0-7: next state
const SYM1_SHIFT = 8; // bits 8-15: first symbol completed by this byte
const SYM2_SHIFT = 16; // bits 16-23: second symbol
const COUNT_SHIFT = 24; // bits 24-25: how many symbols (0, 1 or 2)
const FAIL = 1 << 26; // the byte completes EOS

/** Transitions, indexed by state * 256 + input byte. */
const TRANSITIONS = new Uint32Array(256 * 256);
/** 1 for states in which a string may end (the padding so far is valid). */
const ACCEPTING = new Uint8Array(256);

function buildDecoder(): void {
  // The code tree. Internal nodes are numbered from 0 (the root) in creation order; a child
  // slot holds an internal node's number, or ~symbol for a leaf. A complete prefix code with
  // 257 leaves has exactly 256 internal nodes, which is what makes a state fit in a byte.
  const UNSET = 0x7fffffff;
  const children = new Int32Array(2 * 256).fill(UNSET);
  let nodes = 1;
  for (let sym = 0; sym <= EOS; sym++) {
    const code = HUFFMAN_CODES[sym] ?? 0;
    const len = HUFFMAN_LENGTHS[sym] ?? 0;
    let node = 0;
    for (let bit = len - 1; bit >= 0; bit--) {
      const slot = 2 * node + ((code >>> bit) & 1);
      const child = children[slot] ?? UNSET;
      if (bit === 0) {
        if (child !== UNSET) throw new Error(`huffman table: code of symbol ${sym} is not prefix-free`);
        children[slot] = ~sym;
      } else if (child === UNSET) {
        if (nodes === 256) throw new Error('huffman table: too many internal nodes');
        children[slot] = nodes;
        node = nodes++;
      } else {
        if (child < 0) throw new Error(`huffman table: code of symbol ${sym} is not prefix-free`);
        node = child;
      }
    }
  }
  if (nodes !== 256 || children.includes(UNSET)) throw new Error('huffman table: the code is not complete');

  for (let state = 0; state < 256; state++) {
    for (let byte = 0; byte < 256; byte++) {
      let node = state;
      let count = 0;
      let syms = 0;
      let fail = 0;
      for (let bit = 7; bit >= 0; bit--) {
        const child = children[2 * node + ((byte >>> bit) & 1)] ?? 0;
        if (child >= 0) {
          node = child;
          continue;
        }
        const sym = ~child;
        if (sym === EOS) {
          fail = FAIL;
          node = 0;
          break;
        }
        syms |= sym << (count === 0 ? SYM1_SHIFT : SYM2_SHIFT);
        count++;
        node = 0;
      }
      TRANSITIONS[state * 256 + byte] = (fail | (count << COUNT_SHIFT) | syms | node) >>> 0;
    }
  }

  // Valid padding: up to 7 bits, all ones, i.e. a prefix of EOS.
  let node = 0;
  ACCEPTING[0] = 1;
  for (let i = 1; i <= 7; i++) {
    node = children[2 * node + 1] ?? 0;
    ACCEPTING[node] = 1;
  }
}
buildDecoder();

/**
 * Room `huffmanDecode` needs in its output for `encodedLength` input bytes: the shortest
 * code is 5 bits, and the decoder may write up to two bytes past the decoded length.
 */
export function huffmanDecodeCapacity(encodedLength: number): number {
  return Math.floor((encodedLength * 8) / 5) + 2;
}

/**
 * Decodes `src[start, end)` into `out` from index 0 and returns the decoded length, or -1
 * when the input holds EOS or ends in invalid padding (RFC 7541 section 5.2). `out` must
 * have `huffmanDecodeCapacity(end - start)` bytes.
 */
export function huffmanDecode(src: Uint8Array, start: number, end: number, out: Uint8Array): number {
  let state = 0;
  let n = 0;
  for (let i = start; i < end; i++) {
    const t = TRANSITIONS[(state << 8) | (src[i] as number)] as number;
    if ((t & FAIL) !== 0) return -1;
    // Both symbol slots are written unconditionally; only `count` of them are kept.
    out[n] = t >>> SYM1_SHIFT;
    out[n + 1] = t >>> SYM2_SHIFT;
    n += (t >>> COUNT_SHIFT) & 3;
    state = t & STATE_MASK;
  }
  return ACCEPTING[state] === 1 ? n : -1;
}

/** Length in bytes of the Huffman encoding of `src`. */
export function huffmanEncodedLength(src: Uint8Array): number {
  let bits = 0;
  for (let i = 0; i < src.length; i++) bits += HUFFMAN_LENGTHS[src[i] as number] as number;
  return Math.ceil(bits / 8);
}

/** Huffman-encodes `src`, padding the last byte with the high bits of EOS. */
export function huffmanEncode(src: Uint8Array): Buffer {
  const out = Buffer.allocUnsafe(huffmanEncodedLength(src));
  let n = 0;
  // Pending bits, kept below 8 between symbols so acc stays below 2^38 (exact in a double).
  let acc = 0;
  let bits = 0;
  for (let i = 0; i < src.length; i++) {
    const sym = src[i] as number;
    const len = HUFFMAN_LENGTHS[sym] as number;
    acc = acc * 2 ** len + (HUFFMAN_CODES[sym] as number);
    bits += len;
    while (bits >= 8) {
      bits -= 8;
      const div = 2 ** bits;
      const byte = Math.floor(acc / div);
      out[n++] = byte & 0xff;
      acc -= byte * div;
    }
  }
  if (bits > 0) out[n++] = ((acc << (8 - bits)) | (0xff >>> bits)) & 0xff;
  return out;
}
