// A pod's relay (native/relay.c) applies the ttrpc server's bounds (src/ttrpc/limits.ts) to
// containerd's connections: the two copies, one in C and one in TypeScript, must not drift.
// The protocol between the two sides must not either (src/ttrpc/pod-link.ts).
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { FRAME_ARRIVAL_MS, HEADER_BYTES, MAX_MESSAGE_BYTES, MAX_PARTIAL_FRAME_BYTES, MAX_QUEUED_OUTPUT_BYTES, SWEEP_MS } from '../../src/ttrpc/limits.js';
import { POD_CANCEL, POD_HELLO, POD_PROTOCOL_VERSION, POD_SERVICE } from '../../src/ttrpc/pod-link.js';
import { relayBound } from '../support/pod-relay.js';

const native = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..', '..', 'native');

test('the relay\'s framing and bounds are the ttrpc server\'s', () => {
  const shared = { HEADER_BYTES, MAX_MESSAGE_BYTES, MAX_PARTIAL_FRAME_BYTES, FRAME_ARRIVAL_MS, MAX_QUEUED_OUTPUT_BYTES, SWEEP_MS };
  for (const [name, value] of Object.entries(shared)) assert.equal(relayBound(name), value, name);
});

test('the pod\'s process speaks the protocol tsbox speaks: its service, methods and version', () => {
  const shim = readFileSync(path.join(native, 'tsbox-shim.c'), 'utf8');
  const relay = readFileSync(path.join(native, 'relay.c'), 'utf8');
  assert.match(shim, new RegExp(`^#define POD_SERVICE "${POD_SERVICE.replace(/\./g, '\\.')}"$`, 'm'));
  assert.match(shim, new RegExp(`^#define POD_PROTOCOL_VERSION ${POD_PROTOCOL_VERSION}$`, 'm'));
  assert.match(relay, new RegExp(`^static const char HELLO\\[\\] = "${POD_HELLO}";$`, 'm'));
  assert.match(relay, new RegExp(`^static const char CANCEL\\[\\] = "${POD_CANCEL}";$`, 'm'));
});
