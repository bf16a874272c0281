import { existsSync } from 'node:fs';
import { parseArgs } from 'node:util';
import { ConfigError, DEFAULT_CONFIG_FILE, readConfigFile, resolveConfig, type Config, type ConfigInput } from './config.js';

export const USAGE = `tsbox: a sandboxer for containerd 2.x

Usage:
  tsbox serve [options]              serve the Sandbox Controller API on a unix socket
  tsbox config containerd [options]  print the containerd config.toml snippet for tsbox
  tsbox config show [options]        print the effective configuration as JSON
  tsbox help | --help                this text

Options (they override the config file, which overrides the defaults):
  --config FILE             TOML config file (default ${DEFAULT_CONFIG_FILE} if it exists)
  --socket PATH             unix socket (root: /run/tsbox/tsbox.sock)
  --socket-mode MODE        socket permissions, octal (0660)
  --state-dir DIR           state directory (root: /var/lib/tsbox)
  --log-level LEVEL         fatal|error|warn|info|debug|trace|silent (info)
  --backend NAME            process (default) | noop (runs nothing; benchmarks only)
  --namespaces BOOL         own pid/ipc/uts/mount namespaces per sandbox (root: true)
  --cgroup-parent PATH      parent cgroup of sandboxes that are not pods (tsbox)
  --containerd-address PATH containerd's socket (/run/containerd/containerd.sock)
  --containerd-root DIR     containerd's root directory (/var/lib/containerd)
  --containerd-state DIR    containerd's state directory (/run/containerd)
  --containerd-config FILE  containerd's config, checked at start-up (/etc/containerd/config.toml)
  --start-timeout-ms N      how long a sandbox may take to start (10000)
  --shutdown-drain-ms N     drain time on SIGTERM before connections close (5000)
  --recovery-concurrency N  sandboxes recovered at once at start-up (32)
`;

/** What the command line asks for. */
export type Command =
  | { readonly kind: 'serve'; readonly config: Config }
  | { readonly kind: 'containerd-snippet'; readonly config: Config }
  | { readonly kind: 'show-config'; readonly config: Config }
  | { readonly kind: 'help' };

/** A command line that cannot be used (exit status 2). */
export class UsageError extends Error {
  override readonly name = 'UsageError';
}

const OPTIONS = {
  config: { type: 'string' },
  socket: { type: 'string' },
  'socket-mode': { type: 'string' },
  'state-dir': { type: 'string' },
  'log-level': { type: 'string' },
  backend: { type: 'string' },
  namespaces: { type: 'string' },
  'cgroup-parent': { type: 'string' },
  'containerd-address': { type: 'string' },
  'containerd-root': { type: 'string' },
  'containerd-state': { type: 'string' },
  'start-timeout-ms': { type: 'string' },
  'containerd-config': { type: 'string' },
  'shim-path': { type: 'string' },
  'shutdown-drain-ms': { type: 'string' },
  'recovery-concurrency': { type: 'string' },
  'supervisor-poll-ms': { type: 'string' },
  help: { type: 'boolean', short: 'h' },
} as const;

/** Parses argv (without node and the script) into a command; throws UsageError or ConfigError. */
export function parseCommand(argv: readonly string[]): Command {
  let parsed;
  try {
    parsed = parseArgs({ args: [...argv], options: OPTIONS, allowPositionals: true, strict: true });
  } catch (err) {
    throw new UsageError((err as Error).message);
  }
  const { values, positionals } = parsed;
  if (values.help === true || positionals.length === 0 || positionals[0] === 'help') return { kind: 'help' };
  const words = positionals.join(' ');
  const kinds: Record<string, Command['kind']> = {
    serve: 'serve',
    'config containerd': 'containerd-snippet',
    'config show': 'show-config',
  };
  const kind = kinds[words];
  if (kind === undefined || kind === 'help') throw new UsageError(`unknown command "${words}"; see tsbox --help`);

  const flags: ConfigInput = {};
  const { config: configFile, help: _help, ...settings } = values;
  for (const [name, value] of Object.entries(settings)) {
    if (value !== undefined) (flags as Record<string, unknown>)[name.replace(/-([a-z])/g, (_, c: string) => c.toUpperCase())] = value;
  }
  let file: ConfigInput = {};
  if (configFile !== undefined) file = readConfigFile(configFile);
  else if (existsSync(DEFAULT_CONFIG_FILE)) file = readConfigFile(DEFAULT_CONFIG_FILE);
  return { kind, config: resolveConfig(file, flags) };
}

/** The config.toml snippet that registers tsbox with containerd 2.x (SPEC.md section 1). */
export function containerdSnippet(config: Config): string {
  return `# containerd config.toml (version 3) — register tsbox as a sandboxer
[proxy_plugins.tsbox]
  type = "sandbox"
  address = ${JSON.stringify(config.socket)}

# Kubernetes pods whose RuntimeClass handler is "tsbox" run on tsbox. Their containers run
# in containerd's runc shim, inside the pod's namespaces (runtime_type must name a real shim).
[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.tsbox]
  runtime_type = "io.containerd.runc.v2"
  sandboxer = "tsbox"
`;
}

export { ConfigError };
