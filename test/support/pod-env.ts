/**
 * A node for pods with containers: a private containerd 2.x whose CRI plugin has a runtime
 * handler `tsbox` (sandboxer tsbox, `runtime_type = "io.containerd.runc.v2"`, SPEC.md
 * section 7) next to containerd's own default handler `runc` (podsandbox), tsbox serving the
 * sandboxer socket and given only containerd's config (containerd's root, state and socket are
 * not the defaults: tsbox reads them there), the test images imported, and a CNI bridge
 * whose pod addresses lie in 127.0.0.0/8 (no traffic leaves the machine). Shared by the
 * end-to-end tests of pods and the pod benchmark.
 */
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync, readdirSync, readlinkSync, rmdirSync, symlinkSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { after, before } from 'node:test';
import {
  type CriContainerConfig,
  type CriRuntimeMethods,
  type PodSandboxConfig,
  type UnaryClient,
  createCriRuntimeClient,
  grpc,
} from './containerd-clients.js';
import { type CommandResult, type Containerd, containerdRelease, containerdUnavailableReason, runCommand, startContainerd, waitForCri } from './containerd.js';
import { cgroupMounts } from './host.js';
import { stateLayout } from '../../src/state/layout.js';
import { formerTaskDirs, taskDirs } from '../../src/tasks/serve.js';
import { taskDirName } from '../../src/tasks/task-record.js';
import { BUSYBOX_IMAGE, PAUSE_IMAGES, importTestImages } from './images.js';
import {
  type SandboxerCommand,
  type SandboxerDaemon,
  createSandboxerDaemon,
  makeTempDir,
  removeTree,
  tsboxMain,
  tsboxSandboxer,
  waitFor,
} from './tsbox-daemon.js';

export const TSBOX_HANDLER = 'tsbox';
/** A second handler on tsbox whose pods' containers tsbox runs itself (Task API v3, no runc shim). */
export const TSBOX_TASK_HANDLER = 'tsbox-task';
/** containerd's own default handler: podsandbox (a pause container) and runc. */
export const RUNC_HANDLER = 'runc';

/**
 * A container script's start that waits for an exec's go-ahead (GO_AHEAD), then for that exec's
 * process to be gone, before going on to end the container: the container's end kills every
 * process left in it (its pid namespace goes), so an exec still finishing would be killed and
 * report 137 instead of its own code.
 */
export const AWAIT_GO_AHEAD = 'mkfifo /tmp/go && read p < /tmp/go && while [ -e /proc/$p ]; do sleep 0.05; done';
/** The exec that lets AWAIT_GO_AHEAD go on: it names itself and ends (code 0). */
export const GO_AHEAD = ['sh', '-c', 'until [ -p /tmp/go ]; do sleep 0.05; done; echo $$ > /tmp/go'];

export interface PodEnv {
  readonly tsbox: SandboxerDaemon;
  readonly containerd: Containerd;
  readonly cri: UnaryClient<CriRuntimeMethods>;
  /** Where pods' log directories go. */
  readonly logRoot: string;
  /** The CNI bridge pods with their own network join. */
  readonly bridge: string;
  /** containerd's CRI sandbox root dir (hostname, hosts, resolv.conf) of pod `id`. */
  criRootDir(id: string): string;
  /** containerd's CRI volatile sandbox dir (shm) of pod `id`. */
  criStateDir(id: string): string;
  /** A fresh PodSandboxConfig with a log directory that exists. */
  podConfig(name: string, overrides?: Partial<PodSandboxConfig>): PodSandboxConfig;
  logTails(): string;
  teardown(): Promise<void>;
}

/** Pod subnet of the test bridge: loopback range, distinct from other tools' ranges. */
const POD_SUBNET = '127.89.0.0/24';

