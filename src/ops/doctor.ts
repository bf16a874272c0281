/**
 * `tsbox doctor`: checks that this node can run tsbox behind containerd and says, for each
 * thing that is wrong, how to fix it. Exit 0 only when every check passes.
 */
import { execFileSync } from 'node:child_process';
import { existsSync, readFileSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { setTimeout as delay } from 'node:timers/promises';
import * as grpc from '@grpc/grpc-js';
import { ConfigError, DEFAULT_CONTAINERD_CONFIG, type Config } from '../config/config.js';
import { CONTAINERD_DEFAULTS, disagreements, pathsFromConfig } from '../config/containerd-paths.js';
import { type ContainerdConfigFiles, type SandboxerHandler, type Toml, findOnPath, pinnedSandboxImage, readContainerdConfig, sandboxerHandlers, shimBinaryName } from '../config/containerd-config.js';
import { isGone, messageOf } from '../base/errors.js';
import { detectCgroups } from '../runtime/cgroups.js';
import { MAX_SOCKET_PATH, longestPodSocket } from '../state/layout.js';
import { ContainerdCallError, connectContainerd, socketExists } from './containerd-client.js';
import { KNOWN_RELEASES, describeTraits, parseRelease, releaseOfBinary, traitsOf } from './containerd-release.js';
import type { Empty } from '../gen/google/protobuf/empty.js';
import type { GetImageRequest } from '../gen/containerd/services/images/v1/images.js';
import type { VersionResponse } from '../gen/containerd/services/version/v1/version.js';
import { probeSocket } from '../transport/socket.js';
import { EXIT } from './exit-codes.js';
import { type HandlerRoutes, routeHandlers } from '../config/task-routes.js';
import { SANDBOXER, type Output } from './sandbox-commands.js';

/** What doctor looks at. */
export interface DoctorOptions {
  readonly config: Config;
  /** containerd's socket; default: the one containerd's config names. */
  readonly address: string | undefined;
  /** containerd's config.toml. */
  readonly containerdConfig: string;
  readonly output: Output;
  /** PATH to find binaries on (default: the environment's). */
  readonly path?: string;
}

/** One check's outcome; a note (what applies, what could not be checked) is no problem. */
export interface Finding {
  readonly ok: boolean;
  readonly what: string;
  readonly fix?: string;
  readonly note?: boolean;
}

const pass = (what: string): Finding => ({ ok: true, what });
const note = (what: string): Finding => ({ ok: true, what, note: true });

/** The containerd namespace of CRI's images and pods. */
const CRI_NAMESPACE = 'k8s.io';
const fail = (what: string, fix: string): Finding => ({ ok: false, what, fix });


const table = (v: unknown): Toml | undefined => (typeof v === 'object' && v !== null && !Array.isArray(v) ? (v as Toml) : undefined);

/** containerd's config with its imports; undefined when there is no such file, an Error when it cannot be read. */
function readConfig(path: string): ContainerdConfigFiles | Error | undefined {
  if (!existsSync(path)) return undefined;
  try {
    return readContainerdConfig(path);
  } catch (err) {
    return err instanceof Error ? err : new Error(messageOf(err));
  }
}

/** Checks of containerd's config: the proxy plugin and the CRI handler. */
function checkContainerdConfig(path: string, read: ContainerdConfigFiles | Error | undefined, config: Config, handlers: readonly SandboxerHandler[], routes: HandlerRoutes): Finding[] {
  if (read === undefined) {
    return [fail(`containerd config ${path} does not exist`, `run "tsbox install" (it creates one that imports tsbox's drop-in), or pass --containerd-config`)];
  }
  if (read instanceof Error) return [fail(read.message, 'fix it (containerd cannot start with it either); "containerd config dump" shows what containerd reads')];
  const parsed = read;
  const findings: Finding[] = [];
  if (parsed.version < 2) findings.push(fail(`${path} is a version ${parsed.version} config: containerd 2.x needs version 2 or 3`, 'migrate it: containerd config migrate > config.toml'));
  const proxies = parsed.files.flatMap((f) => {
    const p = table(table(f.toml['proxy_plugins'])?.[SANDBOXER]);
    return p === undefined ? [] : [{ file: f.path, plugin: p }];
  });
  const proxy = proxies[proxies.length - 1];
  if (proxy === undefined) {
    findings.push(fail(`no [proxy_plugins.${SANDBOXER}] in ${parsed.files.map((f) => f.path).join(', ')}`, `"tsbox install" adds it (or paste "tsbox config containerd"), then restart containerd`));
  } else if (proxy.plugin['type'] !== 'sandbox') {
    findings.push(fail(`[proxy_plugins.${SANDBOXER}] in ${proxy.file} has type ${JSON.stringify(proxy.plugin['type'])}, not "sandbox"`, 'set type = "sandbox" and restart containerd'));
  } else if (proxy.plugin['address'] !== config.socket) {
    findings.push(
      fail(
        `[proxy_plugins.${SANDBOXER}] in ${proxy.file} points at ${JSON.stringify(proxy.plugin['address'])}, but tsbox serves ${config.socket}`,
        `set address = ${JSON.stringify(config.socket)} (or start tsbox with --socket ${String(proxy.plugin['address'])}) and restart containerd`,
      ),
    );
  } else {
    findings.push(pass(`tsbox is registered as sandbox proxy plugin "${SANDBOXER}" at ${config.socket} (${proxy.file})`));
  }

  if (handlers.length === 0) {
    findings.push(fail(`no CRI runtime handler with sandboxer = "${SANDBOXER}"`, `"tsbox install" adds [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.tsbox]; Kubernetes pods need it`));
  }
  for (const h of handlers) {
    if (routes.taskApi.includes(h.name)) {
      const runc = routes.notRunc.some((n) => n.name === h.name) ? ` (its runtime_type ${h.runtimeType} is not runc's: task_api_handlers names it, so runc runs them)` : '';
      findings.push(pass(`CRI runtime handler "${h.name}" runs on tsbox; tsbox runs its containers with runc over the Task API, without a shim per pod${runc}`));
      continue;
    }
    if (typeof h.runtimeType !== 'string' || h.runtimeType === '') {
      findings.push(fail(`CRI runtime handler "${h.name}" (${h.file}) has no runtime_type`, 'set runtime_type = "io.containerd.runc.v2"'));
      continue;
    }
    const shim = shimBinaryName(h.runtimeType);
    const found = h.shim;
    if (found === undefined) {
      findings.push(
        fail(
          `CRI runtime handler "${h.name}": runtime_type ${h.runtimeType} needs shim binary ${shim}, which is not on PATH`,
          `set runtime_type = "io.containerd.runc.v2" (the shim that runs the pod's containers) and install containerd's runc shim (Debian: containerd)`,
        ),
      );
    } else {
      findings.push(pass(`CRI runtime handler "${h.name}" runs on tsbox; its containers use ${found}`));
    }
  }
  return findings;
}

/**
 * containerd's root, state and socket as its config (with imports and defaults) gives them,
 * and whether tsbox's own settings agree; the socket to reach containerd on. `read` is the
 * config as read (undefined: no file, an Error: unreadable, which the config check reports).
 */
function checkContainerdPaths(config: Config, read: ContainerdConfigFiles | Error | undefined): { findings: Finding[]; address: string } {
  const fallback = config.containerdAddress || CONTAINERD_DEFAULTS.address;
  if (read instanceof Error || (read === undefined && config.containerdConfig !== DEFAULT_CONTAINERD_CONFIG)) return { findings: [], address: fallback };
  let paths;
  try {
    paths = pathsFromConfig(read);
  } catch (err) {
    if (!(err instanceof ConfigError)) throw err;
    return { findings: err.problems.map((p) => fail(p, 'fix containerd\'s config (set an absolute path)')), address: fallback };
  }
  const problems = disagreements(config, paths);
  if (problems.length > 0) {
    return { findings: problems.map((p) => fail(p, "leave the setting out (tsbox follows containerd's config), or point --containerd-config at the config containerd runs with")), address: fallback };
  }
  const source = [...new Set(Object.values(paths.from).map((f) => f ?? "containerd's defaults"))].join(', ');
  return { findings: [pass(`containerd's root ${paths.root}, state ${paths.state}, socket ${paths.address} (from ${source})`)], address: paths.address };
}

/** How long containerd may take to dial tsbox again after tsbox restarted (its backoff, and more). */
const REDIAL_MS = 5_000;

/** containerd's version from its binary, and whether it answers on its socket. */
/**
 * The running containerd's release (its version service) and what it asks of tsbox: notes on
 * what applies, and from 2.3 on the sandbox image CRI pulls for every pod, tsbox's too, unless
 * (2.4) tsbox's handlers set disable_pause_image_pull.
 */
async function checkRelease(address: string, read: ContainerdConfigFiles | Error | undefined, handlers: readonly SandboxerHandler[]): Promise<Finding[]> {
  const client = connectContainerd(address, CRI_NAMESPACE);
  try {
    let text: string;
    try {
      text = (await client.call<Empty, VersionResponse>('version', 'Version', {}, { timeoutMs: 5_000 })).version;
    } catch (err) {
      return [note(`cannot ask containerd at ${address} its version (${messageOf(err)}): what it asks of a sandboxer is not checked`)];
    }
    const release = parseRelease(text);
    if (release === undefined) return [note(`containerd at ${address} says its version is "${text}", which names no release: what it asks of a sandboxer is not checked`)];
    const traits = traitsOf(release);
    const name = release.join('.');
    if (!traits.known) {
      const { from, to } = KNOWN_RELEASES;
      return [note(`containerd ${name} runs at ${address}, a release tsbox does not know (it knows ${from.join('.')} to ${to.join('.')}): what it asks of a sandboxer is not checked`)];
    }
    const findings = describeTraits(traits).map((what) => note(`containerd ${name} ${what}`));
    if (!traits.pullsPauseImage) return findings;
    const unset = handlers.filter((h) => !h.disablePauseImagePull).map((h) => h.name);
    if (traits.knowsDisablePausePull && handlers.length > 0 && unset.length === 0) {
      return [...findings, pass(`containerd ${name} pulls no sandbox image for tsbox pods (disable_pause_image_pull on ${handlers.map((h) => h.name).join(', ')})`)];
    }
    const pinned = read === undefined || read instanceof Error ? undefined : pinnedSandboxImage(read);
    const image = pinned ?? traits.defaultSandboxImage;
    const why = `containerd ${name} pulls the sandbox image ${image} at every RunPodSandbox, also for tsbox pods, which never run it${traits.knowsDisablePausePull ? ` (disable_pause_image_pull is not set on ${unset.join(', ')})` : ''}`;
    const fix = `${traits.knowsDisablePausePull ? 'run "tsbox install" again (it sets disable_pause_image_pull), or ' : ''}pull or import ${image} into namespace ${CRI_NAMESPACE} (ctr -n ${CRI_NAMESPACE} images pull ${image})`;
    try {
      await client.call<GetImageRequest, unknown>('images', 'Get', { name: image }, { timeoutMs: 5_000 });
      return [...findings, pass(`${why}: it is present`)];
    } catch (err) {
      if (err instanceof ContainerdCallError && err.code === grpc.status.NOT_FOUND) {
        return [...findings, fail(`${why}, and it is not in namespace ${CRI_NAMESPACE}: tsbox pods fail where its registry cannot be reached`, fix)];
      }
      return [...findings, fail(`${why}; whether it is present cannot be asked: ${messageOf(err)}`, fix)];
    }
  } finally {
    client.close();
  }
}

async function checkContainerd(address: string, read: ContainerdConfigFiles | Error | undefined, handlers: readonly SandboxerHandler[], binPath?: string): Promise<Finding[]> {
  const findings: Finding[] = [];
  const binary = findOnPath('containerd', binPath);
  if (binary === undefined) {
    findings.push(fail('containerd is not on PATH', 'install containerd ≥ 2.0 (Debian: apt-get install containerd from a suite that has 2.x)'));
  } else {
    const found = releaseOfBinary(binary);
    if ('error' in found) findings.push(fail(found.error, 'install containerd ≥ 2.0'));
    else if (found.release[0] < 2) {
      findings.push(fail(`containerd ${found.release.join('.')} is too old: tsbox needs ≥ 2.0 (1.x has no sandbox proxy plugins)`, 'install containerd 2.x'));
    } else findings.push(pass(`containerd ${found.release.join('.')} at ${binary} (≥ 2.0)`));
  }
  if (!socketExists(address)) {
    findings.push(fail(`containerd is not running at ${address} (no socket)`, 'systemctl start containerd, or pass --address'));
    return findings;
  }
  // One call through containerd to tsbox: proves the running containerd has the plugin and reaches tsbox.
  const client = connectContainerd(address, 'default');
  const probe = (): Promise<unknown> => client.call('controller', 'Status', { sandboxId: 'tsbox-doctor-probe', sandboxer: SANDBOXER, verbose: false }, { timeoutMs: 5_000 });
  try {
    await probe().catch(async (err: unknown) => {
      // containerd's channel to tsbox backs off after tsbox restarts (3 s at most in containerd
      // 2.1): a dial that fails is tried again until that has passed, as kubelet's calls are.
      if (!(err instanceof ContainerdCallError && err.code === grpc.status.UNAVAILABLE && err.target === 'controller' && /dial/.test(err.details))) throw err;
      const until = Date.now() + REDIAL_MS;
      for (;;) {
        await delay(250);
        try {
          return await probe();
        } catch (again) {
          if (Date.now() >= until) throw again;
        }
      }
    });
    findings.push(pass(`containerd at ${address} reaches tsbox`));
  } catch (err) {
    if (err instanceof ContainerdCallError && err.code === grpc.status.NOT_FOUND && !/sandbox controller/.test(err.details)) {
      findings.push(pass(`containerd at ${address} reaches tsbox`));
    } else if (err instanceof ContainerdCallError && err.code === grpc.status.NOT_FOUND) {
      findings.push(fail(`the running containerd at ${address} has no sandboxer "${SANDBOXER}" (${err.details})`, 'register tsbox in its config ("tsbox install") and restart containerd'));
    } else if (err instanceof ContainerdCallError && err.code === grpc.status.UNAVAILABLE && err.target === 'controller' && /dial/.test(err.details)) {
      findings.push(fail(`containerd at ${address} cannot reach tsbox: ${err.details}`, 'start tsbox (systemctl start tsbox) on the socket containerd\'s [proxy_plugins.tsbox] names'));
    } else {
      findings.push(fail(`containerd at ${address} does not answer: ${messageOf(err)}`, 'systemctl status containerd; journalctl -u containerd'));
    }
  } finally {
    client.close();
  }
  findings.push(...(await checkRelease(address, read, handlers)));
  return findings;
}

/** cgroup version and the controllers tsbox uses (memory, cpu, pids). */
function checkCgroups(_config: Config): Finding[] {
  let mounts: string[][];
  try {
    mounts = readFileSync('/proc/self/mounts', 'utf8').split('\n').filter(Boolean).map((l) => l.split(' '));
  } catch (err) {
    return [fail(`cannot read /proc/self/mounts: ${messageOf(err)}`, 'mount /proc')];
  }
  const v1 = new Set(mounts.filter((m) => m[2] === 'cgroup').flatMap((m) => (m[3] ?? '').split(',')));
  const v2 = mounts.find((m) => m[2] === 'cgroup2' && existsSync(join(m[1] ?? '', 'cgroup.controllers')));
  const v2Controllers = v2 === undefined ? [] : readFileSync(join(v2[1] ?? '', 'cgroup.controllers'), 'utf8').trim().split(/\s+/);
  const wanted = ['memory', 'cpu', 'pids'];
  let description: string;
  let missing: string[];
  if (v1.has('memory')) {
    description = `cgroup v1${v2 === undefined ? '' : ' (hybrid, cgroup2 at ' + String(v2[1]) + ')'}, controllers ${[...v1].filter((c) => ['memory', 'cpu', 'cpuacct', 'pids', 'cpuset', 'blkio'].includes(c)).join(', ')}`;
    missing = [...wanted, 'cpuacct'].filter((c) => !v1.has(c));
  } else if (v2 !== undefined) {
    description = `cgroup v2 at ${String(v2[1])}, controllers ${v2Controllers.join(', ')}`;
    missing = wanted.filter((c) => !v2Controllers.includes(c));
  } else {
    return [fail('no cgroup file system is mounted', 'mount cgroup2 at /sys/fs/cgroup (systemd does this at boot)')];
  }
  const findings: Finding[] = [];
  if (missing.length > 0) findings.push(fail(`${description}: missing ${missing.join(', ')}`, 'enable them (kernel command line, or cgroup.subtree_control of the parent)'));
  const { manager, reason } = detectCgroups();
  if (manager === undefined) findings.push(fail(`tsbox cannot use cgroups: ${reason ?? 'unknown'}; Metrics and pod stats will fail`, 'run tsbox as root on a host with the memory and cpu controllers'));
  else if (missing.length === 0) findings.push(pass(description));
  return findings;
}

function checkRunc(binPath?: string): Finding {
  const runc = findOnPath('runc', binPath);
  if (runc === undefined) return fail("runc is not on PATH: neither tsbox (Task API route) nor containerd's runc shim can run a pod's containers", 'apt-get install runc');
  try {
    const version = execFileSync(runc, ['--version'], { encoding: 'utf8', timeout: 10_000 }).split('\n')[0] ?? '';
    return pass(`${runc}: ${version}`);
  } catch (err) {
    return fail(`${runc} --version failed: ${messageOf(err)}`, 'reinstall runc');
  }
}


/**
 * tsbox's socket (a socket, its mode, someone answering), its Task API socket when a handler's
 * pods use it (`taskApi`: their names), and its state dir.
 */
async function checkTsboxFiles(config: Config, taskApi: readonly string[]): Promise<Finding[]> {
  const findings: Finding[] = [];
  const mode = (m: number): string => (m & 0o777).toString(8).padStart(4, '0');
  let socketOk = false;
  try {
    const st = statSync(config.socket);
    if (!st.isSocket()) findings.push(fail(`${config.socket} is not a socket`, 'remove it; tsbox creates its socket when it starts'));
    else if ((st.mode & 0o777) !== config.socketMode) {
      findings.push(fail(`socket ${config.socket} has mode ${mode(st.mode)}, the config says ${mode(config.socketMode)}`, 'restart tsbox (it sets the mode), or set socket_mode'));
    } else if ((st.mode & 0o002) !== 0) findings.push(fail(`socket ${config.socket} is writable by everyone: anyone could drive sandboxes`, 'set socket_mode = "0660"'));
    else socketOk = true;
  } catch (err) {
    if (isGone(err, ['ENOTDIR'])) findings.push(fail(`tsbox's socket ${config.socket} does not exist: tsbox is not running`, 'systemctl start tsbox (or tsbox serve)'));
    else findings.push(fail(`cannot check tsbox's socket ${config.socket}: ${messageOf(err)}`, 'check the permissions of its directory'));
  }
  if (socketOk) {
    if ((await probeSocket(config.socket, 2_000)) === 'accepts') findings.push(pass(`tsbox answers on ${config.socket} (mode ${mode(config.socketMode)})`));
    else findings.push(fail(`nothing answers on ${config.socket}: a stale socket, tsbox is not running`, 'systemctl restart tsbox'));
  }
  if (taskApi.length > 0) {
    const handlers = taskApi.map((h) => `"${h}"`).join(', ');
    const longest = longestPodSocket(config.stateDir);
    if (longest > MAX_SOCKET_PATH) findings.push(fail(`the pods' task sockets below ${config.stateDir} would be ${longest} bytes long, more than a unix socket's ${MAX_SOCKET_PATH}: the pods of handler ${handlers} cannot start`, 'give tsbox a shorter --state-dir'));
    else findings.push(pass(`each pod of handler ${handlers} gets a task socket of its own below ${join(config.stateDir, 's')} (containerd speaks the Task API v3 to the pod's process)`));
  }
  try {
    const st = statSync(config.stateDir);
    if (!st.isDirectory()) findings.push(fail(`state dir ${config.stateDir} is not a directory`, 'move it away; tsbox creates its state dir'));
    else if ((st.mode & 0o022) !== 0) findings.push(fail(`state dir ${config.stateDir} has mode ${mode(st.mode)}: others can change sandbox records`, `chmod 0700 ${config.stateDir}`));
    else if (process.getuid?.() === 0 && st.uid !== 0) findings.push(fail(`state dir ${config.stateDir} is owned by uid ${st.uid}, not root`, `chown root: ${config.stateDir}`));
    else findings.push(pass(`state dir ${config.stateDir} (mode ${mode(st.mode)})`));
  } catch (err) {
    if (isGone(err, ['ENOTDIR'])) findings.push(fail(`state dir ${config.stateDir} does not exist`, 'start tsbox once (it creates it), or check state_dir'));
    else findings.push(fail(`cannot check state dir ${config.stateDir}: ${messageOf(err)}`, 'check the permissions of its parent directories'));
  }
  return findings;
}

/** Runs every check; prints one line per check and a fix under each problem. */
export async function runDoctor(options: DoctorOptions): Promise<number> {
  const { config, output } = options;
  const read = readConfig(options.containerdConfig);
  const paths = checkContainerdPaths(config, read);
  // The handlers tsbox is registered for, and the route of each, as tsbox resolves them.
  const handlers = read === undefined || read instanceof Error ? [] : sandboxerHandlers(read, SANDBOXER, options.path);
  const routes = routeHandlers(config.taskApiHandlers, handlers);
  const findings = [
    ...(await checkContainerd(options.address ?? paths.address, read, handlers, options.path)),
    ...checkContainerdConfig(options.containerdConfig, read, config, handlers, routes),
    ...paths.findings,
    ...checkCgroups(config),
    checkRunc(options.path),
    ...(await checkTsboxFiles(config, routes.taskApi)),
  ];
  for (const f of findings) output.out(f.note === true ? `note  ${f.what}\n` : f.ok ? `ok    ${f.what}\n` : `FAIL  ${f.what}\n      fix: ${f.fix ?? ''}\n`);
  const problems = findings.filter((f) => !f.ok).length;
  output.out(problems === 0 ? 'tsbox doctor: everything is in order\n' : `tsbox doctor: ${problems} problem${problems === 1 ? '' : 's'}\n`);
  return problems === 0 ? EXIT.ok : EXIT.unhealthy;
}
