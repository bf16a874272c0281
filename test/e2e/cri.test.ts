/**
 * End to end through Kubernetes CRI: containerd's CRI plugin (runtime.v1 RuntimeService on
 * containerd's socket) runs a host-network pod on the sandboxer via runtime handler `tsbox`
 * (SPEC.md sections 1 and 5).
 *
 * TSBOX_E2E_SANDBOXER=goref runs the same tests against sbbench's reference server.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import {
  type CriRuntimeMethods,
  type UnaryClient,
  createCriRuntimeClient,
  createSandboxClients,
  expectGrpcError,
  grpc,
} from '../support/containerd-clients.js';
import { type Containerd, containerdUnavailableReason, releaseTraits, startContainerd, waitForCri } from '../support/containerd.js';
import { importSandboxImageWherePulled } from '../support/images.js';
import {
  type SandboxerDaemon,
  processAlive,
  sandboxerFromEnv,
  startSandboxerDaemon,
  waitFor,
} from '../support/tsbox-daemon.js';

const handler = 'tsbox';
/** containerd's CRI plugin keeps everything in this containerd namespace. */
const criNamespace = 'k8s.io';

describe('Kubernetes CRI pods on the sandboxer', () => {
  const spec = sandboxerFromEnv();
  let sandboxer: SandboxerDaemon | undefined;
  let containerd: Containerd | undefined;
  let cri: UnaryClient<CriRuntimeMethods> | undefined;
  /** Pod sandbox ids RunPodSandbox returned, removed in `after` whatever happened. */
  const pods: string[] = [];

  async function withLogs(body: () => Promise<void>): Promise<void> {
    try {
      await body();
    } catch (err) {
      const logs = [containerd?.logTail(30), sandboxer?.logTail(30)].filter(Boolean).join('\n');
      if (err instanceof Error) err.message = `${err.message}\n${logs}`;
      throw err;
    }
  }

  before(async () => {
    // Never skipped: without root and containerd these tests fail, saying why.
    const missing = containerdUnavailableReason();
    if (missing !== undefined) throw new Error(missing);
    sandboxer = await startSandboxerDaemon(spec);
    containerd = await startContainerd({ sandboxerSocket: sandboxer.socketPath, sandboxerName: handler });
    const client = createCriRuntimeClient(containerd.address);
    cri = client;
    // NetworkReady stays false (no CNI config): host-network pods do not need it.
    await waitForCri(client, ['RuntimeReady'], () => containerd?.logTail() ?? '', 30_000);
    await importSandboxImageWherePulled(containerd);
  });

  after(async () => {
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
    if (sandboxer?.pid !== undefined && pods.length > 0) {
      const direct = createSandboxClients(sandboxer.socketPath, criNamespace);
      for (const id of pods) {
        try {
          await direct.controller.call('Shutdown', { sandbox_id: id, sandboxer: handler }, { timeoutMs: 10_000 });
        } catch {
          // best effort: teardown kills whatever is left of the sandboxer's processes
        }
      }
      direct.close();
    }
    await containerd?.teardown();
    await sandboxer?.teardown();
  });

  test('host-network pod: run, status, list, stop, remove', () =>
    withLogs(async () => {
      const c = cri;
      assert.ok(c);
      const uid = `uid-${process.pid}-${Date.now().toString(36)}`;
      const run = await c.call(
        'RunPodSandbox',
        {
          runtime_handler: handler,
          config: {
            metadata: { name: 'e2e-pod', namespace: 'e2e', uid, attempt: 0 },
            hostname: 'e2e-pod-host',
            labels: { app: 'tsbox-e2e' },
            annotations: {},
            linux: { security_context: { namespace_options: { network: 'NODE' } } },
          },
        },
        { timeoutMs: 60_000 },
      );
      const id = run.pod_sandbox_id;
      pods.push(id);
      assert.match(id, /^[0-9a-f]{64}$/);
      // A pod on a proxy sandboxer needs no pause image: before containerd 2.3, CRI pulled nothing.
      assert.ok(containerd);
      if (!releaseTraits().pullsPauseImage) {
        const images = await containerd.ctr(['images', 'ls', '-q'], { namespace: criNamespace });
        assert.equal(images.code, 0, images.stderr);
        assert.equal(images.stdout.trim(), '', `no image pulled for the pod, found: ${images.stdout}`);
      }

      const ready = await c.call('PodSandboxStatus', { pod_sandbox_id: id, verbose: true });
      assert.equal(ready.status?.state, 'SANDBOX_READY');
      assert.equal(ready.status?.metadata?.name, 'e2e-pod');
      assert.equal(ready.status?.metadata?.namespace, 'e2e');
      assert.equal(ready.status?.metadata?.uid, uid);
      assert.equal(ready.status?.runtime_handler, handler);
      const pid = podPid(ready.info);
      if (spec.runsProcesses) {
        assert.ok(pid !== undefined && pid > 0, `verbose info carries the sandbox pid: ${JSON.stringify(ready.info)}`);
        assert.ok(processAlive(pid), `pid ${pid} alive while READY`);
      }

      const listed = await c.call('ListPodSandbox', {});
      const item = listed.items.find((p) => p.id === id);
      assert.ok(item, `ListPodSandbox includes ${id}`);
      assert.equal(item.state, 'SANDBOX_READY');
      assert.equal(item.runtime_handler, handler);

      await c.call('StopPodSandbox', { pod_sandbox_id: id }, { timeoutMs: 60_000 });
      // The pod turns NOTREADY when CRI's long-lived Wait returns (SPEC.md section 5).
      await waitFor(
        async () => (await c.call('PodSandboxStatus', { pod_sandbox_id: id })).status?.state === 'SANDBOX_NOTREADY',
        { what: 'pod NOTREADY after StopPodSandbox', timeoutMs: 15_000 },
      );
      if (spec.runsProcesses && pid !== undefined && pid > 0) {
        await waitFor(() => !processAlive(pid), { what: `pid ${pid} to be gone after StopPodSandbox` });
      }

      await c.call('RemovePodSandbox', { pod_sandbox_id: id }, { timeoutMs: 60_000 });
      const gone = await expectGrpcError(c.call('PodSandboxStatus', { pod_sandbox_id: id }));
      assert.equal(gone.code, grpc.status.NOT_FOUND, `PodSandboxStatus after RemovePodSandbox: ${gone.details}`);
      const listedAfter = await c.call('ListPodSandbox', {});
      assert.equal(listedAfter.items.find((p) => p.id === id), undefined, 'removed pod is not listed');

      // The sandboxer forgot it as well.
      const d = sandboxer;
      assert.ok(d);
      const direct = createSandboxClients(d.socketPath, criNamespace);
      try {
        const status = await expectGrpcError(direct.controller.call('Status', { sandbox_id: id, sandboxer: handler }));
        assert.equal(status.code, grpc.status.NOT_FOUND);
      } finally {
        direct.close();
      }
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
