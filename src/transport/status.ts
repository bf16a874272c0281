import type { Logger } from 'pino';
import { GRPC_CODES, TsboxError } from '../base/errors.js';

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
    return { code: GRPC_CODES[err.kind], message: err.message };
  }
  log.error({ err, rpc }, 'internal error');
  return { code: GRPC_CODES.Internal, message: 'internal error (see the tsbox log)' };
}
