import type { Logger } from 'pino';
import { TsboxError, type ErrorKind } from '../errors.js';

/** gRPC status codes (the numbers are the protocol's). */
const CODES: Readonly<Record<ErrorKind, number>> = {
  Cancelled: 1,
  InvalidArgument: 3,
  DeadlineExceeded: 4,
  NotFound: 5,
  AlreadyExists: 6,
  FailedPrecondition: 9,
  Unimplemented: 12,
  Internal: 13,
  Unavailable: 14,
};

/** A gRPC status: code and plain message (no details, no metadata). */
export interface Status {
  readonly code: number;
  readonly message: string;
}

/**
 * The one mapping from errors to gRPC statuses (SPEC.md section 4): a TsboxError keeps its
 * kind and message; anything else is a bug, answered as INTERNAL with a fixed message while
 * the cause goes to the log.
 */
export function toStatus(err: unknown, log: Logger, rpc: string): Status {
  if (err instanceof TsboxError && err.kind !== 'Internal') {
    return { code: CODES[err.kind], message: err.message };
  }
  log.error({ err, rpc }, 'internal error');
  return { code: CODES.Internal, message: 'internal error (see the tsbox log)' };
}
