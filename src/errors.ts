/**
 * The kinds of error tsbox answers with and their gRPC status codes (the numbers are the
 * protocol's): the one table of them. The kinds mirror containerd's error classes (errdefs),
 * which containerd maps one to one onto these codes and acts on (SPEC.md section 4), so the
 * kind is part of the API.
 */
export const GRPC_CODES = {
  Cancelled: 1,
  InvalidArgument: 3,
  DeadlineExceeded: 4,
  NotFound: 5,
  AlreadyExists: 6,
  FailedPrecondition: 9,
  Unimplemented: 12,
  Internal: 13,
  Unavailable: 14,
} as const satisfies Record<string, number>;

/** A kind of failure; see GRPC_CODES. */
export type ErrorKind = keyof typeof GRPC_CODES;

/**
 * The one error type of tsbox, with a kind the transport turns into a gRPC code. The message
 * reaches the client; `cause` stays in the log.
 */
export class TsboxError extends Error {
  override readonly name = 'TsboxError';
  constructor(
    readonly kind: ErrorKind,
    message: string,
    options?: { cause?: unknown },
  ) {
    super(message, options);
  }
}

/** True when `err` is a TsboxError, optionally of the given kind. */
export function isTsboxError(err: unknown, kind?: ErrorKind): err is TsboxError {
  return err instanceof TsboxError && (kind === undefined || err.kind === kind);
}

/** The message of any thrown value, for logs and wrapped errors. */
export function messageOf(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}

/**
 * The error an aborted wait rejects with: the signal's reason when it is a TsboxError (the
 * transport sets Cancelled, DeadlineExceeded or Unavailable), else Cancelled.
 */
export function abortError(signal: { readonly reason: unknown }): TsboxError {
  const reason = signal.reason;
  return reason instanceof TsboxError ? reason : new TsboxError('Cancelled', 'call cancelled');
}

/**
 * A rejection handler for an error that cannot matter, with the reason in words:
 * `promise.catch(ignoreError('the file may already be gone'))`. Lint forbids handlers that
 * drop an error without one of these or a comment saying why (eslint.config.js).
 */
export function ignoreError(_why: string): (err: unknown) => undefined {
  return () => undefined;
}

/**
 * Waits for every operation to settle, then rejects with the first failure: a caller that
 * cleans up after a failure finds nothing still under way.
 */
export async function allOrFirstError<T extends readonly unknown[]>(operations: readonly [...{ [K in keyof T]: Promise<T[K]> }]): Promise<T> {
  const settled = await Promise.allSettled(operations as readonly Promise<unknown>[]);
  const failed = settled.find((s): s is PromiseRejectedResult => s.status === 'rejected');
  if (failed !== undefined) throw failed.reason;
  return settled.map((s) => (s as PromiseFulfilledResult<unknown>).value) as unknown as T;
}
