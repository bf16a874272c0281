// The HPACK codec (RFC 7541): the Huffman code, the examples of Appendix C, round trips
// through our encoder and decoder, malformed input, and interoperation with Node's own
// HTTP/2 stack (nghttp2) in both directions: a node:http2 client's request header blocks,
// captured on a raw socket, go through our decoder, and our encoder's response blocks go
// through the client's decoder.
import assert from 'node:assert/strict';
import { once } from 'node:events';
import http2 from 'node:http2';
import net from 'node:net';
import { describe, test } from 'node:test';
import {
  HpackDecoder,
  HpackEncoder,
  HpackError,
  STATIC_TABLE,
  encodeStatic,
  type Header,
} from '../../src/transport/h2/hpack.js';
import {
  EOS,
  HUFFMAN_CODES,
  HUFFMAN_LENGTHS,
  huffmanDecode,
  huffmanDecodeCapacity,
  huffmanEncode,
} from '../../src/transport/h2/huffman.js';

/** Bytes from hex, ignoring whitespace. */
const hex = (s: string): Buffer => Buffer.from(s.replace(/\s+/g, ''), 'hex');

/** Deterministic pseudo-random numbers (xorshift32), so failures reproduce. */
function prng(seed: number): (n: number) => number {
  let x = seed >>> 0 || 1;
  return (n) => {
    x ^= x << 13;
    x >>>= 0;
    x ^= x >>> 17;
    x ^= x << 5;
    x >>>= 0;
    return x % n;
  };
}

/** Decodes with our Huffman decoder; undefined when the decoder rejects the input. */
function huffDecode(bytes: Uint8Array): Buffer | undefined {
  const out = Buffer.alloc(huffmanDecodeCapacity(bytes.length));
  const n = huffmanDecode(bytes, 0, bytes.length, out);
  return n < 0 ? undefined : out.subarray(0, n);
}

// Block building for tests: integers with a prefix and raw or Huffman strings.
function int(value: number, prefixBits: number, flags: number): number[] {
  const max = (1 << prefixBits) - 1;
  if (value < max) return [flags | value];
  const out = [flags | max];
  value -= max;
  while (value >= 128) {
    out.push((value % 128) | 0x80);
    value = Math.floor(value / 128);
  }
  out.push(value);
  return out;
}
function str(s: string, huffman = false): number[] {
  const bytes = Buffer.from(s, 'latin1');
  const body = huffman ? huffmanEncode(bytes) : bytes;
  return [...int(body.length, 7, huffman ? 0x80 : 0), ...body];
}

describe('Huffman code', () => {
  test('the code table is a complete canonical prefix code', () => {
    const syms = Array.from({ length: 257 }, (_, i) => i).sort(
      (a, b) => (HUFFMAN_LENGTHS[a] as number) - (HUFFMAN_LENGTHS[b] as number) || a - b,
    );
    let code = 0;
    let len = HUFFMAN_LENGTHS[syms[0] as number] as number;
    assert.equal(len, 5);
    for (const sym of syms) {
      const l = HUFFMAN_LENGTHS[sym] as number;
      code *= 2 ** (l - len);
      len = l;
      assert.equal(HUFFMAN_CODES[sym], code, `symbol ${sym}`);
      code++;
    }
    // The last code (EOS) is all ones: the Kraft sum is exactly 1.
    assert.equal(syms[256], EOS);
    assert.equal(code, 2 ** 30);
    assert.equal(HUFFMAN_CODES[EOS], 0x3fffffff);
    assert.equal(HUFFMAN_LENGTHS[EOS], 30);
  });

  test('known codes of Appendix B', () => {
    const known: [string, number, number][] = [
      ['0', 0x0, 5], ['a', 0x3, 5], ['t', 0x9, 5], [' ', 0x14, 6], ['/', 0x18, 6],
      [':', 0x5c, 7], ['X', 0xfc, 8], ['\\', 0x7fff0, 19], ['~', 0x1ffd, 13],
    ];
    for (const [ch, code, len] of known) {
      const sym = ch.charCodeAt(0);
      assert.equal(HUFFMAN_CODES[sym], code, ch);
      assert.equal(HUFFMAN_LENGTHS[sym], len, ch);
    }
  });

  test('every byte value round-trips, alone and in long random strings', () => {
    for (let b = 0; b < 256; b++) {
      assert.deepEqual(huffDecode(huffmanEncode(Buffer.from([b]))), Buffer.from([b]), `byte ${b}`);
    }
    const rnd = prng(7);
    for (let round = 0; round < 50; round++) {
      const src = Buffer.from(Array.from({ length: rnd(3000) }, () => rnd(256)));
      assert.deepEqual(huffDecode(huffmanEncode(src)), src);
    }
  });

  test('encodings from Appendix C', () => {
    const cases: [string, string][] = [
      ['www.example.com', 'f1e3c2e5f23a6ba0ab90f4ff'],
      ['no-cache', 'a8eb10649cbf'],
      ['custom-key', '25a849e95ba97d7f'],
      ['custom-value', '25a849e95bb8e8b4bf'],
      ['302', '6402'],
      ['private', 'aec3771a4b'],
      ['Mon, 21 Oct 2013 20:13:21 GMT', 'd07abe941054d444a8200595040b8166e082a62d1bff'],
      ['https://www.example.com', '9d29ad171863c78f0b97c8e9ae82ae43d3'],
    ];
    for (const [text, code] of cases) {
      assert.equal(huffmanEncode(Buffer.from(text)).toString('hex'), code);
      assert.equal(huffDecode(hex(code))?.toString('latin1'), text);
    }
  });

  test('empty input, valid and invalid padding, EOS', () => {
    assert.deepEqual(huffDecode(new Uint8Array(0)), Buffer.alloc(0));
    assert.equal(huffDecode(hex('1f'))?.toString(), 'a'); // 00011 + 111
    assert.equal(huffDecode(hex('18')), undefined); // 00011 + 000: padding not ones
    assert.equal(huffDecode(hex('1e')), undefined); // 00011 + 110
    assert.equal(huffDecode(hex('1fff')), undefined); // 'a' + 11 bits of padding
    assert.equal(huffDecode(hex('ff')), undefined); // 8 bits of padding
    assert.equal(huffDecode(hex('ffffffff')), undefined); // EOS (30 ones)
    assert.equal(huffDecode(hex('1fffffffff')), undefined); // 'a', then EOS
    // EOS followed by a valid symbol is still an error.
    assert.equal(huffDecode(hex('fffffffc 1f')), undefined);
  });
});

