// The systemd cgroup driver as tsbox drives it over D-Bus, against a fake systemd manager:
// which unit, slice, pid and limits StartTransientUnit is given, how the job's end is
// awaited (also when its signal comes before the reply), and what a failure says. The real
// systemd is exercised in test/node/cgroup-driver.test.ts.
import assert from 'node:assert/strict';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import { DBusError, Variant } from '@jellybrick/dbus-next';
import { pino } from 'pino';
import type { LaunchSpec } from '../../src/controller/types.js';
import { isTsboxError } from '../../src/base/errors.js';
import { ProcessBackend } from '../../src/runtime/process-backend.js';
import { SystemdScopes, limitProperties, scopeUnit, sliceOf, type SystemdConnection } from '../../src/runtime/systemd.js';
import { stateLayout } from '../../src/state/layout.js';

const silent = pino({ level: 'silent' });
const UNLIMITED = 18446744073709551615n;

type JobListener = (job: string, unit: string, result: string) => void;
interface Call {
  readonly member: string;
  readonly signature: string;
  readonly body: unknown[];
}

/** A fake systemd manager: `answer` decides each call's reply and may signal jobs. */
function fakeSystemd(answer: (call: Call, signal: JobListener) => unknown[]): { connection: SystemdConnection; calls: Call[]; closed: () => boolean } {
  const calls: Call[] = [];
  const listeners: JobListener[] = [];
  let closed = false;
  const signal: JobListener = (job, unit, result) => {
    for (const listener of listeners) listener(job, unit, result);
  };
  return {
    calls,
    closed: () => closed,
    connection: {
      call: (member, signature, body) => {
        const call = { member, signature, body };
        calls.push(call);
        // Answered on a later turn, as a reply from the bus is.
        return Promise.resolve().then(() => answer(call, signal));
      },
      onJobRemoved: (listener) => listeners.push(listener),
      close: () => {
        closed = true;
      },
    },
  };
}

const properties = (call: Call | undefined): Map<string, unknown> =>
  new Map(((call?.body[2] ?? []) as [string, Variant][]).map(([name, variant]) => [name, variant.value]));

const UNIT = scopeUnit('sb1');
const SLICE = 'kubepods-besteffort-podu_1.slice';

