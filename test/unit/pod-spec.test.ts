// What a Kubernetes pod asks of its sandbox (SPEC.md section 7): CRI's PodSandboxConfig,
// encoded here with Kubernetes' own api.proto (Debian's copy) as containerd's CRI plugin
// sends it, decoded and checked by Create. Every refusal names the field and the reason.
import assert from 'node:assert/strict';
import path from 'node:path';
import { describe, test } from 'node:test';
import protobuf from 'protobufjs';
import { deriveLaunchSpec } from '../../src/controller/launch-spec.js';
import { resolvConfOf, sandboxLimits } from '../../src/controller/pod-spec.js';
import { controllersFor, expandSlice, sandboxCgroupPath, sharesToWeight } from '../../src/runtime/cgroups.js';
import { isTsboxError } from '../../src/base/errors.js';
import { debianProtoRoot } from '../support/containerd-clients.js';

const root = new protobuf.Root();
root.resolvePath = (_origin, target) => (path.isAbsolute(target) ? target : path.join(debianProtoRoot(), target));
root.loadSync(path.join(debianProtoRoot(), 'k8s.io/cri-api/pkg/apis/runtime/v1/api.proto'), { keepCase: true });
const PodSandboxConfig = root.lookupType('runtime.v1.PodSandboxConfig');

const ID = '5f1c2b3a4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8';

/** Create's input for a pod config given as CRI's JSON-like object. */
function create(config: Record<string, unknown>, netnsPath = '') {
  const value = PodSandboxConfig.encode(PodSandboxConfig.fromObject(config)).finish();
  return deriveLaunchSpec('k8s.io', ID, {
    netnsPath,
    options: { typeUrl: 'runtime.v1.PodSandboxConfig', value },
    spec: undefined,
    extensions: {},
  });
}

const base = { metadata: { name: 'web-0', uid: 'u-1', namespace: 'default', attempt: 0 }, hostname: 'web-0' };
const modes = (network: number, pid: number, ipc: number) => ({ linux: { security_context: { namespace_options: { network, pid, ipc } } } });
const POD = 0;
const CONTAINER = 1;
const NODE = 2;

function refused(config: Record<string, unknown>, message: RegExp, kind: 'InvalidArgument' | 'Unimplemented' = 'InvalidArgument', netnsPath = '') {
  assert.throws(
    () => create(config, netnsPath),
    (err: unknown) => {
      assert.ok(isTsboxError(err, kind), `expected ${kind}, got ${String(err)}`);
      assert.match((err as Error).message, message);
      return true;
    },
  );
}

