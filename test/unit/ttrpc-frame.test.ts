// ttrpc framing (src/ttrpc/frame.ts): the 10-byte header as containerd's ttrpc writes it, frames
// whatever the chunking, and frames the decoder refuses to keep (longer than 4 MiB, or of a type
// it does not know) skipped at their header without their payload ever being held.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { FrameDecoder, FrameType, encodeFrame, type Decoded } from '../../src/ttrpc/frame.js';
import { decodeCancel } from '../../src/ttrpc/pod-link.js';
import { HEADER_BYTES, MAX_MESSAGE_BYTES } from '../../src/ttrpc/limits.js';
import { cancelPayload } from '../support/pod-relay.js';

function header(length: number, streamId: number, type: number, flags = 0): Buffer {
  const bytes = Buffer.alloc(HEADER_BYTES);
  bytes.writeUInt32BE(length, 0);
  bytes.writeUInt32BE(streamId, 4);
  bytes[8] = type;
  bytes[9] = flags;
  return bytes;
}

/** The frames decoded, as plain values. */
function frames(decoded: readonly Decoded[]): { streamId: number; type: number; flags: number; payload: string }[] {
  return decoded.map((d) => {
    assert.equal(d.kind, 'frame');
    if (d.kind !== 'frame') throw new Error('unreachable');
    return { streamId: d.frame.streamId, type: d.frame.type, flags: d.frame.flags, payload: d.frame.payload.toString('latin1') };
  });
}

test("a frame's header is length, stream id, type and flags, big-endian, as ttrpc writes it", () => {
  const frame = encodeFrame(0x01020305, FrameType.Response, Buffer.from('hello'), 0x04);
  assert.deepEqual([...frame], [0, 0, 0, 5, 1, 2, 3, 5, 2, 4, ...Buffer.from('hello')]);
  assert.deepEqual(frames(new FrameDecoder().push(frame)), [{ streamId: 0x01020305, type: 2, flags: 4, payload: 'hello' }]);
});

test('frames come out whole and in order however the stream is cut: byte by byte, or all in one chunk', () => {
  const sent = [
    { streamId: 1, type: FrameType.Request, flags: 0, payload: 'first' },
    { streamId: 3, type: FrameType.Request, flags: 0, payload: '' },
    { streamId: 5, type: FrameType.Data, flags: 1, payload: 'x'.repeat(70_000) },
    { streamId: 7, type: FrameType.Request, flags: 0, payload: 'last' },
  ];
  const stream = Buffer.concat(sent.map((f) => encodeFrame(f.streamId, f.type, Buffer.from(f.payload, 'latin1'), f.flags)));

  assert.deepEqual(frames(new FrameDecoder().push(stream)), sent, 'all in one chunk');

  for (const size of [1, 3, 10, 11, 4096, 65_536]) {
    const decoder = new FrameDecoder();
    const out: Decoded[] = [];
    let mostBuffered = 0;
    for (let at = 0; at < stream.length; at += size) {
      out.push(...decoder.push(stream.subarray(at, at + size)));
      mostBuffered = Math.max(mostBuffered, decoder.buffered);
    }
    assert.deepEqual(frames(out), sent, `chunks of ${size} bytes`);
    assert.equal(decoder.midFrame, false);
    assert.equal(decoder.buffered, 0);
    assert.ok(mostBuffered <= HEADER_BYTES + 70_000, `chunks of ${size}: held ${mostBuffered} bytes, more than one frame`);
  }
});

test('a frame in progress is held; its bytes are counted until it is whole', () => {
  const decoder = new FrameDecoder();
  const frame = encodeFrame(9, FrameType.Request, Buffer.alloc(100, 1));
  assert.deepEqual(decoder.push(frame.subarray(0, 4)), []);
  assert.equal(decoder.midFrame, true);
  assert.equal(decoder.buffered, 4);
  assert.deepEqual(decoder.push(frame.subarray(4, 60)), []);
  assert.equal(decoder.buffered, 60);
  assert.equal(frames(decoder.push(frame.subarray(60))).length, 1);
  assert.equal(decoder.midFrame, false);
});

test('a header announcing more than 4 MiB is refused at once, its payload skipped unheld, and the next frame decodes', () => {
  const decoder = new FrameDecoder();
  const length = MAX_MESSAGE_BYTES + 1;
  const decoded = decoder.push(header(length, 11, FrameType.Request));
  assert.deepEqual(decoded, [{ kind: 'skipped', reason: 'oversized', header: { length, streamId: 11, type: FrameType.Request, flags: 0 } }]);
  // The payload goes by in chunks without being held.
  const chunk = Buffer.alloc(1024 * 1024, 0x61);
  for (let sent = 0; sent < length; sent += chunk.length) {
    assert.deepEqual(decoder.push(chunk.subarray(0, Math.min(chunk.length, length - sent))), []);
    assert.equal(decoder.buffered, 0);
  }
  assert.deepEqual(frames(decoder.push(encodeFrame(13, FrameType.Request, Buffer.from('next')))), [
    { streamId: 13, type: FrameType.Request, flags: 0, payload: 'next' },
  ]);

  // The largest length there is: refused from its 10 header bytes alone.
  assert.equal(new FrameDecoder().push(header(0xffffffff, 1, FrameType.Request))[0]?.kind, 'skipped');
  // And exactly 4 MiB is allowed.
  const max = new FrameDecoder().push(encodeFrame(1, FrameType.Request, Buffer.alloc(MAX_MESSAGE_BYTES)));
  assert.equal(max[0]?.kind, 'frame');
});

test('a frame of an unknown type is skipped without its payload, and the next frame decodes', () => {
  const decoder = new FrameDecoder();
  const bad = Buffer.concat([header(5, 1, 0x09), Buffer.from('junk!')]);
  const good = encodeFrame(3, FrameType.Request, Buffer.from('ok'));
  const decoded = decoder.push(Buffer.concat([bad, good]));
  assert.deepEqual(decoded[0], { kind: 'skipped', reason: 'unknown type', header: { length: 5, streamId: 1, type: 9, flags: 0 } });
  assert.deepEqual(frames(decoded.slice(1)), [{ streamId: 3, type: FrameType.Request, flags: 0, payload: 'ok' }]);
});

test('a message over 4 MiB cannot be encoded', () => {
  assert.throws(() => encodeFrame(1, FrameType.Request, Buffer.alloc(MAX_MESSAGE_BYTES + 1)), RangeError);
});

test('the relay\'s cancel payload: stream ids as 4-byte big-endian integers, as tsbox reads them', () => {
  // The relay's whole request, and which requests it refuses to relay, are tested through a
  // real pod's process (test/integration/relay.test.ts).
  const ids = [1, 3, 0xfffffff1];
  assert.deepEqual(decodeCancel(cancelPayload(ids)), ids);
  assert.deepEqual([...cancelPayload([0x01020304])], [1, 2, 3, 4]);
  // A payload that is not whole stream ids is refused.
  assert.equal(decodeCancel(Buffer.alloc(5)), undefined);
});
