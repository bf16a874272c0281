import { readFileSync } from 'node:fs';
import { homedir } from 'node:os';
import { dirname, isAbsolute, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parse as parseToml } from 'smol-toml';
import { z } from 'zod';

/** A configuration that cannot be used; `problems` lists every reason, one per line. */
export class ConfigError extends Error {
  override readonly name = 'ConfigError';
  constructor(readonly problems: readonly string[]) {
    super(`invalid configuration:\n${problems.map((p) => `  - ${p}`).join('\n')}`);
  }
}

/** The package's root: this file is dist/src/config/config.js in it. */
const packageRoot = join(dirname(fileURLToPath(import.meta.url)), '..', '..', '..');

/** The defaults for this user: system paths as root, per-user paths otherwise. */
export function defaultConfig(env: NodeJS.ProcessEnv = process.env, uid = process.getuid?.() ?? 0): Config {
  const root = uid === 0;
  const runtimeDir = env['XDG_RUNTIME_DIR'] || `/tmp/tsbox-${uid}`;
  const stateHome = env['XDG_STATE_HOME'] || join(env['HOME'] || homedir(), '.local', 'state');
  return {
    socket: root ? '/run/tsbox/tsbox.sock' : join(runtimeDir, 'tsbox', 'tsbox.sock'),
    socketMode: 0o660,
    taskApiHandlers: ['*'],
    stateDir: root ? '/var/lib/tsbox' : join(stateHome, 'tsbox'),
    logLevel: 'info',
    logFormat: 'auto',
    metricsAddress: '',
    backend: 'process',
    shimPath: join(packageRoot, 'dist', 'bin', 'tsbox-shim'),
    namespaces: root,
    cgroupParent: 'tsbox',
    // Empty: as containerd's config says (src/config/containerd-paths.ts).
    containerdAddress: '',
    containerdRoot: '',
    containerdState: '',
    containerdConfig: DEFAULT_CONTAINERD_CONFIG,
    startTimeoutMs: 10_000,
    killTimeoutMs: 10_000,
    shutdownDrainMs: 5000,
    recoveryConcurrency: 32,
    supervisorPollMs: 5000,
    crashAt: env['TSBOX_CRASH_AT'] ?? '',
  };
}

/** containerd's config file when none is named (containerd's own default). */
export const DEFAULT_CONTAINERD_CONFIG = '/etc/containerd/config.toml';

/** The system-wide file read when no --config is given, if it exists. */
export const DEFAULT_CONFIG_FILE = '/etc/tsbox/config.toml';

const absolutePath = z.string().min(1).refine(isAbsolute, 'must be an absolute path');
/** An absolute path, or empty for "as containerd's config says". */
const containerdPath = z.string().refine((p) => p === '' || isAbsolute(p), 'must be an absolute path (or empty: as containerd\'s config says)');
const mode = z.preprocess(
  (v) => (typeof v === 'string' && /^0?[0-7]{3}$/.test(v) ? parseInt(v, 8) : v),
  z.number({ error: 'must be an octal mode such as "0660"' }).int().min(0).max(0o777),
);
/** A metrics listen address: `HOST:PORT` (IPv6 in brackets) or an absolute socket path. */
export type ListenAddress = { readonly kind: 'tcp'; readonly host: string; readonly port: number } | { readonly kind: 'unix'; readonly path: string };

/** Parses a metrics listen address; undefined when it is not one. */
export function parseListenAddress(address: string): ListenAddress | undefined {
  if (isAbsolute(address)) return { kind: 'unix', path: address };
  const match = /^(?:\[([0-9A-Fa-f:.]+)\]|([A-Za-z0-9.-]+)):(\d{1,5})$/.exec(address);
  if (match === null) return undefined;
  const port = Number(match[3]);
  if (port < 1 || port > 65535) return undefined;
  return { kind: 'tcp', host: match[1] ?? match[2] ?? '', port };
}

const intFlag = (min: number, max: number) => z.coerce.number().int().min(min).max(max);
const boolFlag = z.union([z.boolean(), z.enum(['true', 'false']).transform((s) => s === 'true')]);