function cniConfig(bridge: string, dataDir: string): string {
  return JSON.stringify(
    {
      cniVersion: '1.0.0',
      name: 'tsbox-e2e',
      plugins: [
        {
          type: 'bridge',
          bridge,
          isGateway: false,
          ipMasq: false,
          ipam: { type: 'host-local', ranges: [[{ subnet: POD_SUBNET }]], dataDir },
        },
        { type: 'loopback' },
      ],
    },
    null,
    2,
  );
}

/** Starts the node. Never skips: without root, containerd or the images it fails, saying why. */
export async function startPodEnv(
  options: {
    containerdLogLevel?: string;
    tsboxLogLevel?: string;
    /** Another tsbox build (the benchmark compares builds); it gets only the basic flags. */
    tsboxMain?: string;
    /** How to run tsbox instead of this checkout's build (a release artifact's launcher). */
    tsboxCommand?: SandboxerCommand;
    /** More of containerd's config (TOML tables), e.g. runc options of the handlers. */
    containerdToml?: string;
    /** Node flags for tsbox's process (before its main script), e.g. heap snapshot flags. */
    tsboxNodeFlags?: readonly string[];
    /**
     * The files a node keeps under /run on a tmpfs (this machine's /run is not one): containerd's
     * state dir, with the runc shims' runc root below it (their default is /run/containerd/runc)
     * and tsbox's tasks (below containerd's state dir). Records and images stay on disk.
     */
    runOnTmpfs?: boolean;
    /** A containerd release unpacked into .cache/containerd (e.g. 2.3.4); default TSBOX_E2E_CONTAINERD, else Debian's. */
    containerdRelease?: string;
    /** `disable_pause_image_pull = true` on tsbox's handlers, as `tsbox install` sets it for containerd 2.4. */
    disablePauseImagePull?: boolean;
    /** containerd's NRI on, for a test plugin (nriSocket). */
    nri?: boolean;
  } = {},
): Promise<PodEnv> {
  const missing = containerdUnavailableReason(containerdRelease(options.containerdRelease ?? process.env['TSBOX_E2E_CONTAINERD']));
  if (missing !== undefined) throw new Error(missing);
  let containerd: Containerd | undefined;
  const built = tsboxSandboxer(options.tsboxMain === undefined ? {} : { main: options.tsboxMain });
  const base = options.tsboxCommand === undefined ? built : { ...built, command: options.tsboxCommand };
  const tsbox = await createSandboxerDaemon({
    ...base,
    command: (paths) => {
      const cmd = base.command(paths);
      const c = containerd;
      if (c === undefined) throw new Error('containerd must run before tsbox is started');
      const args = [
        ...(options.tsboxNodeFlags ?? []),
        ...cmd.args.map((a, i) => (cmd.args[i - 1] === '--log-level' && options.tsboxLogLevel !== undefined ? options.tsboxLogLevel : a)),
      ];
      if (options.tsboxMain !== undefined) return { ...cmd, args };
      // As an operator runs it: containerd's config is the only containerd setting; tsbox takes
      // containerd's root, state and socket (all in the private containerd's dir) from it.
      // The Task API route for the pods of TSBOX_TASK_HANDLER (a task socket per pod, below the state dir).
      return { ...cmd, args: [...args, '--containerd-config', c.paths.configPath, '--task-api-handlers', TSBOX_TASK_HANDLER] };
    },
  });
  const work = await makeTempDir('pods-e2e-');
  const bridge = `tsbx${process.pid.toString(36).slice(-6)}`;
  let cri: UnaryClient<CriRuntimeMethods> | undefined;
  try {
    containerd = await startContainerd({
      sandboxerSocket: tsbox.socketPath,
      sandboxerName: TSBOX_HANDLER,
      runtimeType: 'io.containerd.runc.v2',
      logLevel: options.containerdLogLevel ?? 'info',
      stateOnTmpfs: options.runOnTmpfs === true,
      ...(options.containerdRelease === undefined ? {} : { release: options.containerdRelease }),
      ...(options.disablePauseImagePull === true ? { handlerToml: '  disable_pause_image_pull = true\n' } : {}),
      ...(options.nri === true ? { nri: true } : {}),
      extraToml: (paths) => `
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.${RUNC_HANDLER}]
  runtime_type = "io.containerd.runc.v2"
  sandboxer = "podsandbox"
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.${TSBOX_TASK_HANDLER}]
  runtime_type = "io.containerd.runc.v2"
  sandboxer = ${JSON.stringify(TSBOX_HANDLER)}
${options.disablePauseImagePull === true ? '  disable_pause_image_pull = true\n' : ''}${options.runOnTmpfs === true ? [RUNC_HANDLER, TSBOX_HANDLER].map((h) => `[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.${h}.options]\n  Root = ${JSON.stringify(path.join(paths.state, 'runc'))}\n`).join('') : ''}${options.containerdToml ?? ''}`,
    });
    // CNI: containerd's private bin dir gets the Debian plugins, its conf dir our bridge.
    for (const plugin of ['bridge', 'host-local', 'loopback']) {
      const target = path.join(containerd.paths.cniBinDir, plugin);
      if (!existsSync(target)) symlinkSync(path.join('/usr/lib/cni', plugin), target);
    }
    writeFileSync(path.join(containerd.paths.cniConfDir, '10-tsbox-e2e.conflist'), cniConfig(bridge, path.join(work, 'ipam')));
    await tsbox.start();
    const client = createCriRuntimeClient(containerd.address);
    cri = client;
    await waitForCri(client, ['RuntimeReady', 'NetworkReady'], () => containerd?.logTail() ?? '');
    await importTestImages(containerd, work);
  } catch (err) {
    cri?.close();
    await containerd?.teardown();
    await tsbox.teardown();
    await removeTree(work);
    throw err;
  }
  const c = containerd;
  const logRoot = path.join(work, 'pod-logs');
  mkdirSync(logRoot, { recursive: true });
  let podCount = 0;
  // The pods' cgroups (kubelet's part) all live below this one, removed at teardown.
  const cgroupScope = `/tsbox-e2e-${process.pid}`;
  return {
    tsbox,
    containerd: c,
    cri,
    logRoot,
    bridge,
    criRootDir: (id) => path.join(c.paths.root, 'io.containerd.grpc.v1.cri', 'sandboxes', id),
    criStateDir: (id) => path.join(c.paths.state, 'io.containerd.grpc.v1.cri', 'sandboxes', id),
    podConfig(name, overrides = {}) {
      const uid = `${name}-${process.pid}-${++podCount}`;
      const logDirectory = path.join(logRoot, uid);
      mkdirSync(logDirectory, { recursive: true });
      const network = overrides.linux?.security_context?.namespace_options?.network ?? 'NODE';
      return {
        metadata: { name, namespace: 'e2e', uid, attempt: 0 },
        // kubelet names only pods with a network of their own: a host-network pod has the
        // host's UTS namespace (runc refuses a host name there).
        hostname: network === 'POD' || network === 0 ? name : '',
        log_directory: logDirectory,
        labels: { app: 'tsbox-e2e' },
        annotations: {},
        ...overrides,
        // kubelet always names the pod's cgroup; CRI reads pod stats from it.
        linux: {
          cgroup_parent: `${cgroupScope}/pod${uid}`,
          security_context: { namespace_options: { network: 'NODE', pid: 'POD', ipc: 'POD' } },
          ...overrides.linux,
        },
      };
    },
    logTails: () => [c.logTail(40), tsbox.logTail(40)].join('\n'),
    async teardown() {
      cri.close();
      await c.teardown();
      await tsbox.teardown();
      for (const root of cgroupMounts()) removeEmptyTree(path.join(root, cgroupScope));
      try {
        execFileSync('ip', ['link', 'del', bridge], { stdio: 'ignore' });
      } catch {
        // no bridge: no pod with its own network ran
      }
      await removeTree(work);
    },
  };
}

