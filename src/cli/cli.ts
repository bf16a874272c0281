/**
 * The command line: one commander program for the daemon (`serve`, `config`), the operator's
 * commands through containerd (`sandbox …`), `doctor`, `install`/`uninstall` and `completion`.
 * Parsing is pure: it returns what to do (a Command) and never runs or exits anything; the
 * entry point (main.ts) does.
 */
import { existsSync } from 'node:fs';
import { resolve } from 'node:path';
import { Command as Program, CommanderError, InvalidArgumentError, Option } from 'commander';
import { ConfigError, DEFAULT_CONFIG_FILE, readConfigFile, resolveConfig, type Config, type ConfigInput } from '../config/config.js';
import { bashCompletion } from './completion.js';
import { withContainerdPaths } from '../config/containerd-paths.js';
import { DEFAULT_CONTAINERD_ADDRESS, DEFAULT_NAMESPACE } from '../ops/containerd-client.js';
import { EXIT_CODE_HELP } from '../ops/exit-codes.js';
import { sandboxerTables } from '../ops/install.js';
import { systemdIsInit } from '../runtime/systemd.js';
import type { RunOptions } from '../ops/sandbox-commands.js';

/** Where the operator commands reach containerd. */
export interface ClientTarget {
  readonly address: string;
  readonly namespace: string;
}

/** One of the `sandbox` subcommands with its arguments. */
export type SandboxAction =
  | { readonly op: 'run'; readonly options: RunOptions }
  | { readonly op: 'ls'; readonly json: boolean }
  | { readonly op: 'inspect'; readonly id: string }
  | { readonly op: 'wait'; readonly id: string }
  | { readonly op: 'stop'; readonly id: string; readonly timeoutSeconds: number }
  | { readonly op: 'rm'; readonly ids: readonly string[]; readonly force: boolean }
  | { readonly op: 'logs'; readonly id: string; readonly follow: boolean };

/** What the command line asks for. */
export type Command =
  | { readonly kind: 'serve'; readonly config: Config }
  | { readonly kind: 'containerd-snippet'; readonly config: Config }
  | { readonly kind: 'show-config'; readonly config: Config }
  | { readonly kind: 'help'; readonly text: string }
  | { readonly kind: 'completion'; readonly text: string }
  | { readonly kind: 'sandbox'; readonly config: Config; readonly target: ClientTarget; readonly action: SandboxAction }
  | { readonly kind: 'ready'; readonly config: Config; readonly timeoutSeconds: number }
  | { readonly kind: 'doctor'; readonly config: Config; readonly address: string | undefined; readonly containerdConfig: string }
  | {
      readonly kind: 'install' | 'uninstall';
      readonly config: Config;
      readonly root: string;
      readonly containerdConfig: string;
      readonly execPath: string | undefined;
    };

/** A command line that cannot be used (exit status 2). */
export class UsageError extends Error {
  override readonly name = 'UsageError';
}

