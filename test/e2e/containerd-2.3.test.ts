/**
 * What containerd 2.3 (the long-term release) asks of a sandboxer, through CRI on containerd
 * 2.3.4 (unpacked by scripts/install-containerd.sh), a tsbox pod beside a podsandbox pod:
 * the pod's OCI spec from Start, which CRI shows as the pod's `runtimeSpec` and builds NRI's
 * view of the pod from; and UpdatePodSandboxResources (CRI v1.33), which reaches tsbox as an
 * Update carrying the pod's new resources.
 */
import assert from 'node:assert/strict';
import { readFileSync, statSync } from 'node:fs';
import path from 'node:path';
import { describe, test } from 'node:test';
import type { PodSandboxConfig } from '../support/containerd-clients.js';
import { cgroupNode } from '../support/host.js';
import { nriSocket } from '../support/containerd.js';
import { type NriPod, connectNriPlugin } from '../support/nri-plugin.js';
import { RUNC_HANDLER, TSBOX_TASK_HANDLER, doctor, usePodEnv, withoutPauseImages } from '../support/pod-env.js';
import { EXIT } from '../../src/ops/exit-codes.js';

const RELEASE = '2.3.4';

interface OciSpec {
  annotations?: Record<string, string>;
  linux?: { namespaces?: { type: string; path?: string }[]; cgroupsPath?: string; resources?: { cpu?: { shares?: number }; memory?: { limit?: number } } };
}