describe('RFC 7541 Appendix C', () => {
  test('C.1 integers: 10 and 1337 with a 5-bit prefix (as table size updates)', () => {
    const d = new HpackDecoder(4096);
    assert.deepEqual(d.decode(hex('2a')), []);
    assert.equal(d.dynamicTableLimit, 10);
    assert.deepEqual(d.decode(hex('3f9a0a')), []);
    assert.equal(d.dynamicTableLimit, 1337);
  });

  test('C.2.1 literal header field with indexing', () => {
    const d = new HpackDecoder();
    const block = hex('400a 6375 7374 6f6d 2d6b 6579 0d63 7573 746f 6d2d 6865 6164 6572');
    assert.deepEqual(d.decode(block), [['custom-key', 'custom-header']]);
    assert.deepEqual(d.dynamicTable(), [['custom-key', 'custom-header']]);
    assert.equal(d.dynamicTableSize, 55);
  });

  test('C.2.2 literal header field without indexing', () => {
    const d = new HpackDecoder();
    assert.deepEqual(d.decode(hex('040c 2f73 616d 706c 652f 7061 7468')), [[':path', '/sample/path']]);
    assert.deepEqual(d.dynamicTable(), []);
  });

  test('C.2.3 literal header field never indexed', () => {
    const d = new HpackDecoder();
    assert.deepEqual(d.decode(hex('1008 7061 7373 776f 7264 0673 6563 7265 74')), [['password', 'secret']]);
    assert.deepEqual(d.dynamicTable(), []);
  });

  test('C.2.4 indexed header field', () => {
    const d = new HpackDecoder();
    assert.deepEqual(d.decode(hex('82')), [[':method', 'GET']]);
    assert.deepEqual(d.dynamicTable(), []);
  });

  const requests: Header[][] = [
    [[':method', 'GET'], [':scheme', 'http'], [':path', '/'], [':authority', 'www.example.com']],
    [[':method', 'GET'], [':scheme', 'http'], [':path', '/'], [':authority', 'www.example.com'], ['cache-control', 'no-cache']],
    [[':method', 'GET'], [':scheme', 'https'], [':path', '/index.html'], [':authority', 'www.example.com'], ['custom-key', 'custom-value']],
  ];
  const requestTables: { table: Header[]; size: number }[] = [
    { table: [[':authority', 'www.example.com']], size: 57 },
    { table: [['cache-control', 'no-cache'], [':authority', 'www.example.com']], size: 110 },
    { table: [['custom-key', 'custom-value'], ['cache-control', 'no-cache'], [':authority', 'www.example.com']], size: 164 },
  ];

  function runSequence(d: HpackDecoder, blocks: string[], expected: Header[][], tables: { table: Header[]; size: number }[]): void {
    blocks.forEach((block, i) => {
      assert.deepEqual(d.decode(hex(block)), expected[i], `block ${i + 1}`);
      assert.deepEqual(d.dynamicTable(), tables[i]?.table, `table after block ${i + 1}`);
      assert.equal(d.dynamicTableSize, tables[i]?.size, `table size after block ${i + 1}`);
    });
  }

  test('C.3 requests without Huffman coding', () => {
    runSequence(
      new HpackDecoder(),
      [
        '8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d',
        '8286 84be 5808 6e6f 2d63 6163 6865',
        '8287 85bf 400a 6375 7374 6f6d 2d6b 6579 0c63 7573 746f 6d2d 7661 6c75 65',
      ],
      requests,
      requestTables,
    );
  });

  test('C.4 requests with Huffman coding', () => {
    runSequence(
      new HpackDecoder(),
      [
        '8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff',
        '8286 84be 5886 a8eb 1064 9cbf',
        '8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf',
      ],
      requests,
      requestTables,
    );
  });

  const date1 = 'Mon, 21 Oct 2013 20:13:21 GMT';
  const date2 = 'Mon, 21 Oct 2013 20:13:22 GMT';
  const location = 'https://www.example.com';
  const cookie = 'foo=ASDJKHQKBZXOQWEOPIUAXQWEOIU; max-age=3600; version=1';
  const responses: Header[][] = [
    [[':status', '302'], ['cache-control', 'private'], ['date', date1], ['location', location]],
    [[':status', '307'], ['cache-control', 'private'], ['date', date1], ['location', location]],
    [
      [':status', '200'], ['cache-control', 'private'], ['date', date2], ['location', location],
      ['content-encoding', 'gzip'], ['set-cookie', cookie],
    ],
  ];
  const responseTables: { table: Header[]; size: number }[] = [
    { table: [['location', location], ['date', date1], ['cache-control', 'private'], [':status', '302']], size: 222 },
    { table: [[':status', '307'], ['location', location], ['date', date1], ['cache-control', 'private']], size: 222 },
    { table: [['set-cookie', cookie], ['content-encoding', 'gzip'], ['date', date2]], size: 215 },
  ];

  test('C.5 responses without Huffman coding, table size 256 (eviction)', () => {
    runSequence(
      new HpackDecoder(256),
      [
        `4803 3330 3258 0770 7269 7661 7465 611d 4d6f 6e2c 2032 3120 4f63 7420 3230 3133
         2032 303a 3133 3a32 3120 474d 546e 1768 7474 7073 3a2f 2f77 7777 2e65 7861 6d70
         6c65 2e63 6f6d`,
        '4803 3330 37c1 c0bf',
        `88c1 611d 4d6f 6e2c 2032 3120 4f63 7420 3230 3133 2032 303a 3133 3a32 3220 474d
         54c0 5a04 677a 6970 7738 666f 6f3d 4153 444a 4b48 514b 425a 584f 5157 454f 5049
         5541 5851 5745 4f49 553b 206d 6178 2d61 6765 3d33 3630 303b 2076 6572 7369 6f6e
         3d31`,
      ],
      responses,
      responseTables,
    );
  });

  test('C.6 responses with Huffman coding, table size 256 (eviction)', () => {
    runSequence(
      new HpackDecoder(256),
      [
        `4882 6402 5885 aec3 771a 4b61 96d0 7abe 9410 54d4 44a8 2005 9504 0b81 66e0 82a6
         2d1b ff6e 919d 29ad 1718 63c7 8f0b 97c8 e9ae 82ae 43d3`,
        '4883 640e ffc1 c0bf',
        `88c1 6196 d07a be94 1054 d444 a820 0595 040b 8166 e084 a62d 1bff c05a 839b d9ab
         77ad 94e7 821d d7f2 e6c7 b335 dfdf cd5b 3960 d5af 2708 7f36 72c1 ab27 0fb5 291f
         9587 3160 65c0 03ed 4ee5 b106 3d50 07`,
      ],
      responses,
      responseTables,
    );
  });
});

