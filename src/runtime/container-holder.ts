import { spawn } from 'node:child_process';
import { type FSWatcher, watch } from 'node:fs';
import { type Socket, createConnection } from 'node:net';
import { join } from 'node:path';
import { systemClock } from '../controller/clock.js';
import type { CallSignal, ExitInfo } from '../controller/types.js';
import { TsboxError, abortError, errnoOf, messageOf, readIfPresentNow } from '../base/errors.js';
import { type ChangeCalls, poolCalls } from '../base/fs-now.js';
import { type ProgramAnswer, programAnswerOf, readChildAnswer } from './child-answer.js';
import { type HelperService, spawnThrough } from './helper-service.js';
import { boundOf } from './bound.js';
import { signalGroup } from './proc.js';
import { type ProcessId, endProcess, isRunning, readExitRecord, superviseAgain } from './supervised.js';

/**
 * The per-container holder (native/tsbox-ctr.c), seen from tsbox: it runs `runc create` or
 * `runc exec`, holds the process's FIFOs and pty, is the process's parent, and writes its exit
 * to `<dir>/exit`. Everything tsbox needs to find it again is in `<dir>`: a restart of tsbox
 * ends no container and loses no exit. The task table (src/tasks/tasks.ts) runs every
 * container and exec of the Task API route through one.
 */

/** What the holder writes to `<dir>/pid` before it answers: both pids with their start times. */
export interface HolderRecord {
  readonly holderPid: number;
  readonly holderStart: string;
  readonly pid: number;
  readonly pidStart: string;
}

/** Parses `<dir>/pid`: "<holder-pid> <holder-start> <pid> <pid-start>\n"; undefined when malformed. */
export function parseHolderRecord(text: string): HolderRecord | undefined {
  const match = /^([1-9]\d{0,9}) (\d{1,20}) ([1-9]\d{0,9}) (\d{1,20})\n?$/.exec(text);
  if (match === null) return undefined;
  const [, holderPid, holderStart, pid, pidStart] = match as unknown as [string, string, string, string, string];
  return { holderPid: Number(holderPid), holderStart, pid: Number(pid), pidStart };
}

/** The holder itself, as supervised.ts names a process. */
function holderOf(record: HolderRecord): ProcessId {
  return { pid: record.holderPid, start: record.holderStart };
}

/**
 * True when a container made from this OCI config has no pid namespace of its own: none is
 * listed (the host's), or it joins one by path (a pod that shares its process namespace).
 * Then the kernel ends nothing else when the container's init ends, and the holder must end
 * the rest before it records the exit, as the runc shim does (ShouldKillAllOnExit), or CRI's
 * wait for the output's end never returns.
 */
export function sharesPidNamespace(config: unknown): boolean {
  const namespaces = (config as { linux?: { namespaces?: unknown } } | null)?.linux?.namespaces;
  if (!Array.isArray(namespaces)) return true;
  const pid = (namespaces as { type?: unknown; path?: unknown }[]).find((ns) => ns?.type === 'pid');
  return pid === undefined || (typeof pid.path === 'string' && pid.path !== '');
}

/** What every holder is given: where it keeps its files, the runc to run, the process's IO. */
export interface HolderIo {
  /** The holder's own directory (absolute; `<dir>/ctl` must fit a socket address: < 108 bytes). */
  readonly dir: string;
  /** The container id runc knows it by. */
  readonly id: string;
  /** runc's state root (absolute), tsbox's own. */
  readonly root: string;
  /** FIFO paths as CRI gives them; empty or absent: none (/dev/null). */
  readonly stdin?: string;
  readonly stdout?: string;
  readonly stderr?: string;
  readonly terminal: boolean;
  readonly systemdCgroup?: boolean;
  /** A file the holder creates once the exit file is written (tsbox's exits directory). */
  readonly notify?: string;
  readonly holderPath: string;
  /**
   * Starts the holder when one of its serving processes is free (no fork of tsbox itself);
   * else, and without it, tsbox starts the holder.
   */
  readonly starter?: HelperService;
  readonly runcPath?: string;
  /** How long the holder may take to answer (runc create included). */
  readonly timeoutMs: number;
  readonly signal?: CallSignal;
}