/** What is left on the host of pod `id`: processes, mounts, cgroup directories, files. */
export interface PodLeftovers {
  readonly processes: string[];
  readonly mounts: string[];
  readonly cgroups: string[];
  readonly files: string[];
}


/** Removes a cgroup directory tree bottom-up (cgroup directories are removed with rmdir). */
function removeEmptyTree(dir: string): void {
  let entries;
  try {
    entries = readdirSync(dir, { withFileTypes: true });
  } catch {
    return; // absent in this hierarchy
  }
  for (const e of entries) if (e.isDirectory()) removeEmptyTree(path.join(dir, e.name));
  try {
    rmdirSync(dir);
  } catch (err) {
    process.stderr.write(`# pod env teardown: cannot remove cgroup ${dir}: ${String(err)}\n`);
  }
}

/** Directories named `name` (or containing it) anywhere below `dir`, at most `depth` deep. */
function findNamed(dir: string, needle: string, depth: number): string[] {
  if (depth < 0) return [];
  let entries;
  try {
    entries = readdirSync(dir, { withFileTypes: true });
  } catch {
    return []; // not a directory we can read: nothing below it
  }
  const out: string[] = [];
  for (const e of entries) {
    if (!e.isDirectory()) continue;
    const full = path.join(dir, e.name);
    if (e.name.includes(needle)) out.push(full);
    else out.push(...findNamed(full, needle, depth - 1));
  }
  return out;
}

