/**
 * Pods on a cgroup v2 node with systemd as init (the user-mode Linux node that
 * scripts/test-uml-node.sh boots): a pod's limits land in the v2 files of its cgroup, the
 * sandbox joins that cgroup through cgroup.procs, Metrics answer the v2 message with the
 * values of those files, a limit whose controller the node cannot give is refused naming the
 * controller and where to enable it, and nothing of a pod is left. Real containerd, runc and
 * CRI. These tests fail on any other kind of node: they check what only a v2 node has.
 */
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, readlinkSync, rmdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { before, describe, test } from 'node:test';
import { Metrics as CgroupV2Metrics } from '../../src/gen/cgroups/v2/metrics.js';
import { LinuxContainerResources } from '../../src/gen/runtime/v1/pod_sandbox_config.js';
import { createSandboxClients, expectGrpcError } from '../support/containerd-clients.js';
import { cgroupNode } from '../support/host.js';
import { type PodEnv, TSBOX_HANDLER, podLeftovers, usePodEnv } from '../support/pod-env.js';
import { killAndReap, waitFor } from '../support/processes.js';

const CRI_NS = 'k8s.io';
const MiB = 1024 * 1024;
const CGROUP_ROOT = '/sys/fs/cgroup';

/** runc's (and kubelet's) conversion of CPU shares to a cgroup v2 cpu.weight. */
const weightOf = (shares: number): number => 1 + Math.floor(((shares - 2) * 9999) / 262142);

const read = (file: string): string => readFileSync(file, 'utf8').trim();
const keyed = (file: string): Map<string, bigint> =>
  new Map(
    read(file)
      .split('\n')
      .map((line) => line.split(' '))
      .map(([k, v]) => [k ?? '', BigInt(v ?? '0')]),
  );