describe('PodSandboxConfig → what tsbox makes for the pod', () => {
  test('defaults: every namespace the pod\'s own, the pod hostname, the host\'s resolv.conf', () => {
    const spec = create({ ...base }, '/var/run/netns/cni-1');
    assert.deepEqual(spec.pod, {
      network: 'pod',
      pid: 'pod',
      ipc: 'pod',
      hostname: 'web-0',
      sysctls: {},
      pod: { name: 'web-0', namespace: 'default', uid: 'u-1' },
    });
    assert.equal(spec.hostname, 'web-0');
    assert.equal(spec.netnsPath, '/var/run/netns/cni-1');
  });

  test('host network keeps the host\'s UTS name: no hostname is set', () => {
    const spec = create({ ...base, ...modes(NODE, POD, POD) });
    assert.equal(spec.pod?.network, 'node');
    assert.equal(spec.hostname, undefined);
    assert.equal(spec.pod?.hostname, 'web-0', 'still written to the pod\'s /etc/hostname');
  });

  test('pid and ipc modes as kubelet sends them', () => {
    assert.deepEqual([create({ ...base, ...modes(NODE, NODE, NODE) }).pod?.pid, create({ ...base, ...modes(NODE, NODE, NODE) }).pod?.ipc], ['node', 'node']);
    assert.equal(create({ ...base, ...modes(NODE, CONTAINER, POD) }).pod?.pid, 'container');
  });

  test('DNS config becomes resolv.conf as podsandbox writes it', () => {
    const spec = create({ ...base, dns_config: { servers: ['10.96.0.10'], searches: ['default.svc.cluster.local', 'svc.cluster.local'], options: ['ndots:5'] } });
    assert.equal(spec.pod?.resolvConf, 'search default.svc.cluster.local svc.cluster.local\nnameserver 10.96.0.10\noptions ndots:5\n');
    assert.equal(resolvConfOf({ servers: [], searches: [], options: [] }), '');
  });

  test('sysctls, cgroup parent, resources and overhead are kept; limits add up', () => {
    const spec = create({
      ...base,
      linux: {
        cgroup_parent: '/kubepods/burstable/podu-1',
        sysctls: { 'net.ipv4.ip_local_port_range': '1024 65000', 'kernel.shmmax': '1000000', 'fs.mqueue.msg_max': '20' },
        resources: { cpu_shares: 512, cpu_quota: 20000, cpu_period: 100000, memory_limit_in_bytes: 1 << 28, oom_score_adj: -997 },
        overhead: { cpu_shares: 10, memory_limit_in_bytes: 1 << 20 },
      },
    });
    assert.deepEqual(spec.pod?.sysctls, { 'net.ipv4.ip_local_port_range': '1024 65000', 'kernel.shmmax': '1000000', 'fs.mqueue.msg_max': '20' });
    assert.equal(spec.pod?.cgroupParent, '/kubepods/burstable/podu-1');
    assert.deepEqual(sandboxLimits(spec.pod ?? { network: 'pod', pid: 'pod', ipc: 'pod', hostname: '', sysctls: {} }), {
      cpuPeriod: 100000,
      cpuQuota: 20000,
      cpuShares: 522,
      memoryLimitBytes: (1 << 28) + (1 << 20),
      oomScoreAdj: -997,
    });
  });

  test('refused: namespace modes tsbox does not know or cannot give a pod', () => {
    refused({ ...base, ...modes(7, POD, POD) }, /unknown network namespace mode 7/);
    refused({ ...base, ...modes(CONTAINER, POD, POD) }, /network namespace mode CONTAINER is not supported/);
    refused({ ...base, ...modes(POD, POD, CONTAINER) }, /ipc namespace mode CONTAINER is not supported/);
    refused({ ...base, linux: { security_context: { namespace_options: { userns_options: { mode: POD } } } } }, /user namespace mode POD is not supported/, 'Unimplemented');
    refused({ ...base, ...modes(NODE, POD, POD) }, /netns_path is set, but the pod asks for the host network/, 'InvalidArgument', '/var/run/netns/x');
  });

  test('refused: sysctls that are not namespaced or would change the host', () => {
    refused({ ...base, linux: { sysctls: { 'kernel.pid_max': '1' } } }, /kernel\.pid_max is not namespaced/);
    refused({ ...base, linux: { sysctls: { 'vm.overcommit_memory': '1' } } }, /vm\.overcommit_memory is not namespaced/);
    refused({ ...base, ...modes(NODE, POD, POD), linux: { ...modes(NODE, POD, POD).linux, sysctls: { 'net.core.somaxconn': '1' } } }, /host's network settings/);
    refused({ ...base, linux: { ...modes(POD, POD, NODE).linux, sysctls: { 'kernel.msgmax': '1' } } }, /host's IPC settings/);
    refused({ ...base, linux: { sysctls: { 'net/../../kernel.x': '1' } } }, /is not a sysctl name/);
    refused({ ...base, linux: { sysctls: { 'net.core.somaxconn': '1\nkernel.pid_max=2' } } }, /line break/);
  });

  test('refused: DNS settings that do not fit resolv.conf', () => {
    refused({ ...base, dns_config: { options: ['ndots: 5'] } }, /dns_config option "ndots: 5" does not fit/);
    refused({ ...base, dns_config: { servers: ['1.1.1.1\nnameserver 6.6.6.6'] } }, /line break/);
    refused({ ...base, dns_config: { searches: [''] } }, /does not fit/);
    refused({ ...base, dns_config: { servers: ['1.1.1.1', '1.0.0.1', '8.8.8.8', '8.8.4.4'] } }, /at most 3/);
  });

  test('refused: a cgroup parent outside the cgroup root, and limits out of range', () => {
    refused({ ...base, linux: { cgroup_parent: '/kubepods/../..' } }, /leaves the cgroup root/);
    refused({ ...base, linux: { cgroup_parent: 'kube pods.slice' } }, /not a systemd slice name/);
    refused({ ...base, linux: { resources: { cpu_shares: -5 } } }, /resources\.cpu_shares is negative/);
    refused({ ...base, linux: { resources: { oom_score_adj: 2000 } } }, /oom_score_adj 2000 is outside/);
    refused({ ...base, linux: { resources: { cpuset_cpus: '0-1,x' } } }, /cpuset_cpus "0-1,x" is not a CPU or node list/);
  });

  test('refused: bytes that are not a PodSandboxConfig', () => {
    assert.throws(
      () => deriveLaunchSpec('k8s.io', ID, { netnsPath: '', options: { typeUrl: 'runtime.v1.PodSandboxConfig', value: new Uint8Array([0x0a, 0xff, 0xff]) }, spec: undefined, extensions: {} }),
      (err: unknown) => isTsboxError(err, 'InvalidArgument') && /malformed runtime\.v1\.PodSandboxConfig/.test((err as Error).message),
    );
  });

  test('NUL bytes in what reaches execve or the kernel are refused at Create', () => {
    const oci = (process: unknown) => ({ typeUrl: 'types.containerd.io/opencontainers/runtime-spec/1/Spec', value: Buffer.from(JSON.stringify({ process })) });
    for (const [what, proc] of [
      ['args', { args: ['/bin/sh\0x'] }],
      ['env', { args: ['/bin/sh'], env: ['A=\0'] }],
      ['cwd', { args: ['/bin/sh'], cwd: '/\0tmp' }],
    ] as const) {
      assert.throws(
        () => deriveLaunchSpec('default', 'x', { netnsPath: '', options: undefined, spec: oci(proc), extensions: {} }),
        (err: unknown) => isTsboxError(err, 'InvalidArgument') && /NUL byte/.test((err as Error).message),
        what,
      );
    }
    assert.throws(
      () => deriveLaunchSpec('default', 'x', { netnsPath: '/var/run/netns/a\0b', options: undefined, spec: undefined, extensions: {} }),
      (err: unknown) => isTsboxError(err, 'InvalidArgument') && /netns_path contains a NUL byte/.test((err as Error).message),
    );
  });
});

describe('the pod\'s cgroup', () => {
  test('cgroupfs parent: <parent>/<id>, where CRI puts a pause container', () => {
    const pod = create({ ...base, linux: { cgroup_parent: '/kubepods/besteffort/podu-1' } }).pod;
    assert.equal(sandboxCgroupPath('tsbox', 'k8s.io', ID, pod), `/kubepods/besteffort/podu-1/${ID}`);
  });

  test('systemd parent: the scope runc makes of <slice>:cri-containerd:<id>', () => {
    const pod = create({ ...base, linux: { cgroup_parent: 'kubepods-besteffort-podu_1.slice' } }).pod;
    assert.equal(sandboxCgroupPath('tsbox', 'k8s.io', ID, pod), `/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podu_1.slice/cri-containerd-${ID}.scope`);
    assert.equal(expandSlice('-.slice'), '');
  });

  test('no pod, or no parent: tsbox\'s own parent, <ns>@<id>', () => {
    assert.equal(sandboxCgroupPath('tsbox', 'default', 'sb1', undefined), '/tsbox/default@sb1');
  });

  test('cpu shares map onto cgroup v2 weights as runc maps them', () => {
    assert.deepEqual([2, 1024, 262144].map(sharesToWeight), [1, 39, 10000]);
  });

  test('cgroup v2: the controllers a pod\'s limits need are cpu and memory, plus those of its cpuset and unified files', () => {
    assert.deepEqual(controllersFor({ memoryLimitBytes: 1 }), ['cpu', 'memory']);
    assert.deepEqual(controllersFor({ cpusetCpus: '0', unified: { 'pids.max': '10', 'io.weight': '50', 'cgroup.max.depth': '3' } }), [
      'cpu',
      'memory',
      'cpuset',
      'pids',
      'io',
    ]);
  });
});
