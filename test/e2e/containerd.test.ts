/**
 * End to end through a real containerd 2.x: the sandboxer registered as proxy plugin `tsbox`
 * (SPEC.md section 1), driven through containerd's own sandbox Store and Controller services
 * and through `ctr sandboxes` (SPEC.md section 5).
 *
 * TSBOX_E2E_SANDBOXER=goref runs the same tests against sbbench's reference server.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import {
  type SandboxClients,
  type Sandbox,
  createSandboxClients,
  expectGrpcError,
  grpc,
  timestampMs,
} from '../support/containerd-clients.js';
import { type Containerd, containerdUnavailableReason, startContainerd } from '../support/containerd.js';
import {
  type SandboxerDaemon,
  processAlive,
  sandboxerFromEnv,
  startSandboxerDaemon,
  waitFor,
} from '../support/tsbox-daemon.js';
import { within } from '../support/processes.js';

const sandboxerName = 'tsbox';
const runtimeName = 'io.containerd.tsbox.v1';

describe('sandboxer behind a real containerd', () => {
  const spec = sandboxerFromEnv();
  let sandboxer: SandboxerDaemon | undefined;
  let containerd: Containerd | undefined;
  const clientsByNs = new Map<string, SandboxClients>();
  /** Every (namespace, id) a test created, shut down in `after` whatever happened. */
  const created: { ns: string; id: string }[] = [];
  // Unique per run, so a failed run's leftovers never collide with the next one.
  const suffix = `${process.pid}-${Date.now().toString(36)}`;

  function clients(ns: string): SandboxClients {
    const d = containerd;
    if (d === undefined) throw new Error('containerd not started');
    let c = clientsByNs.get(ns);
    if (c === undefined) {
      c = createSandboxClients(d.address, ns);
      clientsByNs.set(ns, c);
    }
    return c;
  }

  /** Runs a test body; on failure, the logs of containerd and the sandboxer join the error. */
  async function withLogs(body: () => Promise<void>): Promise<void> {
    try {
      await body();
    } catch (err) {
      const logs = [containerd?.logTail(30), sandboxer?.logTail(30)].filter(Boolean).join('\n');
      if (err instanceof Error) err.message = `${err.message}\n${logs}`;
      throw err;
    }
  }

  function sandboxRecord(id: string): Sandbox {
    return {
      sandbox_id: id,
      // containerd 2.1.9 crashes on a Create whose sandbox has no runtime (SPEC.md section 5).
      runtime: { name: runtimeName, options: null },
      sandboxer: sandboxerName,
      labels: { 'tsbox.test': 'e2e' },
      extensions: {},
    };
  }

  /**
   * Creates a sandbox the way a non-CRI client must (SPEC.md section 5): a record in
   * containerd's sandbox store, then Create on containerd's Controller service.
   */
  async function createThroughContainerd(ns: string, id: string): Promise<void> {
    const c = clients(ns);
    created.push({ ns, id });
    await c.store.call('Create', { sandbox: sandboxRecord(id) });
    await c.controller.call('Create', {
      sandbox_id: id,
      sandboxer: sandboxerName,
      sandbox: sandboxRecord(id),
      rootfs: [],
      annotations: {},
      netns_path: '',
    });
  }

  before(async () => {
    // Never skipped: without root and containerd these tests fail, saying why.
    const missing = containerdUnavailableReason();
    if (missing !== undefined) throw new Error(missing);
    sandboxer = await startSandboxerDaemon(spec);
    containerd = await startContainerd({ sandboxerSocket: sandboxer.socketPath, sandboxerName });
  });

  after(async () => {
    for (const c of clientsByNs.values()) c.close();
    // Shut down every sandbox at the sandboxer itself: works even if containerd is gone.
    if (sandboxer?.pid !== undefined) {
      for (const { ns, id } of created) {
        const direct = createSandboxClients(sandboxer.socketPath, ns);
        try {
          await direct.controller.call('Shutdown', { sandbox_id: id, sandboxer: sandboxerName }, { timeoutMs: 10_000 });
        } catch {
          // best effort: teardown below kills whatever is left of the sandboxer's processes
        } finally {
          direct.close();
        }
      }
    }
    await containerd?.teardown();
    await sandboxer?.teardown();
  });

  test('Store + Controller: create, start, status, stop, wait, shutdown', () =>
    withLogs(async () => {
      const ns = `e2e-life-${suffix}`;
      const id = 'life-1';
      const c = clients(ns);
      await createThroughContainerd(ns, id);
      const ref = { sandbox_id: id, sandboxer: sandboxerName };

      const started = await c.controller.call('Start', ref);
      if (spec.runsProcesses) assert.ok(started.pid > 0, `Start pid ${started.pid} > 0`);
      assert.ok(timestampMs(started.created_at) !== undefined, 'Start created_at set');

      const running = await c.controller.call('Status', ref);
      assert.equal(running.state, 'SANDBOX_READY');
      assert.equal(running.pid, started.pid);
      assert.equal(timestampMs(running.exited_at), undefined, 'no exited_at while running');
      if (spec.runsProcesses) assert.ok(processAlive(started.pid), `pid ${started.pid} alive while READY`);

      await c.controller.call('Stop', { ...ref, timeout_secs: 0 });
      const waited = await c.controller.call('Wait', ref);
      assert.equal(waited.exit_status, spec.stopExitStatus);
      assert.ok(timestampMs(waited.exited_at) !== undefined, 'Wait exited_at set');

      const stopped = await c.controller.call('Status', ref);
      assert.equal(stopped.state, 'SANDBOX_NOTREADY');
      assert.deepEqual(stopped.exited_at, waited.exited_at);

      await c.controller.call('Shutdown', ref);
      const gone = await expectGrpcError(c.controller.call('Status', ref));
      assert.equal(gone.code, grpc.status.NOT_FOUND, `Status after Shutdown: ${gone.details}`);
      if (spec.runsProcesses) {
        await waitFor(() => !processAlive(started.pid), { what: `pid ${started.pid} to be gone` });
      }
      await c.store.call('Delete', { sandbox_id: id });
    }));

  test('ctr sandboxes ls lists it; ctr sandboxes rm stops and shuts it down', () =>
    withLogs(async () => {
      const d = containerd;
      assert.ok(d);
      const ns = `e2e-ctr-${suffix}`;
      const id = 'ctr-1';
      const c = clients(ns);
      await createThroughContainerd(ns, id);
      const ref = { sandbox_id: id, sandboxer: sandboxerName };
      const started = await c.controller.call('Start', ref);

      const ls = await d.ctr(['sandboxes', 'ls'], { namespace: ns });
      assert.equal(ls.code, 0, `ctr sandboxes ls failed: ${ls.stderr}`);
      assert.match(ls.stdout, new RegExp(`^${id}\\s`, 'm'), `ctr sandboxes ls output:\n${ls.stdout}`);

      const rm = await d.ctr(['sandboxes', 'rm', id], { namespace: ns });
      assert.equal(rm.code, 0, `ctr sandboxes rm failed: ${rm.stderr}`);

      const gone = await expectGrpcError(c.controller.call('Status', ref));
      assert.equal(gone.code, grpc.status.NOT_FOUND, `Status after ctr rm: ${gone.details}`);
      const record = await expectGrpcError(c.store.call('Get', { sandbox_id: id }));
      assert.equal(record.code, grpc.status.NOT_FOUND, 'ctr rm deletes the store record');
      const lsAfter = await d.ctr(['sandboxes', 'ls'], { namespace: ns });
      assert.doesNotMatch(lsAfter.stdout, new RegExp(`^${id}\\s`, 'm'));
      if (spec.runsProcesses && started.pid > 0) {
        await waitFor(() => !processAlive(started.pid), { what: `pid ${started.pid} to be gone after ctr rm` });
      }
    }));

  test('a Wait held through containerd returns when another call stops the sandbox', () =>
    withLogs(async () => {
      const ns = `e2e-wait-${suffix}`;
      const id = 'wait-1';
      await createThroughContainerd(ns, id);
      const ref = { sandbox_id: id, sandboxer: sandboxerName };
      const c = clients(ns);
      await c.controller.call('Start', ref);

      // Two waiters with no deadline, on their own channel, as CRI holds its Wait.
      const waiterClients = createSandboxClients(containerd?.address ?? '', ns);
      const abort = new AbortController();
      try {
        let settled = 0;
        const waits = [0, 1].map(() =>
          waiterClients.controller.call('Wait', ref, { timeoutMs: Infinity, signal: abort.signal }).finally(() => {
            settled += 1;
          }),
        );
        // A round trip on the waiters' channel, then one on ours: both Waits are in flight.
        await waiterClients.controller.call('Status', ref);
        const status = await c.controller.call('Status', ref);
        assert.equal(status.state, 'SANDBOX_READY');
        assert.equal(settled, 0, 'Wait returned before the sandbox was stopped');

        await c.controller.call('Stop', { ...ref, timeout_secs: 0 });
        const results = await within(Promise.all(waits), 30_000, 'held Waits to return after Stop');
        for (const r of results) {
          assert.equal(r.exit_status, spec.stopExitStatus);
          assert.ok(timestampMs(r.exited_at) !== undefined, 'exited_at set');
          assert.deepEqual(r, results[0], 'every waiter gets the same answer');
        }
        const stopped = await c.controller.call('Status', ref);
        assert.equal(stopped.state, 'SANDBOX_NOTREADY');
      } finally {
        abort.abort();
        waiterClients.close();
      }
      await c.controller.call('Shutdown', ref);
      await c.store.call('Delete', { sandbox_id: id });
    }));

  test('a Wait through containerd whose 1 s deadline passes on a running sandbox is DEADLINE_EXCEEDED, every time', () =>
    withLogs(async () => {
      const ns = `e2e-wait-deadline-${suffix}`;
      const id = 'wait-deadline';
      await createThroughContainerd(ns, id);
      const ref = { sandbox_id: id, sandboxer: sandboxerName };
      const c = clients(ns);
      await c.controller.call('Start', ref);
      // containerd passes the client's deadline on to the sandboxer: whichever side sees it
      // pass first, the client must be told DEADLINE_EXCEEDED (never CANCELLED, which a caller
      // reads as its own cancel), as with podsandbox. One after the other, on one channel,
      // then eight at once: the race is between tsbox's answer and containerd's own expiry.
      const codes: string[] = [];
      const oneWait = async (): Promise<void> => {
        const err = await expectGrpcError(c.controller.call('Wait', ref, { timeoutMs: 1000 }));
        codes.push(`${grpc.status[err.code ?? -1] ?? String(err.code)}${err.code === grpc.status.DEADLINE_EXCEEDED ? '' : ` (${err.details})`}`);
      };
      for (let i = 0; i < 6; i++) await oneWait();
      await Promise.all(Array.from({ length: 8 }, oneWait));
      assert.deepEqual(
        codes.filter((code) => code !== 'DEADLINE_EXCEEDED'),
        [],
        `each of ${codes.length} Waits must end DEADLINE_EXCEEDED: ${codes.join(', ')}`,
      );
      const status = await c.controller.call('Status', ref);
      assert.equal(status.state, 'SANDBOX_READY', 'the Waits changed nothing');
      await c.controller.call('Stop', { ...ref, timeout_secs: 0 });
      await c.controller.call('Shutdown', ref);
      await c.store.call('Delete', { sandbox_id: id });
    }));

  test('the same id in two namespaces is two independent sandboxes', () =>
    withLogs(async () => {
      const nsA = `e2e-ns-a-${suffix}`;
      const nsB = `e2e-ns-b-${suffix}`;
      const id = 'same-id';
      const a = clients(nsA);
      const b = clients(nsB);
      const ref = { sandbox_id: id, sandboxer: sandboxerName };
      await createThroughContainerd(nsA, id);
      // Not ALREADY_EXISTS: the other namespace is another key.
      await createThroughContainerd(nsB, id);
      const startedA = await a.controller.call('Start', ref);
      const startedB = await b.controller.call('Start', ref);
      if (spec.runsProcesses) assert.notEqual(startedA.pid, startedB.pid, 'two processes');

      await a.controller.call('Stop', { ...ref, timeout_secs: 0 });
      assert.equal((await a.controller.call('Wait', ref)).exit_status, spec.stopExitStatus);
      assert.equal((await a.controller.call('Status', ref)).state, 'SANDBOX_NOTREADY');
      const stillB = await b.controller.call('Status', ref);
      assert.equal(stillB.state, 'SANDBOX_READY', 'stopping A leaves B running');
      assert.equal(stillB.pid, startedB.pid);

      await a.controller.call('Shutdown', ref);
      assert.equal((await expectGrpcError(a.controller.call('Status', ref))).code, grpc.status.NOT_FOUND);
      const afterShutdownA = await b.controller.call('Status', ref);
      assert.equal(afterShutdownA.state, 'SANDBOX_READY', 'shutting A down leaves B running');
      if (spec.runsProcesses) assert.ok(processAlive(startedB.pid), 'B process alive');

      // The id is free again in A, while B still holds it.
      await a.controller.call('Create', {
        sandbox_id: id,
        sandboxer: sandboxerName,
        sandbox: sandboxRecord(id),
        rootfs: [],
        annotations: {},
        netns_path: '',
      });
      await a.controller.call('Shutdown', ref);

      await b.controller.call('Stop', { ...ref, timeout_secs: 0 });
      await b.controller.call('Shutdown', ref);
      assert.equal((await expectGrpcError(b.controller.call('Status', ref))).code, grpc.status.NOT_FOUND);
      await a.store.call('Delete', { sandbox_id: id });
      await b.store.call('Delete', { sandbox_id: id });
    }));
});

