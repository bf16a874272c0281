/**
 * The operator's path on a node with systemd as init (the user-mode Linux node,
 * scripts/uml-node.sh), with the node's own containerd service and config: `tsbox install`,
 * then the commands it prints, give an active tsbox.service ordered before containerd that
 * systemd restarts when it fails; containerd, restarted by systemd, runs a pod with a
 * container on tsbox (by default over tsbox's Task API: no runc shim, runc's systemd driver); `tsbox doctor` passes, and fails naming the cause when tsbox is stopped
 * or the drop-in is gone; `tsbox uninstall` leaves containerd's config as it was. Without
 * systemd as init this test fails, saying where to run it.
 */
import assert from 'node:assert/strict';
import { execFileSync, spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { createCriRuntimeClient, repoRoot, type CriContainerConfig, type PodSandboxConfig } from '../support/containerd-clients.js';
import { waitForCri } from '../support/containerd.js';
import { BUSYBOX_IMAGE, buildTestImages } from '../support/images.js';
import { waitFor } from '../support/processes.js';

const MAIN = path.join(repoRoot, 'dist', 'src', 'main.js');
const CONTAINERD_CONFIG = '/etc/containerd/config.toml';
const DROP_IN = '/etc/containerd/conf.d/tsbox.toml';
const UNIT = '/etc/systemd/system/tsbox.service';
const CONTAINERD_SOCKET = '/run/containerd/containerd.sock';

/** Runs the tsbox CLI; its exit status and output. */
function tsbox(args: readonly string[]): { code: number | null; out: string } {
  const r = spawnSync(process.execPath, [MAIN, ...args], { encoding: 'utf8', timeout: 120_000 });
  return { code: r.status, out: `${r.stdout}${r.stderr}` };
}

function systemctl(...args: string[]): string {
  return execFileSync('systemctl', args, { encoding: 'utf8' }).trim();
}

function show(unit: string, property: string): string {
  return systemctl('show', unit, '-p', property, '--value');
}

describe('tsbox install, doctor and uninstall under systemd', { timeout: 900_000 }, () => {
  const work = mkdtempSync(path.join(tmpdir(), 'tsbox-operator-'));
  let shippedConfig: Buffer | undefined;

  before(() => {
    shippedConfig = readFileSync(CONTAINERD_CONFIG);
    if (!existsSync('/run/systemd/system')) throw new Error('this test needs systemd as init: run it in the test node (scripts/uml-node.sh)');
    if (existsSync(UNIT) || existsSync(DROP_IN)) throw new Error(`${UNIT} or ${DROP_IN} exists already: this node is not fresh`);
    systemctl('unmask', 'containerd.service');
    // The node's root is an overlay, which overlayfs refuses as an upper layer: containerd's
    // snapshots go on a tmpfs of their own, as on a real node's disk.
    // (Its directory exists only if the machine under the node's overlay has one.)
    mkdirSync('/var/lib/containerd', { recursive: true });
    execFileSync('mount', ['-t', 'tmpfs', 'tmpfs', '/var/lib/containerd']);
  });

  // The node as it was, whatever happened: the tests that run after these in the same node
  // read containerd's config at its default path.
  after(() => {
    spawnSync('systemctl', ['disable', '--now', 'tsbox.service']);
    spawnSync('systemctl', ['stop', 'containerd.service']);
    if (shippedConfig !== undefined) writeFileSync(CONTAINERD_CONFIG, shippedConfig);
    rmSync(DROP_IN, { force: true });
    rmSync(UNIT, { force: true });
    spawnSync('systemctl', ['daemon-reload']);
    spawnSync('umount', ['/var/lib/containerd']);
    rmSync(work, { recursive: true, force: true });
  });

  test('install → active service, containerd sees tsbox, a pod runs, doctor passes; stopped or unregistered tsbox fails doctor by name; uninstall restores containerd\'s config', async () => {
    // containerd's config as the distribution ships it (version 2): install refuses it, naming the fix.
    const shipped = readFileSync(CONTAINERD_CONFIG, 'utf8');
    const refused = tsbox(['install']);
    assert.equal(refused.code, 11, refused.out);
    assert.match(refused.out, /is a version 2 config.*\n.*fix: migrate it first: containerd config migrate/, refused.out);
    assert.equal(readFileSync(CONTAINERD_CONFIG, 'utf8'), shipped, 'a refused install writes nothing');
    execFileSync('sh', ['-c', `containerd config migrate > ${CONTAINERD_CONFIG}.new && mv ${CONTAINERD_CONFIG}.new ${CONTAINERD_CONFIG}`]);
    const before = readFileSync(CONTAINERD_CONFIG);

    const installed = tsbox(['install']);
    assert.equal(installed.code, 0, installed.out);
    const next = /^next: (.*)$/m.exec(installed.out)?.[1];
    assert.ok(next !== undefined, `install says what to run next: ${installed.out}`);
    assert.match(readFileSync(DROP_IN, 'utf8'), /\.runtimes\.tsbox\.options\]\n\s*SystemdCgroup = true/, 'runc uses systemd\'s cgroup driver on a systemd node');
    execFileSync('sh', ['-c', next], { stdio: 'inherit' });

    assert.equal(show('tsbox.service', 'ActiveState'), 'active');
    assert.equal(show('containerd.service', 'ActiveState'), 'active');
    assert.ok(show('tsbox.service', 'Before').split(' ').includes('containerd.service'), 'tsbox starts before containerd');
    assert.equal(show('tsbox.service', 'Restart'), 'on-failure');
    assert.match(show('tsbox.service', 'RestartPreventExitStatus'), /\b2\b/, 'a bad configuration is not restarted in a loop');

    // A crash of tsbox: systemd starts it again.
    const firstPid = Number(show('tsbox.service', 'MainPID'));
    assert.ok(firstPid > 0);
    process.kill(firstPid, 'SIGKILL');
    await waitFor(
      () => {
        const pid = Number(show('tsbox.service', 'MainPID'));
        return pid > 0 && pid !== firstPid && show('tsbox.service', 'ActiveState') === 'active';
      },
      { what: 'systemd restarts tsbox after it was killed', timeoutMs: 60_000, intervalMs: 200, describe: () => systemctl('status', '--no-pager', 'tsbox.service') },
    );

    // containerd, restarted by systemd with the drop-in, runs a pod with a container on tsbox.
    const cri = createCriRuntimeClient(CONTAINERD_SOCKET);
    try {
      await waitForCri(cri, ['RuntimeReady'], () => systemctl('status', '--no-pager', 'containerd.service'));
      const imported = spawnSync('ctr', ['--address', CONTAINERD_SOCKET, '--namespace', 'k8s.io', 'images', 'import', buildTestImages(work)], { encoding: 'utf8', timeout: 120_000 });
      assert.equal(imported.status, 0, imported.stderr);
      const logDirectory = path.join(work, 'logs');
      const config: PodSandboxConfig = {
        metadata: { name: 'operator', namespace: 'node', uid: `operator-${process.pid}`, attempt: 0 },
        hostname: '',
        log_directory: logDirectory,
        labels: {},
        annotations: {},
        linux: { cgroup_parent: `kubepods-besteffort-podoperator${process.pid}.slice`, security_context: { namespace_options: { network: 'NODE', pid: 'POD', ipc: 'POD' } } },
      };
      const { pod_sandbox_id: id } = await cri.call('RunPodSandbox', { config, runtime_handler: 'tsbox' }, { timeoutMs: 120_000 });
      const container: CriContainerConfig = { metadata: { name: 'main' }, image: { image: BUSYBOX_IMAGE }, command: ['/bin/sh', '-c', 'echo ran; exec sleep 100000'], log_path: 'main.log' };
      const { container_id: c } = await cri.call('CreateContainer', { pod_sandbox_id: id, config: container, sandbox_config: config }, { timeoutMs: 120_000 });
      await cri.call('StartContainer', { container_id: c }, { timeoutMs: 120_000 });
      const { status } = await cri.call('ContainerStatus', { container_id: c });
      assert.equal(status?.state, 'CONTAINER_RUNNING');
      assert.equal(show(`cri-containerd-${id}.scope`, 'ActiveState'), 'active', 'the sandbox runs in its scope');
      // The default route: tsbox runs the container with runc (no runc shim for the pod), with
      // the handler's runc options: systemd's cgroup driver makes the container's scope.
      assert.equal(spawnSync('pgrep', ['-f', 'containerd-shim-runc-v2']).status, 1, 'no runc shim runs');
      assert.equal(show(`cri-containerd-${c}.scope`, 'ActiveState'), 'active', 'the container runs in the scope runc made through systemd');

      const healthy = tsbox(['doctor']);
      assert.equal(healthy.code, 0, healthy.out);
      assert.match(healthy.out, /tsbox doctor: everything is in order/);
      assert.match(healthy.out, /^ok +CRI runtime handler "tsbox" runs on tsbox; tsbox runs its containers with runc over the Task API/m);
      assert.match(healthy.out, /^ok +each pod of handler "tsbox" gets a task socket of its own below \/var\/lib\/tsbox\/s /m);

      await cri.call('StopContainer', { container_id: c, timeout: 0 }, { timeoutMs: 60_000 });
      await cri.call('RemoveContainer', { container_id: c }, { timeoutMs: 60_000 });
      await cri.call('StopPodSandbox', { pod_sandbox_id: id }, { timeoutMs: 60_000 });
      await cri.call('RemovePodSandbox', { pod_sandbox_id: id }, { timeoutMs: 60_000 });
      assert.equal(show(`cri-containerd-${id}.scope`, 'LoadState'), 'not-found', 'the scope is gone with the pod');
    } finally {
      cri.close();
    }

    // tsbox stopped: doctor fails and names it.
    systemctl('stop', 'tsbox.service');
    const stopped = tsbox(['doctor']);
    assert.equal(stopped.code, 10, stopped.out);
    assert.match(stopped.out, /FAIL {2}tsbox's socket \/run\/tsbox\/tsbox\.sock does not exist: tsbox is not running\n\s+fix: systemctl start tsbox/, stopped.out);
    systemctl('start', 'tsbox.service');
    assert.equal(tsbox(['doctor']).code, 0, 'healthy again once tsbox runs');

    // The drop-in removed: doctor fails and names it.
    rmSync(DROP_IN);
    const unregistered = tsbox(['doctor']);
    assert.equal(unregistered.code, 10, unregistered.out);
    // containerd itself would not start with an import that names no file.
    assert.ok(unregistered.out.includes(`FAIL  cannot read containerd config ${DROP_IN} (imported by ${CONTAINERD_CONFIG}): no such file`), unregistered.out);

    const removed = tsbox(['uninstall']);
    assert.equal(removed.code, 0, removed.out);
    assert.deepEqual(readFileSync(CONTAINERD_CONFIG), before, 'containerd\'s config is byte for byte what it was before install');
    assert.equal(existsSync(UNIT), false);
  });
});
