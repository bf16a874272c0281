// Configuration at the edge: defaults < TOML file < command-line flags, validated together
// so that an operator sees every mistake at once; and the containerd snippet that
// registers tsbox (SPEC.md section 1).
import assert from 'node:assert/strict';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { describe, test, type TestContext } from 'node:test';
import { fileURLToPath } from 'node:url';
import { parse as parseToml } from 'smol-toml';
import { UsageError, containerdSnippet, parseCommand, type Command } from '../../src/cli/cli.js';
import { ConfigError, defaultConfig, readConfigFile, resolveConfig, type Config } from '../../src/config/config.js';

/** Defaults as a non-root user with a known environment, so tests do not depend on the host. */
const BASE: Config = defaultConfig({ XDG_RUNTIME_DIR: '/run/user/1000', HOME: '/home/op' }, 1000);

async function tomlFile(t: TestContext, text: string): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), 'tsbox-config-'));
  t.after(() => rm(dir, { recursive: true, force: true }));
  const path = join(dir, 'config.toml');
  await writeFile(path, text);
  return path;
}

/** Runs `fn`, expects a ConfigError, and returns its problems. */
function problemsOf(fn: () => unknown): readonly string[] {
  try {
    fn();
  } catch (err) {
    assert.ok(err instanceof ConfigError, `expected a ConfigError, got ${String(err)}`);
    assert.ok(err.problems.length > 0);
    for (const problem of err.problems) assert.ok(err.message.includes(problem), 'the message lists every problem');
    return err.problems;
  }
  assert.fail('expected a ConfigError');
}

function configOf(command: Command): Config {
  assert.ok('config' in command, `expected a command with a config, got ${command.kind}`);
  return command.config;
}

describe('defaultConfig', () => {
  test('as root: system paths and namespaces on', () => {
    const config = defaultConfig({}, 0);
    assert.equal(config.socket, '/run/tsbox/tsbox.sock');
    assert.equal(config.stateDir, '/var/lib/tsbox');
    assert.equal(config.namespaces, true);
    assert.equal(config.socketMode, 0o660);
    assert.equal(config.backend, 'process');
    assert.equal(config.logLevel, 'info');
  });

  test('as a user: XDG paths and no namespaces', () => {
    assert.equal(BASE.socket, '/run/user/1000/tsbox/tsbox.sock');
    assert.equal(BASE.stateDir, '/home/op/.local/state/tsbox');
    assert.equal(BASE.namespaces, false);
    const xdg = defaultConfig({ XDG_STATE_HOME: '/srv/state' }, 1001);
    assert.equal(xdg.stateDir, '/srv/state/tsbox');
    assert.equal(xdg.socket, '/tmp/tsbox-1001/tsbox/tsbox.sock');
  });

  test("the supervisor is the package's own build", () => {
    const packageRoot = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..', '..');
    assert.equal(BASE.shimPath, join(packageRoot, 'dist', 'bin', 'tsbox-shim'));
  });

  test('the defaults are valid as they are', () => {
    assert.deepEqual(resolveConfig({}, {}, BASE), BASE);
  });
});

