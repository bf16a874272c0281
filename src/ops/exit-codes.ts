/**
 * The exit codes of tsbox's commands, in one table: a script branches on them, the help text
 * and the README list them from here. `sandbox wait` exits with the sandbox's own status
 * instead when it succeeds (and prints it); an error there prints nothing on stdout.
 */
const EXIT_TABLE = {
  /** Done. */
  ok: { code: 0, help: "done (sandbox wait: the sandbox's exit status, also printed)" },
  /** An unexpected failure (a bug, or an answer tsbox cannot classify); the message says what. */
  failure: { code: 1, help: 'unexpected failure' },
  /** The command line or the configuration is wrong. */
  usage: { code: 2, help: 'bad command line or configuration' },
  /** containerd does not answer at --address. */
  containerdDown: { code: 3, help: 'containerd is not running at --address' },
  /** containerd answers, but has no sandboxer named "tsbox" (no proxy plugin in its config). */
  notRegistered: { code: 4, help: "tsbox is not registered as a sandboxer in containerd's config" },
  /** containerd knows the tsbox sandboxer but cannot reach tsbox on its socket. */
  tsboxDown: { code: 5, help: 'containerd cannot reach tsbox (tsbox not running on its socket)' },
  /** No sandbox with that id in that namespace, in containerd or in tsbox. */
  notFound: { code: 6, help: 'no such sandbox' },
  /** containerd and tsbox disagree: the id is known to one of them only. */
  mismatch: { code: 7, help: 'containerd and tsbox disagree about the sandbox (known to one only)' },
  /** A sandbox with that id exists already. */
  exists: { code: 8, help: 'the sandbox exists already' },
  /** The sandbox is not in a state that allows it (e.g. `rm` of a sandbox owned by another sandboxer). */
  badState: { code: 9, help: 'the sandbox is not in a state that allows the command' },
  /** `tsbox doctor` found a problem. */
  unhealthy: { code: 10, help: 'tsbox doctor found problems' },
  /** `tsbox install` refused to change a file it cannot safely merge. */
  refused: { code: 11, help: 'tsbox install refused to change a file' },
} as const;

type ExitTable = typeof EXIT_TABLE;

/** Each exit code by name. */
export const EXIT = Object.fromEntries(Object.entries(EXIT_TABLE).map(([name, { code }]) => [name, code])) as {
  readonly [K in keyof ExitTable]: ExitTable[K]['code'];
};

export type ExitCode = (typeof EXIT)[keyof typeof EXIT];

/** The table for `--help` and the README. */
export const EXIT_CODE_HELP = ['Exit codes:', ...Object.values(EXIT_TABLE).map(({ code, help }) => `  ${String(code).padEnd(4)}${help}`)].join('\n');

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