export interface CreateOptions extends HolderIo {
  /** The bundle (absolute), with config.json and the mounted rootfs. */
  readonly bundle: string;
  /** The container has no pid namespace of its own: see sharesPidNamespace. */
  readonly killAll: boolean;
  /**
   * Where the holder ends those processes itself, through the container's cgroup, rather than
   * with runc kill --all: the mount point of the cgroup2 hierarchy (version 2) or of the v1
   * freezer hierarchy (version 1).
   */
  readonly killThrough?: { readonly version: 1 | 2; readonly mount: string };
  /** The bundle has no poststart hooks: the holder starts the container without runc (see hasPoststartHooks). */
  readonly directStart?: boolean;
  /** The holder unmounts the bundle's rootfs when the init ends (tsbox mounted it). */
  readonly unmountRootfs?: boolean;
}

export interface ExecOptions extends HolderIo {
  /** The OCI process to run in the container; `terminal` is set from the options. */
  readonly process: Record<string, unknown>;
  /** How `<dir>/process.json` is written (at once where the directory is held in memory); the pool's by default. */
  readonly changes?: ChangeCalls;
}

function ioArgs(io: HolderIo): string[] {
  const args = ['--dir', io.dir, '--id', io.id, '--root', io.root];
  for (const [flag, path] of [['--stdin', io.stdin], ['--stdout', io.stdout], ['--stderr', io.stderr]] as const) {
    if (path !== undefined && path !== '') args.push(flag, path);
  }
  if (io.terminal) args.push('--terminal');
  if (io.systemdCgroup === true) args.push('--systemd-cgroup');
  if (io.runcPath !== undefined) args.push('--runc', io.runcPath);
  if (io.notify !== undefined) args.push('--notify', io.notify);
  return args;
}

/**
 * True when an OCI config names poststart hooks (or cannot be read as a config): then only
 * `runc start` may start the container, since newer runc versions may run them there. Without
 * any, starting is what runc start does alone in runc 1.1: the holder opens runc's exec FIFO.
 */
export function hasPoststartHooks(config: unknown): boolean {
  if (config === null || typeof config !== 'object') return true;
  const hooks = (config as { hooks?: unknown }).hooks;
  if (hooks === undefined || hooks === null) return false;
  if (typeof hooks !== 'object') return true;
  const poststart = (hooks as { poststart?: unknown }).poststart;
  return poststart !== undefined && poststart !== null && (!Array.isArray(poststart) || poststart.length > 0);
}

/** Creates the container (runc create, not started): resolves once it exists, with its holder. */
export function createContainer(options: CreateOptions): Promise<ContainerHolder> {
  const args = ['create', ...ioArgs(options), '--bundle', options.bundle];
  if (options.killAll && options.killThrough !== undefined) {
    args.push(options.killThrough.version === 2 ? '--kill-all-v2' : '--kill-all-freezer', options.killThrough.mount);
  } else if (options.killAll) {
    args.push('--kill-all');
  }
  if (options.directStart === true) args.push('--direct-start');
  if (options.unmountRootfs === true) args.push('--unmount-rootfs');
  return runHolder(options, args, `create container ${options.id}`);
}

/** Runs a process in a created or running container (runc exec --detach), with its own holder. */
export async function execProcess(options: ExecOptions): Promise<ContainerHolder> {
  const spec = join(options.dir, 'process.json');
  await (options.changes ?? poolCalls).writeFile(spec, JSON.stringify({ ...options.process, terminal: options.terminal }), { mode: 0o600 });
  return runHolder(options, ['exec', ...ioArgs(options), '--process', spec], `exec in container ${options.id}`);
}

async function runHolder(io: HolderIo, args: string[], what: string): Promise<ContainerHolder> {
  const said = (await startThroughService(io, args, what)) ?? (await startFromTsbox(io, args, what));
  const line = 'line' in said ? said.line : '';
  if (line.startsWith('error ')) throw new TsboxError('FailedPrecondition', `cannot ${what}: ${line.slice(6)}`);
  const ok = /^ok (\d+) (\d+)$/.exec(line);
  if (ok === null) throw new TsboxError('Internal', `container holder failed: ${('line' in said ? line : said.said).slice(0, 300)}`);
  const record = parseHolderRecord((await readIfPresentNow(join(io.dir, 'pid'))) ?? '');
  if (record === undefined || record.holderPid !== Number(ok[1]) || record.pid !== Number(ok[2])) {
    throw new TsboxError('Internal', `container holder ${ok[1]} answered but ${join(io.dir, 'pid')} does not name it`);
  }
  return new ContainerHolder(io.dir, record);
}

function holderTimeout(io: HolderIo, what: string): TsboxError {
  return new TsboxError('DeadlineExceeded', `cannot ${what}: its holder did not answer within ${io.timeoutMs} ms`);
}

