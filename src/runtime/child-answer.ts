import type { ChildProcess } from 'node:child_process';

/** What a helper process said: its first line, or nothing before it ended. */
export type ChildAnswer =
  | { readonly kind: 'line'; readonly line: string; readonly stderr: string }
  | { readonly kind: 'ended'; readonly partial: string; readonly stderr: string; readonly exit: string };

export interface ChildAnswerOptions {
  /** How long the child may take to answer. */
  readonly timeoutMs: number;
  /** The error the promise rejects with when it did not answer in time. */
  readonly timeoutError: () => Error;
  /** The error for a child that could not be run at all. */
  readonly spawnError: (err: Error) => Error;
  /** Ends the wait early (with this signal's abortError), e.g. the call that asked for it. */
  readonly signal?: AbortSignal;
  readonly abortError?: (signal: AbortSignal) => Error;
}

/**
 * Waits for the first line a helper process writes on stdout (tsbox's native supervisor
 * answers "ok …", "error …" or "busy …" there, then goes on running), with a bound, then lets
 * go of the child's stdout and stderr. A child whose stdout ends without a whole line has
 * failed: the answer carries what it wrote and its stderr, for the caller's message. The
 * caller owns the child: on a timeout or an abort it decides what to kill.
 */
export function readChildAnswer(child: ChildProcess, options: ChildAnswerOptions): Promise<ChildAnswer> {
  return new Promise((resolve, reject) => {
    const { signal } = options;
    let out = '';
    let err = '';
    let settled = false;
    const settle = (fn: () => void): void => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      signal?.removeEventListener('abort', onAbort);
      child.stdout?.destroy();
      child.stderr?.destroy();
      fn();
    };
    const onAbort = (): void => settle(() => reject(options.abortError?.(signal as AbortSignal) ?? new Error('aborted')));
    const timer = setTimeout(() => settle(() => reject(options.timeoutError())), options.timeoutMs);
    if (signal?.aborted) onAbort();
    else signal?.addEventListener('abort', onAbort, { once: true });
    child.once('error', (e) => settle(() => reject(options.spawnError(e))));
    child.stderr?.setEncoding('utf8').on('data', (chunk: string) => (err += chunk));
    child.stdout?.setEncoding('utf8').on('data', (chunk: string) => {
      out += chunk;
      const newline = out.indexOf('\n');
      if (newline >= 0) settle(() => resolve({ kind: 'line', line: out.slice(0, newline), stderr: err }));
    });
    // stderr may still be on its way when stdout ends: the child's exit says it is all there.
    child.stdout?.once('end', () => {
      const ended = (): void =>
        settle(() => resolve({ kind: 'ended', partial: out, stderr: err, exit: child.signalCode ?? `code ${String(child.exitCode)}` }));
      if (child.exitCode !== null || child.signalCode !== null) ended();
      else child.once('exit', ended);
    });
  });
}

/** What a started program answered: its first line, or what it wrote instead (for the caller's message). */
export type ProgramAnswer = { readonly line: string } | { readonly said: string };

/** A ChildAnswer as a ProgramAnswer: the line, or what it wrote and how it ended. */
export function programAnswerOf(answer: ChildAnswer): ProgramAnswer {
  if (answer.kind === 'line') return { line: answer.line };
  return { said: `${answer.partial}${answer.stderr === '' ? '' : ` ${answer.stderr}`} (it exited: ${answer.exit})`.trim() };
}
