import { type ChildProcess, execFile, spawn } from 'node:child_process';
import type { Logger } from 'pino';
import type { CallSignal } from '../controller/types.js';
import { TsboxError, abortError, isTsboxError, messageOf } from '../base/errors.js';
import { boundOf, pollUntil } from './bound.js';
import type { ProgramAnswer } from './child-answer.js';
import { signalGroup } from './proc.js';

/**
 * The supervisor binary's helper modes that make mount(2) and umount(2) calls for tsbox (Node
 * has neither): `mount` (a task's rootfs), `umount-all` (the rootfs at Delete) and `umount`
 * (a pod's /dev/shm at Stop); and `spawn`, which starts a container's holder or a sandbox's
 * supervisor. Starting a process from tsbox blocks its event loop for the
 * fork of a large process (3 to 5 ms here, on every pod's start and stop); HelperService keeps
 * `tsbox-shim serve` processes running instead, each of which forks itself (a small process)
 * for each request, so tsbox only writes a request and reads an answer (a task's rootfs mount
 * took 4.8 ms through a process per mount, 1.4 ms this way: p50 of 12 pods, bench/profile-pods.ts).
 */

/** A program `tsbox-shim serve` starts and leaves running (see spawnArgs). */
export interface SpawnRequest {
  /** Absolute. */
  readonly path: string;
  readonly args: readonly string[];
  /** Its whole environment (entries without a value are left out). */
  readonly env: Readonly<Record<string, string | undefined>>;
}

/**
 * The request that has a serving process start a program that goes on running (a container's
 * holder, a sandbox's supervisor): its answer is what the program wrote on stdout and stderr
 * until it closed both, and the program runs on in a session of its own. Until then it ends
 * with the request (PR_SET_PDEATHSIG), so a request ended for its bound, or a serving process
 * that dies, takes an unanswered program with it (what that program started is its caller's to
 * end: runc dies with a holder, a sandbox goes with its cgroup); tsbox-ctr and tsbox-shim take
 * that back just before they answer.
 */
export function spawnArgs(request: SpawnRequest): string[] {
  const env = Object.entries(request.env)
    .filter((entry): entry is [string, string] => entry[1] !== undefined && entry[0] !== '' && !entry[0].includes('='))
    .map(([name, value]) => `${name}=${value}`);
  return ['spawn', request.path, String(env.length), ...env, ...request.args];
}

/** The first line of a spawned program's answer, or what it said instead when it wrote none. */
export function spawnedAnswer(result: HelperResult): ProgramAnswer {
  const newline = result.stdout.indexOf('\n');
  if (newline >= 0) return { line: result.stdout.slice(0, newline) };
  const said = `${result.stdout}${result.stderr === '' ? '' : ` ${result.stderr}`}`.trim();
  return { said: `${said === '' ? 'no answer' : said} (status ${result.status})` };
}

/**
 * Starts a program through a serving process of `service` when one may take it (tryRun), and
 * resolves with its answer; undefined when none may (the caller then starts it itself). A
 * request ended by its bound fails with `timeoutError()`, the caller's own words for it.
 */
export function spawnThrough(
  service: HelperService | undefined,
  request: SpawnRequest,
  options: HelperRunOptions & { readonly timeoutError: () => Error },
): Promise<ProgramAnswer> | undefined {
  const started = service?.tryRun(spawnArgs(request), { timeoutMs: options.timeoutMs, ...(options.signal === undefined ? {} : { signal: options.signal }) });
  return started?.then(spawnedAnswer, (err: unknown) => {
    throw isTsboxError(err, 'DeadlineExceeded') ? options.timeoutError() : err;
  });
}

/** What one helper run said. */
export interface HelperResult {
  /** Its exit status, 128+N when signal N ended it. */
  readonly status: number;
  readonly stdout: string;
  readonly stderr: string;
}

