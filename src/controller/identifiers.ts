import { TsboxError } from '../errors.js';

/**
 * containerd's identifier rule for namespaces and sandbox ids (SPEC.md section 3):
 * alphanumerics separated by single '.', '_' or '-', at most 76 characters.
 */
export const IDENTIFIER = /^[A-Za-z0-9]+(?:[._-][A-Za-z0-9]+)*$/;
export const MAX_IDENTIFIER_LENGTH = 76;

/** Throws InvalidArgument unless `value` is a valid containerd identifier. */
export function validateIdentifier(what: 'namespace' | 'sandbox_id', value: string): void {
  if (value === '') throw new TsboxError('InvalidArgument', `${what} is required`);
  if (value.length > MAX_IDENTIFIER_LENGTH) {
    throw new TsboxError('InvalidArgument', `${what} is longer than ${MAX_IDENTIFIER_LENGTH} characters`);
  }
  if (!IDENTIFIER.test(value)) {
    throw new TsboxError(
      'InvalidArgument',
      `${what} ${JSON.stringify(value)} is invalid: it must match ${IDENTIFIER.source}`,
    );
  }
}

/** Checks the namespace metadata containerd sends with every call. */
export function validateNamespace(namespace: string | undefined): string {
  if (namespace === undefined || namespace === '') {
    // What containerd itself answers without a namespace (SPEC.md section 3).
    throw new TsboxError('FailedPrecondition', 'namespace is required');
  }
  validateIdentifier('namespace', namespace);
  return namespace;
}