/** The holder started by a serving process of io.starter; undefined when none may take it. */
async function startThroughService(io: HolderIo, args: string[], what: string): Promise<ProgramAnswer | undefined> {
  const started = spawnThrough(
    io.starter,
    { path: io.holderPath, args, env: process.env },
    { timeoutMs: io.timeoutMs, ...(io.signal === undefined ? {} : { signal: io.signal }), timeoutError: () => holderTimeout(io, what) },
  );
  if (started === undefined) return undefined;
  try {
    return await started;
  } catch (err) {
    // The request's end ended a holder that had not answered (and runc with it); one that
    // answered meanwhile is found by the record it writes first, and ended.
    const early = await readEarlyRecord(io.dir);
    if (early !== undefined) await endWorkingHolder(early, HOLDER_KILL_WAIT_MS);
    throw err;
  }
}

/** The holder started by tsbox itself (a fork of tsbox's process). */
async function startFromTsbox(io: HolderIo, args: string[], what: string): Promise<ProgramAnswer> {
  const child = spawn(io.holderPath, args, { detached: true, stdio: ['ignore', 'pipe', 'pipe'] });
  let answer;
  try {
    answer = await readChildAnswer(child, {
      timeoutMs: io.timeoutMs,
      timeoutError: () => holderTimeout(io, what),
      spawnError: (e) => new TsboxError('Internal', `cannot run the container holder ${io.holderPath}: ${e.message}`, { cause: e }),
      ...(io.signal === undefined ? {} : { signal: io.signal, abortError }),
    });
  } catch (err) {
    // A holder that did not answer is ended with runc under it (runc dies with it: PDEATHSIG).
    if (child.pid !== undefined) signalGroup(child.pid, 'SIGKILL');
    throw err;
  }
  child.unref();
  return programAnswerOf(answer);
}

/** What findContainerHolder found in a holder's directory. */
export type FoundHolder =
  | { readonly kind: 'running'; readonly holder: ContainerHolder }
  | { readonly kind: 'exited'; readonly exit: ExitInfo }
  /** A holder that has not answered yet and still runs (tsbox stopped while it worked). */
  | { readonly kind: 'working'; readonly holder: ProcessId }
  /** No record: the holder never answered, or this is not a holder's directory. */
  | { readonly kind: 'absent' };

/** The exit when the holder is gone without having written one. */
function lostExit(): ExitInfo {
  return { status: 255, exitedAt: systemClock(), reason: 'exit status unknown: the container holder was killed before it could record it' };
}

/** `<dir>/holder`, what a holder writes of itself before it answers: "<pid> <start>"; undefined while there is none. */
async function readEarlyRecord(dir: string): Promise<ProcessId | undefined> {
  const early = /^([1-9]\d*) (\d+)\n$/.exec((await readIfPresentNow(join(dir, 'holder'))) ?? '');
  return early === null ? undefined : { pid: Number(early[1]), start: early[2] as string };
}

/**
 * Finds a holder again from its directory (after a restart of tsbox): the exit file if it
 * was written; else the holder, trusted only when its pid still has the recorded start time.
 */
export async function findContainerHolder(dir: string): Promise<FoundHolder> {
  const exit = await readExitRecord(dir);
  if (exit !== undefined) return { kind: 'exited', exit };
  const record = parseHolderRecord((await readIfPresentNow(join(dir, 'pid'))) ?? '');
  if (record === undefined) {
    const holder = await readEarlyRecord(dir);
    if (holder === undefined || !(await isRunning(holder))) return { kind: 'absent' };
    // It may have answered between the first read and this one.
    const answered = parseHolderRecord((await readIfPresentNow(join(dir, 'pid'))) ?? '');
    if (answered === undefined) return { kind: 'working', holder };
    return { kind: 'running', holder: new ContainerHolder(dir, answered) };
  }
  const found = await superviseAgain(holderOf(record), () => readExitRecord(dir));
  if (found.kind === 'running') return { kind: 'running', holder: new ContainerHolder(dir, record) };
  return { kind: 'exited', exit: found.kind === 'exited' ? found.exit : lostExit() };
}

/**
 * Ends a holder found still at work (and runc under it: its process group) and waits, at most
 * `timeoutMs`, for it to be gone; false when it outlived the bound.
 */
export function endWorkingHolder(holder: ProcessId, timeoutMs: number): Promise<boolean> {
  return endProcess(holder, boundOf(timeoutMs, new AbortController().signal), { group: true });
}