describe('resolveConfig', () => {
  test('the result is frozen', () => {
    const config = resolveConfig({}, {}, BASE);
    assert.ok(Object.isFrozen(config));
  });

  test('the file overrides the defaults and the flags override the file', () => {
    const config = resolveConfig(
      { socket: '/from/file.sock', logLevel: 'debug', recoveryConcurrency: 8 },
      { socket: '/from/flag.sock', recoveryConcurrency: '4' },
      BASE,
    );
    assert.equal(config.socket, '/from/flag.sock');
    assert.equal(config.logLevel, 'debug');
    assert.equal(config.recoveryConcurrency, 4);
    assert.equal(config.stateDir, BASE.stateDir);
  });

  test('every bad value is reported at once, each naming its setting', () => {
    const problems = problemsOf(() =>
      resolveConfig(
        { socketMode: 'rw-rw----', logLevel: 'loud', stateDir: 'relative/state' },
        { backend: 'docker', shutdownDrainMs: '-5', recoveryConcurrency: 'many', namespaces: 'yes' },
        BASE,
      ),
    );
    // Settings are named as the TOML file spells them.
    for (const key of ['socket_mode', 'log_level', 'state_dir', 'backend', 'shutdown_drain_ms', 'recovery_concurrency', 'namespaces']) {
      assert.ok(
        problems.some((p) => p.startsWith(`${key}:`)),
        `a problem names ${key}; got:\n${problems.join('\n')}`,
      );
    }
  });

  test('numbers out of range are refused', () => {
    const problems = problemsOf(() =>
      resolveConfig({}, { recoveryConcurrency: '0', supervisorPollMs: '10', shutdownDrainMs: '1.5' }, BASE),
    );
    assert.equal(problems.length, 3, problems.join('\n'));
  });

  test('the socket mode may be an octal string or a number', () => {
    assert.equal(resolveConfig({ socketMode: '0660' }, {}, BASE).socketMode, 0o660);
    assert.equal(resolveConfig({ socketMode: '640' }, {}, BASE).socketMode, 0o640);
    assert.equal(resolveConfig({ socketMode: 0o600 }, {}, BASE).socketMode, 0o600);
    assert.equal(resolveConfig({}, { socketMode: '0666' }, BASE).socketMode, 0o666);
    for (const bad of ['0999', 'rw', '06600', 0o1777]) {
      assert.ok(problemsOf(() => resolveConfig({ socketMode: bad }, {}, BASE))[0]?.startsWith('socket_mode:'), String(bad));
    }
  });

  test('relative paths given as flags are resolved against the working directory', () => {
    const config = resolveConfig({}, { socket: 'run/tsbox.sock', stateDir: 'state', shimPath: './bin/shim' }, BASE);
    assert.equal(config.socket, resolve('run/tsbox.sock'));
    assert.equal(config.stateDir, resolve('state'));
    assert.equal(config.shimPath, resolve('bin/shim'));
  });

  test('task_socket, which no build uses any more, is accepted (a config of an earlier build starts) and has no default', () => {
    assert.equal(defaultConfig({}, 0).taskSocket, undefined);
    assert.equal(resolveConfig({ taskSocket: '/srv/t.sock' }, { socket: '/srv/a/tsbox.sock' }, BASE).taskSocket, '/srv/t.sock');
    assert.deepEqual(problemsOf(() => resolveConfig({ taskSocket: 'rel/t.sock' }, {}, BASE)), ['task_socket: must be an absolute path']);
  });

  test('task_api_handlers: * by default, a list of names, or none', () => {
    assert.deepEqual(BASE.taskApiHandlers, ['*']);
    assert.deepEqual(resolveConfig({ taskApiHandlers: ['a', 'b'] }, {}, BASE).taskApiHandlers, ['a', 'b']);
    assert.deepEqual(resolveConfig({}, { taskApiHandlers: 'a, b' }, BASE).taskApiHandlers, ['a', 'b']);
    assert.deepEqual(resolveConfig({ taskApiHandlers: ['a'] }, { taskApiHandlers: '' }, BASE).taskApiHandlers, []);
    assert.deepEqual(resolveConfig({ taskApiHandlers: [] }, {}, BASE).taskApiHandlers, []);
    assert.match(problemsOf(() => resolveConfig({}, { taskApiHandlers: 'a b' }, BASE))[0] ?? '', /^task_api_handlers\.0: must be CRI runtime handler names/);
  });

  test('relative paths in the file are refused', () => {
    const problems = problemsOf(() => resolveConfig({ socket: 'tsbox.sock' }, {}, BASE));
    assert.match(problems[0] ?? '', /^socket: .*absolute/);
  });

  test('boolean flags accept true and false as words', () => {
    assert.equal(resolveConfig({}, { namespaces: 'false' }, { ...BASE, namespaces: true }).namespaces, false);
    assert.equal(resolveConfig({ namespaces: true }, {}, BASE).namespaces, true);
  });

  test('unknown settings are reported', () => {
    const problems = problemsOf(() => resolveConfig({ frobnicate: 1 } as Record<string, unknown>, {}, BASE));
    assert.ok(problems.some((p) => /unknown setting/.test(p) && p.includes('frobnicate')), problems.join('\n'));
  });

  test('the crash-test point cannot be set from a file or a flag', () => {
    const problems = problemsOf(() => resolveConfig({ crashAt: 'start:after-spawn' }, {}, BASE));
    assert.ok(problems.some((p) => /unknown setting/.test(p)));
    assert.equal(defaultConfig({}, 1000).crashAt, '');
  });
});