/**
 * `call`'s answer once CRI gives one: a containerd that restarts answers UNAVAILABLE while its
 * CRI plugin initializes, and CRI's channel to tsbox's sandbox socket backs off after tsbox
 * restarts; kubelet retries such calls, and so does this (nothing else).
 */
export async function untilCriAnswers<T>(call: () => Promise<T>): Promise<T> {
  let answer: { value: T } | undefined;
  await waitFor(
    async () => {
      try {
        answer = { value: await call() };
        return true;
      } catch (err) {
        if ((err as { code?: number }).code === grpc.status.UNAVAILABLE) return false;
        throw err;
      }
    },
    { what: 'CRI answers again', timeoutMs: 30_000 },
  );
  return (answer as { value: T }).value;
}

/**
 * What tsbox's Task API route keeps of containers `ids`, in either place it keeps them (below
 * containerd's state dir, or an earlier build's state dir): each task's directory (its records
 * and holders' files) and runc's state of each container.
 */
function taskFilesOf(env: PodEnv, ids: readonly string[], namespace = 'k8s.io'): string[] {
  const former = formerTaskDirs(env.tsbox.stateDir);
  const places = [taskDirs(env.containerd.paths.state), { tasks: former.dir, runcRoot: former.runcRoot }];
  return places
    .flatMap(({ tasks, runcRoot }) => ids.flatMap((c) => [path.join(tasks, taskDirName(namespace, c)), path.join(runcRoot, namespace, c)]))
    .filter((p) => existsSync(p));
}

/** Processes whose command line or cgroup names one of `names` (zombies aside), mount points and cgroup directories naming one. */
function leftoversNamed(names: readonly string[]): Omit<PodLeftovers, 'files'> {
  const processes: string[] = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    let cmdline = '';
    let cgroup = '';
    let stat = '';
    try {
      cmdline = readFileSync(`/proc/${entry}/cmdline`, 'utf8').split('\0').join(' ');
      cgroup = readFileSync(`/proc/${entry}/cgroup`, 'utf8');
      stat = readFileSync(`/proc/${entry}/stat`, 'utf8');
    } catch {
      continue; // the process ended meanwhile
    }
    if (stat.slice(stat.lastIndexOf(')') + 2).startsWith('Z')) continue;
    if (names.some((n) => cmdline.includes(n) || cgroup.includes(n))) processes.push(`${entry}: ${cmdline.slice(0, 160)}`);
  }
  const mounts = readFileSync('/proc/self/mountinfo', 'utf8')
    .split('\n')
    .map((line) => line.split(' ')[4] ?? '')
    .filter((point) => names.some((n) => point.includes(n)));
  const cgroups = cgroupMounts().flatMap((root) => names.flatMap((n) => findNamed(root, n, 6)));
  return { processes, mounts, cgroups: [...new Set(cgroups)] };
}