export interface HelperRunOptions {
  /** How long the run may take, waiting for its turn included, before the call fails. */
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

/**
 * How many serving processes run side by side: a mount that hangs holds one, not every pod's;
 * starts (a holder holds its process until its runc create is done) take at most all but one
 * (tryRun), so the pods' mounts do not wait behind three containers' starts.
 */
export const HELPER_SERVERS = 4;

/** How long a request ended by its bound waits for its own child to be gone before it fails. */
const KILL_WAIT_MS = 2000;

/**
 * What one request to `tsbox-shim serve` may carry: the program is built with these values
 * (scripts/build-shim.mjs writes them into its header).
 */
export const SERVE_MAX_ARGS = 4096;
export const SERVE_MAX_BYTES = 4 << 20;

function withinServeBounds(args: readonly string[]): boolean {
  if (args.length > SERVE_MAX_ARGS) return false;
  let bytes = 0;
  for (const a of args) bytes += Buffer.byteLength(a) + 1;
  return bytes <= SERVE_MAX_BYTES;
}

/** The answer's header: "<status> <stdout bytes> <stderr bytes>\n". */
const HEADER = /^(\d{1,3}) (\d{1,10}) (\d{1,10})\n/;

/** One request, from run() until it is answered or fails. */
interface Job {
  readonly args: readonly string[];
  readonly resolve: (result: HelperResult) => void;
  readonly reject: (err: Error) => void;
  readonly timer: NodeJS.Timeout;
  readonly signal: CallSignal | undefined;
  readonly onAbort: () => void;
  /** The serving process it was given to; undefined while it waits for one. */
  server: Server | undefined;
  /** Written to a process that had already ended (it never read it): sent again, once. */
  resent: boolean;
}

/** One `tsbox-shim serve` process. */
interface Server {
  readonly child: ChildProcess;
  job: Job | undefined;
  chunks: Buffer[];
  bytes: number;
  stderr: string;
  /** Its stdin refused the job's request (EPIPE): the process had ended before reading it. */
  unread: boolean;
}

/**
 * A few `tsbox-shim serve` processes (HELPER_SERVERS), all started at the first request, and again
 * when a request finds fewer (one ended), each taking requests one at a time. A request that outlives its bound, or whose
 * call is cancelled, ends the process serving it with the request's own child (its process
 * group), and fails once that child is gone (within KILL_WAIT_MS), so that an unmount which
 * follows finds what it left; a request that waits for its turn fails the same way, without
 * ending anything.
 */
export class HelperService {
  readonly #path: string;
  readonly #log: Logger;
  readonly #servers = new Set<Server>();
  readonly #waiting: Job[] = [];
  /** close() was called: requests are still taken until every one has been answered. */
  #closing = false;
  #closed = false;
  #idle: (() => void) | undefined;

  constructor(path: string, log: Logger) {
    this.#path = path;
    this.#log = log;
  }

