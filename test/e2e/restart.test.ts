/**
 * Restarts with a real containerd 2.x in front of tsbox (SPEC.md section 5):
 * - containerd restarts while sandboxes run: they stay SANDBOX_READY with the same pids, both
 *   through containerd's sandbox Controller and through CRI, and a Wait held after the restart
 *   returns the real exit status;
 * - tsbox restarts (SIGTERM, and SIGKILL) while containerd holds a Wait with no deadline:
 *   containerd retries it on UNAVAILABLE, so it survives and returns the real exit status, also
 *   for an exit that happened while tsbox was down.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, rmdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import {
  type ControllerMethods,
  type CriRuntimeMethods,
  type Sandbox,
  type SandboxClients,
  type UnaryClient,
  createCriRuntimeClient,
  createSandboxClients,
  expectGrpcError,
  grpc,
  timestampMs,
} from '../support/containerd-clients.js';
import { type Containerd, containerdUnavailableReason, startContainerd, waitForCri } from '../support/containerd.js';
import { importSandboxImageWherePulled } from '../support/images.js';
import { cgroupDirsOfNamespace, existingCgroupDirs, killSandboxLeftovers } from '../support/host.js';
import { KILLED, OCI_SPEC_TYPE, exitOnTrigger, logRecords } from '../support/crash-invariants.js';
import { type SandboxerDaemon, processAlive, startSandboxerDaemon, tsboxSandboxer, waitFor } from '../support/tsbox-daemon.js';
import { within } from '../support/processes.js';

const sandboxerName = 'tsbox';
const runtimeName = 'io.containerd.tsbox.v1';
/** containerd's CRI plugin keeps everything in this containerd namespace. */
const criNamespace = 'k8s.io';

type WaitResponse = ControllerMethods['Wait'][1];