/** Every setting, as it may appear in the TOML file (snake_case) after key conversion. */
const schema = z
  .object({
    /** Unix socket containerd dials. */
    socket: absolutePath,
    /** Permission bits of the socket. */
    socketMode: mode,
    /**
     * No longer used: each pod on the Task API route has a task socket of its own, owned by the
     * pod's process, below the state dir (`s/`). Accepted so that a config written for an
     * earlier build still starts; tsbox says once that it is ignored.
     */
    taskSocket: absolutePath.optional(),
    /**
     * CRI runtime handlers whose pods' containers tsbox runs itself (Task API v3: no runc shim
     * per pod). `*` (the default) is every handler containerd's config puts on tsbox whose
     * runtime_type is runc's; empty is none. Pods of any other handler keep the version-2
     * route, on which containerd runs the handler's shim per pod (src/config/task-routes.ts).
     */
    taskApiHandlers: z.preprocess(
      (v) => (typeof v === 'string' ? v.split(',').map((h) => h.trim()).filter((h) => h !== '') : v),
      z.array(z.string().regex(/^(?:\*|[A-Za-z0-9][A-Za-z0-9._-]*)$/, 'must be CRI runtime handler names (or *)')),
    ),
    /** Where records, supervisor files and quarantined records live. */
    stateDir: absolutePath,
    logLevel: z.enum(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent']),
    /** `json` lines for journald and collectors, `pretty` for people, `auto`: pretty on a terminal. */
    logFormat: z.enum(['auto', 'json', 'pretty']),
    /**
     * Where /metrics, /healthz and /readyz are served: `HOST:PORT` (a loopback address such as
     * 127.0.0.1:9464), or an absolute unix socket path; empty turns the endpoint off.
     */
    metricsAddress: z
      .string()
      .refine((a) => a === '' || parseListenAddress(a) !== undefined, 'must be HOST:PORT (e.g. 127.0.0.1:9464), an absolute unix socket path, or empty'),
    /** `process` runs real sandboxes; `noop` runs nothing and exists for benchmarks only. */
    backend: z.enum(['process', 'noop']),
    /** The per-sandbox supervisor binary. */
    shimPath: absolutePath,
    /** Give each sandbox its own pid, ipc, uts and mount namespaces (root only). */
    namespaces: boolFlag,
    /** Parent cgroup of the cgroups of sandboxes that are not Kubernetes pods. */
    cgroupParent: z.string().regex(/^[A-Za-z0-9._-]+(?:\/[A-Za-z0-9._-]+)*$/, 'must be a relative cgroup path'),
    /**
     * containerd's socket: its runtime shims name a pod's task socket after it. This and the
     * next two come from containerd's config (containerdConfig); one given here must agree.
     */
    containerdAddress: containerdPath,
    /** containerd's root directory; CRI reads a pod's hostname, hosts and resolv.conf below it. */
    containerdRoot: containerdPath,
    /** containerd's state directory; CRI mounts a pod's /dev/shm from below it. */
    containerdState: containerdPath,
    /**
     * containerd's config file (with its imports): where tsbox reads containerd's root, state
     * and address, and checks the CRI handlers that use tsbox.
     */
    containerdConfig: absolutePath,
    /** How long a sandbox's supervisor may take to answer at Start before the Start fails. */
    startTimeoutMs: intFlag(100, 600_000),
    /**
     * How long a sandbox's processes may take to die of SIGKILL (at Stop, Shutdown, after a
     * failed Start, at recovery) before the call fails and the log names the cgroup and pids.
     */
    killTimeoutMs: intFlag(100, 600_000),
    /** How long a shutdown lets calls in flight finish before closing connections. */
    shutdownDrainMs: intFlag(0, 600_000),
    /** How many sandboxes are recovered at once at start-up. */
    recoveryConcurrency: intFlag(1, 1024),
    /**
     * How often sandboxes whose supervisor is not tsbox's child (started through
     * `tsbox-shim serve`, or found after a restart) are checked for a supervisor gone without
     * an exit file.
     */
    supervisorPollMs: intFlag(100, 600_000),
    /**
     * Crash tests only: the daemon kills itself with SIGKILL at this named point (see
     * CrashPoint in controller.ts, TaskCrashPoint in tasks/tasks.ts). Set only by the
     * TSBOX_CRASH_AT environment variable; no flag, file setting or RPC reaches it; empty
     * (off) by default.
     */
    crashAt: z.string(),
  })
  .strict();

/** The validated, frozen configuration every module receives: the schema's output. */
export type Config = Readonly<z.output<typeof schema>>;

export type ConfigInput = Partial<Record<keyof Config, unknown>>;

const camel = (key: string): string => key.replace(/[_-]([a-z])/g, (_, c: string) => c.toUpperCase());
/** Settings are named in messages as the TOML file spells them. */
const snake = (key: string): string => key.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`);

/** Reads a TOML config file into settings, with keys turned into camelCase. */
export function readConfigFile(path: string): ConfigInput {
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (err) {
    throw new ConfigError([`cannot read config file ${path}: ${(err as Error).message}`]);
  }
  let parsed: Record<string, unknown>;
  try {
    parsed = parseToml(text);
  } catch (err) {
    throw new ConfigError([`${path} is not valid TOML: ${(err as Error).message.split('\n')[0]}`]);
  }
  const out: Record<string, unknown> = {};
  for (const [key, value] of Object.entries(parsed)) out[camel(key)] = value;
  return out;
}

/**
 * Defaults < file < flags, validated together; every problem is reported at once. Relative
 * paths in flags are resolved against the working directory.
 */
export function resolveConfig(file: ConfigInput, flags: ConfigInput, base: Config = defaultConfig()): Config {
  const problems: string[] = [];
  // The crash-test hook comes only from the environment (see Config.crashAt).
  const { crashAt: fileCrash, ...fromFile } = file;
  const { crashAt: flagCrash, ...fromFlags } = flags;
  if (fileCrash !== undefined || flagCrash !== undefined) problems.push('unknown setting(s): crash_at');
  const merged: Record<string, unknown> = { ...base, ...fromFile, ...fromFlags };
  for (const key of ['socket', 'stateDir', 'shimPath', 'containerdAddress', 'containerdRoot', 'containerdState', 'containerdConfig'] as const) {
    const value = flags[key];
    if (typeof value === 'string' && value !== '') merged[key] = resolve(value);
  }
  const result = schema.safeParse(merged);
  if (!result.success) {
    for (const issue of result.error.issues) {
      const key = issue.path.join('.');
      if (issue.code === 'unrecognized_keys') problems.push(`unknown setting(s): ${issue.keys.map(snake).join(', ')}`);
      else problems.push(`${snake(key) || 'config'}: ${issue.message}`);
    }
  }
  if (problems.length > 0 || !result.success) throw new ConfigError(problems);
  return Object.freeze(result.data);
}
