import { type ChildProcess, spawn } from 'node:child_process';
import { join } from 'node:path';
import type { Logger } from 'pino';
import { readChildAnswer } from './child-answer.js';

/** The lock file in the state dir; it names the daemon that holds it. */
export const LOCK_FILE = 'tsbox.lock';

/** How long the lock helper may take to answer; it does a handful of syscalls. */
const ANSWER_TIMEOUT_MS = 10_000;
/** How long release() waits for the helper to exit after its stdin closes before killing it. */
const EXIT_TIMEOUT_MS = 5_000;

/** Another daemon holds the state dir. */
export class StateDirInUseError extends Error {
  override readonly name = 'StateDirInUseError';
  constructor(
    readonly stateDir: string,
    /** The holder's pid, undefined when its lock file names none yet. */
    readonly holderPid: number | undefined,
  ) {
    super(`state dir ${stateDir} is in use by another tsbox (pid ${holderPid ?? 'unknown'}; lock ${join(stateDir, LOCK_FILE)})`);
  }
}

/** The state dir, held by this daemon until release(). */
export interface StateLock {
  /** The lock file. */
  readonly path: string;
  /** Lets the lock go: ends the helper and waits for its exit. Idempotent. */
  release(): Promise<void>;
}

/**
 * Makes this daemon the only one on `stateDir`, whose records it alone may recover and
 * change. Node has no flock(2), so the supervisor binary's `lock` mode takes the lock and
 * holds it for as long as its stdin, a socket pair to this process, is open. The kernel
 * closes it when tsbox exits however it ends, SIGKILL included, so the lock needs no cleanup
 * after a crash and the helper never outlives tsbox (tsbox's end is close-on-exec: no sandbox
 * supervisor inherits it). A helper that dies while tsbox runs is logged and replaced.
 * Rejects with StateDirInUseError when another daemon holds the lock.
 */
export async function lockStateDir(stateDir: string, helper: string, logger: Logger): Promise<StateLock> {
  const path = join(stateDir, LOCK_FILE);
  let child = await takeLock(path, stateDir, helper);
  let released = false;
  const watch = (held: ChildProcess): void => {
    held.once('exit', (code, signal) => {
      if (released) return;
      logger.error({ lock: path, pid: held.pid, code, signal }, 'the state dir lock helper exited while tsbox runs: taking the lock again');
      takeLock(path, stateDir, helper).then(
        (next) => {
          if (released) {
            void endHelper(next);
            return;
          }
          child = next;
          watch(next);
          logger.info({ lock: path, pid: next.pid }, 'state dir locked again');
        },
        (err: unknown) => logger.error({ err, lock: path }, 'cannot lock the state dir again: another tsbox may start on it'),
      );
    });
  };
  watch(child);
  return {
    path,
    async release() {
      if (released) return;
      released = true;
      await endHelper(child);
    },
  };
}

/** Starts a lock helper and resolves with it once it holds the lock. */
async function takeLock(path: string, stateDir: string, helper: string): Promise<ChildProcess> {
  // Its own group: a Ctrl-C meant for tsbox's terminal must not release the lock before
  // tsbox's shutdown is done (the helper ignores SIGINT and SIGTERM anyway).
  const child = spawn(helper, ['lock', path], { stdio: ['pipe', 'pipe', 'pipe'], detached: true });
  child.stdin?.on('error', (e) => {
    // EPIPE: the helper is gone; its exit, not this, tells what happened. Anything else fails
    // the write that holds the lock, and shows as the helper's exit.
    if ((e as NodeJS.ErrnoException).code !== 'EPIPE') child.kill('SIGKILL');
  });
  const failed = (error: Error): Error => {
    // A helper that answered anything but "ok" exits by itself; one that did not answer in
    // time is ended, and reaped by Node.
    void endHelper(child);
    return error;
  };
  const answer = await readChildAnswer(child, {
    timeoutMs: ANSWER_TIMEOUT_MS,
    timeoutError: () => failed(new Error(`cannot lock ${path}: ${helper} lock did not answer within ${ANSWER_TIMEOUT_MS} ms`)),
    spawnError: (e) => failed(new Error(`cannot lock ${path}: cannot run ${helper}: ${e.message}`, { cause: e })),
  });
  if (answer.kind === 'ended') {
    const err = answer.stderr.trim();
    throw failed(new Error(`cannot lock ${path}: ${helper} lock exited (${answer.exit}) without an answer${err === '' ? '' : `: ${err.slice(0, 300)}`}`));
  }
  const { line } = answer;
  if (line === 'ok') return child;
  const busy = /^busy (\d+|unknown)$/.exec(line);
  if (busy !== null) throw failed(new StateDirInUseError(stateDir, busy[1] === 'unknown' ? undefined : Number(busy[1])));
  if (line.startsWith('error ')) throw failed(new Error(`cannot lock ${path}: ${line.slice(6)}`));
  throw failed(new Error(`cannot lock ${path}: ${helper} lock answered ${JSON.stringify(line.slice(0, 200))}`));
}

/** Closes the helper's stdin (it lets the lock go and exits) and waits for its exit; kills it past a bound. */
function endHelper(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
  return new Promise((resolve) => {
    const timer = setTimeout(() => child.kill('SIGKILL'), EXIT_TIMEOUT_MS);
    child.once('exit', () => {
      clearTimeout(timer);
      resolve();
    });
    child.stdin?.end();
  });
}