/** A container as CRI reports it (ContainerStatus, verbose): its state, exit code and process. */
export async function containerState(env: PodEnv, id: string): Promise<{ state: string; exitCode: number; pid: number }> {
  const { status, info } = await env.cri.call('ContainerStatus', { container_id: id, verbose: true });
  assert.ok(status);
  const pid = (JSON.parse(info['info'] ?? '{}') as { pid?: number }).pid ?? 0;
  return { state: status.state, exitCode: status.exit_code, pid };
}

/**
 * Everything of pod `id` (and its containers `containerIds`) still on the host, found
 * without asking tsbox or containerd: processes whose command line, cgroup or mount namespace
 * names the pod or a container (runc shims serving it included), mount points, cgroup
 * directories, and the pod's directories in tsbox's and containerd's state, with what tsbox
 * keeps of its containers (task records, holders' files, runc's state).
 */
export function podLeftovers(env: PodEnv, id: string, containerIds: readonly string[]): PodLeftovers {
  const { processes, mounts, cgroups } = leftoversNamed([id, ...containerIds]);
  const socket = podShimSocket(env, id);
  for (const shim of runcShimsOf(env)) {
    if (shim.sockets.includes(socket)) processes.push(`${shim.pid}: runc shim serving the pod on ${socket}`);
  }
  const files = [
    socket,
    env.criRootDir(id),
    env.criStateDir(id),
    path.join(env.tsbox.stateDir, 'sandboxes', 'k8s.io', id),
    // The pod's task socket and link, which its process binds on the Task API route.
    ...Object.values(stateLayout(env.tsbox.stateDir).podSockets('k8s.io', id)),
  ].filter((p) => existsSync(p));
  return { processes: [...new Set(processes)], mounts, cgroups, files: [...files, ...taskFilesOf(env, containerIds)] };
}

/**
 * What is left on the host of containers `ids` of a pod on the Task API route, while their pod
 * runs on: processes (holders, the containers' own), mounts (their rootfs), cgroups, and what
 * tsbox keeps of them (task records, holders' files, runc's state).
 */
export function containerLeftovers(env: PodEnv, ids: readonly string[]): PodLeftovers {
  return { ...leftoversNamed(ids), files: taskFilesOf(env, ids) };
}

/**
 * containerd's pkg/shim names the socket of a grouped runc shim after containerd's address,
 * the namespace and the pod's id: /run/containerd/s/<sha256 of "<address>/<ns>/<id>">.
 */
export function podShimSocket(env: PodEnv, id: string, namespace = 'k8s.io'): string {
  return `/run/containerd/s/${createHash('sha256').update(path.join(env.containerd.address, namespace, id)).digest('hex')}`;
}

/** The containerd-shim processes of the test containerd, each with the unix sockets it listens on. */
export function runcShimsOf(env: PodEnv): { pid: number; sockets: string[] }[] {
  const byInode = new Map<string, string>();
  for (const line of readFileSync('/proc/net/unix', 'utf8').split('\n').slice(1)) {
    const f = line.trim().split(/\s+/);
    if (f[6] !== undefined && f[7] !== undefined) byInode.set(f[6], f[7]);
  }
  const out: { pid: number; sockets: string[] }[] = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    let argv: string[];
    try {
      argv = readFileSync(`/proc/${entry}/cmdline`, 'utf8').split('\0');
    } catch {
      continue; // the process ended meanwhile
    }
    if (!path.basename(argv[0] ?? '').startsWith('containerd-shim') || !argv.includes(env.containerd.address)) continue;
    const sockets: string[] = [];
    try {
      for (const fd of readdirSync(`/proc/${entry}/fd`)) {
        const m = /^socket:\[(\d+)\]$/.exec(readlinkSync(`/proc/${entry}/fd/${fd}`));
        const socket = m === null ? undefined : byInode.get(m[1] as string);
        if (socket !== undefined) sockets.push(socket);
      }
    } catch {
      continue; // gone meanwhile
    }
    out.push({ pid: Number(entry), sockets });
  }
  return out;
}

