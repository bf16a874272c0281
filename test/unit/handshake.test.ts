// Which first bytes of a connection the connection table hands to grpc-js: the client preface
// and a whole first SETTINGS frame (RFC 9113 section 3.4), anything else is closed at once.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { handshakeProgress } from '../../src/transport/connections.js';
import { Flag, FrameType, PREFACE, frame, settingsFrame } from '../support/h2-frames.js';

describe('the handshake a connection must send before it costs an HTTP/2 session', () => {
  const settings = settingsFrame([[4, 65_535], [5, 16_384]]);

  test('the preface and a whole SETTINGS frame complete it, with whatever follows', () => {
    assert.equal(handshakeProgress(Buffer.concat([PREFACE, settings])), 'complete');
    assert.equal(handshakeProgress(Buffer.concat([PREFACE, settingsFrame(), frame(FrameType.SETTINGS, Flag.ACK, 0)])), 'complete');
  });

  test('any prefix of it is incomplete', () => {
    const whole = Buffer.concat([PREFACE, settings]);
    for (const length of [0, 1, 12, 23, 24, 30, 33, whole.length - 1]) {
      assert.equal(handshakeProgress(whole.subarray(0, length)), 'incomplete', `${length} bytes`);
    }
  });

  test('bytes that are not the preface, or a first frame that is not SETTINGS, are not HTTP/2', () => {
    assert.equal(handshakeProgress(Buffer.from('GET / HTTP/1.1\r\n')), 'not HTTP/2');
    assert.equal(handshakeProgress(Buffer.from('PRX')), 'not HTTP/2');
    assert.equal(handshakeProgress(Buffer.concat([PREFACE, frame(FrameType.HEADERS, Flag.END_HEADERS, 1, Buffer.alloc(4))])), 'not HTTP/2');
    assert.equal(handshakeProgress(Buffer.concat([PREFACE, frame(FrameType.SETTINGS, Flag.ACK, 0)])), 'not HTTP/2');
    assert.equal(handshakeProgress(Buffer.concat([PREFACE, frame(FrameType.SETTINGS, 0, 1, Buffer.alloc(6))])), 'not HTTP/2');
    assert.equal(handshakeProgress(Buffer.concat([PREFACE, frame(FrameType.SETTINGS, 0, 0, Buffer.alloc(5))])), 'not HTTP/2');
    assert.equal(handshakeProgress(Buffer.concat([PREFACE, frame(FrameType.SETTINGS, 0, 0, Buffer.alloc(0), 1 << 20)])), 'not HTTP/2');
  });
});
