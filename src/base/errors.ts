import { readFile } from 'node:fs/promises';
import { readFile as readFileNow } from './fs-now.js';

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
  ResourceExhausted: 8,
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

/** The errno code of a failed system call (`ENOENT`, `EACCES`, ...), or undefined for any other value. */
export function errnoOf(err: unknown): string | undefined {
  const code = (err as { code?: unknown } | null)?.code;
  return typeof code === 'string' ? code : undefined;
}

/**
 * True when `err` says that what was looked for is already gone: ENOENT (no such file) or
 * ESRCH (no such process), plus the codes in `also` where the caller knows they mean the
 * same (ENOTDIR when a parent directory went away). Every other error is a failure.
 */
export function isGone(err: unknown, also: readonly string[] = []): boolean {
  const code = errnoOf(err);
  return code === 'ENOENT' || code === 'ESRCH' || (code !== undefined && also.includes(code));
}

/**
 * `err` as a TsboxError whose message names `path` (and the errno), for failures reported
 * to a caller: "cannot read /proc/12/cgroup: EACCES: permission denied, ...". A TsboxError
 * is returned as it is.
 */
export function withPath(err: unknown, path: string, what = 'access'): TsboxError {
  if (err instanceof TsboxError) return err;
  const message = messageOf(err);
  return new TsboxError('Internal', `cannot ${what} ${path}: ${message.includes(path) ? message : `${message} (${path})`}`, { cause: err });
}

/** The text of `path`, or undefined when it (or its process, for /proc) is gone; any other failure throws, naming the path. */
export function readIfPresent(path: string, also: readonly string[] = []): Promise<string | undefined> {
  return readOrGone(path, also, readFile);
}

/**
 * As readIfPresent, read at once on tsbox's thread (src/base/fs-now.ts): for tsbox's own small
 * files, cgroupfs and a process's /proc stat or cgroup, never for what can wait on another process
 * or a device (another process's cmdline takes its memory map's lock; a FUSE mount waits for its
 * daemon).
 */
export function readIfPresentNow(path: string, also: readonly string[] = []): Promise<string | undefined> {
  return readOrGone(path, also, readFileNow);
}

async function readOrGone(path: string, also: readonly string[], read: (path: string, encoding: 'utf8') => Promise<string>): Promise<string | undefined> {
  try {
    return await read(path, 'utf8');
  } catch (err) {
    if (isGone(err, also)) return undefined;
    throw withPath(err, path, 'read');
  }
}
