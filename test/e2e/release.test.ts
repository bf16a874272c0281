/**
 * The release artifact: built by scripts/release.mjs (what `npm run release` runs after the
 * build), unpacked into a fresh directory outside the repository, and run from there with
 * a PATH that holds no Node: its own Node serves behind a real containerd, its CLI creates
 * and removes a sandbox through containerd, and a Kubernetes pod with a container runs on it.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, readFileSync, readlinkSync, readdirSync } from 'node:fs';
import path from 'node:path';
import { repoRoot } from '../support/containerd-clients.js';
import { type CommandResult, type Containerd, containerdUnavailableReason, runCommand, startContainerd } from '../support/containerd.js';
import { BUSYBOX_IMAGE } from '../support/images.js';
import { TSBOX_HANDLER, podLeftovers, startPodEnv } from '../support/pod-env.js';
import { type SandboxerDaemon, makeTempDir, processAlive, removeTree, startSandboxerDaemon, waitFor } from '../support/tsbox-daemon.js';
import { DAEMON_NODE_FLAGS } from '../../src/base/node-flags.js';

describe('the release artifact, unpacked on a fresh directory', () => {
  let dir = '';
  let home = '';
  let sandboxer: SandboxerDaemon | undefined;
  let containerd: Containerd | undefined;
  /** No Node on it: the artifact must bring its own. */
  const env = { PATH: '/usr/local/sbin:/usr/sbin:/sbin:/bin' };

  function tsbox(args: readonly string[]): Promise<CommandResult> {
    return runCommand('/usr/bin/env', ['-i', `PATH=${env.PATH}`, path.join(home, 'bin', 'tsbox'), ...args], 60_000);
  }

  before(async () => {
    const missing = containerdUnavailableReason();
    if (missing !== undefined) throw new Error(missing);
    dir = await makeTempDir('release-');
    const built = await runCommand(process.execPath, [path.join(repoRoot, 'scripts', 'release.mjs'), '--out', path.join(dir, 'out')], 300_000);
    assert.equal(built.code, 0, built.stderr);
    const tarball = readdirSync(path.join(dir, 'out')).find((f) => f.endsWith('.tar.gz'));
    assert.ok(tarball !== undefined, built.stdout);
    const unpacked = await runCommand('tar', ['-C', dir, '-xzf', path.join(dir, 'out', tarball)], 120_000);
    assert.equal(unpacked.code, 0, unpacked.stderr);
    home = path.join(dir, tarball.replace(/-linux-[a-z0-9]+\.tar\.gz$/, ''));
    sandboxer = await startSandboxerDaemon({
      name: 'tsbox-release',
      runsProcesses: true,
      stopExitStatus: 137,
      command: ({ socketPath, stateDir }) => ({
        file: '/usr/bin/env',
        args: ['-i', `PATH=${env.PATH}`, path.join(home, 'bin', 'tsbox'), 'serve', '--socket', socketPath, '--state-dir', stateDir],
      }),
    });
    containerd = await startContainerd({ sandboxerSocket: sandboxer.socketPath });
  });

  after(async () => {
    await containerd?.teardown();
    await sandboxer?.teardown();
    if (dir !== '') await removeTree(dir);
  });

  test('holds the program, the supervisor, production modules only, and its own Node', () => {
    for (const f of ['bin/tsbox', 'bin/node', 'dist/src/main.js', 'dist/bin/tsbox-shim', 'dist/bin/tsbox-pause', 'node_modules/@grpc/grpc-js/package.json', 'node_modules/commander/package.json', 'VERSION']) {
      assert.ok(existsSync(path.join(home, f)), f);
    }
    for (const dev of ['typescript', 'eslint', 'ts-proto', '@bufbuild/buf']) assert.ok(!existsSync(path.join(home, 'node_modules', dev)), `no dev dependency ${dev}`);
    assert.ok(!existsSync(path.join(home, 'dist', 'test')), 'no tests');
    assert.match(readFileSync(path.join(home, 'VERSION'), 'utf8'), new RegExp(`node ${process.version.replace(/\./g, '\\.')}`));
    // The holder is the one program under its own name: a link inside the artifact, not to the build's tree.
    assert.equal(readlinkSync(path.join(home, 'dist', 'bin', 'tsbox-ctr')), 'tsbox-shim');
  });

  test('serves behind containerd with its own Node; its CLI creates and removes a sandbox', async () => {
    const d = containerd;
    const s = sandboxer;
    assert.ok(d !== undefined && s !== undefined && s.pid !== undefined);
    // The daemon is the artifact's Node (env execs the launcher, which execs node).
    assert.equal(readlinkSync(`/proc/${s.pid}/exe`), path.join(home, 'bin', 'node'));
    // With the daemon's Node flags (src/base/node-flags.ts): the launcher passes them.
    const argv = readFileSync(`/proc/${s.pid}/cmdline`, 'utf8').split('\0');
    for (const flag of DAEMON_NODE_FLAGS) assert.ok(argv.includes(flag), `${flag} in ${argv.join(' ')}`);

    const run = await tsbox(['sandbox', 'run', '--address', d.address, '-n', 'release', '--id', 'smoke']);
    assert.equal(run.code, 0, `${run.stdout}${run.stderr}`);
    const ls = await tsbox(['sandbox', 'ls', '--address', d.address, '-n', 'release', '--json']);
    assert.equal(ls.code, 0, ls.stderr);
    const [row] = JSON.parse(ls.stdout) as { id: string; state: string; pid: number }[];
    assert.equal(row?.id, 'smoke');
    assert.equal(row.state, 'SANDBOX_READY');
    assert.ok(processAlive(row.pid));
    const ctr = await d.ctr(['sandboxes', 'ls'], { namespace: 'release' });
    assert.match(ctr.stdout, /^smoke\s/m);

    const rm = await tsbox(['sandbox', 'rm', '--address', d.address, '-n', 'release', 'smoke']);
    assert.equal(rm.code, 0, rm.stderr);
    assert.ok(!processAlive(row.pid), 'rm stopped it');
    assert.doesNotMatch((await d.ctr(['sandboxes', 'ls'], { namespace: 'release' })).stdout, /smoke/);
  });

  test('a Kubernetes pod with a container runs on it through CRI, and nothing of the pod is left', async () => {
    const launcher = path.join(home, 'bin', 'tsbox');
    const pods = await startPodEnv({
      tsboxCommand: ({ socketPath, stateDir }) => ({
        file: '/usr/bin/env',
        args: ['-i', `PATH=${env.PATH}`, launcher, 'serve', '--socket', socketPath, '--state-dir', stateDir, '--log-level', 'debug'],
      }),
    });
    try {
      assert.equal(readlinkSync(`/proc/${pods.tsbox.pid ?? 0}/exe`), path.join(home, 'bin', 'node'), 'the artifact serves');
      const config = pods.podConfig('released', { dns_config: { servers: ['127.0.0.53'] } });
      const { pod_sandbox_id: id } = await pods.cri.call('RunPodSandbox', { config, runtime_handler: TSBOX_HANDLER }, { timeoutMs: 60_000 });
      const { container_id: c } = await pods.cri.call(
        'CreateContainer',
        { pod_sandbox_id: id, config: { metadata: { name: 'main' }, image: { image: BUSYBOX_IMAGE }, command: ['sleep', '100000'] }, sandbox_config: config },
        { timeoutMs: 60_000 },
      );
      await pods.cri.call('StartContainer', { container_id: c }, { timeoutMs: 60_000 });
      const out = await pods.cri.call('ExecSync', { container_id: c, cmd: ['cat', '/etc/resolv.conf', '/proc/1/cmdline'], timeout: 20 });
      assert.match(Buffer.from(out.stdout).toString('utf8'), /^nameserver 127\.0\.0\.53\n.*tsbox-pause/s);
      await pods.cri.call('StopContainer', { container_id: c, timeout: 0 }, { timeoutMs: 60_000 });
      await pods.cri.call('RemoveContainer', { container_id: c }, { timeoutMs: 60_000 });
      await pods.cri.call('StopPodSandbox', { pod_sandbox_id: id }, { timeoutMs: 60_000 });
      await pods.cri.call('RemovePodSandbox', { pod_sandbox_id: id }, { timeoutMs: 60_000 });
      let left = podLeftovers(pods, id, [c]);
      await waitFor(
        () => {
          left = podLeftovers(pods, id, [c]);
          return Object.values(left).every((l: string[]) => l.length === 0);
        },
        { what: 'nothing of the pod left', timeoutMs: 15_000, describe: () => JSON.stringify(left) },
      );
    } finally {
      await pods.teardown();
    }
  });

  test('its install writes a unit that runs the artifact\'s launcher', async () => {
    const root = path.join(dir, 'root');
    const r = await tsbox(['install', '--root', root]);
    assert.equal(r.code, 0, r.stderr);
    const unit = readFileSync(path.join(root, 'etc/systemd/system/tsbox.service'), 'utf8');
    assert.ok(unit.includes(`ExecStart=${path.join(home, 'bin', 'tsbox')} serve `), unit);
  });
});