describe(`containerd ${RELEASE}: the pod's spec and its resources updated in place`, { timeout: 600_000 }, () => {
  const harness = usePodEnv({ containerdRelease: RELEASE, nri: true });
  const { withLogs, runPod, startContainer, removePod, assertNothingLeft, pidOf } = harness;

  /** PodSandboxStatus verbose, as `crictl inspectp` prints it: CRI's info JSON. */
  const inspect = async (id: string): Promise<{ pid: number; processStatus: string; runtimeSpec?: OciSpec }> => {
    const { info } = await harness.env.cri.call('PodSandboxStatus', { pod_sandbox_id: id, verbose: true });
    return JSON.parse(info['info'] ?? '{}') as { pid: number; processStatus: string; runtimeSpec?: OciSpec };
  };
  const podConfig = (name: string, parent: string): PodSandboxConfig =>
    harness.env.podConfig(name, {
      linux: {
        cgroup_parent: parent,
        security_context: { namespace_options: { network: 'POD', pid: 'POD', ipc: 'POD' } },
        resources: { memory_limit_in_bytes: 96 * 1024 * 1024, cpu_shares: 256 },
        overhead: { memory_limit_in_bytes: 32 * 1024 * 1024, cpu_shares: 64 },
      },
    });

  test("the pod's runtimeSpec names its namespaces and cgroup as podsandbox's does; tsbox's namespaces are the ones its containers are in", () =>
    withLogs(async () => {
      const parent = `/tsbox-e2e-${process.pid}/spec`;
      const ours = podConfig('spec-tsbox', parent);
      const theirs = podConfig('spec-runc', parent);
      const id = await runPod(ours, TSBOX_TASK_HANDLER);
      const ref = await runPod(theirs, RUNC_HANDLER);
      const c = await startContainer(id, ours, 'main', 'exec sleep 100000');

      const [mine, reference] = [await inspect(id), await inspect(ref)];
      const types = (s: OciSpec | undefined): string[] => (s?.linux?.namespaces ?? []).map((n) => n.type).sort();
      assert.ok(reference.runtimeSpec !== undefined, "podsandbox's pod has a runtimeSpec");
      assert.ok(mine.runtimeSpec !== undefined, `tsbox's pod has a runtimeSpec: ${JSON.stringify(mine)}`);
      for (const type of ['ipc', 'mount', 'network', 'pid', 'uts']) assert.ok(types(reference.runtimeSpec).includes(type), `podsandbox names ${type}: ${types(reference.runtimeSpec).join(',')}`);
      assert.deepEqual(types(mine.runtimeSpec), types(reference.runtimeSpec), 'the same namespaces');
      assert.equal(reference.runtimeSpec.linux?.cgroupsPath, `${parent}/${ref}`);
      assert.equal(mine.runtimeSpec.linux?.cgroupsPath, `${parent}/${id}`, 'where the sandbox is (kubelet\'s pod cgroup)');
      for (const s of [mine.runtimeSpec, reference.runtimeSpec]) {
        assert.equal(s.annotations?.['io.kubernetes.cri.container-type'], 'sandbox');
        assert.equal(s.annotations?.['io.kubernetes.cri.sandbox-memory'], String(96 * 1024 * 1024), "the pod's own memory");
      }
      // podsandbox's pause gets CPU shares 2 and no memory limit; tsbox's sandbox the pod's limits.
      assert.deepEqual(mine.runtimeSpec.linux?.resources?.memory, { limit: 128 * 1024 * 1024 }, 'resources plus overhead');
      assert.equal(mine.runtimeSpec.annotations?.['io.kubernetes.cri.sandbox-name'], 'spec-tsbox');
      assert.equal(mine.processStatus, 'running');

      // Each named namespace is the one the pod's container is in (a plugin entering it reaches the pod).
      const sandbox = await pidOf('PodSandboxStatus', id);
      const container = await pidOf('ContainerStatus', c);
      assert.equal(mine.pid, sandbox);
      const files: Record<string, string> = { ipc: 'ipc', mount: 'mnt', network: 'net', pid: 'pid', uts: 'uts' };
      // A namespace is its inode on nsfs, whether named by /proc/PID/ns or by a bind mount (the netns).
      const inode = (file: string): number => statSync(file).ino;
      for (const ns of mine.runtimeSpec.linux?.namespaces ?? []) {
        assert.ok(ns.path !== undefined && ns.path !== '', `${ns.type} has a path`);
        if (ns.type === 'mount') {
          assert.equal(inode(ns.path), inode(`/proc/${sandbox}/ns/mnt`), "the sandbox's own mount namespace");
          continue;
        }
        assert.equal(inode(ns.path), inode(`/proc/${container}/ns/${files[ns.type] ?? ns.type}`), `the container is in the pod's ${ns.type} namespace`);
      }
      await removePod(id, [c]);
      await removePod(ref, []);
      await assertNothingLeft(id, [c]);
    }));

  test('an NRI plugin sees a tsbox pod as it sees a podsandbox pod: its namespaces (each the pod\'s), cgroups path, limits and pid', () =>
    withLogs(async () => {
      const plugin = connectNriPlugin(nriSocket(harness.env.containerd.paths));
      try {
        const { runtimeName, runtimeVersion } = await plugin.ready;
        assert.equal(runtimeName, 'containerd');
        assert.match(runtimeVersion, /2\.3\.4/);
        const parent = `/tsbox-e2e-${process.pid}/nri`;
        const id = await runPod(podConfig('nri-tsbox', parent), TSBOX_TASK_HANDLER);
        const ref = await runPod(podConfig('nri-runc', parent), RUNC_HANDLER);
        const [mine, theirs] = [await plugin.pod(id), await plugin.pod(ref)];
        const types = (pod: NriPod): string[] => (pod.linux?.namespaces ?? []).map((n) => n.type).sort();
        assert.deepEqual(types(mine), types(theirs), `the same namespaces: tsbox ${JSON.stringify(mine.linux)}, podsandbox ${JSON.stringify(theirs.linux)}`);
        assert.ok(types(mine).includes('pid') && types(mine).includes('network'), types(mine).join(','));
        assert.equal(theirs.linux?.cgroups_path, `${parent}/${ref}`);
        assert.equal(mine.linux?.cgroups_path, `${parent}/${id}`);
        assert.equal(mine.linux?.cgroup_parent, parent);
        assert.equal(mine.runtime_handler, TSBOX_TASK_HANDLER);
        const sandbox = await pidOf('PodSandboxStatus', id);
        assert.equal(mine.pid, sandbox, "NRI has the sandbox's pid");
        assert.ok(theirs.pid > 0);
        // The paths name the sandbox's namespaces (the network one is the pod's netns).
        const inode = (file: string): number => statSync(file).ino;
        for (const ns of mine.linux?.namespaces ?? []) {
          if (ns.type === 'network') continue;
          const file = ns.type === 'mount' ? 'mnt' : ns.type;
          assert.equal(inode(ns.path), inode(`/proc/${sandbox}/ns/${file}`), `${ns.type}: ${ns.path}`);
        }
        assert.equal(mine.linux?.resources?.memory?.limit?.value, String(128 * 1024 * 1024), "the pod cgroup's memory limit");
        assert.equal(mine.annotations['io.kubernetes.cri.sandbox-name'], 'nri-tsbox');
        await removePod(id, []);
        await removePod(ref, []);
      } finally {
        plugin.close();
      }
    }));

  test('UpdatePodSandboxResources sets the pod cgroup\'s new limits (resources plus overhead) and the runtimeSpec shows them; one the kernel refuses fails naming the file and the former limits stay', () =>
    withLogs(async () => {
      const parent = `/tsbox-e2e-${process.pid}/resize`;
      const config = podConfig('resize', parent);
      const id = await runPod(config, TSBOX_TASK_HANDLER);
      const c = await startContainer(id, config, 'main', 'exec sleep 100000');
      const node = cgroupNode();
      const read = (controller: string, file: string): string => readFileSync(path.join(node.root(controller), parent, id, file), 'utf8').trim();
      const memory = (): string => read('memory', node.kind === 'v1' ? 'memory.limit_in_bytes' : 'memory.max');
      const cpu = (): string => read('cpu', node.kind === 'v1' ? 'cpu.shares' : 'cpu.weight');
      assert.equal(memory(), String(128 * 1024 * 1024));
      const sharesBefore = cpu();

      await harness.env.cri.call('UpdatePodSandboxResources', {
        pod_sandbox_id: id,
        resources: { memory_limit_in_bytes: 200 * 1024 * 1024, cpu_shares: 512 },
        overhead: { memory_limit_in_bytes: 32 * 1024 * 1024, cpu_shares: 64 },
      });
      assert.equal(memory(), String(232 * 1024 * 1024));
      assert.equal(cpu(), node.kind === 'v1' ? '576' : '22', 'runc\'s conversion of 576 shares on cgroup v2');
      const spec = (await inspect(id)).runtimeSpec;
      assert.deepEqual(spec?.linux?.resources?.memory, { limit: 232 * 1024 * 1024 });
      assert.deepEqual(spec?.linux?.resources?.cpu, { shares: 576 });

      // A CPU the node does not have: refused (by the kernel on cgroup v1, by tsbox where the
      // cgroup v2 kernel offers no cpuset controller at all), naming the cpuset; the limits stay.
      await assert.rejects(
        harness.env.cri.call('UpdatePodSandboxResources', { pod_sandbox_id: id, resources: { memory_limit_in_bytes: 300 * 1024 * 1024, cpuset_cpus: '4095' } }),
        node.kind === 'v1' ? /cpuset\.cpus = 4095/ : /cpuset/,
      );
      assert.equal(memory(), String(232 * 1024 * 1024), 'the former memory limit is back');
      assert.notEqual(cpu(), sharesBefore);
      // The container runs on, and the pod goes as usual.
      assert.equal((await harness.exec(c, ['true'])).code, 0);
      await removePod(id, [c]);
      await assertNothingLeft(id, [c]);
    }));

  test('tsbox doctor names containerd 2.3.4 and what it asks; without the sandbox image it fails naming it, as a tsbox pod then fails to start', () =>
    withLogs(async () => {
      const present = await doctor(harness.env, RELEASE);
      assert.match(present.stdout, /^ok +containerd 2\.3\.4 at .* \(≥ 2\.0\)$/m, present.stdout);
      assert.match(present.stdout, /^note +containerd 2\.3\.4 keeps the pod's OCI spec tsbox returns from Start/m);
      assert.match(present.stdout, /^ok +containerd 2\.3\.4 pulls the sandbox image registry\.k8s\.io\/pause:3\.10\.2 at every RunPodSandbox, also for tsbox pods, which never run it: it is present$/m);

      await withoutPauseImages(harness.env, async () => {
        const absent = await doctor(harness.env, RELEASE);
        assert.equal(absent.code, EXIT.unhealthy, absent.stdout);
        assert.match(absent.stdout, /^FAIL +containerd 2\.3\.4 pulls the sandbox image registry\.k8s\.io\/pause:3\.10\.2 .*and it is not in namespace k8s\.io/m);
        assert.match(absent.stdout, /fix: pull or import registry\.k8s\.io\/pause:3\.10\.2 into namespace k8s\.io/);
        // What doctor warns of: this node reaches no registry.
        await assert.rejects(runPod(harness.env.podConfig('no-pause'), TSBOX_TASK_HANDLER), /failed to pull image "registry\.k8s\.io\/pause:3\.10\.2"/);
      });
    }));
});
