import { TsboxError } from '../base/errors.js';

/**
 * containerd's identifier rule (its pkg/identifiers) for namespaces, sandbox ids, container
 * (task) ids and exec ids alike (SPEC.md section 3): alphanumerics separated by single '.',
 * '_' or '-', at most 76 characters. containerd refuses any other before it reaches tsbox, so
 * tsbox refuses the same, on the Sandbox API and the Task API.
 */
export const IDENTIFIER = /^[A-Za-z0-9]+(?:[._-][A-Za-z0-9]+)*$/;
export const MAX_IDENTIFIER_LENGTH = 76;

/** Throws InvalidArgument unless `value` is a valid containerd identifier. */
export function validateIdentifier(what: 'namespace' | 'sandbox_id' | 'task id' | 'exec id', value: string): void {
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

/**
 * Checks the namespace metadata containerd sends with every call (gRPC or ttrpc): missing is
 * FailedPrecondition, as containerd answers it; present and not an identifier, InvalidArgument.
 */
export function validateNamespace(namespace: string | undefined): string {
  if (namespace === undefined || namespace === '') {
    // What containerd itself answers without a namespace (SPEC.md section 3).
    throw new TsboxError('FailedPrecondition', 'namespace is required');
  }
  validateIdentifier('namespace', namespace);
  return namespace;
}