/** Every daemon setting as a flag; the camelCase name of each is its Config key. */
function addDaemonOptions(cmd: Program): Program {
  return cmd
    .option('--config <file>', `TOML config file (default ${DEFAULT_CONFIG_FILE} if it exists)`)
    .option('--socket <path>', 'unix socket tsbox serves (root: /run/tsbox/tsbox.sock)')
    .option('--socket-mode <mode>', 'socket permissions, octal (0660)')
    .option('--task-api-handlers <names>', "CRI runtime handlers whose pods' containers tsbox runs itself, without a runc shim per pod (comma-separated; *: every handler of tsbox in containerd's config whose runtime_type is runc's; '': none) (*)")
    .option('--state-dir <dir>', 'state directory (root: /var/lib/tsbox)')
    .option('--log-level <level>', 'fatal|error|warn|info|debug|trace|silent (info)')
    .option('--log-format <format>', 'auto|json|pretty: auto is pretty on a terminal, else JSON lines (auto)')
    .option('--backend <name>', 'process (default) | noop (runs nothing; benchmarks only)')
    .option('--namespaces <bool>', 'own pid/ipc/uts/mount namespaces per sandbox (root: true)')
    .option('--cgroup-parent <path>', 'parent cgroup of sandboxes that are not Kubernetes pods (tsbox)')
    .option('--containerd-config <file>', "containerd's config: tsbox takes containerd's root, state and socket from it (and its imports) and checks its CRI handlers (/etc/containerd/config.toml)")
    .option('--containerd-address <path>', "containerd's socket, after which its runc shim names a pod's task socket (default: [grpc] address in containerd's config; must agree with it)")
    .option('--containerd-root <dir>', "containerd's root directory: CRI reads pods' hostname, hosts and resolv.conf below it (default: root in containerd's config; must agree)")
    .option('--containerd-state <dir>', "containerd's state directory: CRI mounts pods' /dev/shm from below it (default: state in containerd's config; must agree)")
    .option('--start-timeout-ms <n>', 'how long a sandbox may take to start before Start fails (10000)')
    .option('--kill-timeout-ms <n>', "how long a sandbox's processes may take to die of SIGKILL before Stop or Shutdown fails (10000)")
    .option('--shutdown-drain-ms <n>', 'drain time on SIGTERM before connections close (5000)')
    .option('--recovery-concurrency <n>', 'sandboxes recovered at once at start-up (32)')
    .option('--metrics-address <addr>', 'serve /metrics, /healthz, /readyz on 127.0.0.1:PORT or a unix socket path; empty: off (off)')
    .addOption(new Option('--shim-path <path>', 'the per-sandbox supervisor binary').hideHelp())
    .addOption(new Option('--supervisor-poll-ms <n>', 'poll interval for sandboxes without a supervisor').hideHelp());
}

const DAEMON_KEYS = [
  'socket',
  'socketMode',
  'taskApiHandlers',
  'stateDir',
  'logLevel',
  'logFormat',
  'backend',
  'namespaces',
  'cgroupParent',
  'containerdAddress',
  'containerdRoot',
  'containerdState',
  'containerdConfig',
  'startTimeoutMs',
  'killTimeoutMs',
  'shutdownDrainMs',
  'recoveryConcurrency',
  'metricsAddress',
  'shimPath',
  'supervisorPollMs',
] as const;

/** Defaults < file (--config, else the system file if it exists) < flags. */
function configFrom(opts: Record<string, unknown>): Config {
  const flags: ConfigInput = {};
  for (const key of DAEMON_KEYS) {
    if (opts[key] !== undefined) (flags as Record<string, unknown>)[key] = opts[key];
  }
  const configFile = opts['config'];
  let file: ConfigInput = {};
  if (typeof configFile === 'string') file = readConfigFile(configFile);
  else if (existsSync(DEFAULT_CONFIG_FILE)) file = readConfigFile(DEFAULT_CONFIG_FILE);
  return resolveConfig(file, flags);
}

function addClientOptions(cmd: Program): Program {
  return cmd
    .option('--address <path>', "containerd's socket", DEFAULT_CONTAINERD_ADDRESS)
    .option('-n, --namespace <ns>', 'containerd namespace', DEFAULT_NAMESPACE)
    .option('--config <file>', `tsbox's TOML config file, for its state dir (default ${DEFAULT_CONFIG_FILE} if it exists)`)
    .option('--state-dir <dir>', "tsbox's state directory, where logs reads console output when tsbox does not say");
}

function targetFrom(opts: Record<string, unknown>): ClientTarget {
  return { address: resolve(String(opts['address'])), namespace: String(opts['namespace']) };
}

function sandboxConfig(opts: Record<string, unknown>): Config {
  return configFrom({ config: opts['config'], stateDir: opts['stateDir'] });
}

function seconds(value: string): number {
  if (!/^\d+$/.test(value) || Number(value) > 86_400) throw new InvalidArgumentError('must be whole seconds from 0 to 86400');
  return Number(value);
}

function label(value: string, previous: Record<string, string> = {}): Record<string, string> {
  const eq = value.indexOf('=');
  if (eq <= 0) throw new InvalidArgumentError('must be KEY=VALUE');
  return { ...previous, [value.slice(0, eq)]: value.slice(eq + 1) };
}