describe('restarts of containerd and of tsbox', () => {
  let sandboxer: SandboxerDaemon | undefined;
  let containerd: Containerd | undefined;
  let cri: UnaryClient<CriRuntimeMethods> | undefined;
  const clientsByNs = new Map<string, SandboxClients>();
  /** Every (namespace, id) a test created, shut down in `after` whatever happened. */
  const created: { ns: string; id: string }[] = [];
  const pods: string[] = [];
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

  /** Fresh channels to containerd (after containerd restarted, the old ones back off). */
  function resetClients(): void {
    for (const c of clientsByNs.values()) c.close();
    clientsByNs.clear();
  }

  async function withLogs(body: () => Promise<void>): Promise<void> {
    try {
      await body();
    } catch (err) {
      const logs = [containerd?.logTail(30), sandboxer?.logTail(30)].filter(Boolean).join('\n');
      if (err instanceof Error) err.message = `${err.message}\n${logs}`;
      throw err;
    }
  }

  function sandboxRecord(id: string, args?: readonly string[]): Sandbox {
    const spec = args === undefined ? null : { ociVersion: '1.1.0', process: { args, env: [], cwd: '/' } };
    return {
      sandbox_id: id,
      // containerd 2.1.9 crashes on a Create whose sandbox has no runtime (SPEC.md section 5).
      runtime: { name: runtimeName, options: null },
      sandboxer: sandboxerName,
      labels: { 'tsbox.test': 'e2e-restart' },
      extensions: {},
      spec: spec === null ? null : { type_url: OCI_SPEC_TYPE, value: Buffer.from(JSON.stringify(spec)) },
    };
  }

  /** Store record + Controller Create + Start through containerd (SPEC.md section 5); the pid. */
  async function runThroughContainerd(ns: string, id: string, args?: readonly string[]): Promise<number> {
    const c = clients(ns);
    created.push({ ns, id });
    await c.store.call('Create', { sandbox: sandboxRecord(id, args) });
    await c.controller.call('Create', {
      sandbox_id: id,
      sandboxer: sandboxerName,
      sandbox: sandboxRecord(id, args),
      rootfs: [],
      annotations: {},
      netns_path: '',
    });
    const started = await c.controller.call('Start', { sandbox_id: id, sandboxer: sandboxerName });
    assert.ok(started.pid > 0 && processAlive(started.pid), `Start pid ${started.pid} runs`);
    return started.pid;
  }

  async function removeThroughContainerd(ns: string, id: string): Promise<void> {
    const c = clients(ns);
    await c.controller.call('Shutdown', { sandbox_id: id, sandboxer: sandboxerName });
    const gone = await expectGrpcError(c.controller.call('Status', { sandbox_id: id, sandboxer: sandboxerName }));
    assert.equal(gone.code, grpc.status.NOT_FOUND, `Status after Shutdown: ${gone.details}`);
    await c.store.call('Delete', { sandbox_id: id });
  }

  /**
   * A Wait through containerd with no deadline, as CRI holds it, on its own channel. `settled`
   * tells whether it returned (or failed) yet.
   */
  function holdWait(ns: string, id: string): { result: Promise<WaitResponse>; settled(): boolean; close(): void } {
    const d = containerd;
    if (d === undefined) throw new Error('containerd not started');
    const own = createSandboxClients(d.address, ns);
    let done = false;
    const result = own.controller
      .call('Wait', { sandbox_id: id, sandboxer: sandboxerName }, { timeoutMs: Infinity })
      .finally(() => {
        done = true;
      });
    // A failure is read by the test through `result`; never an unhandled rejection.
    result.catch(() => undefined);
    return { result, settled: () => done, close: () => own.close() };
  }

  async function status(ns: string, id: string): Promise<ControllerMethods['Status'][1]> {
    return clients(ns).controller.call('Status', { sandbox_id: id, sandboxer: sandboxerName });
  }

  before(async () => {
    // Never skipped: without root and containerd these tests fail, saying why.
    const missing = containerdUnavailableReason();
    if (missing !== undefined) throw new Error(missing);
    sandboxer = await startSandboxerDaemon(tsboxSandboxer());
    containerd = await startContainerd({ sandboxerSocket: sandboxer.socketPath, sandboxerName });
    await importSandboxImageWherePulled(containerd);
  });

  after(async () => {
    for (const c of clientsByNs.values()) c.close();
    if (cri !== undefined) {
      for (const id of pods) {
        try {
          await cri.call('StopPodSandbox', { pod_sandbox_id: id }, { timeoutMs: 10_000 });
          await cri.call('RemovePodSandbox', { pod_sandbox_id: id }, { timeoutMs: 10_000 });
        } catch {
          // best effort; the sandboxer is told directly below
        }
      }
      cri.close();
    }
    // Shut down every sandbox at the sandboxer itself: works even if containerd is gone.
    const all = [...created, ...pods.map((id) => ({ ns: criNamespace, id }))];
    if (sandboxer?.pid !== undefined) {
      for (const { ns, id } of all) {
        const direct = createSandboxClients(sandboxer.socketPath, ns);
        try {
          await direct.controller.call('Shutdown', { sandbox_id: id, sandboxer: sandboxerName }, { timeoutMs: 10_000 });
        } catch {
          // best effort: whatever is left is killed below
        } finally {
          direct.close();
        }
      }
    }
    await containerd?.teardown();
    if (sandboxer !== undefined) {
      const stateDir = sandboxer.stateDir;
      await sandboxer.stop();
      const killed = await killSandboxLeftovers(stateDir, [...new Set(created.map((c) => c.ns))]);
      if (killed.length > 0) process.stderr.write(`# restart teardown: killed leftover processes ${killed.join(', ')}\n`);
      for (const { ns, id } of all) {
        const dirs = ns === criNamespace ? existingCgroupDirs(ns, id) : cgroupDirsOfNamespace(ns);
        for (const dir of dirs) {
          try {
            rmdirSync(dir);
          } catch (err) {
            process.stderr.write(`# cannot remove cgroup ${dir}: ${(err as Error).message}\n`);
          }
        }
      }
      await sandboxer.teardown();
    }
  });

  test('containerd restarts: sandboxes stay READY with their pids; a Wait held afterwards gets 137', () =>
    withLogs(async () => {
      const d = containerd;
      assert.ok(d);
      const ns = `e2e-cdrestart-${suffix}`;
      const pids = new Map<string, number>();
      for (const id of ['first', 'second']) pids.set(id, await runThroughContainerd(ns, id));

      const containerdPid = d.pid;
      await d.restart();
      assert.notEqual(d.pid, containerdPid, 'a new containerd process');
      resetClients();
      for (const [id, pid] of pids) {
        const st = await status(ns, id);
        assert.equal(st.state, 'SANDBOX_READY', `${id} after containerd restarted`);
        assert.equal(st.pid, pid, `${id} keeps its pid`);
        assert.ok(processAlive(pid), `${id}'s process runs`);
      }

      for (const id of pids.keys()) {
        const held = holdWait(ns, id);
        try {
          assert.equal((await status(ns, id)).state, 'SANDBOX_READY');
          assert.equal(held.settled(), false, 'the Wait returned before the sandbox was stopped');
          await clients(ns).controller.call('Stop', { sandbox_id: id, sandboxer: sandboxerName, timeout_secs: 0 });
          const exit = await within(held.result, 30_000, `the held Wait of ${id}`);
          assert.equal(exit.exit_status, KILLED);
          assert.ok(timestampMs(exit.exited_at) !== undefined, 'exited_at set');
        } finally {
          held.close();
        }
        assert.equal((await status(ns, id)).state, 'SANDBOX_NOTREADY');
        await removeThroughContainerd(ns, id);
      }
    }));

  test('CRI: a pod stays SANDBOX_READY across a containerd restart, and stops afterwards', () =>
    withLogs(async () => {
      const d = containerd;
      assert.ok(d);
      cri = createCriRuntimeClient(d.address);
      await waitForCri(cri, ['RuntimeReady'], () => d.logTail(), 30_000);
      const uid = `uid-restart-${suffix}`;
      const run = await cri.call(
        'RunPodSandbox',
        {
          runtime_handler: sandboxerName,
          config: {
            metadata: { name: 'restart-pod', namespace: 'e2e', uid, attempt: 0 },
            hostname: 'restart-pod',
            labels: {},
            annotations: {},
            linux: { security_context: { namespace_options: { network: 'NODE' } } },
          },
        },
        { timeoutMs: 60_000 },
      );
      const id = run.pod_sandbox_id;
      pods.push(id);
      const before = await cri.call('PodSandboxStatus', { pod_sandbox_id: id, verbose: true });
      assert.equal(before.status?.state, 'SANDBOX_READY');
      const pid = podPid(before.info);
      assert.ok(pid !== undefined && processAlive(pid), `the pod's process runs: ${JSON.stringify(before.info)}`);

      const containerdPid = d.pid;
      await d.restart();
      assert.notEqual(d.pid, containerdPid, 'a new containerd process');
      cri.close();
      cri = createCriRuntimeClient(d.address);
      await waitForCri(cri, ['RuntimeReady'], () => d.logTail(), 30_000);
      const afterRestart = await cri.call('PodSandboxStatus', { pod_sandbox_id: id, verbose: true });
      assert.equal(afterRestart.status?.state, 'SANDBOX_READY', 'still READY after containerd restarted');
      assert.equal(podPid(afterRestart.info), pid, 'the same process');
      assert.ok(processAlive(pid));
      const listed = await cri.call('ListPodSandbox', {});
      assert.equal(listed.items.find((p) => p.id === id)?.state, 'SANDBOX_READY');

      // CRI's Wait, re-established by containerd after its restart, sees the stop.
      const client = cri;
      await client.call('StopPodSandbox', { pod_sandbox_id: id }, { timeoutMs: 60_000 });
      await waitFor(
        async () => (await client.call('PodSandboxStatus', { pod_sandbox_id: id })).status?.state === 'SANDBOX_NOTREADY',
        { what: 'pod NOTREADY after StopPodSandbox', timeoutMs: 15_000 },
      );
      await waitFor(() => !processAlive(pid), { what: `pid ${pid} to be gone` });
      await client.call('RemovePodSandbox', { pod_sandbox_id: id }, { timeoutMs: 60_000 });
      const gone = await expectGrpcError(client.call('PodSandboxStatus', { pod_sandbox_id: id }));
      assert.equal(gone.code, grpc.status.NOT_FOUND);
    }));

  for (const how of ['SIGTERM', 'SIGKILL'] as const) {
    test(`tsbox restarts (${how}) while containerd holds a Wait: the Wait survives and gets 137`, () =>
      withLogs(async () => {
        const s = sandboxer;
        assert.ok(s);
        const ns = `e2e-tsbox-${how.toLowerCase()}-${suffix}`;
        const id = 'held';
        const pid = await runThroughContainerd(ns, id);
        const held = holdWait(ns, id);
        try {
          assert.equal((await status(ns, id)).state, 'SANDBOX_READY');
          if (how === 'SIGTERM') {
            const stopped = await s.stop();
            assert.ok(stopped.graceful && stopped.code === 0, `tsbox stopped cleanly: ${JSON.stringify(stopped)}`);
          } else {
            assert.equal((await s.kill9()).signal, 'SIGKILL');
          }
          assert.ok(processAlive(pid), 'the sandbox runs on without tsbox');
          if (how === 'SIGTERM') {
            // tsbox ended the Wait containerd held with UNAVAILABLE, which containerd retries.
            assert.ok(
              logRecords(s).some((r) => r['rpc'] === 'Wait' && r['id'] === id && r['code'] === grpc.status.UNAVAILABLE),
              'the held Wait reached tsbox and was ended as UNAVAILABLE',
            );
          }
          await s.start();
          // Through containerd again: containerd reached the new tsbox.
          await waitFor(async () => (await status(ns, id).catch(() => undefined))?.state === 'SANDBOX_READY', {
            what: 'Status through containerd after tsbox restarted',
            timeoutMs: 30_000,
          });
          assert.equal((await status(ns, id)).pid, pid);
          assert.equal(held.settled(), false, 'the held Wait survived the restart');

          await clients(ns).controller.call('Stop', { sandbox_id: id, sandboxer: sandboxerName, timeout_secs: 0 });
          const exit = await within(held.result, 30_000, 'the held Wait after Stop');
          assert.equal(exit.exit_status, KILLED);
          assert.ok(timestampMs(exit.exited_at) !== undefined, 'exited_at set');
        } finally {
          held.close();
        }
        await removeThroughContainerd(ns, id);
      }));
  }

  test('a sandbox exits with 9 while tsbox is down: the Wait held through containerd returns 9', () =>
    withLogs(async () => {
      const s = sandboxer;
      assert.ok(s);
      const ns = `e2e-exit-down-${suffix}`;
      const id = 'exits-9';
      const trigger = path.join(s.dir, `exit-9-${suffix}`);
      const pid = await runThroughContainerd(ns, id, exitOnTrigger(trigger, 9));
      const held = holdWait(ns, id);
      try {
        assert.equal((await status(ns, id)).state, 'SANDBOX_READY');
        await s.kill9();
        const downAt = Date.now();
        writeFileSync(trigger, '');
        const exitFile = path.join(s.stateDir, 'sandboxes', ns, id, 'exit');
        await waitFor(() => existsSync(exitFile) && !processAlive(pid), {
          what: 'the sandbox to exit while tsbox is down',
        });
        const restartAt = Date.now();
        await s.start();
        const exit = await within(held.result, 30_000, 'the held Wait after tsbox came back');
        assert.equal(exit.exit_status, 9, 'the real exit status');
        const exitedAtMs = timestampMs(exit.exited_at);
        assert.ok(exitedAtMs !== undefined && exitedAtMs >= downAt && exitedAtMs <= restartAt, 'exited while tsbox was down');
        const st = await status(ns, id);
        assert.equal(st.state, 'SANDBOX_NOTREADY');
        assert.deepEqual(st.exited_at, exit.exited_at);
      } finally {
        held.close();
      }
      await removeThroughContainerd(ns, id);
    }));
});

/** The sandbox pid from CRI's verbose `info["info"]` JSON, when present. */
function podPid(info: Record<string, string>): number | undefined {
  const raw = info['info'];
  if (raw === undefined) return undefined;
  try {
    const parsed: unknown = JSON.parse(raw);
    if (typeof parsed === 'object' && parsed !== null && 'pid' in parsed && typeof parsed.pid === 'number') {
      return parsed.pid;
    }
  } catch {
    // not JSON: no pid
  }
  return undefined;
}