describe('readConfigFile', () => {
  test('reads snake_case and kebab-case keys into settings', async (t) => {
    const path = await tomlFile(
      t,
      [
        'socket = "/run/custom/tsbox.sock"',
        'socket_mode = "0660"',
        'state-dir = "/srv/tsbox"',
        'log_level = "warn"',
        'recovery_concurrency = 16',
        'namespaces = false',
        '',
      ].join('\n'),
    );
    const config = resolveConfig(readConfigFile(path), {}, BASE);
    assert.equal(config.socket, '/run/custom/tsbox.sock');
    assert.equal(config.socketMode, 0o660);
    assert.equal(config.stateDir, '/srv/tsbox');
    assert.equal(config.logLevel, 'warn');
    assert.equal(config.recoveryConcurrency, 16);
    assert.equal(config.namespaces, false);
  });

  test('a TOML octal integer works as the socket mode', async (t) => {
    assert.equal(resolveConfig(readConfigFile(await tomlFile(t, 'socket_mode = 0o640\n')), {}, BASE).socketMode, 0o640);
  });

  test('a decimal socket mode (660 is not 0660) is refused rather than misread', async (t) => {
    const path = await tomlFile(t, 'socket_mode = 660\n');
    const problems = problemsOf(() => resolveConfig(readConfigFile(path), {}, BASE));
    assert.ok(problems.some((p) => p.startsWith('socket_mode:')));
  });

  test('unknown keys in the file are reported together with bad values', async (t) => {
    const path = await tomlFile(t, 'frobnicate = true\nlog_level = "chatty"\n');
    const problems = problemsOf(() => resolveConfig(readConfigFile(path), {}, BASE));
    assert.ok(problems.some((p) => /unknown setting/.test(p) && p.includes('frobnicate')), problems.join('\n'));
    assert.ok(problems.some((p) => p.startsWith('log_level:')), problems.join('\n'));
  });

  test('bad TOML is a ConfigError naming the file', async (t) => {
    const path = await tomlFile(t, 'socket = "/unterminated\n');
    const problems = problemsOf(() => readConfigFile(path));
    assert.equal(problems.length, 1);
    assert.ok(problems[0]?.includes(path));
    assert.match(problems[0] ?? '', /not valid TOML/);
  });

  test('a missing file is a ConfigError naming the file', () => {
    const path = join(tmpdir(), 'tsbox-no-such-dir', 'config.toml');
    const problems = problemsOf(() => readConfigFile(path));
    assert.match(problems[0] ?? '', /cannot read config file/);
    assert.ok(problems[0]?.includes(path));
  });
});

