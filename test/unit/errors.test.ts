// The one table of error kinds and gRPC codes: each kind answers with the code grpc-js (and
// containerd, which maps them back to its error classes) gives the same name.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { status } from '@grpc/grpc-js';
import { GRPC_CODES, type ErrorKind } from '../../src/base/errors.js';

test('each error kind maps to the gRPC code of the same name', () => {
  const snake = (kind: string): string => kind.replace(/([a-z])([A-Z])/g, '$1_$2').toUpperCase();
  for (const [kind, code] of Object.entries(GRPC_CODES) as [ErrorKind, number][]) {
    const expected = (status as unknown as Record<string, number>)[snake(kind)];
    assert.equal(code, expected, `${kind} must be ${snake(kind)} (${expected})`);
  }
  assert.equal(new Set(Object.values(GRPC_CODES)).size, Object.keys(GRPC_CODES).length, 'no two kinds share a code');
});
