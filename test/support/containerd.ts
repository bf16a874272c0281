/**
 * A private containerd for end-to-end tests: the `containerd` binary from PATH, run as root with
 * a generated config (version 3) whose root, state, temp dir, sockets and plugin paths all live
 * in a fresh temp dir, with a sandboxer registered as proxy plugin and as CRI runtime handler
 * (SPEC.md section 1). Start, stop, restart on the same dirs, and a teardown that removes
 * everything.
 */
import { execFileSync, spawn } from 'node:child_process';
import { existsSync, readFileSync, readdirSync, rmdirSync, writeFileSync } from 'node:fs';
import { mkdir } from 'node:fs/promises';
import path from 'node:path';
import {
  type ExitInfo,
  type ManagedProcess,
  createProcessTracker,
  makeTempDir,
  removeTree,
  spawnLogged,
  stopProcess,
  tailFile,
  waitFor,
  waitForSocket,
  which,
} from './tsbox-daemon.js';
import { type CriRuntimeMethods, type UnaryClient, createSandboxClients, repoRoot } from './containerd-clients.js';
import { type ReleaseTraits, releaseOfBinary, traitsOf } from '../../src/ops/containerd-release.js';

/** What goes into the generated config. */
export interface ContainerdConfigOptions {
  /** Socket of the sandboxer (its proxy plugin address). */
  sandboxerSocket: string;
  /** Proxy plugin id = sandboxer name, also used as CRI runtime handler. Default `tsbox`. */
  sandboxerName?: string;
  /** CRI runtime_type of the handler. Default `io.containerd.runc.v2` (SPEC.md section 7). */
  runtimeType?: string;
  /** containerd's log level. Default `debug`. */
  logLevel?: string;
  /** More keys of the sandboxer's handler table (lines of TOML), e.g. disable_pause_image_pull. */
  handlerToml?: string;
  /** NRI on, its socket at nriSocket(paths) (else the plugin is disabled: it would listen on /var/run/nri). */
  nri?: boolean;
  /** Extra TOML appended verbatim (tables only); a function gets the instance's paths. */
  extraToml?: string | ((paths: ContainerdPaths) => string);
}

/** Paths of one containerd instance, all below `dir`. */
export interface ContainerdPaths {
  dir: string;
  root: string;
  state: string;
  temp: string;
  address: string;
  ttrpcAddress: string;
  configPath: string;
  logPath: string;
  cniConfDir: string;
  cniBinDir: string;
  optDir: string;
}

/** The paths of an instance rooted at `dir`. */
export function containerdPaths(dir: string): ContainerdPaths {
  return {
    dir,
    root: path.join(dir, 'root'),
    state: path.join(dir, 'state'),
    temp: path.join(dir, 'tmp'),
    address: path.join(dir, 'containerd.sock'),
    ttrpcAddress: path.join(dir, 'containerd.sock.ttrpc'),
    configPath: path.join(dir, 'config.toml'),
    logPath: path.join(dir, 'containerd.log'),
    cniConfDir: path.join(dir, 'cni', 'conf'),
    cniBinDir: path.join(dir, 'cni', 'bin'),
    optDir: path.join(dir, 'opt'),
  };
}

/**
 * Plugins that are disabled: they would need kernel features, hardware or system paths the
 * tests do not have or must not touch (NRI listens on /var/run/nri; tracing and the restart
 * monitor are unused), and keeping them out makes startup quiet and fast. Everything CRI needs
 * (content, snapshotters native/overlayfs, metadata, images, sandbox store and controllers)
 * stays.
 */
const NRI_PLUGIN = 'io.containerd.nri.v1.nri';

/** Where an instance with `nri` on listens for NRI plugins. */
export function nriSocket(paths: ContainerdPaths): string {
  return path.join(paths.dir, 'nri', 'nri.sock');
}

export const disabledPlugins: readonly string[] = [
  'io.containerd.snapshotter.v1.btrfs',
  'io.containerd.snapshotter.v1.devmapper',
  'io.containerd.snapshotter.v1.zfs',
  'io.containerd.snapshotter.v1.blockfile',
  'io.containerd.snapshotter.v1.erofs',
  'io.containerd.differ.v1.erofs',
  'io.containerd.nri.v1.nri',
  'io.containerd.tracing.processor.v1.otlp',
  'io.containerd.internal.v1.tracing',
  'io.containerd.monitor.container.v1.restart',
];

/** Plugins whose failure to load must stop containerd from starting (a clear error). */
export const requiredPlugins: readonly string[] = ['io.containerd.grpc.v1.cri', 'io.containerd.cri.v1.runtime'];

/** TOML basic string (JSON string escapes are valid TOML). */
function tomlString(s: string): string {
  return JSON.stringify(s);
}