describe('parseCommand', () => {
  test('help in every spelling', () => {
    for (const argv of [[], ['help'], ['--help'], ['-h'], ['serve', '--help']]) {
      assert.equal(parseCommand(argv).kind, 'help', argv.join(' '));
    }
  });

  test('serve, config containerd and config show, with flags over the file', async (t) => {
    const path = await tomlFile(t, 'socket = "/from/file.sock"\nlog_level = "debug"\nstate_dir = "/srv/file-state"\n');
    const serve = parseCommand(['serve', '--config', path, '--socket', '/from/flag.sock', '--socket-mode', '0600']);
    assert.equal(serve.kind, 'serve');
    const config = configOf(serve);
    assert.equal(config.socket, '/from/flag.sock');
    assert.equal(config.socketMode, 0o600);
    assert.equal(config.logLevel, 'debug');
    assert.equal(config.stateDir, '/srv/file-state');

    assert.equal(parseCommand(['config', 'containerd', '--config', path]).kind, 'containerd-snippet');
    assert.equal(parseCommand(['config', 'show', '--config', path]).kind, 'show-config');
  });

  test('numeric and boolean flags are converted', async (t) => {
    const path = await tomlFile(t, '');
    const config = configOf(
      parseCommand([
        'serve',
        '--config',
        path,
        '--shutdown-drain-ms',
        '250',
        '--recovery-concurrency',
        '3',
        '--namespaces',
        'false',
        '--backend',
        'noop',
      ]),
    );
    assert.equal(config.shutdownDrainMs, 250);
    assert.equal(config.recoveryConcurrency, 3);
    assert.equal(config.namespaces, false);
    assert.equal(config.backend, 'noop');
  });

  test('relative flag paths are resolved', async (t) => {
    const path = await tomlFile(t, '');
    const config = configOf(parseCommand(['serve', '--config', path, '--state-dir', 'my-state']));
    assert.equal(config.stateDir, resolve('my-state'));
  });

  test('all bad flag values are reported together', async (t) => {
    const path = await tomlFile(t, '');
    const problems = problemsOf(() =>
      parseCommand(['serve', '--config', path, '--log-level', 'noisy', '--recovery-concurrency', 'x', '--socket-mode', '8888']),
    );
    assert.equal(problems.length, 3, problems.join('\n'));
  });

  test('an unknown command or flag is a UsageError', () => {
    assert.throws(() => parseCommand(['run']), UsageError);
    assert.throws(() => parseCommand(['config', 'edit']), UsageError);
    assert.throws(() => parseCommand(['serve', '--frobnicate']), UsageError);
    assert.throws(() => parseCommand(['serve', '--crash-at', 'start:after-spawn']), UsageError);
  });
});

describe('containerdSnippet', () => {
  test('registers the proxy plugin on the configured socket and a CRI runtime using it', () => {
    const config = resolveConfig({}, { socket: '/run/custom dir/tsbox.sock' }, BASE);
    const text = containerdSnippet(config);
    assert.match(text, /\[proxy_plugins\.tsbox\]/);
    assert.match(text, /sandboxer = "tsbox"/);

    const toml = parseToml(text) as {
      proxy_plugins?: { tsbox?: { type?: unknown; address?: unknown } };
      plugins?: Record<string, { containerd?: { runtimes?: { tsbox?: { runtime_type?: unknown; sandboxer?: unknown } } } }>;
    };
    assert.deepEqual({ ...toml.proxy_plugins?.tsbox }, { type: 'sandbox', address: '/run/custom dir/tsbox.sock' });
    const runtime = toml.plugins?.['io.containerd.cri.v1.runtime']?.containerd?.runtimes?.tsbox;
    assert.equal(runtime?.sandboxer, 'tsbox');
    assert.equal(runtime?.runtime_type, 'io.containerd.runc.v2', 'the shim that runs the pod\'s containers (SPEC.md section 7)');
  });

  test('a socket path with quotes or backslashes stays valid TOML', () => {
    const socket = '/run/we"ird\\dir/tsbox.sock';
    const text = containerdSnippet({ ...BASE, socket });
    const toml = parseToml(text) as { proxy_plugins?: { tsbox?: { address?: unknown } } };
    assert.equal(toml.proxy_plugins?.tsbox?.address, socket);
  });
});