/** How waitExit follows the exit besides the control socket. */
export interface WaitExitOptions {
  /** Told when the directory cannot be watched (the exit is still seen, through the socket). */
  readonly onWatchLost?: (err: Error) => void;
  /** fs.watch, or a stand-in. */
  readonly watchDir?: (dir: string, listener: (event: string, name: string | null) => void) => FSWatcher;
  /** Told the container's OOM-kill count each time it grows, once `watchOom` is on. */
  readonly onOom?: (kills: number) => void;
}

/** How long a holder ended after a failed start is waited for. */
const HOLDER_KILL_WAIT_MS = 2000;

/** How long a control request may take (runc start included). */
const CONTROL_TIMEOUT_MS = 30_000;

/** One running holder: its control socket and its exit. */
export class ContainerHolder {
  constructor(
    readonly dir: string,
    readonly record: HolderRecord,
  ) {}

  /** The container's init (create) or the exec'd process, as a host pid. */
  get pid(): number {
    return this.record.pid;
  }

  /** runc start: the container's process runs. Idempotent while it runs. */
  async start(signal?: CallSignal): Promise<void> {
    await this.#request('start', signal);
  }

  /** Sets the terminal's size; a process without a terminal accepts and ignores it. */
  async resize(width: number, height: number, signal?: CallSignal): Promise<void> {
    if (!Number.isInteger(width) || !Number.isInteger(height) || width < 0 || height < 0 || width > 65535 || height > 65535) {
      throw new TsboxError('InvalidArgument', `terminal size ${width}x${height} is out of range`);
    }
    await this.#request(`resize ${width} ${height}`, signal);
  }

  /**
   * Signals the process through its holder, which has not reaped it yet (so the pid is still
   * the process's): NotFound once it has exited.
   */
  async kill(signalNumber: number, signal?: CallSignal): Promise<void> {
    await this.#request(`kill ${signalNumber}`, signal);
  }

  /**
   * Has the holder watch the container's cgroup for OOM kills (`file`: its memory.events or
   * memory.oom_control) while the container runs; each kill reaches `waitExit`'s `onOom`.
   * Returns the count of OOM kills so far. Asking again (a restarted tsbox) keeps the one watch.
   */
  async watchOom(file: string, signal?: CallSignal): Promise<number> {
    const said = await this.#request(`oom ${file}`, signal);
    return Number(/^ok (\d+)$/.exec(said)?.[1] ?? 0);
  }

  /** Lets go of the holder's stdin writer: the process sees EOF once CRI's writer closes too. */
  async closeIO(signal?: CallSignal): Promise<void> {
    await this.#request('closeio', signal);
  }