/**
 * Builds the program. `done` receives the parsed command; actions are synchronous, so
 * `parse` has returned it by the time it ends.
 */
function buildProgram(done: (command: Command) => void): Program {
  const program = new Program('tsbox')
    .description('tsbox: a sandboxer for containerd 2.x')
    .exitOverride()
    .showSuggestionAfterError(true)
    .addHelpText('after', `\n${EXIT_CODE_HELP}\n`);

  addDaemonOptions(program.command('serve').description('serve the Sandbox Controller API on a unix socket')).action((opts: Record<string, unknown>) =>
    done({ kind: 'serve', config: withContainerdPaths(configFrom(opts)) }),
  );

  const config = program.command('config').description("print tsbox's configuration, or the containerd config that registers it");
  addDaemonOptions(config.command('containerd').description('print the containerd config.toml snippet for tsbox')).action((opts: Record<string, unknown>) =>
    done({ kind: 'containerd-snippet', config: configFrom(opts) }),
  );
  addDaemonOptions(config.command('show').description('print the effective configuration as JSON')).action((opts: Record<string, unknown>) =>
    done({ kind: 'show-config', config: withContainerdPaths(configFrom(opts)) }),
  );

  const sandbox = program
    .command('sandbox')
    .alias('sandboxes')
    .description('create, list, inspect, wait for, stop, remove and read sandboxes through containerd')
    .addHelpText('after', `\n${EXIT_CODE_HELP}\n`);
  const leaf = (cmd: Program, build: (args: unknown[], opts: Record<string, unknown>) => SandboxAction): void => {
    addClientOptions(cmd).action((...params: unknown[]) => {
      const command = params[params.length - 1] as Program;
      const opts = command.opts();
      const args = params.slice(0, -2);
      done({ kind: 'sandbox', config: sandboxConfig(opts), target: targetFrom(opts), action: build(args, opts) });
    });
  };
  leaf(
    sandbox
      .command('run')
      .description('create and start a sandbox on tsbox through containerd; prints its id')
      .argument('[command...]', 'its process and arguments, after "--" (default: a pause process)')
      .option('--id <id>', 'sandbox id (default: 32 random hex digits)')
      .option('--hostname <name>', "the sandbox's host name")
      .option('--netns <path>', 'network namespace to join (default: the host network)')
      .option('--label <key=value>', 'a label on containerd\'s record (repeatable)', label),
    (args, opts) => ({
      op: 'run',
      options: {
        command: (args[0] as string[] | undefined) ?? [],
        labels: (opts['label'] as Record<string, string> | undefined) ?? {},
        ...(typeof opts['id'] === 'string' ? { id: opts['id'] } : {}),
        ...(typeof opts['hostname'] === 'string' ? { hostname: opts['hostname'] } : {}),
        ...(typeof opts['netns'] === 'string' ? { netns: resolve(opts['netns']) } : {}),
      },
    }),
  );
  leaf(
    sandbox.command('ls').alias('list').description('list the tsbox sandboxes of a namespace').option('--json', 'print JSON instead of a table', false),
    (_args, opts) => ({ op: 'ls', json: opts['json'] === true }),
  );
  leaf(sandbox.command('inspect').description("print containerd's record and tsbox's verbose status as JSON").argument('<id>'), (args) => ({
    op: 'inspect',
    id: String(args[0]),
  }));
  leaf(sandbox.command('wait').description("wait until the sandbox exits; print its exit status and exit with it").argument('<id>'), (args) => ({
    op: 'wait',
    id: String(args[0]),
  }));
  leaf(
    sandbox
      .command('stop')
      .description('stop a sandbox: SIGTERM, then SIGKILL after --timeout seconds (0: SIGKILL at once)')
      .argument('<id>')
      .option('--timeout <seconds>', 'grace period before SIGKILL', seconds, 10),
    (args, opts) => ({ op: 'stop', id: String(args[0]), timeoutSeconds: opts['timeout'] as number }),
  );
  leaf(
    sandbox
      .command('rm')
      .alias('remove')
      .description("remove sandboxes: stop if running, Shutdown in tsbox, delete containerd's record")
      .argument('<id...>')
      .option('-f, --force', 'also remove a sandbox known to only one of containerd and tsbox; ignore unknown ids', false),
    (args, opts) => ({ op: 'rm', ids: args[0] as string[], force: opts['force'] === true }),
  );
  leaf(
    sandbox.command('logs').description("print the sandbox's console output (its process's stdout and stderr)").argument('<id>').option('-f, --follow', 'keep printing until the sandbox exits', false),
    (args, opts) => ({ op: 'logs', id: String(args[0]), follow: opts['follow'] === true }),
  );

  addDaemonOptions(
    program
      .command('doctor')
      .description('check this node: containerd, its config for tsbox, the CRI handler, cgroups, runc, permissions')
      .option('--address <path>', "containerd's socket (default: the one containerd's config names)"),
  ).action((opts: Record<string, unknown>) => {
    const config = configFrom(opts);
    const address = typeof opts['address'] === 'string' ? resolve(opts['address']) : undefined;
    done({ kind: 'doctor', config, address, containerdConfig: config.containerdConfig });
  });

  for (const kind of ['install', 'uninstall'] as const) {
    addDaemonOptions(
      program
        .command(kind)
        .description(
          kind === 'install'
            ? "install tsbox's systemd unit and containerd drop-in, and add the drop-in to containerd's config imports"
            : 'remove what install put in place',
        )
        .option('--root <dir>', 'install below this directory instead of / (for images and tests); --containerd-config is below it too', '/')
        .option('--exec <path>', 'the tsbox command the unit runs (default: this one)'),
    ).action((opts: Record<string, unknown>) => {
      const config = configFrom(opts);
      done({
        kind,
        config,
        root: resolve(String(opts['root'])),
        containerdConfig: config.containerdConfig,
        execPath: typeof opts['exec'] === 'string' ? resolve(opts['exec']) : undefined,
      });
    });
  }

  addDaemonOptions(
    program
      .command('ready')
      .description("wait until tsbox serves on its socket (it binds it only after recovery); the systemd unit's readiness check")
      .option('--timeout <seconds>', 'give up after this long (exit 5)', seconds, 60),
  ).action((opts: Record<string, unknown>) => done({ kind: 'ready', config: configFrom(opts), timeoutSeconds: opts['timeout'] as number }));

  program
    .command('completion')
    .description('print a shell completion script: eval "$(tsbox completion bash)"')
    .argument('<shell>', 'bash')
    .action((shell: string) => {
      if (shell !== 'bash') throw new UsageError(`no completion for shell "${shell}"; only bash`);
      done({ kind: 'completion', text: bashCompletion(program) });
    });
  return program;
}

