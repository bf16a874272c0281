import { type ChildProcess, execFile, spawn } from 'node:child_process';
import type { Logger } from 'pino';
import type { CallSignal } from '../controller/types.js';
import { TsboxError, abortError, ignoreError, messageOf } from '../errors.js';
import { signalGroup } from './proc.js';

/**
 * The supervisor binary's helper modes that make mount(2) and umount(2) calls for tsbox (Node
 * has neither): `mount` (a task's rootfs), `umount-all` (the rootfs at Delete) and `umount`
 * (a pod's /dev/shm at Stop). Starting a process from tsbox blocks its event loop for the
 * fork of a large process (3 to 5 ms here, on every pod's start and stop); HelperService keeps
 * one `tsbox-shim serve` running instead, which forks itself (a small process) for each
 * request, so a mount costs well under a millisecond of tsbox's time.
 */

/** What one helper run said. */
export interface HelperResult {
  /** Its exit status, 128+N when signal N ended it. */
  readonly status: number;
  readonly stdout: string;
  readonly stderr: string;
}

export interface HelperRunOptions {
  /** How long the run may take before it is ended and the call fails. */
  readonly timeoutMs: number;
  readonly signal?: CallSignal;
}

/** Where the helper modes run: a HelperService, or the binary's path (a process per run). */
export type Helper = HelperService | string;

/**
 * Runs a helper mode; resolves with its stdout when it succeeded, else rejects with a TsboxError
 * (Internal) saying `what` and the helper's own one line of stderr.
 */
export async function runHelper(helper: Helper, args: readonly string[], what: string, options: HelperRunOptions): Promise<string> {
  const result = typeof helper === 'string' ? await runOnce(helper, args, options) : await helper.run(args, options);
  if (result.status === 0) return result.stdout;
  throw new TsboxError('Internal', `${what}: ${result.stderr.trim() || `the helper exited with status ${result.status}`}`);
}

/** A helper run as a process of its own. */
function runOnce(path: string, args: readonly string[], { timeoutMs, signal }: HelperRunOptions): Promise<HelperResult> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) {
      reject(abortError(signal));
      return;
    }
    const options = { encoding: 'utf8' as const, timeout: timeoutMs, ...(signal === undefined ? {} : { signal }) };
    execFile(path, args, options, (err, stdout, stderr) => {
      if (err === null) resolve({ status: 0, stdout, stderr });
      else if (signal?.aborted) reject(abortError(signal));
      else if (typeof err.code === 'number') resolve({ status: err.code, stdout, stderr });
      else if (err.killed === true) reject(new TsboxError('DeadlineExceeded', `${path} ${args[0] ?? ''} did not finish within ${timeoutMs} ms`, { cause: err }));
      else reject(new TsboxError('Internal', `cannot run ${path}: ${messageOf(err)}`, { cause: err }));
    });
  });
}

/** One request's wait for its answer. */
interface Pending {
  readonly resolve: (result: HelperResult) => void;
  readonly reject: (err: Error) => void;
}

/** The answer's header: "<status> <stdout bytes> <stderr bytes>\n". */
const HEADER = /^(\d{1,3}) (\d{1,10}) (\d{1,10})\n/;

/**
 * One `tsbox-shim serve` process, started at the first request and again after it ends, taking
 * requests one at a time. A request that outlives its bound, or whose call is cancelled, ends
 * the process (with the request's child: its process group), and the next request starts a new
 * one; nothing else waits behind a mount that hangs for longer than its bound.
 */
export class HelperService {
  readonly #path: string;
  readonly #log: Logger;
  #child: ChildProcess | undefined;
  #pending: Pending | undefined;
  #buffered = Buffer.alloc(0);
  #stderr = '';
  /** The last request queued: the next one is written once it has settled. */
  #tail: Promise<unknown> = Promise.resolve();
  #closed = false;

  constructor(path: string, log: Logger) {
    this.#path = path;
    this.#log = log;
  }

  /** The serving process's pid, when one runs (for tests and diagnostics). */
  get pid(): number | undefined {
    return this.#child?.pid;
  }

  run(args: readonly string[], options: HelperRunOptions): Promise<HelperResult> {
    if (args.length === 0 || args.some((a) => a.includes('\0'))) {
      return Promise.reject(new TsboxError('InvalidArgument', 'a helper request needs a mode, and no argument may contain a NUL byte'));
    }
    const result = this.#tail.then(() => this.#request(args, options));
    this.#tail = result.catch(ignoreError('that failure went to its own caller; the next request runs regardless'));
    return result;
  }

  /** Lets the serving process go: it exits once it reads the end of its stdin. */
  close(): void {
    this.#closed = true;
    this.#child?.stdin?.end();
    this.#child = undefined;
  }

