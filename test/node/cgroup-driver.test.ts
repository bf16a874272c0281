/**
 * kubelet's systemd cgroup driver on a cgroup v2 node with systemd as init (the user-mode
 * Linux node, scripts/uml-node.sh): runc runs the tsbox handler's containers with
 * `SystemdCgroup = true` and CRI sends the pod's cgroup_parent as a slice. The sandbox must
 * be where runc would put a pause container, in a scope systemd knows, with the pod's limits,
 * and gone after the pod. Without systemd as init this test fails, saying where to run it.
 */
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { describe, test } from 'node:test';
import type { PodSandboxConfig } from '../support/containerd-clients.js';
import { RUNC_HANDLER, TSBOX_HANDLER, usePodEnv } from '../support/pod-env.js';

const CGROUP_ROOT = '/sys/fs/cgroup';
const RUNTIMES = "plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes";

/** systemctl show's properties of a unit. */
function unitProperties(unit: string, names: readonly string[]): Record<string, string> {
  const out = execFileSync('systemctl', ['show', unit, ...names.flatMap((n) => ['-p', n])], { encoding: 'utf8' });
  const props: Record<string, string> = {};
  for (const line of out.split('\n')) {
    const eq = line.indexOf('=');
    if (eq > 0) props[line.slice(0, eq)] = line.slice(eq + 1);
  }
  return props;
}

/** The v2 cgroup of a process (its "0::" line). */
function cgroupOf(pid: number): string {
  const line = readFileSync(`/proc/${pid}/cgroup`, 'utf8')
    .split('\n')
    .find((l) => l.startsWith('0::'));
  return line?.slice(3) ?? '';
}

describe('the systemd cgroup driver: a pod in a slice on tsbox', { timeout: 900_000 }, () => {
  const harness = usePodEnv({
    precondition: () => {
      if (!existsSync('/run/systemd/system') || !existsSync(path.join(CGROUP_ROOT, 'cgroup.controllers'))) {
        throw new Error('this test needs cgroup v2 with systemd as init: run it in the test node (scripts/uml-node.sh)');
      }
    },
    containerdToml: `
[${RUNTIMES}.${TSBOX_HANDLER}.options]
  SystemdCgroup = true
[${RUNTIMES}.${RUNC_HANDLER}.options]
  SystemdCgroup = true
`,
    // kubelet's slices, which systemd made for the pods' scopes.
    cleanup: () => execFileSync('systemctl', ['stop', 'kubepods.slice']),
  });
  const { withLogs, runPod, startContainer, removePod, assertNothingLeft, pidOf } = harness;

  test('the sandbox runs in cri-containerd-<id>.scope under the slice, known to systemd, with the pod\'s limits; its container runs beside it; nothing is left after the pod', () =>
    withLogs(async () => {
      // kubelet's name for a burstable pod's slice (dashes of the uid become underscores).
      const slice = `kubepods-burstable-pod${process.pid}_e2e.slice`;
      const config: PodSandboxConfig = harness.env.podConfig('systemd', {
        linux: {
          cgroup_parent: slice,
          security_context: { namespace_options: { network: 'NODE', pid: 'POD', ipc: 'POD' } },
          resources: { memory_limit_in_bytes: 96 * 1024 * 1024, cpu_shares: 256, cpu_period: 100_000, cpu_quota: 50_000 },
        },
      });
      const id = await runPod(config);
      const pid = await pidOf('PodSandboxStatus', id);
      const unit = `cri-containerd-${id}.scope`;
      const scopeCgroup = `/kubepods.slice/kubepods-burstable.slice/${slice}/${unit}`;

      const shown = unitProperties(unit, ['ActiveState', 'Slice', 'ControlGroup', 'Delegate', 'MemoryMax']);
      assert.deepEqual(shown, { ActiveState: 'active', Slice: slice, ControlGroup: scopeCgroup, Delegate: 'yes', MemoryMax: String(96 * 1024 * 1024) }, 'systemd knows the scope');
      assert.equal(cgroupOf(pid), scopeCgroup, 'the sandbox process is in the scope');
      const procs = readFileSync(path.join(CGROUP_ROOT, scopeCgroup, 'cgroup.procs'), 'utf8').split('\n');
      assert.ok(procs.includes(String(pid)), `the scope's cgroup.procs lists the sandbox pid ${pid}: ${procs.join(' ')}`);

      const limits = (): Record<string, string> =>
        Object.fromEntries(['memory.max', 'cpu.max', 'cpu.weight'].map((f) => [f, readFileSync(path.join(CGROUP_ROOT, scopeCgroup, f), 'utf8').trim()]));
      // cpu.weight of 256 shares: 1 + (256 - 2) * 9999 / 262142, as runc and kubelet convert them.
      const wanted = { 'memory.max': String(96 * 1024 * 1024), 'cpu.max': '50000 100000', 'cpu.weight': '10' };
      assert.deepEqual(limits(), wanted, 'the pod\'s limits are in the scope\'s files');
      // systemd rewrites a unit's cgroup files from its properties at a reload: they are the same.
      execFileSync('systemctl', ['daemon-reload']);
      assert.deepEqual(limits(), wanted, 'the limits survive a daemon-reload');

      // A container of the pod, which runc puts in its own scope in the same slice.
      const c = await startContainer(id, config, 'main', 'exec sleep 100000');
      const containerPid = await pidOf('ContainerStatus', c);
      assert.equal(cgroupOf(containerPid), `/kubepods.slice/kubepods-burstable.slice/${slice}/cri-containerd-${c}.scope`, 'runc put the container beside the sandbox');

      await removePod(id, [c]);
      assert.equal(unitProperties(unit, ['LoadState']).LoadState, 'not-found', 'systemd no longer knows the scope');
      assert.equal(existsSync(path.join(CGROUP_ROOT, scopeCgroup)), false, 'the scope\'s cgroup is gone');
      await assertNothingLeft(id, [c], 30_000);
    }));
});
