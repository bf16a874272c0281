// The task front (native/tsbox-front.c) applies the ttrpc server's bounds (src/ttrpc/limits.ts)
// to containerd's connections: the two copies, one in C and one in TypeScript, must not drift.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { FRAME_ARRIVAL_MS, HEADER_BYTES, MAX_MESSAGE_BYTES, MAX_PARTIAL_FRAME_BYTES, MAX_QUEUED_OUTPUT_BYTES, SWEEP_MS } from '../../src/ttrpc/limits.js';
import { frontBound } from '../support/task-front.js';

test('the front\'s framing and bounds are the ttrpc server\'s', () => {
  const shared = { HEADER_BYTES, MAX_MESSAGE_BYTES, MAX_PARTIAL_FRAME_BYTES, FRAME_ARRIVAL_MS, MAX_QUEUED_OUTPUT_BYTES, SWEEP_MS };
  for (const [name, value] of Object.entries(shared)) assert.equal(frontBound(name), value, name);
});