/** A test file's pods on a PodEnv, with the calls kubelet makes, and the checks after them. */
export interface PodHarness {
  /** The env, once `before` started it. */
  readonly env: PodEnv;
  /** Runs `body`; on failure the message carries containerd's and tsbox's last log lines. */
  readonly withLogs: (body: () => Promise<void>) => Promise<void>;
  /** RunPodSandbox on `handler` (tsbox's by default); the pod is removed in `after` if a test left it. */
  readonly runPod: (config: PodSandboxConfig, handler?: string) => Promise<string>;
  /** CreateContainer and StartContainer of busybox running `sh -c script`. */
  readonly startContainer: (pod: string, podConfig: PodSandboxConfig, name: string, script: string, extra?: Partial<CriContainerConfig>) => Promise<string>;
  readonly exec: (container: string, cmd: string[]) => Promise<{ stdout: string; stderr: string; code: number }>;
  /** `sh -c script` in the container, which must exit 0; its stdout. */
  readonly sh: (container: string, script: string) => Promise<string>;
  /** Stops and removes the pod's containers and the pod, the way kubelet does. */
  readonly removePod: (id: string, containers: readonly string[]) => Promise<void>;
  /** Waits (bounded) until nothing of the pod is left: processes, mounts, files, cgroups, sockets. */
  readonly assertNothingLeft: (id: string, containers: readonly string[], timeoutMs?: number) => Promise<void>;
  /** The pid verbose PodSandboxStatus (or ContainerStatus) names. */
  readonly pidOf: (call: 'PodSandboxStatus' | 'ContainerStatus', id: string) => Promise<number>;
}

/**
 * Starts a PodEnv in the enclosing suite's `before` (after `precondition`, which throws when
 * the node cannot run the suite) and, in its `after`, removes the pods a failed test left,
 * tears the env down and runs `cleanup`.
 */
