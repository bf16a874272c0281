/**
 * The exit codes of tsbox's commands, in one table: a script branches on them, the help text
 * and the README list them from here. `sandbox wait` exits with the sandbox's own status
 * instead when it succeeds (and prints it); an error there prints nothing on stdout.
 */
export const EXIT = {
  /** Done. */
  ok: 0,
  /** An unexpected failure (a bug, or an answer tsbox cannot classify); the message says what. */
  failure: 1,
  /** The command line or the configuration is wrong. */
  usage: 2,
  /** containerd does not answer at --address. */
  containerdDown: 3,
  /** containerd answers, but has no sandboxer named "tsbox" (no proxy plugin in its config). */
  notRegistered: 4,
  /** containerd knows the tsbox sandboxer but cannot reach tsbox on its socket. */
  tsboxDown: 5,
  /** No sandbox with that id in that namespace, in containerd or in tsbox. */
  notFound: 6,
  /** containerd and tsbox disagree: the id is known to one of them only. */
  mismatch: 7,
  /** A sandbox with that id exists already. */
  exists: 8,
  /** The sandbox is not in a state that allows it (e.g. `rm` of a sandbox owned by another sandboxer). */
  badState: 9,
  /** `tsbox doctor` found a problem. */
  unhealthy: 10,
  /** `tsbox install` refused to change a file it cannot safely merge. */
  refused: 11,
} as const;

export type ExitCode = (typeof EXIT)[keyof typeof EXIT];

/** The table for `--help` and the README. */
export const EXIT_CODE_HELP = `Exit codes:
  0   done (sandbox wait: the sandbox's exit status, also printed)
  1   unexpected failure
  2   bad command line or configuration
  3   containerd is not running at --address
  4   tsbox is not registered as a sandboxer in containerd's config
  5   containerd cannot reach tsbox (tsbox not running on its socket)
  6   no such sandbox
  7   containerd and tsbox disagree about the sandbox (known to one only)
  8   the sandbox exists already
  9   the sandbox is not in a state that allows the command
  10  tsbox doctor found problems
  11  tsbox install refused to change a file`;

/** An error the operator can act on: what failed, how to fix it, and the exit code. */
export class OperatorError extends Error {
  override readonly name = 'OperatorError';
  constructor(
    readonly exitCode: ExitCode,
    message: string,
    /** What to do about it, one sentence or a command. */
    readonly fix?: string,
    options?: { cause?: unknown },
  ) {
    super(message, options);
  }

  /** The text printed on stderr. */
  describe(): string {
    return this.fix === undefined ? `tsbox: ${this.message}\n` : `tsbox: ${this.message}\n  fix: ${this.fix}\n`;
  }
}