describe('the scope of a pod in a slice', () => {
  test('is named as runc names the pause container of <slice>:cri-containerd:<id>, and only a .slice parent is one', () => {
    assert.equal(UNIT, 'cri-containerd-sb1.scope');
    assert.equal(sliceOf('kubepods-besteffort-podu_1.slice'), 'kubepods-besteffort-podu_1.slice');
    assert.equal(sliceOf('/kubepods.slice/kubepods-burstable.slice'), 'kubepods-burstable.slice');
    assert.equal(sliceOf('/kubepods/besteffort/podu-1'), undefined);
    assert.equal(sliceOf(undefined), undefined);
  });

  test('StartTransientUnit gets the slice, the supervisor\'s pid, Delegate and the pod\'s limits; the start waits for the job', async () => {
    let jobDone = false;
    const fake = fakeSystemd((call, signal) => {
      setImmediate(() => {
        jobDone = true;
        signal('/org/freedesktop/systemd1/job/7', UNIT, 'done');
      });
      return call.member === 'StartTransientUnit' ? ['/org/freedesktop/systemd1/job/7'] : [];
    });
    const scopes = new SystemdScopes(() => Promise.resolve(fake.connection), silent);
    await scopes.start({ unit: UNIT, slice: SLICE, pid: 4242, description: 'tsbox sandbox k8s.io/sb1', limits: { memoryLimitBytes: 64 << 20, cpuShares: 512, cpuQuota: 50_000, cpuPeriod: 100_000 } });
    assert.equal(jobDone, true, 'the start returned before systemd\'s job ended');
    const [start] = fake.calls;
    assert.equal(start?.member, 'StartTransientUnit');
    assert.equal(start?.signature, 'ssa(sv)a(sa(sv))');
    assert.deepEqual(start?.body.slice(0, 2), [UNIT, 'fail']);
    const props = properties(start);
    assert.equal(props.get('Slice'), SLICE);
    assert.deepEqual(props.get('PIDs'), [4242]);
    assert.equal(props.get('Delegate'), true);
    assert.equal(props.get('MemoryAccounting'), true);
    assert.equal(props.get('MemoryMax'), 64n << 20n);
    assert.equal(props.get('CPUWeight'), 20n);
    assert.equal(props.get('CPUQuotaPerSecUSec'), 500_000n);
    assert.equal(props.get('CPUQuotaPeriodUSec'), 100_000n);
  });

  test('a job whose end is signalled before the reply names it is not waited for again', async () => {
    const fake = fakeSystemd((call, signal) => {
      signal('/org/freedesktop/systemd1/job/8', 'other.scope', 'failed');
      signal('/org/freedesktop/systemd1/job/9', UNIT, 'done');
      return ['/org/freedesktop/systemd1/job/9'];
    });
    const scopes = new SystemdScopes(() => Promise.resolve(fake.connection), silent);
    await scopes.start({ unit: UNIT, slice: SLICE, pid: 1, description: '', limits: undefined });
    assert.equal(fake.calls.length, 1);
    assert.equal(properties(fake.calls[0]).has('MemoryMax'), false, 'a pod without limits sets none');
  });

  test('a failed job, or a refused call, fails the start naming the scope, the slice and the cause', async () => {
    const failedJob = fakeSystemd((_call, signal) => {
      setImmediate(() => signal('/job/1', UNIT, 'failed'));
      return ['/job/1'];
    });
    await assert.rejects(
      new SystemdScopes(() => Promise.resolve(failedJob.connection), silent).start({ unit: UNIT, slice: SLICE, pid: 1, description: '', limits: undefined }),
      (err: unknown) => isTsboxError(err, 'FailedPrecondition') && err.message.includes(UNIT) && err.message.includes(SLICE) && err.message.includes('"failed"'),
    );
    const refused = fakeSystemd(() => {
      throw new DBusError('org.freedesktop.systemd1.UnitExists', `Unit ${UNIT} was already loaded or has a fragment file.`);
    });
    await assert.rejects(
      new SystemdScopes(() => Promise.resolve(refused.connection), silent).start({ unit: UNIT, slice: SLICE, pid: 1, description: '', limits: undefined }),
      (err: unknown) => isTsboxError(err, 'FailedPrecondition') && err.message.includes(`cannot make scope ${UNIT} in ${SLICE}`) && err.message.includes('already loaded'),
    );
  });

  test('a systemd that cannot be reached fails the start, and the next one connects again', async () => {
    let attempts = 0;
    const fake = fakeSystemd((_call, signal) => {
      setImmediate(() => signal('/job/2', UNIT, 'done'));
      return ['/job/2'];
    });
    const scopes = new SystemdScopes(() => (++attempts === 1 ? Promise.reject(new Error('connect ENOENT /run/dbus/system_bus_socket')) : Promise.resolve(fake.connection)), silent);
    await assert.rejects(scopes.start({ unit: UNIT, slice: SLICE, pid: 1, description: '', limits: undefined }), /system_bus_socket/);
    await scopes.start({ unit: UNIT, slice: SLICE, pid: 1, description: '', limits: undefined });
    assert.equal(attempts, 2);
    scopes.close();
    await new Promise((resolve) => setImmediate(resolve));
    assert.equal(fake.closed(), true);
  });

  test('stop stops the scope and resets a failed one; a scope already gone is fine, another error is not', async () => {
    const fake = fakeSystemd((call, signal) => {
      if (call.member === 'StopUnit') {
        setImmediate(() => signal('/job/3', UNIT, 'done'));
        return ['/job/3'];
      }
      return [];
    });
    await new SystemdScopes(() => Promise.resolve(fake.connection), silent).stop(UNIT);
    assert.deepEqual(
      fake.calls.map((c) => [c.member, ...c.body]),
      [
        ['StopUnit', UNIT, 'replace'],
        ['ResetFailedUnit', UNIT],
      ],
    );
    const gone = fakeSystemd(() => {
      throw new DBusError('org.freedesktop.systemd1.NoSuchUnit', `Unit ${UNIT} not loaded.`);
    });
    await new SystemdScopes(() => Promise.resolve(gone.connection), silent).stop(UNIT);
    assert.equal(gone.calls.length, 2);
    const denied = fakeSystemd(() => {
      throw new DBusError('org.freedesktop.DBus.Error.AccessDenied', 'Access denied');
    });
    await assert.rejects(new SystemdScopes(() => Promise.resolve(denied.connection), silent).stop(UNIT), (err: unknown) => isTsboxError(err, 'Internal') && /Access denied/.test(err.message));
  });

  test('an Update sets every limit property, a limit left out as unlimited', async () => {
    const fake = fakeSystemd(() => []);
    await new SystemdScopes(() => Promise.resolve(fake.connection), silent).update(UNIT, { memoryLimitBytes: 100 << 20, memorySwapLimitBytes: 150 << 20 });
    const [set] = fake.calls;
    assert.equal(set?.member, 'SetUnitProperties');
    assert.deepEqual(set?.body.slice(0, 2), [UNIT, true]);
    const props = new Map(((set?.body[2] ?? []) as [string, Variant][]).map(([name, variant]) => [name, variant.value]));
    assert.equal(props.get('MemoryMax'), 100n << 20n);
    assert.equal(props.get('MemorySwapMax'), 50n << 20n, 'CRI counts memory plus swap, systemd swap alone');
    assert.equal(props.get('CPUWeight'), UNLIMITED);
    assert.equal(props.get('CPUQuotaPerSecUSec'), UNLIMITED);
  });

  test('a CPU quota per second is rounded up to systemd\'s 10 ms steps', () => {
    const quota = new Map(limitProperties({ cpuQuota: 12_345, cpuPeriod: 100_000 }).map(([name, variant]) => [name, variant.value]));
    assert.equal(quota.get('CPUQuotaPerSecUSec'), 130_000n);
  });
});

describe('a slice when systemd is not init', () => {
  test('the start fails naming the slice and what to change, and runs nothing', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'tsbox-systemd-'));
    const backend = new ProcessBackend({
      layout: stateLayout(dir),
      shimPath: '/nonexistent/tsbox-shim',
      namespaces: true,
      cgroups: undefined,
      cgroupParent: 'tsbox',
      systemd: undefined,
      podFiles: undefined,
      containerdAddress: '/run/containerd/containerd.sock',
      startTimeoutMs: 1000,
      killTimeoutMs: 1_000,
      logger: silent,
      pollIntervalMs: 1000,
    });
    const spec: LaunchSpec = {
      namespace: 'k8s.io',
      id: 'sb1',
      pod: { network: 'node', pid: 'pod', ipc: 'pod', hostname: '', sysctls: {}, cgroupParent: SLICE },
    };
    try {
      await assert.rejects(
        backend.start(spec, new AbortController().signal),
        (err: unknown) => isTsboxError(err, 'FailedPrecondition') && err.message.includes(`"${SLICE}" is a systemd slice`) && err.message.includes('/run/systemd/system') && err.message.includes('cgroupfs'),
      );
    } finally {
      backend.close();
      await rm(dir, { recursive: true, force: true });
    }
  });
});