describe('HpackDecoder', () => {
  test('all 61 static entries, by index and as literal names', () => {
    const d = new HpackDecoder();
    const block = STATIC_TABLE.map((_, i) => 0x80 | (i + 1));
    assert.deepEqual(d.decode(Buffer.from(block)), STATIC_TABLE);
    const literal = STATIC_TABLE.flatMap((_, i) => [...int(i + 1, 4, 0x00), ...str('v')]);
    assert.deepEqual(
      d.decode(Buffer.from(literal)),
      STATIC_TABLE.map(([name]) => [name, 'v']),
    );
  });

  test('accepts a Uint8Array view that does not start its buffer', () => {
    const backing = new Uint8Array([0xff, 0xff, 0x82, 0x84, 0xff]);
    assert.deepEqual(new HpackDecoder().decode(backing.subarray(2, 4)), [[':method', 'GET'], [':path', '/']]);
  });

  test('indexed names from the dynamic table; never-indexed and without-indexing literals', () => {
    const d = new HpackDecoder();
    d.decode(Buffer.from([0x40, ...str('x-name'), ...str('one')]));
    const block = [
      0xbe, // 62: x-name: one
      0x7e, ...str('two'), // incremental, name 62: x-name: two (now 62; x-name: one is 63)
      0x0f, 0x30, ...str('three', true), // without indexing, name 63 (15 + 48)
      0x1f, 0x2f, ...str('four'), // never indexed, name 62
      0xbf, // 63
    ];
    assert.deepEqual(d.decode(Buffer.from(block)), [
      ['x-name', 'one'], ['x-name', 'two'], ['x-name', 'three'], ['x-name', 'four'], ['x-name', 'one'],
    ]);
    assert.deepEqual(d.dynamicTable(), [['x-name', 'two'], ['x-name', 'one']]);
  });

  test('eviction by the 32-octet overhead rule; an oversized entry empties the table', () => {
    const d = new HpackDecoder(100);
    // 'aaaa' + 10 chars + 32 = 46 octets each: two fit in 100, a third evicts the oldest.
    const add = (v: string): number[] => [0x40, ...str('aaaa'), ...str(v)];
    d.decode(Buffer.from([...add('0123456789'), ...add('abcdefghij')]));
    assert.equal(d.dynamicTableSize, 92);
    d.decode(Buffer.from(add('ABCDEFGHIJ')));
    assert.deepEqual(d.dynamicTable(), [['aaaa', 'ABCDEFGHIJ'], ['aaaa', 'abcdefghij']]);
    assert.equal(d.dynamicTableSize, 92);
    // An entry exactly the table's size fits alone.
    d.decode(Buffer.from(add('x'.repeat(64))));
    assert.deepEqual(d.dynamicTable(), [['aaaa', 'x'.repeat(64)]]);
    assert.equal(d.dynamicTableSize, 100);
    // One octet more: the table ends up empty, the field is still emitted.
    assert.deepEqual(d.decode(Buffer.from(add('y'.repeat(65)))), [['aaaa', 'y'.repeat(65)]]);
    assert.deepEqual(d.dynamicTable(), []);
    assert.equal(d.dynamicTableSize, 0);
  });

  test('a new entry may name the entry its insertion evicts (section 4.4)', () => {
    const d = new HpackDecoder(60);
    d.decode(Buffer.from([0x40, ...str('name'), ...str('value')])); // 41 octets
    assert.deepEqual(d.decode(Buffer.from([0x7e, ...str('other')])), [['name', 'other']]);
    assert.deepEqual(d.dynamicTable(), [['name', 'other']]);
  });

  test('dynamic table size updates: shrink evicts, zero empties, up to the advertised maximum', () => {
    const d = new HpackDecoder(200);
    d.decode(Buffer.from([0x40, ...str('a'), ...str('1'), 0x40, ...str('b'), ...str('2')]));
    assert.equal(d.dynamicTableSize, 68);
    assert.deepEqual(d.decode(Buffer.from([...int(40, 5, 0x20)])), []);
    assert.deepEqual(d.dynamicTable(), [['b', '2']]);
    assert.deepEqual(d.decode(Buffer.from([0x20])), []);
    assert.deepEqual(d.dynamicTable(), []);
    // Limit 0: insertions are emitted but not stored.
    assert.deepEqual(d.decode(Buffer.from([0x40, ...str('c'), ...str('3')])), [['c', '3']]);
    assert.deepEqual(d.dynamicTable(), []);
    // Two updates at the start of one block (the smallest, then the final size), then a field.
    assert.deepEqual(d.decode(Buffer.from([0x20, ...int(200, 5, 0x20), 0x82])), [[':method', 'GET']]);
    assert.equal(d.dynamicTableLimit, 200);
  });

  test('the dynamic table matches a reference model under random operations', () => {
    const rnd = prng(42);
    const d = new HpackDecoder(2048);
    let model: Header[] = [];
    let limit = 2048;
    const sizeOf = ([n, v]: Header): number => n.length + v.length + 32;
    const evict = (target: number): void => {
      while (model.reduce((s, e) => s + sizeOf(e), 0) > target) model.pop();
    };
    for (let round = 0; round < 400; round++) {
      const bytes: number[] = [];
      const expected: Header[] = [];
      if (rnd(8) === 0) {
        limit = rnd(2049);
        bytes.push(...int(limit, 5, 0x20));
        evict(limit);
      }
      for (let f = rnd(6); f > 0; f--) {
        if (model.length > 0 && rnd(2) === 0) {
          const i = rnd(model.length);
          bytes.push(...int(62 + i, 7, 0x80));
          expected.push(model[i] as Header);
        } else {
          const entry: Header = [`n${rnd(100)}`, 'v'.repeat(rnd(300))];
          bytes.push(0x40, ...str(entry[0], rnd(2) === 0), ...str(entry[1], rnd(2) === 0));
          expected.push(entry);
          if (sizeOf(entry) > limit) model = [];
          else {
            evict(limit - sizeOf(entry));
            model.unshift(entry);
          }
        }
      }
      assert.deepEqual(d.decode(Buffer.from(bytes)), expected, `round ${round}`);
      assert.deepEqual(d.dynamicTable(), model, `table after round ${round}`);
    }
  });

  test('long strings and multi-byte lengths, raw and Huffman', () => {
    const d = new HpackDecoder();
    for (const len of [126, 127, 128, 255, 16_383, 16_384, 70_000]) {
      const value = 'x-'.repeat(len).slice(0, len);
      assert.deepEqual(d.decode(Buffer.from([0x00, ...str('k'), ...str(value)])), [['k', value]], `raw ${len}`);
      assert.deepEqual(d.decode(Buffer.from([0x00, ...str('k'), ...str(value, true)])), [['k', value]], `huffman ${len}`);
    }
  });

  test('bytes above 0x7f decode as latin1, one char per byte', () => {
    const value = Array.from({ length: 256 }, (_, i) => String.fromCharCode(i)).join('');
    const d = new HpackDecoder();
    assert.deepEqual(d.decode(Buffer.from([0x00, ...str('k'), ...str(value)])), [['k', value]]);
    assert.deepEqual(d.decode(Buffer.from([0x40, ...str('k'), ...str(value, true)])), [['k', value]]);
    assert.equal(d.dynamicTableSize, 1 + 256 + 32);
  });

  test('short strings repeat correctly: same bytes raw and Huffman-coded, many distinct strings', () => {
    const d = new HpackDecoder();
    // The byte 0x1f is the string "\x1f" raw, and "a" Huffman-coded.
    for (let round = 0; round < 3; round++) {
      assert.deepEqual(d.decode(Buffer.from([0x00, ...str('k'), 0x01, 0x1f])), [['k', '\x1f']]);
      assert.deepEqual(d.decode(Buffer.from([0x00, ...str('k'), 0x81, 0x1f])), [['k', 'a']]);
    }
    for (let round = 0; round < 2; round++) {
      for (let i = 0; i < 5000; i++) {
        const name = `x-${i % 97}`;
        const value = `v${String(i).padStart(5, '0')}`;
        const block = [0x00, ...str(name, i % 2 === 0), ...str(value, i % 3 === 0), 0x10, ...str(name), ...str(value)];
        assert.deepEqual(d.decode(Buffer.from(block)), [[name, value], [name, value]]);
      }
    }
  });

  test('rejects an advertised table size that is not a valid integer', () => {
    assert.throws(() => new HpackDecoder(-1), RangeError);
    assert.throws(() => new HpackDecoder(1.5), RangeError);
  });
});

