// What the native programs share with tsbox (ttrpc's framing and the bounds the relay applies to
// containerd's connections as tsbox's ttrpc server does, the protocol between a pod's process and
// tsbox, what one request to `tsbox-shim serve` may carry) is defined once, in TypeScript: the
// build writes it into the header the programs include, and no program defines it again.
import assert from 'node:assert/strict';
import { readFileSync, readdirSync } from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { SERVE_MAX_ARGS, SERVE_MAX_BYTES } from '../../src/runtime/helper-service.js';
import { FRAME_ARRIVAL_MS, HEADER_BYTES, MAX_MESSAGE_BYTES, MAX_PARTIAL_FRAME_BYTES, MAX_QUEUED_OUTPUT_BYTES, SWEEP_MS } from '../../src/ttrpc/limits.js';
import { FORMER_FRONT_SERVICE, POD_CANCEL, POD_HELLO, POD_PROTOCOL_VERSION, POD_SERVICE } from '../../src/ttrpc/pod-link.js';
import { contractHeader, relayBound } from '../support/pod-relay.js';

const native = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..', '..', 'native');
const numbers = { HEADER_BYTES, MAX_MESSAGE_BYTES, MAX_PARTIAL_FRAME_BYTES, FRAME_ARRIVAL_MS, MAX_QUEUED_OUTPUT_BYTES, SWEEP_MS, POD_PROTOCOL_VERSION, SERVE_MAX_ARGS, SERVE_MAX_BYTES };
const names = { POD_SERVICE, POD_HELLO, POD_CANCEL, FORMER_FRONT_SERVICE };

test('the programs are built with the values tsbox has: framing, shared bounds, the pod protocol, serve requests', () => {
  for (const [name, value] of Object.entries(numbers)) assert.equal(relayBound(name), value, name);
  const header = readFileSync(contractHeader, 'utf8');
  for (const [name, value] of Object.entries(names)) assert.match(header, new RegExp(`^#define ${name} "${value.replace(/\./g, '\\.')}"$`, 'm'), name);
});

test('no native source defines what the contract header does: each value has one definition', () => {
  const defined = [...Object.keys(numbers), ...Object.keys(names)];
  for (const file of readdirSync(native).filter((f) => f.endsWith('.c') || f.endsWith('.h'))) {
    const source = readFileSync(path.join(native, file), 'utf8');
    for (const name of defined) assert.doesNotMatch(source, new RegExp(`^\\s*#\\s*define\\s+${name}\\b`, 'm'), `${file} defines ${name} again`);
    if (/#include "tsbox-contract\.h"/.test(source)) continue;
    for (const name of defined) assert.doesNotMatch(source, new RegExp(`\\b${name}\\b`), `${file} uses ${name} without the contract header`);
  }
});