  /** Starts the serving processes now (else the first request does); none once closed. */
  start(): void {
    if (this.#closed) return;
    while (this.#servers.size < HELPER_SERVERS) this.#start();
  }

  /** The pids of the serving processes (for tests and diagnostics). */
  get pids(): number[] {
    return [...this.#servers].map((s) => s.child.pid ?? 0).filter((pid) => pid > 0);
  }

  run(args: readonly string[], options: HelperRunOptions): Promise<HelperResult> {
    if (args.length === 0 || args.some((a) => a.includes('\0'))) {
      return Promise.reject(new TsboxError('InvalidArgument', 'a helper request needs a mode, and no argument may contain a NUL byte'));
    }
    if (!withinServeBounds(args)) {
      return Promise.reject(new TsboxError('InvalidArgument', `a helper request takes at most ${SERVE_MAX_ARGS} arguments and ${SERVE_MAX_BYTES} bytes; this one has ${args.length}`));
    }
    if (this.#closed) return Promise.reject(new TsboxError('Unavailable', 'tsbox has stopped: no more mounts'));
    const { signal, timeoutMs } = options;
    if (signal?.aborted) return Promise.reject(abortError(signal));
    return new Promise<HelperResult>((resolve, reject) => {
      const job: Job = {
        args,
        resolve,
        reject,
        timer: setTimeout(() => this.#end(job, new TsboxError('DeadlineExceeded', `tsbox-shim ${args[0] ?? ''} did not finish within ${timeoutMs} ms`)), timeoutMs),
        signal,
        onAbort: () => this.#end(job, abortError(signal as CallSignal)),
        server: undefined,
        resent: false,
      };
      signal?.addEventListener('abort', job.onAbort, { once: true });
      this.#waiting.push(job);
      this.#dispatch();
    });
  }

  /**
   * As run(), but only when a serving process is free at once (they are started when none
   * runs) and another stays free for run(); undefined otherwise, or for a request past what a
   * serving process takes: the caller does the work another way rather than wait behind
   * requests that may take long (a spawned holder's runc create) or take the mounts' place.
   */
  tryRun(args: readonly string[], options: HelperRunOptions): Promise<HelperResult> | undefined {
    if (this.#closing || this.#closed || this.#waiting.length > 0 || !withinServeBounds(args)) return undefined;
    // One process is always left to run(): mounts never wait behind the starts.
    const free = HELPER_SERVERS - [...this.#servers].filter((s) => s.job !== undefined).length;
    if (free < 2) return undefined;
    return this.run(args, options);
  }

  /**
   * Lets the serving processes go once every request taken has been answered (each within its
   * own bound): each exits at the end of its stdin. Later requests fail Unavailable.
   */
  async close(): Promise<void> {
    this.#closing = true;
    if (this.#waiting.length > 0 || [...this.#servers].some((s) => s.job !== undefined)) {
      await new Promise<void>((resolve) => (this.#idle = resolve));
    }
    this.#closed = true;
    for (const server of this.#servers) server.child.stdin?.end();
    this.#servers.clear();
  }

  /** Gives waiting requests to free serving processes, starting processes up to HELPER_SERVERS. */
  #dispatch(): void {
    while (this.#waiting.length > 0) {
      // All of them at once: how many run (and the descriptors tsbox holds for them) does not
      // depend on how many requests happened to come together.
      this.start();
      const server = [...this.#servers].find((s) => s.job === undefined);
      if (server === undefined) return;
      const job = this.#waiting.shift() as Job;
      job.server = server;
      server.job = job;
      server.chunks = [];
      server.bytes = 0;
      server.unread = false;
      const request = Buffer.concat([Buffer.from(`${job.args.length}\n`), ...job.args.map((a) => Buffer.from(`${a}\0`))]);
      server.child.stdin?.write(request, (err) => {
        if (err !== null && err !== undefined && server.job === job) server.unread = true;
      });
    }
    if (this.#closing && this.#idle !== undefined && [...this.#servers].every((s) => s.job === undefined)) {
      const idle = this.#idle;
      this.#idle = undefined;
      idle();
    }
  }

  #start(): Server {
    const child = spawn(this.#path, ['serve'], { stdio: ['pipe', 'pipe', 'pipe'], detached: true, cwd: '/' });
    const server: Server = { child, job: undefined, chunks: [], bytes: 0, stderr: '', unread: false };
    this.#servers.add(server);
    // The daemon ends them (close); they keep no one else's event loop running.
    child.unref();
    for (const stream of [child.stdin, child.stdout, child.stderr]) (stream as { unref?: () => void } | null)?.unref?.();
    child.stdin?.on('error', (err) => this.#log.debug({ err, pid: child.pid }, 'a mount helper stopped reading its requests'));
    child.stdout?.on('data', (chunk: Buffer) => this.#answer(server, chunk));
    child.stderr?.setEncoding('utf8').on('data', (text: string) => {
      server.stderr = (server.stderr + text).slice(-2000);
    });
    child.once('error', (err) => this.#ended(server, new TsboxError('Internal', `cannot run the mount helper ${this.#path} serve: ${err.message}`, { cause: err })));
    // 'close', not 'exit': by then all it wrote on stderr has been read.
    child.once('close', (code, sig) => {
      const said = server.stderr.trim();
      this.#ended(server, new TsboxError('Internal', `the mount helper ${this.#path} serve ended (${sig ?? `code ${String(code)}`})${said === '' ? '' : `: ${said}`}`));
    });
    return server;
  }

  #answer(server: Server, chunk: Buffer): void {
    if (!this.#servers.has(server)) return; // ended already: what it still wrote is no one's
    const job = server.job;
    if (job === undefined) {
      this.#kill(server, 'it answered a request it was not sent');
      return;
    }
    server.chunks.push(chunk);
    server.bytes += chunk.length;
    const head = (server.chunks.length === 1 ? chunk : Buffer.concat(server.chunks)).subarray(0, 64).toString('latin1');
    const header = HEADER.exec(head);
    if (header === null) {
      if (head.includes('\n') || server.bytes >= 64) {
        this.#kill(server, 'it answered something that is not an answer');
        this.#settle(job, undefined, new TsboxError('Internal', `the mount helper answered something that is not an answer: ${JSON.stringify(head)}`));
      }
      return;
    }
    const [line, status, outBytes, errBytes] = header as unknown as [string, string, string, string];
    const total = line.length + Number(outBytes) + Number(errBytes);
    if (server.bytes < total) return;
    const all = Buffer.concat(server.chunks, server.bytes);
    server.chunks = [];
    server.bytes = 0;
    if (all.length > total) {
      this.#kill(server, 'it answered more than it was asked');
      this.#settle(job, undefined, new TsboxError('Internal', 'the mount helper answered more than one request'));
      return;
    }
    const stdout = all.subarray(line.length, line.length + Number(outBytes)).toString('utf8');
    const stderr = all.subarray(line.length + Number(outBytes), total).toString('utf8');
    this.#settle(job, { status: Number(status), stdout, stderr });
  }

  /** A serving process ended (or could not start). */
  #ended(server: Server, err: Error): void {
    if (!this.#servers.delete(server)) return;
    const job = server.job;
    server.job = undefined;
    if (job === undefined) {
      if (!this.#closing) this.#log.warn({ err }, 'a mount helper ended between requests; another starts when one is needed');
    } else if (server.unread && server.bytes === 0 && !job.resent) {
      // It had ended before it read the request: nothing of it ran, so it goes to another.
      job.resent = true;
      job.server = undefined;
      this.#waiting.unshift(job);
    } else {
      this.#settle(job, undefined, err);
    }
    this.#dispatch();
  }

  /** A request's bound or its call ended it. */
  #end(job: Job, err: Error): void {
    const server = job.server;
    if (server === undefined) {
      const at = this.#waiting.indexOf(job);
      if (at < 0) return; // already answered
      this.#waiting.splice(at, 1);
      this.#settle(job, undefined, err);
      this.#dispatch();
      return;
    }
    if (server.job !== job) return;
    const pid = server.child.pid;
    this.#kill(server, 'a request it served outlived its bound or was cancelled');
    server.job = undefined;
    clearTimeout(job.timer);
    job.signal?.removeEventListener('abort', job.onAbort);
    // The request's child may be in the middle of mount(2): what follows (the caller's unmount)
    // must find what it did, so the failure waits until the process group is gone.
    const groupGone = (): Promise<boolean> => {
      try {
        process.kill(-(pid ?? 0), 0);
        return Promise.resolve(false);
      } catch (e) {
        if ((e as NodeJS.ErrnoException).code === 'ESRCH') return Promise.resolve(true);
        return Promise.reject(e instanceof Error ? e : new Error(String(e)));
      }
    };
    void (pid === undefined ? Promise.resolve(true) : pollUntil(groupGone, boundOf(KILL_WAIT_MS, new AbortController().signal)))
      .then((gone) => {
        if (!gone) this.#log.warn({ pid, waitedMs: KILL_WAIT_MS }, 'a mount helper ended for its bound still has a process after SIGKILL');
      })
      .catch((e: unknown) => this.#log.warn({ err: e, pid }, 'cannot tell whether a mount helper ended for its bound is gone'))
      .finally(() => {
        job.reject(err);
        this.#dispatch();
      });
  }

  #settle(job: Job, result: HelperResult | undefined, err?: Error): void {
    clearTimeout(job.timer);
    job.signal?.removeEventListener('abort', job.onAbort);
    const server = job.server;
    if (server !== undefined && server.job === job) server.job = undefined;
    if (result !== undefined) job.resolve(result);
    else job.reject(err ?? new Error('no answer'));
    this.#dispatch();
  }

  /** Ends a serving process and its children (its process group); it is no longer used. */
  #kill(server: Server, why: string): void {
    this.#servers.delete(server);
    const { pid } = server.child;
    this.#log.debug({ pid, why }, 'ending a mount helper');
    if (pid !== undefined && server.child.exitCode === null && server.child.signalCode === null) signalGroup(pid, 'SIGKILL');
  }
}