describe('malformed header blocks', () => {
  const cases: [string, number[], number?][] = [
    ['truncated integer (prefix all ones, nothing after)', [0xff]],
    ['truncated integer (continuation bit on the last byte)', [0xff, 0x80]],
    ['truncated integer in a string length', [0x00, 0x7f, 0x85]],
    ['integer too large', [0xff, 0xff, 0xff, 0xff, 0xff, 0x0f]],
    ['integer too long (padded with continuation bytes)', [0xff, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00]],
    ['string length past the end', [0x40, 0x05, 0x61]],
    ['long string length past the end', [0x00, 0x01, 0x61, 0x7f, 0x81, 0x01, 0x61]],
    ['name string missing', [0x40]],
    ['value string missing', [0x40, 0x01, 0x61]],
    ['value missing after an indexed name', [0x04]],
    ['index 0', [0x80]],
    ['index 0 after valid fields', [0x82, 0x84, 0x80]],
    ['index beyond the table (empty dynamic table)', [0xbe]],
    ['index beyond the table (multi-byte)', [0xff, 0x00]],
    ['literal name index beyond the table', [0x7e, 0x01, 0x61]],
    ['without-indexing name index beyond the table', [0x0f, 0x2f, 0x01, 0x61]],
    ['invalid Huffman padding (zeros)', [0x00, 0x81, 0x18, 0x01, 0x61]],
    ['Huffman padding longer than 7 bits', [0x00, 0x01, 0x61, 0x82, 0x1f, 0xff]],
    ['EOS inside a Huffman string', [0x00, 0x01, 0x61, 0x84, 0xff, 0xff, 0xff, 0xff]],
    ['size update above the advertised maximum', [0x3f, 0xe2, 0x1f], 4096],
    ['size update above a small maximum', [0x3f, 0x02], 32],
    ['size update after a header field', [0x82, 0x20]],
  ];
  for (const [name, bytes, max] of cases) {
    test(name, () => {
      assert.throws(() => new HpackDecoder(max).decode(Buffer.from(bytes)), HpackError);
    });
  }

  test('a size update equal to the advertised maximum is accepted', () => {
    const d = new HpackDecoder(4096);
    assert.deepEqual(d.decode(hex('3fe11f')), []);
    assert.equal(d.dynamicTableLimit, 4096);
  });

  test('an index one past the dynamic table is rejected, the last entry is not', () => {
    const d = new HpackDecoder();
    d.decode(Buffer.from([0x40, ...str('a'), ...str('b')]));
    assert.deepEqual(d.decode(hex('be')), [['a', 'b']]);
    assert.throws(() => d.decode(hex('bf')), HpackError);
  });

  test('every truncation of valid blocks decodes a prefix or throws HpackError', () => {
    const blocks = [
      hex('8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff'),
      hex('400a 6375 7374 6f6d 2d6b 6579 0d63 7573 746f 6d2d 6865 6164 6572'),
      new HpackEncoder().encode([['grpc-message', 'x'.repeat(300)], ['content-type', 'application/grpc']]),
    ];
    for (const block of blocks) {
      for (let cut = 0; cut < block.length; cut++) {
        try {
          new HpackDecoder().decode(block.subarray(0, cut));
        } catch (err) {
          assert.ok(err instanceof HpackError, `cut at ${cut}: ${String(err)}`);
        }
      }
    }
  });

  test('random and mutated input only ever throws HpackError', () => {
    const rnd = prng(1234);
    const seeds = [
      hex('8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff'),
      hex('4882 6402 5885 aec3 771a 4b61 96d0 7abe 9410 54d4 44a8 2005 9504 0b81 66e0 82a6'),
      hex('88c1 611d 4d6f 6e2c 2032 3120 4f63 7420 3230 3133 2032 303a 3133 3a32 3220 474d'),
    ];
    const d = new HpackDecoder(256);
    for (let round = 0; round < 5000; round++) {
      let block: Buffer;
      if (round % 2 === 0) {
        block = Buffer.from(Array.from({ length: rnd(40) }, () => rnd(256)));
      } else {
        block = Buffer.from(seeds[rnd(seeds.length)] as Buffer);
        for (let k = rnd(4) + 1; k > 0; k--) block[rnd(block.length)] = rnd(256);
      }
      try {
        d.decode(block);
      } catch (err) {
        assert.ok(err instanceof HpackError, `round ${round}: ${String(err)}`);
      }
    }
  });
});