/** Parses argv (without node and the script) into a command; throws UsageError or ConfigError. */
export function parseCommand(argv: readonly string[]): Command {
  let result: Command | undefined;
  let text = '';
  const program = buildProgram((command) => (result = command));
  const capture = {
    writeOut: (s: string) => (text += s),
    writeErr: (s: string) => (text += s),
    outputError: () => undefined,
  };
  const configure = (cmd: Program): void => {
    cmd.configureOutput(capture).exitOverride();
    cmd.commands.forEach(configure);
  };
  configure(program);
  if (argv.length === 0) return { kind: 'help', text: program.helpInformation() + `\n${EXIT_CODE_HELP}\n` };
  try {
    program.parse([...argv], { from: 'user' });
  } catch (err) {
    if (err instanceof CommanderError) {
      if (err.code === 'commander.helpDisplayed' || err.code === 'commander.help' || err.code === 'commander.version') return { kind: 'help', text };
      throw new UsageError(`${err.message.replace(/^error: /, '')}; see tsbox --help`);
    }
    throw err;
  }
  if (result === undefined) throw new UsageError('no command given; see tsbox --help');
  return result;
}

/** The config.toml snippet that registers tsbox with containerd 2.x (SPEC.md section 1). */
export function containerdSnippet(config: Config): string {
  return `# containerd config.toml (version 3) — register tsbox as a sandboxer
${sandboxerTables(config, ' (SPEC.md section 7)', systemdIsInit())}`;
}

export { ConfigError };