function tomlArray(items: readonly string[]): string {
  return `[${items.map(tomlString).join(', ')}]`;
}

/** The config.toml (version 3, containerd 2.x) of an instance. */
export function containerdConfig(paths: ContainerdPaths, options: ContainerdConfigOptions): string {
  const name = options.sandboxerName ?? 'tsbox';
  const runtimeType = options.runtimeType ?? 'io.containerd.runc.v2';
  return `version = 3
root = ${tomlString(paths.root)}
state = ${tomlString(paths.state)}
temp = ${tomlString(paths.temp)}
disabled_plugins = ${tomlArray(disabledPlugins.filter((p) => options.nri !== true || p !== NRI_PLUGIN))}
required_plugins = ${tomlArray(requiredPlugins)}

[grpc]
  address = ${tomlString(paths.address)}

[ttrpc]
  address = ${tomlString(paths.ttrpcAddress)}

[debug]
  level = ${tomlString(options.logLevel ?? 'debug')}

[plugins.'io.containerd.internal.v1.opt']
  path = ${tomlString(paths.optDir)}

[plugins.'io.containerd.image-verifier.v1.bindir']
  bin_dir = ${tomlString(path.join(paths.optDir, 'image-verifier', 'bin'))}

[plugins.'io.containerd.cri.v1.runtime']
  # Without CAP_SYS_RESOURCE (some machines run the tests in a container) runc cannot give a
  # pause container the oom_score_adj podsandbox asks for (-998): then CRI keeps it at ours.
  restrict_oom_score_adj = ${String(!hasCapability(CAP_SYS_RESOURCE))}
  enable_cdi = false
  cdi_spec_dirs = []
  # Pod network namespaces (not used by host-network pods) under the private state dir, not /var/run/netns.
  netns_mounts_under_state_dir = true

[plugins.'io.containerd.cri.v1.runtime'.cni]
  bin_dirs = ${tomlArray([paths.cniBinDir])}
  conf_dir = ${tomlString(paths.cniConfDir)}

# The sandboxer, as SPEC.md section 1 registers it.
[proxy_plugins.${name}]
  type = "sandbox"
  address = ${tomlString(options.sandboxerSocket)}

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.${name}]
  runtime_type = ${tomlString(runtimeType)}
  sandboxer = ${tomlString(name)}
${options.handlerToml ?? ''}${
    options.nri === true
      ? `
# NRI for external plugins, below the instance's dir.
[plugins.'io.containerd.nri.v1.nri']
  disable = false
  socket_path = ${tomlString(nriSocket(paths))}
  plugin_path = ${tomlString(path.join(paths.dir, 'nri', 'plugins'))}
  plugin_config_path = ${tomlString(path.join(paths.dir, 'nri', 'conf.d'))}
  plugin_registration_timeout = "5s"
  plugin_request_timeout = "5s"
`
      : ''
  }${typeof options.extraToml === 'function' ? options.extraToml(paths) : (options.extraToml ?? '')}`;
}

const CAP_SYS_RESOURCE = 24;

/** Whether this process has a capability in its effective set. */
function hasCapability(bit: number): boolean {
  const line = readFileSync('/proc/self/status', 'utf8').split('\n').find((l) => l.startsWith('CapEff:'));
  return line !== undefined && (BigInt(`0x${line.split(/\s+/)[1] ?? '0'}`) & (1n << BigInt(bit))) !== 0n;
}

/** A private containerd. */
export interface Containerd {
  readonly paths: ContainerdPaths;
  /** containerd's gRPC socket. */
  readonly address: string;
  readonly logPath: string;
  /** Pid of the current run, undefined while stopped. */
  readonly pid: number | undefined;
  /** Starts containerd (again, on the same dirs) and waits until its gRPC API answers. */
  start(): Promise<void>;
  /** SIGTERM, then SIGKILL to its process group after `graceMs`. */
  stop(options?: { graceMs?: number }): Promise<ExitInfo & { graceful: boolean }>;
  /** stop() then start(). */
  restart(): Promise<void>;
  /** Runs `ctr --address <socket> [-n ns] args…` (bounded). */
  ctr(args: readonly string[], options?: { namespace?: string; timeoutMs?: number }): Promise<CommandResult>;
  logTail(lines?: number): string;
  /**
   * Stops containerd, kills what is left of what it started (shims, if any), unmounts and
   * removes the temp dir (kept when `TSBOX_E2E_KEEP=1`). Resolves with the pids it had to
   * kill. Idempotent.
   */
  teardown(): Promise<number[]>;
}

/** Outcome of a command. */
export interface CommandResult {
  code: number | null;
  signal: NodeJS.Signals | null;
  stdout: string;
  stderr: string;
}