describe('HpackEncoder', () => {
  const enc = new HpackEncoder();

  test('exact static matches are indexed: ":status: 200" is the single byte 0x88', () => {
    assert.deepEqual(enc.encode([[':status', '200']]), hex('88'));
    assert.deepEqual(enc.encode([[':method', 'POST'], [':scheme', 'https']]), hex('8387'));
  });

  test('static names are literal without indexing, by index; other names are literal', () => {
    assert.deepEqual(
      enc.encode([['content-type', 'application/grpc']]),
      Buffer.concat([hex('0f10 10'), Buffer.from('application/grpc')]),
    );
    assert.deepEqual(enc.encode([['grpc-status', '0']]), Buffer.concat([hex('000b'), Buffer.from('grpc-status'), hex('0130')]));
    assert.deepEqual(enc.encode([[':path', '/a']]), Buffer.concat([hex('0402'), Buffer.from('/a')]));
    // Index 61 with a 4-bit prefix: 15, then 46.
    assert.deepEqual(enc.encode([['www-authenticate', 'x']]), Buffer.concat([hex('0f2e01'), Buffer.from('x')]));
    // A 200-octet value: 127, then 73.
    const long = 'v'.repeat(200);
    assert.deepEqual(enc.encode([['x', long]]), Buffer.concat([hex('0001'), Buffer.from('x'), hex('7f49'), Buffer.from(long)]));
  });

  test('round trips through the decoder, leaving its dynamic table empty', () => {
    const latin1 = Array.from({ length: 256 }, (_, i) => String.fromCharCode(i)).join('');
    const headers: Header[] = [
      [':status', '200'],
      [':status', '201'],
      [':method', 'GET'],
      [':authority', ''],
      ['accept-encoding', 'gzip, deflate'],
      ['accept-encoding', 'identity'],
      ['content-type', 'application/grpc'],
      ['grpc-status', '13'],
      ['grpc-message', 'bad%20thing%0Ahappened'],
      ['grpc-encoding', ''],
      ['x-empty', ''],
      ['x-latin1', latin1],
      ['x-long', 'L'.repeat(70_000)],
      ['x-' + 'n'.repeat(200), 'v'],
    ];
    const d = new HpackDecoder();
    for (let i = 0; i <= headers.length; i++) {
      const subset = headers.slice(0, i);
      assert.deepEqual(d.decode(enc.encode(subset)), subset);
    }
    assert.deepEqual(d.decode(enc.encode([])), []);
    assert.equal(d.dynamicTableSize, 0);
  });

  test('encoded blocks stay valid after later encodes', () => {
    const first = enc.encode([['grpc-status', '0']]);
    const copy = Buffer.from(first);
    for (let i = 0; i < 1000; i++) enc.encode([['grpc-status', String(i)], ['grpc-message', 'm'.repeat(i % 50)]]);
    assert.deepEqual(first, copy);
  });

  test('encodeStatic: the same bytes as encode, in a buffer of its own', () => {
    const headers: Header[] = [[':status', '200'], ['content-type', 'application/grpc']];
    const cached = encodeStatic(headers);
    assert.deepEqual(cached, enc.encode(headers));
    assert.equal(cached.byteOffset, 0);
    assert.equal(cached.buffer.byteLength, cached.length);
  });
});