export function usePodEnv(
  options: Parameters<typeof startPodEnv>[0] & { precondition?: () => void; cleanup?: () => void } = {},
): PodHarness {
  let started: PodEnv | undefined;
  const pods = new Set<string>();
  const env = (): PodEnv => {
    assert.ok(started !== undefined, 'the pod env did not start');
    return started;
  };
  before(async () => {
    options.precondition?.();
    started = await startPodEnv(options);
  });
  after(async () => {
    for (const id of pods) {
      // Only pods a failed test left: the env's teardown kills whatever remains.
      await started?.cri.call('StopPodSandbox', { pod_sandbox_id: id }, { timeoutMs: 30_000 }).catch(() => /* see above */ undefined);
      await started?.cri.call('RemovePodSandbox', { pod_sandbox_id: id }, { timeoutMs: 30_000 }).catch(() => /* see above */ undefined);
    }
    await started?.teardown();
    options.cleanup?.();
  });
  const exec = async (container: string, cmd: string[]): Promise<{ stdout: string; stderr: string; code: number }> => {
    const r = await env().cri.call('ExecSync', { container_id: container, cmd, timeout: 20 }, { timeoutMs: 30_000 });
    return { stdout: Buffer.from(r.stdout).toString('utf8'), stderr: Buffer.from(r.stderr).toString('utf8'), code: r.exit_code };
  };
  return {
    get env() {
      return env();
    },
    async withLogs(body) {
      try {
        await body();
      } catch (err) {
        if (err instanceof Error && started !== undefined) err.message = `${err.message}\n${started.logTails()}`;
        throw err;
      }
    },
    async runPod(config, handler = TSBOX_HANDLER) {
      const { pod_sandbox_id: id } = await env().cri.call('RunPodSandbox', { config, runtime_handler: handler }, { timeoutMs: 120_000 });
      pods.add(id);
      return id;
    },
    async startContainer(pod, podConfig, name, script, extra = {}) {
      const config: CriContainerConfig = {
        metadata: { name },
        image: { image: BUSYBOX_IMAGE },
        command: ['/bin/sh', '-c', script],
        log_path: `${name}.log`,
        ...extra,
      };
      const { container_id: id } = await env().cri.call('CreateContainer', { pod_sandbox_id: pod, config, sandbox_config: podConfig }, { timeoutMs: 120_000 });
      await env().cri.call('StartContainer', { container_id: id }, { timeoutMs: 120_000 });
      return id;
    },
    exec,
    async sh(container, script) {
      const r = await exec(container, ['/bin/sh', '-c', script]);
      assert.equal(r.code, 0, `${script}: exit ${r.code}, stderr ${r.stderr}`);
      return r.stdout;
    },
    async removePod(id, containers) {
      const { cri } = env();
      for (const c of containers) await cri.call('StopContainer', { container_id: c, timeout: 0 }, { timeoutMs: 60_000 });
      for (const c of containers) await cri.call('RemoveContainer', { container_id: c }, { timeoutMs: 60_000 });
      await cri.call('StopPodSandbox', { pod_sandbox_id: id }, { timeoutMs: 60_000 });
      await cri.call('RemovePodSandbox', { pod_sandbox_id: id }, { timeoutMs: 60_000 });
      pods.delete(id);
    },
    async assertNothingLeft(id, containers, timeoutMs = 15_000) {
      // Processes may take a moment to be reaped after the calls answered.
      let left = podLeftovers(env(), id, containers);
      await waitFor(
        () => {
          left = podLeftovers(env(), id, containers);
          return Object.values(left).every((list: string[]) => list.length === 0);
        },
        { what: `nothing of pod ${id} left`, timeoutMs, describe: () => JSON.stringify(left, null, 2) },
      );
    },
    async pidOf(call, id) {
      const { info } =
        call === 'PodSandboxStatus'
          ? await env().cri.call('PodSandboxStatus', { pod_sandbox_id: id, verbose: true })
          : await env().cri.call('ContainerStatus', { container_id: id, verbose: true });
      const pid = (JSON.parse(info['info'] ?? '{}') as { pid?: number }).pid;
      assert.ok(typeof pid === 'number' && pid > 0, `verbose ${call} names the pid: ${JSON.stringify(info)}`);
      return pid;
    },
  };
}


/**
 * Runs `body` on a node without the sandbox (pause) images (removed from CRI's namespace), then
 * imports them again from the archive the env imported at its start.
 */
export async function withoutPauseImages(env: PodEnv, body: () => Promise<void>): Promise<void> {
  for (const image of PAUSE_IMAGES) await env.containerd.ctr(['images', 'rm', image], { namespace: 'k8s.io' });
  try {
    await body();
  } finally {
    await importTestImages(env.containerd, path.dirname(env.logRoot));
  }
}

/**
 * `tsbox doctor` as an operator runs it on the env's node: containerd's config, tsbox's socket
 * and state dir, and PATH with the release's programs first (its `containerd --version`).
 */
export function doctor(env: PodEnv, release?: string): Promise<CommandResult> {
  const dir = containerdRelease(release).dir;
  const PATH = dir === undefined ? process.env['PATH'] : `${dir}:${process.env['PATH'] ?? ''}`;
  return runCommand(
    process.execPath,
    [tsboxMain, 'doctor', '--containerd-config', env.containerd.paths.configPath, '--socket', env.tsbox.socketPath, '--state-dir', env.tsbox.stateDir],
    60_000,
    { ...process.env, PATH },
  );
}