  async #request(line: string, signal: CallSignal | undefined): Promise<string> {
    const said = await controlRequest(this.dir, line, { timeoutMs: CONTROL_TIMEOUT_MS, ...(signal === undefined ? {} : { signal }) });
    if (said === undefined) throw new TsboxError('NotFound', `process ${this.pid} has exited: its holder no longer listens`);
    // Only kill answers it: the process is reaped, its pid may be another's.
    if (said === 'gone') throw new TsboxError('NotFound', `process ${this.pid} has already finished`);
    if (said.startsWith('ok')) return said;
    throw new TsboxError('FailedPrecondition', `${line.split(' ')[0]}: ${said.replace(/^error /, '')}`);
  }

  /** The exit, once written; undefined while the process runs. */
  exit(): Promise<ExitInfo | undefined> {
    return readExitRecord(this.dir);
  }

  /**
   * Resolves with the exit once the holder has written it: an inotify watch on the directory
   * sees the file arrive, and a `wait` on the control socket sees the holder end (its
   * connection closes), so a holder killed before it could write the exit is noticed too (status
   * 255). No polling. Either alone is enough: without the watch (inotify out of watches), the
   * socket's end is the sign; a connection that ends while the holder lives (refused, reset) is
   * made again, after a pause that grows to a few seconds.
   */
  waitExit(signal?: CallSignal, options: WaitExitOptions = {}): Promise<ExitInfo> {
    const watchDir = options.watchDir ?? watch;
    return new Promise<ExitInfo>((resolve, reject) => {
      let done = false;
      let conn: Socket | undefined;
      let watcher: FSWatcher | undefined;
      let retry: NodeJS.Timeout | undefined;
      let pauseMs = 50;
      const finish = (fn: () => void): void => {
        if (done) return;
        done = true;
        watcher?.close();
        conn?.destroy();
        clearTimeout(retry);
        signal?.removeEventListener('abort', onAbort);
        fn();
      };
      const check = async (holderGone: boolean): Promise<void> => {
        try {
          const found = holderGone ? await superviseAgain(holderOf(this.record), () => readExitRecord(this.dir)) : undefined;
          const exit = found === undefined ? await readExitRecord(this.dir) : found.kind === 'exited' ? found.exit : undefined;
          if (exit !== undefined) finish(() => resolve(exit));
          else if (found !== undefined) {
            if (found.kind === 'lost') {
              finish(() => resolve(lostExit()));
            } else if (!done) {
              // The holder lives but its socket let go of us: ask again, later.
              retry = setTimeout(dial, pauseMs);
              pauseMs = Math.min(pauseMs * 2, 5000);
            }
          }
        } catch (err) {
          finish(() => reject(err instanceof Error ? err : new Error(messageOf(err))));
        }
      };
      const dial = (): void => {
        if (done) return;
        const socket = createConnection(join(this.dir, 'ctl'));
        conn = socket;
        socket.on('connect', () => socket.write('wait\n'));
        // Before the end, the holder says each OOM kill the container's cgroup counts.
        let said = '';
        socket.setEncoding('utf8');
        socket.on('data', (chunk: string) => {
          said += chunk;
          for (let nl = said.indexOf('\n'); nl >= 0; nl = said.indexOf('\n')) {
            const oom = /^oom (\d+)$/.exec(said.slice(0, nl));
            said = said.slice(nl + 1);
            if (oom !== null) options.onOom?.(Number(oom[1]));
          }
          // Nothing but short lines comes here; a peer that says more is not our holder.
          if (said.length > 4096) socket.destroy();
        });
        // Any end of the connection (the holder exited or died, or never listened): look again.
        let ended = false;
        const onEnd = (): void => {
          if (ended) return;
          ended = true;
          void check(true);
        };
        socket.on('error', onEnd);
        socket.on('close', onEnd);
      };
      const onAbort = (): void => finish(() => reject(abortError(signal as AbortSignal)));
      if (signal?.aborted) {
        onAbort();
        return;
      }
      signal?.addEventListener('abort', onAbort, { once: true });
      try {
        watcher = watchDir(this.dir, (_event, name) => {
          if (name === 'exit') void check(false);
        });
        watcher.on('error', (err) => {
          // The watch is gone; the control socket still tells the end.
          watcher?.close();
          watcher = undefined;
          options.onWatchLost?.(err);
        });
      } catch (err) {
        // No watch to be had (ENOSPC: inotify's limits): the control socket tells the end.
        watcher = undefined;
        options.onWatchLost?.(err instanceof Error ? err : new Error(messageOf(err)));
      }
      dial();
      // The exit may have been written before the watch began.
      void check(false);
    });
  }
}

/**
 * Sends one request line to a holder's control socket and returns its one-line answer;
 * undefined when no holder listens there any more (its process has exited).
 */
export function controlRequest(dir: string, line: string, options: { timeoutMs: number; signal?: CallSignal }): Promise<string | undefined> {
  return new Promise((resolve, reject) => {
    const { signal } = options;
    let got = '';
    let done = false;
    const finish = (fn: () => void): void => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      signal?.removeEventListener('abort', onAbort);
      conn.destroy();
      fn();
    };
    const onAbort = (): void => finish(() => reject(abortError(signal as AbortSignal)));
    const timer = setTimeout(
      () => finish(() => reject(new TsboxError('DeadlineExceeded', `the container holder in ${dir} did not answer "${line}" within ${options.timeoutMs} ms`))),
      options.timeoutMs,
    );
    const conn = createConnection(join(dir, 'ctl'));
    if (signal?.aborted) onAbort();
    else signal?.addEventListener('abort', onAbort, { once: true });
    conn.setEncoding('utf8');
    conn.on('connect', () => conn.write(`${line}\n`));
    conn.on('data', (chunk: string) => {
      got += chunk;
      const newline = got.indexOf('\n');
      if (newline >= 0) finish(() => resolve(got.slice(0, newline)));
    });
    conn.on('error', (err) => {
      const code = errnoOf(err);
      // Gone: no socket, nobody listening, or the holder ended as the request was sent (EPIPE
      // when its end closed before the write, ECONNRESET after it).
      if (code === 'ENOENT' || code === 'ECONNREFUSED' || code === 'ECONNRESET' || code === 'EPIPE') finish(() => resolve(undefined));
      else finish(() => reject(new TsboxError('Internal', `cannot reach the container holder in ${dir}: ${err.message}`, { cause: err })));
    });
    // Closed without an answer: the holder ended meanwhile.
    conn.on('close', () => finish(() => resolve(undefined)));
  });
}
