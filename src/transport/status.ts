import { status as Code, type StatusObject } from '@grpc/grpc-js';
import type { Logger } from 'pino';
import { TsboxError, type ErrorKind } from '../errors.js';

const CODES: Readonly<Record<ErrorKind, Code>> = {
  NotFound: Code.NOT_FOUND,
  AlreadyExists: Code.ALREADY_EXISTS,
  InvalidArgument: Code.INVALID_ARGUMENT,
  FailedPrecondition: Code.FAILED_PRECONDITION,
  Unavailable: Code.UNAVAILABLE,
  Unimplemented: Code.UNIMPLEMENTED,
  Cancelled: Code.CANCELLED,
  DeadlineExceeded: Code.DEADLINE_EXCEEDED,
  Internal: Code.INTERNAL,
};

/**
 * The one mapping from errors to gRPC statuses (SPEC.md section 4): a TsboxError keeps its
 * kind and message; anything else is a bug, answered as INTERNAL with a fixed message while
 * the cause goes to the log. No status details, no metadata.
 */
export function toStatus(err: unknown, log: Logger, rpc: string): Partial<StatusObject> {
  if (err instanceof TsboxError && err.kind !== 'Internal') {
    return { code: CODES[err.kind], details: err.message };
  }
  log.error({ err, rpc }, 'internal error');
  return { code: Code.INTERNAL, details: 'internal error (see the tsbox log)' };
}