// --- Interoperation with node:http2 -------------------------------------------------------

const FRAME_HEADERS = 0x1;
const FRAME_SETTINGS = 0x4;
const FRAME_CONTINUATION = 0x9;
const FLAG_ACK = 0x1;
const FLAG_END_STREAM = 0x1;
const FLAG_END_HEADERS = 0x4;
const FLAG_PADDED = 0x8;
const FLAG_PRIORITY = 0x20;
const PREFACE = 'PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n';

function frame(type: number, flags: number, streamId: number, payload: Buffer): Buffer {
  const head = Buffer.alloc(9);
  head.writeUIntBE(payload.length, 0, 3);
  head[3] = type;
  head[4] = flags;
  head.writeUInt32BE(streamId, 5);
  return Buffer.concat([head, payload]);
}

/**
 * A raw TCP server speaking just enough HTTP/2 for a client to send requests: it exchanges
 * SETTINGS, records each complete request header block (HEADERS + CONTINUATION), and
 * answers each stream with `response` as a HEADERS frame that ends the stream.
 */
async function rawH2Server(response: Buffer): Promise<{ port: number; blocks: Buffer[]; close: () => Promise<void> }> {
  const blocks: Buffer[] = [];
  const sockets = new Set<net.Socket>();
  const server = net.createServer((socket) => {
    sockets.add(socket);
    socket.on('close', () => sockets.delete(socket));
    socket.on('error', () => undefined);
    socket.write(frame(FRAME_SETTINGS, 0, 0, Buffer.alloc(0)));
    let pending = Buffer.alloc(0);
    let prefaceSeen = false;
    let block: { streamId: number; chunks: Buffer[] } | undefined;
    const finish = (): void => {
      if (block === undefined) return;
      blocks.push(Buffer.concat(block.chunks));
      socket.write(frame(FRAME_HEADERS, FLAG_END_HEADERS | FLAG_END_STREAM, block.streamId, response));
      block = undefined;
    };
    socket.on('data', (chunk: Buffer) => {
      pending = Buffer.concat([pending, chunk]);
      if (!prefaceSeen) {
        if (pending.length < PREFACE.length) return;
        if (pending.subarray(0, PREFACE.length).toString('latin1') !== PREFACE) {
          socket.destroy();
          return;
        }
        pending = pending.subarray(PREFACE.length);
        prefaceSeen = true;
      }
      while (pending.length >= 9) {
        const length = pending.readUIntBE(0, 3);
        if (pending.length < 9 + length) break;
        const type = pending[3] as number;
        const flags = pending[4] as number;
        const streamId = pending.readUInt32BE(5) & 0x7fffffff;
        let payload = pending.subarray(9, 9 + length);
        pending = pending.subarray(9 + length);
        if (type === FRAME_SETTINGS && (flags & FLAG_ACK) === 0) {
          socket.write(frame(FRAME_SETTINGS, FLAG_ACK, 0, Buffer.alloc(0)));
        } else if (type === FRAME_HEADERS) {
          if (flags & FLAG_PADDED) payload = payload.subarray(1, payload.length - (payload[0] as number));
          if (flags & FLAG_PRIORITY) payload = payload.subarray(5);
          block = { streamId, chunks: [Buffer.from(payload)] };
          if (flags & FLAG_END_HEADERS) finish();
        } else if (type === FRAME_CONTINUATION && block !== undefined) {
          block.chunks.push(Buffer.from(payload));
          if (flags & FLAG_END_HEADERS) finish();
        }
      }
    });
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const { port } = server.address() as net.AddressInfo;
  return {
    port,
    blocks,
    close: async () => {
      for (const s of sockets) s.destroy();
      server.close();
      await once(server, 'close');
    },
  };
}

describe('interop with node:http2', () => {
  test('decodes the request header blocks of a node:http2 client on one connection', async () => {
    const responseHeaders: Header[] = [
      [':status', '200'],
      ['content-type', 'application/grpc'],
      ['grpc-status', '0'],
      ['grpc-message', 'all%20good'],
      ['x-long', 'z'.repeat(300)],
    ];
    const server = await rawH2Server(encodeStatic(responseHeaders));
    const client = http2.connect(`http://127.0.0.1:${server.port}`);
    client.on('error', () => undefined);
    try {
      const authority = `127.0.0.1:${server.port}`;
      const latin1 = Array.from({ length: 256 }, (_, i) => i)
        .filter((i) => i === 9 || (i >= 0x20 && i !== 0x7f))
        .map((i) => String.fromCharCode(i) + 'eeeeeeee')
        .join('');
      const blob = (seed: number, len: number): string => {
        const rnd = prng(seed);
        const alphabet = 'abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.~:/=+';
        return Array.from({ length: len }, () => alphabet[rnd(alphabet.length)]).join('');
      };
      const common: Record<string, string> = {
        'content-type': 'application/grpc',
        te: 'trailers',
        'user-agent': 'grpc-node-js/1.14.7',
        'grpc-accept-encoding': 'identity,deflate,gzip',
      };
      const create: Record<string, string> = {
        ':method': 'POST', ':path': '/containerd.services.sandbox.v1.Controller/Create',
        ...common, 'grpc-timeout': '9999999u', 'x-blob-a': blob(1, 1500), 'x-trace': 'abc123',
      };
      const requests: Record<string, string>[] = [
        create,
        create,
        {
          ':method': 'POST', ':path': '/containerd.services.sandbox.v1.Controller/Start',
          ...common, 'grpc-timeout': '120S', 'x-blob-b': blob(2, 1500), 'x-trace': 'def456',
          authorization: 'Bearer secret-token-value',
        },
        {
          ':method': 'POST', ':path': '/containerd.services.sandbox.v1.Controller/Wait',
          ...common, 'x-blob-c': blob(3, 1500), 'x-latin1': latin1, 'x-huge': blob(4, 20_000),
        },
        {
          ':method': 'GET', ':path': '/other?query=1',
          'x-blob-a': blob(1, 1500), 'x-trace': 'ghi789', 'x-empty': '',
        },
      ];
      for (const headers of requests) {
        const outgoing: http2.OutgoingHttpHeaders = { ...headers };
        if ('authorization' in headers) {
          Object.assign(outgoing, { [http2.sensitiveHeaders]: ['authorization'] });
        }
        const req = client.request(outgoing, { endStream: true });
        const [incoming] = (await once(req, 'response')) as [http2.IncomingHttpHeaders];
        // Node's decoder read our encoder's block.
        assert.equal(incoming[':status'], 200);
        for (const [name, value] of responseHeaders.slice(1)) assert.equal(incoming[name], value);
        req.resume();
        await once(req, 'close');
      }

      assert.equal(server.blocks.length, requests.length);
      const d = new HpackDecoder(4096);
      server.blocks.forEach((block, i) => {
        const decoded = d.decode(block);
        const sent = requests[i] as Record<string, string>;
        const expected: Header[] = [
          ...Object.entries(sent),
          [':scheme', 'http'],
          [':authority', authority],
        ];
        const sort = (h: Header[]): Header[] => [...h].sort((a, b) => (a[0] + '\0' + a[1] < b[0] + '\0' + b[1] ? -1 : 1));
        assert.deepEqual(sort(decoded), sort(expected), `request ${i}`);
        // Pseudo-headers come first.
        const firstRegular = decoded.findIndex(([name]) => !name.startsWith(':'));
        assert.ok(decoded.slice(firstRegular).every(([name]) => !name.startsWith(':')), `request ${i}: pseudo-header order`);
      });

      // The client used what these tests are for: Huffman strings, a dynamic table it had
      // to evict from, and a block long enough for CONTINUATION frames.
      assert.equal(server.blocks[0]?.includes(Buffer.from('application/grpc')), false);
      assert.ok((server.blocks[1]?.length ?? Infinity) < 64, `repeated request: ${server.blocks[1]?.length} octets`);
      assert.ok((server.blocks[3]?.length ?? 0) > 16_384);
      // authorization (static index 23) as a never-indexed literal: 0001 1111, then 23 - 15.
      assert.ok(server.blocks[2]?.includes(Buffer.from([0x1f, 0x08])));
      assert.ok(d.dynamicTableSize > 0 && d.dynamicTableSize <= 4096);
    } finally {
      client.close();
      await server.close();
    }
  });
});