/** Options of {@link startContainerd}. */
export interface ContainerdOptions extends ContainerdConfigOptions {
  /** containerd binary. Default: the release's (`release`, else TSBOX_E2E_CONTAINERD), else `containerd` on PATH. */
  binary?: string;
  /** A release unpacked into .cache/containerd (containerdRelease): its containerd, ctr and runc shim. */
  release?: string;
  startTimeoutMs?: number;
  stopGraceMs?: number;
  /**
   * The state dir on a tmpfs of its own, as /run/containerd is on a node whose /run is one
   * (systemd's): the volatile files of containerd, its shims and the sandboxer live there.
   */
  stateOnTmpfs?: boolean;
}

/**
 * containerd 2.x creates the compiled-in default state dir /run/containerd even with a private
 * state dir (shim sockets and cio FIFOs are hard-coded below it). Teardown removes it again
 * when it did not exist before and is still empty.
 */
const defaultStateDir = '/run/containerd';

/**
 * The containerd the end-to-end tests run. `TSBOX_E2E_CONTAINERD` names a release that
 * scripts/install-containerd.sh unpacked into .cache/containerd/ (`2.3.4`,
 * `2.4.0-dev.20260822`): its containerd, its ctr, and its runc shim (its folder goes first on
 * containerd's PATH). Unset: Debian's, on PATH.
 */
export interface ContainerdRelease {
  /** The release's name, or `system`. */
  readonly name: string;
  /** Its folder; undefined for the one on PATH. */
  readonly dir?: string;
}

export function containerdRelease(name = process.env['TSBOX_E2E_CONTAINERD']): ContainerdRelease {
  if (name === undefined || name === '' || name === 'system') return { name: 'system' };
  return { name, dir: path.join(repoRoot, '.cache', 'containerd', name) };
}

/** A program of the release under test (containerd, ctr), or the one on PATH. */
export function releaseProgram(program: 'containerd' | 'ctr', release = containerdRelease()): string | undefined {
  const { dir } = release;
  if (dir === undefined) return which(program);
  const file = path.join(dir, program);
  return existsSync(file) ? file : undefined;
}

/** What the release under test does with a sandboxer (src/ops/containerd-release.ts), from its `containerd --version`. */
export function releaseTraits(release = containerdRelease()): ReleaseTraits {
  const binary = releaseProgram('containerd', release);
  if (binary === undefined) throw new Error(`no containerd ${release.name}`);
  const found = releaseOfBinary(binary);
  if ('error' in found) throw new Error(found.error);
  return traitsOf(found.release);
}

/** Why containerd end-to-end tests cannot run here, or undefined when they can. */
export function containerdUnavailableReason(release = containerdRelease()): string | undefined {
  if (typeof process.getuid !== 'function' || process.getuid() !== 0) return 'containerd tests need root';
  const { name, dir } = release;
  const where = dir === undefined ? 'on PATH' : `in ${dir} (containerd ${name})`;
  if (releaseProgram('containerd', release) === undefined) return `containerd not ${where} (run scripts/install-containerd.sh)`;
  if (releaseProgram('ctr', release) === undefined) return `ctr not ${where} (run scripts/install-containerd.sh)`;
  return undefined;
}

