// containerd's identifier rule for namespaces and sandbox ids (SPEC.md section 3):
// alphanumerics separated by single '.', '_' or '-', at most 76 characters; a call without
// a namespace is FAILED_PRECONDITION "namespace is required", a bad one INVALID_ARGUMENT.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { MAX_IDENTIFIER_LENGTH, validateIdentifier, validateNamespace } from '../../src/controller/identifiers.js';
import { isTsboxError, type ErrorKind } from '../../src/base/errors.js';

const VALID = [
  'a',
  'Z9',
  'k8s.io',
  'default',
  'a.b',
  'a_b',
  'a-b',
  'a.b_c-d.e',
  '0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef', // CRI: 64 hex
  'x'.repeat(76),
];

const INVALID = [
  '-a',
  'a-',
  '.a',
  'a.',
  '_a',
  'a__b',
  'a..b',
  'a.-b',
  'a b',
  'a/b',
  'a:b',
  'a@b',
  '../etc',
  'ü',
  'a\nb',
  'x'.repeat(77),
];

const kindOf = (kind: ErrorKind) => (err: unknown): boolean => {
  assert.ok(isTsboxError(err, kind), `expected ${kind}, got ${String(err)}`);
  return true;
};

describe('validateIdentifier', () => {
  test('the limit is 76 characters', () => {
    assert.equal(MAX_IDENTIFIER_LENGTH, 76);
  });

  for (const id of VALID) {
    test(`accepts ${JSON.stringify(id.length > 20 ? `${id.slice(0, 12)}… (${id.length})` : id)}`, () => {
      validateIdentifier('sandbox_id', id);
      validateIdentifier('namespace', id);
    });
  }

  for (const id of INVALID) {
    test(`rejects ${JSON.stringify(id.length > 20 ? `${id.slice(0, 12)}… (${id.length})` : id)} as INVALID_ARGUMENT`, () => {
      assert.throws(() => validateIdentifier('sandbox_id', id), kindOf('InvalidArgument'));
      assert.throws(() => validateIdentifier('namespace', id), kindOf('InvalidArgument'));
    });
  }

  test('an empty id is INVALID_ARGUMENT naming the field', () => {
    assert.throws(
      () => validateIdentifier('sandbox_id', ''),
      (err) => kindOf('InvalidArgument')(err) && /sandbox_id/.test((err as Error).message),
    );
  });

  test('the message names the field and the length limit', () => {
    assert.throws(() => validateIdentifier('sandbox_id', 'x'.repeat(77)), /sandbox_id.*76/);
    assert.throws(() => validateIdentifier('namespace', 'a/b'), /namespace/);
  });
});

describe('validateNamespace', () => {
  test('a missing namespace is FAILED_PRECONDITION "namespace is required"', () => {
    for (const missing of [undefined, '']) {
      assert.throws(
        () => validateNamespace(missing),
        (err) => kindOf('FailedPrecondition')(err) && (err as Error).message === 'namespace is required',
      );
    }
  });

  test('a valid namespace is returned as it is', () => {
    assert.equal(validateNamespace('k8s.io'), 'k8s.io');
    assert.equal(validateNamespace('x'.repeat(76)), 'x'.repeat(76));
  });

  test('a bad namespace is INVALID_ARGUMENT', () => {
    for (const bad of ['k8s io', 'a/b', 'x'.repeat(77), '-ns']) {
      assert.throws(() => validateNamespace(bad), kindOf('InvalidArgument'), bad);
    }
  });
});
