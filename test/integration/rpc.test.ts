/**
 * Every RPC of the Sandbox Controller API (SPEC.md section 3) against the real tsbox daemon on
 * a temp unix socket, with real sandbox processes.
 */
import assert from 'node:assert/strict';
import { existsSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { Metrics as CgroupV1Metrics } from '../../src/gen/cgroups/v1/metrics.js';
import { Metrics as CgroupV2Metrics } from '../../src/gen/cgroups/v2/metrics.js';
import type { ControllerWaitResponse } from '../../src/gen/containerd/services/sandbox/v1/sandbox.js';
import { cgroupNode, sandboxCgroupDirs, uniqueNamespace } from '../support/host.js';
import { type TsboxDaemon, startTsbox } from '../support/tsbox-daemon.js';
import { GrpcStatus, SandboxClient, codeName, expectCode, isServiceError, timestampMs } from '../support/grpc-client.js';
import {
  GO_ZERO_TIME,
  OCI_SPEC_TYPE,
  POD_SANDBOX_CONFIG_TYPE,
  alive,
  createAndStart,
  criCreateRequest,
  podSandboxConfig,
  procExists,
  readUint64Path,
  withLog,
} from './fixtures.js';

/** Go's name for this host's architecture (SPEC.md section 3, Platform). */
const GOARCH: Record<string, string> = { x64: 'amd64', arm64: 'arm64', arm: 'arm', ia32: '386', s390x: 's390x', riscv64: 'riscv64' };

describe('Sandbox Controller RPCs through the socket', () => {
  let daemon: TsboxDaemon | undefined;
  const ns = uniqueNamespace('rpc');

  before(async () => {
    daemon = await startTsbox('tsbox-rpc');
  });

  after(async () => {
    await daemon?.teardown();
  });

  function d(): TsboxDaemon {
    assert.ok(daemon !== undefined, 'daemon not started');
    return daemon;
  }

  test('a CRI-shaped Create registers a sandbox that does not run yet', () =>
    withLog(daemon, async () => {
      const client = d().client(ns);
      const id = 'cri-shaped';
      d().track(ns, id);
      const created = await client.create(criCreateRequest(id, 'cri-host'));
      assert.equal(created.sandboxId, id);

      const status = await client.status({ sandboxId: id });
      assert.equal(status.state, 'SANDBOX_UNKNOWN');
      assert.equal(status.pid, 0);
      // Never Go's zero time before Start: CRI would turn it into garbage.
      assert.equal(status.createdAt, undefined, `created_at before Start: ${JSON.stringify(status.createdAt)}`);
      assert.equal(status.exitedAt, undefined);

      await expectCode(client.create(criCreateRequest(id, 'cri-host')), GrpcStatus.ALREADY_EXISTS);

      const started = await client.start({ sandboxId: id });
      d().track(ns, id, started.pid);
      assert.ok(started.pid > 0);
      assert.equal(started.labels['selinux_label'] ?? '', '');
      const createdAtMs = timestampMs(started.createdAt);
      assert.ok(createdAtMs !== undefined && createdAtMs > 0, `created_at ${JSON.stringify(started.createdAt)} is not the start time`);
      assert.notEqual(started.createdAt?.seconds, GO_ZERO_TIME.seconds);

      await client.stop({ sandboxId: id, timeoutSecs: 0 });
      await client.shutdown({ sandboxId: id });
    }));

  test('Start runs a real process; Status, Platform, Metrics and Update describe and change it', () =>
    withLog(daemon, async () => {
      const client = d().client(ns);
      const id = 'lifecycle';
      const before = Date.now();
      const { pid, createdAtMs, labels } = await createAndStart(d(), client, id);

      assert.ok(procExists(pid), `/proc/${pid} should exist after Start`);
      // CRI applies a non-empty selinux_label to the pod (SPEC.md section 3).
      assert.equal(labels['selinux_label'] ?? '', '', `Start labels: ${JSON.stringify(labels)}`);
      assert.ok(Math.abs(createdAtMs - before) < 60_000, `created_at ${new Date(createdAtMs).toISOString()} is not recent`);

      // Start again: FAILED_PRECONDITION, and the sandbox stays as it was.
      await expectCode(client.start({ sandboxId: id }), GrpcStatus.FAILED_PRECONDITION);

      const status = await client.status({ sandboxId: id, verbose: true });
      assert.equal(status.sandboxId, id);
      assert.equal(status.state, 'SANDBOX_READY');
      assert.equal(status.pid, pid);
      assert.equal(timestampMs(status.createdAt), createdAtMs);
      assert.equal(status.exitedAt, undefined);
      const infoText = status.info['info'];
      assert.ok(infoText !== undefined, `verbose Status has no info["info"]: ${JSON.stringify(status.info)}`);
      const info: unknown = JSON.parse(infoText);
      assert.ok(typeof info === 'object' && info !== null && !Array.isArray(info), `info["info"] is not a JSON object: ${infoText}`);
      assert.equal((info as Record<string, unknown>)['pid'], pid);

      const quiet = await client.status({ sandboxId: id, verbose: false });
      assert.deepEqual(quiet.info, {});
      assert.equal(quiet.state, 'SANDBOX_READY');

      const platform = await client.platform({ sandboxId: id });
      assert.equal(platform.platform?.os, 'linux');
      assert.equal(platform.platform?.architecture, GOARCH[process.arch] ?? process.arch);

      // The process lives in the sandbox's cgroup: the memory hierarchy's on v1, the unified one on v2.
      const node = cgroupNode();
      const memoryCgroup = path.join(node.root('memory'), 'tsbox', `${ns}@${id}`);
      assert.ok(existsSync(memoryCgroup), `${memoryCgroup} should exist while the sandbox runs`);
      const procCgroups = readFileSync(`/proc/${pid}/cgroup`, 'utf8');
      assert.match(procCgroups, new RegExp(`^${node.kind === 'v1' ? '\\d+:memory' : '0:'}:/tsbox/${ns}@${id}$`, 'm'));

      const { metrics } = await client.metrics({ sandboxId: id });
      assert.ok(metrics !== undefined, 'Metrics returned no metric');
      assert.equal(metrics.id, id);
      const metricMs = timestampMs(metrics.timestamp);
      assert.ok(metricMs !== undefined && Math.abs(metricMs - Date.now()) < 60_000, 'metric timestamp is not now');
      const data = metrics.data;
      assert.ok(data !== undefined, 'metric has no data');
      // Paths of field numbers: Metrics.memory.usage (v1: MemoryEntry.usage = 2) and Metrics.pids.current.
      const v1 = node.kind === 'v1';
      assert.equal(data.typeUrl, v1 ? 'io.containerd.cgroups.v1.Metrics' : 'io.containerd.cgroups.v2.Metrics', 'the Metrics of the node\'s cgroup kind');
      const memoryUsage = readUint64Path(data.value, v1 ? [4, 33, 2] : [4, 32]);
      const pidsCurrent = readUint64Path(data.value, v1 ? [2, 1] : [1, 1]);
      assert.ok(memoryUsage !== undefined && memoryUsage > 0n, `memory usage ${memoryUsage}`);
      assert.ok(pidsCurrent !== undefined && pidsCurrent >= 1n, `pids.current ${pidsCurrent}`);

      // containerd never fills Update's sandboxer (SPEC.md section 2).
      await client.update({ sandboxId: id, sandboxer: '', sandbox: { sandboxId: id, labels: { updated: 'yes' } }, fields: ['labels'] });
      await client.update({ sandboxId: id, sandboxer: 'tsbox', sandbox: { sandboxId: id, labels: { again: 'yes' } }, fields: [] });
      const afterUpdate = await client.status({ sandboxId: id });
      assert.equal(afterUpdate.state, 'SANDBOX_READY');
      assert.equal(afterUpdate.pid, pid);
    }));

  test('the Metrics answer decodes with the generated cgroups messages (src/gen/cgroups)', () =>
    withLog(daemon, async () => {
      const client = d().client(ns);
      const { metrics } = await client.metrics({ sandboxId: 'lifecycle' });
      const data = metrics?.data;
      assert.ok(data !== undefined, 'metric has no data');
      if (cgroupNode().kind === 'v1') {
        assert.equal(data.typeUrl, 'io.containerd.cgroups.v1.Metrics');
        const decoded = CgroupV1Metrics.decode(data.value);
        assert.ok((decoded.memory?.usage?.usage ?? 0) > 0, `memory usage ${decoded.memory?.usage?.usage}`);
        assert.ok((decoded.pids?.current ?? 0) >= 1, `pids.current ${decoded.pids?.current}`);
      } else {
        assert.equal(data.typeUrl, 'io.containerd.cgroups.v2.Metrics');
        const decoded = CgroupV2Metrics.decode(data.value);
        assert.ok((decoded.memory?.usage ?? 0) > 0, `memory usage ${decoded.memory?.usage}`);
        assert.ok((decoded.pids?.current ?? 0) >= 1, `pids.current ${decoded.pids?.current}`);
      }
    }));

  test('Metrics report an unlimited pids limit as containerd/cgroups does: 0 on cgroup v1, 2^64-1 on cgroup v2', () =>
    withLog(daemon, async () => {
      const id = 'lifecycle';
      const node = cgroupNode();
      const pidsMax = path.join(node.root('pids'), 'tsbox', `${ns}@${id}`, 'pids.max');
      assert.equal(readFileSync(pidsMax, 'utf8').trim(), 'max', `${pidsMax}: the sandbox has no pids limit`);
      const { metrics } = await d().client(ns).metrics({ sandboxId: id });
      const data = metrics?.data;
      assert.ok(data !== undefined, 'metric has no data');
      if (node.kind === 'v1') {
        assert.equal(data.typeUrl, 'io.containerd.cgroups.v1.Metrics');
        // containerd/cgroups' cgroup1 reads "max" as 0; its message documents 0 as unlimited.
        assert.equal(readUint64Path(data.value, [2, 2]) ?? 0n, 0n);
      } else {
        assert.equal(data.typeUrl, 'io.containerd.cgroups.v2.Metrics');
        // containerd/cgroups' cgroup2 reads "max" as math.MaxUint64.
        assert.equal(readUint64Path(data.value, [1, 2]), 2n ** 64n - 1n);
      }
    }));

  test('Stop(0) returns once the process is gone; Wait answers 137 to every waiter, every time', () =>
    withLog(daemon, async () => {
      const client = d().client(ns);
      const id = 'lifecycle';
      const status = await client.status({ sandboxId: id });
      const pid = status.pid;
      assert.ok(pid > 0 && alive(pid), 'the sandbox of the previous test should run');

      const pending = [client.wait({ sandboxId: id }), d().newClient(ns).wait({ sandboxId: id }), client.wait({ sandboxId: id })];
      await client.stop({ sandboxId: id, timeoutSecs: 0 });
      assert.equal(procExists(pid), false, `/proc/${pid} still exists right after Stop returned`);

      const answers = await Promise.all(pending);
      const first = answers[0] as ControllerWaitResponse;
      assert.equal(first.exitStatus, 137);
      const exitedMs = timestampMs(first.exitedAt);
      assert.ok(exitedMs !== undefined && exitedMs > 0, `exited_at ${JSON.stringify(first.exitedAt)}`);
      assert.ok(exitedMs >= (timestampMs(status.createdAt) ?? 0), 'exited before it started');
      for (const answer of answers) assert.deepEqual(answer, first);

      const again = [await client.wait({ sandboxId: id }), await client.wait({ sandboxId: id })];
      for (const answer of again) assert.deepEqual(answer, first);

      const stopped = await client.status({ sandboxId: id, verbose: true });
      assert.equal(stopped.state, 'SANDBOX_NOTREADY');
      assert.equal(stopped.pid, 0);
      assert.deepEqual(stopped.exitedAt, first.exitedAt);
      assert.ok(JSON.parse(stopped.info['info'] ?? 'null') !== null);

      // Already stopped: OK, nothing changes.
      await client.stop({ sandboxId: id, timeoutSecs: 0 });
      assert.deepEqual(await client.wait({ sandboxId: id }), first);
      await expectCode(client.start({ sandboxId: id }), GrpcStatus.FAILED_PRECONDITION);
    }));

  test('Shutdown forgets the sandbox and removes its directory and cgroup', () =>
    withLog(daemon, async () => {
      const client = d().client(ns);
      const id = 'lifecycle';
      await client.shutdown({ sandboxId: id });

      await expectCode(client.status({ sandboxId: id }), GrpcStatus.NOT_FOUND);
      await expectCode(client.wait({ sandboxId: id }), GrpcStatus.NOT_FOUND);
      await expectCode(client.start({ sandboxId: id }), GrpcStatus.NOT_FOUND);
      await expectCode(client.platform({ sandboxId: id }), GrpcStatus.NOT_FOUND);
      await expectCode(client.metrics({ sandboxId: id }), GrpcStatus.NOT_FOUND);
      await expectCode(client.update({ sandboxId: id, sandbox: { sandboxId: id, labels: {} } }), GrpcStatus.NOT_FOUND);
      await client.stop({ sandboxId: id, timeoutSecs: 0 });
      await client.shutdown({ sandboxId: id });

      const dir = d().sandboxDir(ns, id);
      assert.equal(existsSync(dir), false, `${dir} should be gone after Shutdown`);
      for (const cgroup of sandboxCgroupDirs(ns, id)) assert.equal(existsSync(cgroup), false, `${cgroup} should be gone after Shutdown`);

      // The id may be used again.
      const { pid } = await createAndStart(d(), client, id);
      assert.equal((await client.status({ sandboxId: id })).pid, pid);
      await client.shutdown({ sandboxId: id });
      assert.equal(procExists(pid), false, 'Shutdown of a running sandbox should leave no process');
    }));

  test('Shutdown of a running sandbox answers its pending Waits and releases everything', () =>
    withLog(daemon, async () => {
      const client = d().client(ns);
      const id = 'shutdown-running';
      const { pid } = await createAndStart(d(), client, id);
      const waiting = client.wait({ sandboxId: id });
      await client.shutdown({ sandboxId: id });
      const answer = await waiting;
      assert.equal(answer.exitStatus, 137);
      assert.ok(answer.exitedAt !== undefined);
      assert.equal(alive(pid), false);
      await expectCode(client.status({ sandboxId: id }), GrpcStatus.NOT_FOUND);
      for (const cgroup of sandboxCgroupDirs(ns, id)) assert.equal(existsSync(cgroup), false, `${cgroup} left behind`);
      assert.equal(existsSync(d().sandboxDir(ns, id)), false);
    }));

  test('Stop of a sandbox that never started counts as its exit', () =>
    withLog(daemon, async () => {
      const client = d().client(ns);
      const id = 'never-started';
      d().track(ns, id);
      await client.create({ sandboxId: id, sandbox: { sandboxId: id, runtime: { name: 'io.containerd.tsbox.v1' } } });
      const waiting = client.wait({ sandboxId: id });
      await client.stop({ sandboxId: id, timeoutSecs: 0 });
      const answer = await waiting;
      assert.ok(answer.exitedAt !== undefined, 'exited_at is always set');
      assert.deepEqual(await client.wait({ sandboxId: id }, { timeoutMs: 2000 }), answer);
      const status = await client.status({ sandboxId: id });
      assert.equal(status.state, 'SANDBOX_NOTREADY');
      assert.equal(status.pid, 0);
      await client.shutdown({ sandboxId: id });
      await expectCode(client.status({ sandboxId: id }), GrpcStatus.NOT_FOUND);
    }));

  test('unknown sandboxes: Stop and Shutdown are OK, everything else is NOT_FOUND', () =>
    withLog(daemon, async () => {
      const client = d().client(ns);
      const id = 'no-such-sandbox';
      await client.stop({ sandboxId: id, timeoutSecs: 0 });
      await client.shutdown({ sandboxId: id });
      await expectCode(client.start({ sandboxId: id }), GrpcStatus.NOT_FOUND);
      await expectCode(client.status({ sandboxId: id }), GrpcStatus.NOT_FOUND);
      await expectCode(client.wait({ sandboxId: id }), GrpcStatus.NOT_FOUND);
      await expectCode(client.platform({ sandboxId: id }), GrpcStatus.NOT_FOUND);
      await expectCode(client.metrics({ sandboxId: id }), GrpcStatus.NOT_FOUND);
      await expectCode(client.update({ sandboxId: id }), GrpcStatus.NOT_FOUND);
    }));

  test('Create accepts types it does not know and runs the default process', () =>
    withLog(daemon, async () => {
      const client = d().client(ns);
      const id = 'unknown-types';
      const junk = { typeUrl: 'example.com/some.Unknown', value: Buffer.from([0xff, 0x00, 0x13, 0x37]) };
      const { pid } = await createAndStart(d(), client, id, {
        options: junk,
        sandbox: {
          sandboxId: id,
          runtime: { name: 'io.containerd.runc.v2', options: junk },
          spec: junk,
          extensions: { other: junk },
        },
      });
      assert.ok(alive(pid));
      assert.equal((await client.status({ sandboxId: id })).state, 'SANDBOX_READY');
      await client.shutdown({ sandboxId: id });
    }));

  test('a malformed value of a known type is INVALID_ARGUMENT and registers nothing', () =>
    withLog(daemon, async () => {
      const client = d().client(ns);
      const cases = {
        'malformed-oci-spec': { sandbox: { spec: { typeUrl: OCI_SPEC_TYPE, value: Buffer.from('{not json') } } },
        'malformed-pod-config': { options: { typeUrl: POD_SANDBOX_CONFIG_TYPE, value: Buffer.from([0x12, 0xff, 0x01]) } },
        'invalid-hostname': { options: podSandboxConfig({ name: 'p', uid: 'u', namespace: 'default', hostname: 'bad_host!' }) },
      };
      for (const [id, request] of Object.entries(cases)) {
        d().track(ns, id);
        await expectCode(client.create({ sandboxId: id, ...request }), GrpcStatus.INVALID_ARGUMENT);
        await expectCode(client.status({ sandboxId: id }), GrpcStatus.NOT_FOUND);
      }
    }));

  test('concurrent Creates of one id: exactly one succeeds, the others are ALREADY_EXISTS', () =>
    withLog(daemon, async () => {
      const client = d().client(ns);
      const id = 'raced-create';
      d().track(ns, id);
      const outcomes = await Promise.all(
        Array.from({ length: 5 }, () =>
          client.create({ sandboxId: id }).then(
            () => 'created',
            (err: unknown) => (isServiceError(err) ? codeName(err.code) : String(err)),
          ),
        ),
      );
      assert.deepEqual([...outcomes].sort(), ['ALREADY_EXISTS', 'ALREADY_EXISTS', 'ALREADY_EXISTS', 'ALREADY_EXISTS', 'created']);
      await client.shutdown({ sandboxId: id });
    }));

  test('a Create of about 12 MiB is accepted (containerd sends up to 16 MiB)', () =>
    withLog(daemon, async () => {
      const client = d().client(ns);
      const id = 'big-create';
      d().track(ns, id);
      const big = 'x'.repeat(12 * 1024 * 1024);
      const created = await client.create(
        { sandboxId: id, annotations: { big }, sandbox: { sandboxId: id, runtime: { name: 'io.containerd.tsbox.v1' } } },
        { timeoutMs: 60_000 },
      );
      assert.equal(created.sandboxId, id);
      assert.equal((await client.status({ sandboxId: id })).state, 'SANDBOX_UNKNOWN');
      await client.shutdown({ sandboxId: id });
    }));

  test('a client whose event loop stalls for 3 s after a call keeps its connection: its next Create of 12 MiB is answered', () =>
    withLog(daemon, async () => {
      // A connection of its own, so that only this client's calls are on it.
      const client = new SandboxClient(d().socketPath, ns, { ownConnection: true });
      const id = 'stalled-client';
      d().track(ns, id);
      try {
        await expectCode(client.status({ sandboxId: id }), GrpcStatus.NOT_FOUND);
        // The client is busy for 3 s (a long computation, a GC pause): it reads nothing, answers
        // no PING. Then it sends a request too large for grpc-js to retry on another connection.
        Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 3000);
        const big = 'x'.repeat(12 * 1024 * 1024);
        const created = await client.create(
          { sandboxId: id, annotations: { big }, sandbox: { sandboxId: id, runtime: { name: 'io.containerd.tsbox.v1' } } },
          { timeoutMs: 60_000 },
        );
        assert.equal(created.sandboxId, id);
        await client.shutdown({ sandboxId: id });
      } finally {
        client.close();
      }
    }));
});