/** Creates a temp dir, writes the config and starts containerd; call `teardown()` in `after`. */
export async function startContainerd(options: ContainerdOptions): Promise<Containerd> {
  const dir = await makeTempDir('containerd-e2e-');
  const paths = containerdPaths(dir);
  if (options.stateOnTmpfs === true) {
    await mkdir(paths.state, { recursive: true, mode: 0o711 });
    execFileSync('mount', ['-t', 'tmpfs', '-o', 'mode=0711', 'tsbox-e2e-state', paths.state]);
  }
  await mkdir(paths.cniConfDir, { recursive: true });
  await mkdir(paths.cniBinDir, { recursive: true });
  writeFileSync(paths.configPath, containerdConfig(paths, options));
  const release = containerdRelease(options.release ?? process.env['TSBOX_E2E_CONTAINERD']);
  const binary = options.binary ?? releaseProgram('containerd', release) ?? 'containerd';
  const releaseDir = options.binary === undefined ? release.dir : undefined;
  const hadDefaultStateDir = existsSync(defaultStateDir);
  let current: ManagedProcess | undefined;
  const tracker = createProcessTracker(dir);
  let tornDown = false;

  // Plugin loading lines fill containerd's startup log and never explain a failure.
  const logTail = (lines = 40): string =>
    `--- containerd log (${paths.logPath}) ---\n${tailFile(paths.logPath, lines, /msg="(loading|skip loading) plugin/)}`;

  const instance: Containerd = {
    paths,
    address: paths.address,
    logPath: paths.logPath,
    get pid() {
      return current?.exitInfo() === undefined ? current?.pid : undefined;
    },
    async start() {
      if (tornDown) throw new Error('containerd was torn down');
      if (current !== undefined && current.exitInfo() === undefined) throw new Error('containerd already running');
      const p = await spawnLogged(binary, ['--config', paths.configPath], {
        logPath: paths.logPath,
        cwd: dir,
        // A release's own runc shim before the system's.
        env: tracker.env(releaseDir === undefined ? process.env : { ...process.env, PATH: `${releaseDir}:${process.env['PATH'] ?? ''}` }),
      });
      current = p;
      tracker.addLeader(p.pid);
      const timeoutMs = options.startTimeoutMs ?? 30_000;
      await waitForSocket(p, paths.address, { name: 'containerd', logTail, timeoutMs });
      // The socket is bound before every service is registered: wait for a real answer.
      const clients = createSandboxClients(paths.address, 'default');
      try {
        await waitFor(
          async () => {
            if (p.exitInfo() !== undefined) throw new Error(`containerd exited during startup\n${logTail()}`);
            try {
              await clients.store.call('List', {}, { timeoutMs: 2_000 });
              return true;
            } catch {
              // not serving yet: polled again
              return false;
            }
          },
          { what: 'containerd sandbox store to answer', timeoutMs, describe: logTail },
        );
      } finally {
        clients.close();
      }
    },
    async stop(stopOptions = {}) {
      if (current === undefined) return { code: null, signal: null, graceful: true };
      tracker.snapshot();
      return stopProcess(current, { graceMs: stopOptions.graceMs ?? options.stopGraceMs ?? 10_000 });
    },
    async restart() {
      await instance.stop();
      await instance.start();
    },
    ctr(args, ctrOptions = {}) {
      const full = ['--address', paths.address];
      if (ctrOptions.namespace !== undefined) full.push('--namespace', ctrOptions.namespace);
      full.push(...args);
      return runCommand(releaseProgram('ctr', release) ?? 'ctr', full, ctrOptions.timeoutMs ?? 30_000);
    },
    logTail,
    async teardown() {
      if (tornDown) return [];
      tornDown = true;
      await instance.stop();
      const killed = await tracker.killLeftovers();
      if (killed.length > 0) {
        process.stderr.write(`# containerd teardown: killed leftover processes ${killed.join(', ')}\n`);
      }
      if (!hadDefaultStateDir) removeIfEmpty(defaultStateDir);
      // What is mounted below it (a pod's /dev/shm left by a failure) goes with it.
      if (options.stateOnTmpfs === true) execFileSync('umount', ['--recursive', '--lazy', paths.state]);
      if (process.env['TSBOX_E2E_KEEP'] !== '1') await removeTree(dir);
      return killed;
    },
  };
  try {
    await instance.start();
  } catch (err) {
    await instance.teardown();
    throw err;
  }
  return instance;
}

function removeIfEmpty(dir: string): void {
  try {
    if (readdirSync(dir).length === 0) rmdirSync(dir);
  } catch {
    // absent, not empty or in use by another containerd: leave it
  }
}

/** Runs a command to completion with a time bound (SIGKILL when it passes). */
export function runCommand(file: string, args: readonly string[], timeoutMs: number, env: NodeJS.ProcessEnv = process.env): Promise<CommandResult> {
  return new Promise((resolve, reject) => {
    const child = spawn(file, args, { env, stdio: ['ignore', 'pipe', 'pipe'], timeout: timeoutMs, killSignal: 'SIGKILL' });
    let stdout = '';
    let stderr = '';
    child.stdout.setEncoding('utf8').on('data', (d: string) => (stdout += d));
    child.stderr.setEncoding('utf8').on('data', (d: string) => (stderr += d));
    child.once('error', reject);
    child.once('close', (code, signal) => resolve({ code, signal, stdout, stderr }));
  });
}

/**
 * Waits until containerd's CRI plugin reports every condition in `conditions` (e.g.
 * RuntimeReady, NetworkReady): it answers before it has initialised.
 */
export async function waitForCri(
  client: UnaryClient<CriRuntimeMethods>,
  conditions: readonly string[],
  describe: () => string,
  timeoutMs = 60_000,
): Promise<void> {
  await waitFor(
    async () => {
      try {
        const st = await client.call('Status', {}, { timeoutMs: 2_000 });
        return conditions.every((type) => st.status?.conditions.some((c) => c.type === type && c.status) === true);
      } catch {
        return false; // not answering yet: ask again
      }
    },
    { what: `CRI ${conditions.join(' and ')}`, timeoutMs, describe },
  );
}
