import { spawn } from 'node:child_process';
import { TsboxError, abortError } from '../base/errors.js';
import type { CallSignal } from '../controller/types.js';

/**
 * runc run for one short command (kill, delete, ps, update, pause, resume) with tsbox's own
 * state root. Creating and starting go through the container's holder instead
 * (src/runtime/container-holder.ts), which must be runc's parent.
 */
export interface RuncOptions {
  /** The runc binary (a name looked up on PATH, or a path). */
  readonly runcPath: string;
  /** runc's state root for the namespace (tsbox's own: nothing else finds the containers there). */
  readonly root: string;
  /** runc --systemd-cgroup: the container's cgroupsPath is "slice:prefix:name". */
  readonly systemdCgroup: boolean;
}

/** How long one runc command may take (runc delete --force waits up to 10 s for a kill). */
const RUNC_TIMEOUT_MS = 30_000;

/** runc's message for a container or process that is not (any longer) there: containerd's NotFound. */
const GONE = /container does not exist|not running|no such process|process already finished|container not found|does not exist/i;

/**
 * Runs `runc --root R [--systemd-cgroup] ARGS…` and resolves with its stdout. A failure is a
 * TsboxError with runc's own last words: NotFound when runc says the container or process is
 * gone (containerd relies on that code for Kill and Delete), FailedPrecondition otherwise.
 */
export function runc(options: RuncOptions, args: readonly string[], call: { input?: string; signal?: CallSignal } = {}): Promise<string> {
  const argv = ['--root', options.root, ...(options.systemdCgroup ? ['--systemd-cgroup'] : []), ...args];
  return new Promise((resolve, reject) => {
    const child = spawn(options.runcPath, argv, { stdio: [call.input === undefined ? 'ignore' : 'pipe', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    let settled = false;
    const finish = (fn: () => void): void => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      call.signal?.removeEventListener('abort', onAbort);
      fn();
    };
    const onAbort = (): void => {
      child.kill('SIGKILL');
      finish(() => reject(abortError(call.signal as AbortSignal)));
    };
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      finish(() => reject(new TsboxError('DeadlineExceeded', `runc ${args[0]} did not finish within ${RUNC_TIMEOUT_MS} ms`)));
    }, RUNC_TIMEOUT_MS);
    if (call.signal?.aborted) {
      onAbort();
      return;
    }
    call.signal?.addEventListener('abort', onAbort, { once: true });
    child.stdout?.setEncoding('utf8').on('data', (chunk: string) => (out += chunk));
    child.stderr?.setEncoding('utf8').on('data', (chunk: string) => (err += chunk.length + err.length > 64 * 1024 ? '' : chunk));
    child.on('error', (e) => finish(() => reject(new TsboxError('Internal', `cannot run ${options.runcPath}: ${e.message}`, { cause: e }))));
    child.on('close', (code, signal) => {
      if (code === 0) {
        finish(() => resolve(out));
        return;
      }
      const said = lastWords(err) || `exit ${code ?? signal}`;
      finish(() => reject(new TsboxError(GONE.test(said) ? 'NotFound' : 'FailedPrecondition', `runc ${args[0]}: ${said}`)));
    });
    if (call.input !== undefined) child.stdin?.end(call.input);
  });
}

/** The message of runc's last log line on stderr (`time=… level=error msg="…"`), or the last line. */
export function lastWords(stderr: string): string {
  const lines = stderr.trim().split('\n').filter((l) => l.trim() !== '');
  const last = lines.at(-1) ?? '';
  const msg = /msg="((?:[^"\\]|\\.)*)"/.exec(last);
  return (msg === null ? last : (msg[1] as string).replace(/\\"/g, '"')).slice(0, 500);
}