describe('pods on a cgroup v2 node with systemd', { timeout: 600_000 }, () => {
  const harness = usePodEnv();
  const { withLogs, runPod, startContainer, removePod, assertNothingLeft, pidOf } = harness;
  let env: PodEnv;
  before(() => {
    env = harness.env;
  });

  /** The one cgroup v2 path of a process, from /proc/PID/cgroup ("0::/path"). */
  const cgroupOf = (pid: number): string => {
    const lines = read(`/proc/${pid}/cgroup`).split('\n');
    assert.deepEqual(lines.length, 1, `a v2-only node has one hierarchy: ${lines.join(' | ')}`);
    assert.match(lines[0] ?? '', /^0::\//);
    return (lines[0] ?? '').slice(3);
  };

  test('the node is cgroup v2 only, with systemd as pid 1 and the cpu, memory and pids controllers', () => {
    assert.equal(cgroupNode().kind, 'v2');
    assert.equal(path.basename(readlinkSync('/proc/1/exe')), 'systemd');
    const controllers = read(path.join(CGROUP_ROOT, 'cgroup.controllers')).split(' ');
    for (const c of ['cpu', 'memory', 'pids']) assert.ok(controllers.includes(c), `${c} in ${controllers.join(' ')}`);
  });

  test('a pod\'s limits land in memory.max, cpu.max, cpu.weight and pids.max; the sandbox joins its cgroup; Metrics report the files; Update rewrites them', () =>
    withLogs(async () => {
      const parent = `/tsbox-node-${process.pid}/podlimits`;
      const config = env.podConfig('limits', {
        linux: {
          cgroup_parent: parent,
          security_context: { namespace_options: { network: 'NODE', pid: 'POD', ipc: 'POD' } },
          resources: { memory_limit_in_bytes: 96 * MiB, cpu_shares: 256, cpu_period: 100_000, cpu_quota: 50_000, unified: { 'pids.max': '64' } },
          overhead: { memory_limit_in_bytes: 32 * MiB, cpu_shares: 64 },
        },
      });
      const id = await runPod(config);
      const dir = path.join(CGROUP_ROOT, parent, id);
      const file = (name: string): string => read(path.join(dir, name));
      assert.equal(file('memory.max'), String(128 * MiB), 'resources plus overhead');
      assert.equal(file('cpu.max'), '50000 100000');
      assert.equal(file('cpu.weight'), String(weightOf(256 + 64)));
      assert.equal(file('pids.max'), '64');

      // The sandbox joined the cgroup (cgroup.procs lists it); a container sits next to it, under the pod's parent.
      const pid = await pidOf('PodSandboxStatus', id);
      assert.equal(cgroupOf(pid), `${parent}/${id}`);
      assert.ok(file('cgroup.procs').split('\n').includes(String(pid)), `cgroup.procs of ${dir}: ${file('cgroup.procs')}`);
      const c = await startContainer(id, config, 'main', 'exec sleep 100000');
      const containerCgroup = cgroupOf(await pidOf('ContainerStatus', c));
      assert.ok(containerCgroup.startsWith(`${parent}/`) && containerCgroup !== `${parent}/${id}`, `container cgroup ${containerCgroup}`);

      // Metrics: the v2 message, with what the files say.
      const direct = createSandboxClients(env.tsbox.socketPath, CRI_NS);
      try {
        // The sandbox process alone may have used less CPU than the kernel accounts here (none,
        // seen on the node): a process that spins in the sandbox's cgroup until its cpu.stat
        // shows time used gives Metrics something to report, as a pod's own work would.
        const spinner = spawn('sh', ['-c', 'read go; while :; do :; done'], { stdio: ['pipe', 'ignore', 'ignore'] });
        const spinnerExit = new Promise((resolve) => spinner.once('exit', resolve));
        assert.ok(spinner.pid !== undefined, 'the spinner runs');
        writeFileSync(path.join(dir, 'cgroup.procs'), String(spinner.pid));
        spinner.stdin.end('go\n');
        await waitFor(() => (keyed(path.join(dir, 'cpu.stat')).get('usage_usec') ?? 0n) > 0n, { what: 'CPU time used in the sandbox\'s cgroup' });
        spinner.kill('SIGKILL');
        await spinnerExit;
        // Memory the pod's own processes hold: the pause shares its pages with its supervisor,
        // which is outside the pod's cgroup, so a process of the pod that takes 4 MB of its own
        // (a shell's variable) gives memory.stat something to count, as a container would.
        const holder = spawn('sh', ['-c', 'read go; x=$(head -c 4000000 /dev/zero | tr "\\0" a); echo held; read end'], { stdio: ['pipe', 'pipe', 'ignore'] });
        const holderExit = new Promise((resolve) => holder.once('exit', resolve));
        assert.ok(holder.pid !== undefined, 'the holder runs');
        writeFileSync(path.join(dir, 'cgroup.procs'), String(holder.pid));
        const held = new Promise((resolve) => holder.stdout.once('data', resolve));
        holder.stdin.write('go\n');
        await held;
        // The kernel flushes a cgroup's memory.stat counters lazily (every 2 s on kernel 7.x):
        // shortly after the pod starts the file may still say anon 0 and file 0, and Metrics
        // reports what the file says. Once the file shows memory, Metrics must show it too.
        const statMemory = (): bigint => {
          const stat = keyed(path.join(dir, 'memory.stat'));
          return (stat.get('anon') ?? 0n) + (stat.get('file') ?? 0n);
        };
        await waitFor(() => statMemory() > 0n, { what: 'anon or file memory in the sandbox cgroup\'s memory.stat' });
        const { metrics } = await direct.controller.call('Metrics', { sandbox_id: id, sandboxer: TSBOX_HANDLER });
        assert.equal(metrics?.data?.type_url, 'io.containerd.cgroups.v2.Metrics');
        const m = CgroupV2Metrics.decode(metrics?.data?.value ?? Buffer.alloc(0));
        const cpuAfter = keyed(path.join(dir, 'cpu.stat'));
        assert.equal(m.pids?.limit, 64n);
        assert.equal(m.pids?.current, BigInt(file('pids.current')));
        assert.equal(m.memory?.usageLimit, BigInt(128 * MiB));
        assert.ok((m.memory?.usage ?? 0n) > 0n && (m.memory?.usage ?? 0n) <= BigInt(128 * MiB), `memory usage ${m.memory?.usage}`);
        // memory.peak only grows: what Metrics read is at most what the file says afterwards.
        const peak = m.memory?.maxUsage ?? 0n;
        assert.ok(peak >= (m.memory?.usage ?? 0n) && peak <= BigInt(file('memory.peak')), `peak ${peak}, usage ${m.memory?.usage}, memory.peak ${file('memory.peak')}`);
        const usage = m.cpu?.usageUsec ?? 0n;
        assert.ok(usage > 0n && usage <= (cpuAfter.get('usage_usec') ?? 0n), `cpu usage ${usage} µs, cpu.stat after: ${cpuAfter.get('usage_usec')}`);
        const events = keyed(path.join(dir, 'memory.events'));
        assert.deepEqual(
          { max: m.memoryEvents?.max, oom: m.memoryEvents?.oom, oomKill: m.memoryEvents?.oomKill },
          { max: events.get('max'), oom: events.get('oom'), oomKill: events.get('oom_kill') },
        );
        assert.ok((m.memory?.file ?? 0n) + (m.memory?.anon ?? 0n) > 0n, 'memory.stat is reported (anon, file)');
        holder.stdin.end();
        await holderExit;

        // Update (as a later CRI sends it): the new limits replace the old ones.
        const resources = LinuxContainerResources.encode(LinuxContainerResources.fromPartial({ memoryLimitInBytes: 200 * MiB, cpuShares: 512, cpuQuota: 20_000, cpuPeriod: 100_000 })).finish();
        await direct.controller.call('Update', {
          sandbox_id: id,
          sandboxer: TSBOX_HANDLER,
          sandbox: {
            sandbox_id: id,
            sandboxer: TSBOX_HANDLER,
            runtime: { name: 'io.containerd.runc.v2' },
            extensions: { resources: { type_url: 'runtime.v1.LinuxContainerResources', value: Buffer.from(resources) } },
          },
          fields: ['extensions.resources'],
        });
      } finally {
        direct.close();
      }
      assert.equal(file('memory.max'), String(232 * MiB));
      assert.equal(file('cpu.weight'), String(weightOf(512 + 64)));
      assert.equal(file('cpu.max'), '20000 100000');

      await removePod(id, [c]);
      await assertNothingLeft(id, [c]);
      assert.equal(existsSync(dir), false, `${dir} is gone with the pod`);
    }));

  test('a parent cgroup that cannot hand the controllers down: the pod is refused naming the controller and the subtree_control to fix; nothing is left', () =>
    withLogs(async () => {
      // A parent with a process of its own: cgroup v2 lets it enable no controller for children.
      const top = path.join(CGROUP_ROOT, `tsbox-node-busy-${process.pid}`);
      const busy = path.join(top, 'busy');
      mkdirSync(busy, { recursive: true });
      const holder = spawn('sleep', ['100000'], { stdio: 'ignore' });
      try {
        assert.ok(holder.pid !== undefined);
        writeFileSync(path.join(busy, 'cgroup.procs'), String(holder.pid));
        const config = env.podConfig('busy', { linux: { cgroup_parent: busy.slice(CGROUP_ROOT.length), resources: { memory_limit_in_bytes: 64 * MiB } } });
        const failed = await expectGrpcError(env.cri.call('RunPodSandbox', { config, runtime_handler: TSBOX_HANDLER }, { timeoutMs: 60_000 }));
        assert.match(failed.details, /the pod's limits need the cgroup v2 cpu controller/);
        assert.ok(failed.details.includes(`echo +cpu > ${busy}/cgroup.subtree_control`), failed.details);
        assert.match(failed.details, /EBUSY/, 'the refusal tsbox met is named');
        const id = /sandbox "?([0-9a-f]{64})"?/.exec(failed.details)?.[1];
        assert.ok(id !== undefined, `CRI names the sandbox: ${failed.details}`);
        assert.deepEqual(podLeftovers(env, id, []), { processes: [], mounts: [], cgroups: [], files: [] });
        assert.equal(existsSync(path.join(busy, id)), false);
      } finally {
        await killAndReap([holder.pid ?? 0]);
        rmdirSync(busy);
        rmdirSync(top);
      }
    }));

  test('a limit whose controller this node\'s kernel does not offer (cpuset here) is refused naming it', () =>
    withLogs(async () => {
      const offered = read(path.join(CGROUP_ROOT, 'cgroup.controllers')).split(' ');
      assert.ok(!offered.includes('cpuset'), `this test needs a node without the cpuset controller (the UML node's kernel has none): ${offered.join(' ')}`);
      const config = env.podConfig('cpuset', { linux: { resources: { cpuset_cpus: '0' } } });
      const failed = await expectGrpcError(env.cri.call('RunPodSandbox', { config, runtime_handler: TSBOX_HANDLER }, { timeoutMs: 60_000 }));
      assert.match(failed.details, /the pod's limits need the cgroup v2 cpuset controller, which this node's kernel does not offer \(\/sys\/fs\/cgroup\/cgroup\.controllers: /);
      const id = /sandbox "?([0-9a-f]{64})"?/.exec(failed.details)?.[1];
      assert.ok(id !== undefined, `CRI names the sandbox: ${failed.details}`);
      assert.deepEqual(podLeftovers(env, id, []), { processes: [], mounts: [], cgroups: [], files: [] });
    }));
});