  #request(args: readonly string[], { timeoutMs, signal }: HelperRunOptions): Promise<HelperResult> {
    if (this.#closed) return Promise.reject(new TsboxError('Unavailable', 'tsbox is shutting down: no more mounts'));
    if (signal?.aborted) return Promise.reject(abortError(signal));
    return new Promise<HelperResult>((resolve, reject) => {
      let child: ChildProcess;
      try {
        child = this.#serving();
      } catch (err) {
        reject(err instanceof Error ? err : new Error(String(err)));
        return;
      }
      const done = (): void => {
        clearTimeout(timer);
        signal?.removeEventListener('abort', onAbort);
        this.#pending = undefined;
      };
      // Ends the serving process and the request's child with it; the next request starts anew.
      const end = (err: Error): void => {
        done();
        this.#stop(child);
        reject(err);
      };
      const onAbort = (): void => end(abortError(signal as CallSignal));
      const timer = setTimeout(() => end(new TsboxError('DeadlineExceeded', `tsbox-shim ${args[0] ?? ''} did not finish within ${timeoutMs} ms`)), timeoutMs);
      signal?.addEventListener('abort', onAbort, { once: true });
      this.#pending = {
        resolve: (result) => {
          done();
          resolve(result);
        },
        reject: (err) => {
          done();
          reject(err);
        },
      };
      const request = Buffer.concat([Buffer.from(`${args.length}\n`), ...args.map((a) => Buffer.from(`${a}\0`))]);
      child.stdin?.write(request);
    });
  }

  /** The serving process, started when none runs. */
  #serving(): ChildProcess {
    if (this.#child !== undefined) return this.#child;
    const child = spawn(this.#path, ['serve'], { stdio: ['pipe', 'pipe', 'pipe'], detached: true, cwd: '/' });
    this.#child = child;
    this.#buffered = Buffer.alloc(0);
    this.#stderr = '';
    // The daemon ends it (close); it keeps no one else's process running.
    child.unref();
    for (const stream of [child.stdin, child.stdout, child.stderr]) (stream as { unref?: () => void } | null)?.unref?.();
    child.stdin?.on('error', (err) => this.#log.debug({ err }, 'the mount helper stopped reading its requests'));
    child.stdout?.on('data', (chunk: Buffer) => this.#answer(child, chunk));
    child.stderr?.setEncoding('utf8').on('data', (text: string) => {
      this.#stderr = (this.#stderr + text).slice(-2000);
    });
    child.once('error', (err) => this.#ended(child, new TsboxError('Internal', `cannot run the mount helper ${this.#path} serve: ${err.message}`, { cause: err })));
    child.once('exit', (code, sig) => {
      const said = this.#stderr.trim();
      this.#ended(child, new TsboxError('Internal', `the mount helper ${this.#path} serve ended (${sig ?? `code ${String(code)}`})${said === '' ? '' : `: ${said}`}`));
    });
    return child;
  }

  #answer(child: ChildProcess, chunk: Buffer): void {
    if (child !== this.#child) return;
    this.#buffered = Buffer.concat([this.#buffered, chunk]);
    const header = HEADER.exec(this.#buffered.subarray(0, 64).toString('latin1'));
    if (header === null) {
      if (this.#buffered.includes(0x0a) || this.#buffered.length >= 64) {
        this.#stop(child);
        this.#pending?.reject(new TsboxError('Internal', `the mount helper answered something that is not an answer: ${JSON.stringify(this.#buffered.subarray(0, 64).toString('latin1'))}`));
      }
      return;
    }
    const [line, status, outBytes, errBytes] = header as unknown as [string, string, string, string];
    const total = line.length + Number(outBytes) + Number(errBytes);
    if (this.#buffered.length < total) return;
    const out = this.#buffered.subarray(line.length, line.length + Number(outBytes)).toString('utf8');
    const err = this.#buffered.subarray(line.length + Number(outBytes), total).toString('utf8');
    this.#buffered = this.#buffered.subarray(total);
    const pending = this.#pending;
    if (pending === undefined || this.#buffered.length > 0) {
      this.#stop(child);
      pending?.reject(new TsboxError('Internal', 'the mount helper answered a request it was not sent'));
      return;
    }
    pending.resolve({ status: Number(status), stdout: out, stderr: err });
  }

  #ended(child: ChildProcess, err: Error): void {
    if (child !== this.#child) return;
    this.#child = undefined;
    if (this.#pending !== undefined) this.#pending.reject(err);
    else if (!this.#closed) this.#log.warn({ err }, 'the mount helper ended between requests; the next one starts it again');
  }

  #stop(child: ChildProcess): void {
    if (this.#child === child) this.#child = undefined;
    if (child.pid !== undefined && child.exitCode === null && child.signalCode === null) signalGroup(child.pid, 'SIGKILL');
  }
}
