/**
 * What containerd 2.4 asks of a sandboxer, through CRI on containerd 2.4.0-dev (main of
 * 2026-08-22, unpacked by scripts/install-containerd.sh), a tsbox pod beside a podsandbox pod:
 * a pod's CPU and memory (PodSandboxStats, ListPodSandboxStats) come from the sandboxer's
 * Metrics; and containerd calls the Task API's Shutdown after every task delete, which must
 * leave the pod's other containers served.
 */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { type CriPodSandboxStats, createSandboxClients } from '../support/containerd-clients.js';
import { RUNC_HANDLER, TSBOX_HANDLER, TSBOX_TASK_HANDLER, doctor, usePodEnv, withoutPauseImages } from '../support/pod-env.js';
import { waitFor } from '../support/tsbox-daemon.js';

const RELEASE = '2.4.0-dev.20260822';

describe(`containerd ${RELEASE}: pod stats through Metrics; Shutdown after each task delete`, { timeout: 600_000 }, () => {
  // As `tsbox install` registers tsbox with containerd 2.4: no pause image pulled for its pods.
  const harness = usePodEnv({ containerdRelease: RELEASE, disablePauseImagePull: true });
  const { withLogs, runPod, startContainer, removePod, assertNothingLeft, sh } = harness;

  // CPU: reported (a tsbox pod's cgroup holds only its pause, which may not have used a
  // microsecond yet; podsandbox's held runc's init too); memory: some in use.
  const usage = (stats: CriPodSandboxStats | null): { cpu: bigint | undefined; memory: bigint } => {
    const cpu = stats?.linux?.cpu?.usage_core_nano_seconds?.value;
    return { cpu: cpu === undefined ? undefined : BigInt(cpu), memory: BigInt(stats?.linux?.memory?.usage_bytes?.value ?? '0') };
  };

  test("a pod's CPU and memory from PodSandboxStats and ListPodSandboxStats, as podsandbox's; Metrics of a pod whose cgroup is gone is NOT_FOUND", () =>
    withLogs(async () => {
      const config = harness.env.podConfig('stats-tsbox');
      const id = await runPod(config, TSBOX_TASK_HANDLER);
      const ref = await runPod(harness.env.podConfig('stats-runc'), RUNC_HANDLER);
      const c = await startContainer(id, config, 'main', 'exec sleep 100000');
      for (const pod of [id, ref]) {
        const { stats } = await harness.env.cri.call('PodSandboxStats', { pod_sandbox_id: pod });
        assert.equal(stats?.attributes?.id, pod);
        const { cpu, memory } = usage(stats);
        assert.ok(cpu !== undefined, `${pod === id ? 'tsbox' : 'podsandbox'}: CPU used reported (${String(cpu)} ns)`);
        assert.ok(memory > 0n, `${pod === id ? 'tsbox' : 'podsandbox'}: memory used ${memory} bytes`);
      }
      const listed = await harness.env.cri.call('ListPodSandboxStats', {});
      const ours = listed.stats.find((s) => s.attributes?.id === id);
      assert.ok(ours !== undefined, 'ListPodSandboxStats lists the tsbox pod');
      assert.ok(usage(ours).memory > 0n);

      await removePod(id, [c]);
      // Straight to tsbox, as containerd would ask after the pod went: its cgroup is gone.
      const direct = createSandboxClients(harness.env.tsbox.socketPath, 'k8s.io');
      try {
        const config2 = harness.env.podConfig('stats-gone');
        const gone = await runPod(config2, TSBOX_TASK_HANDLER);
        await harness.env.cri.call('StopPodSandbox', { pod_sandbox_id: gone });
        await assert.rejects(direct.controller.call('Metrics', { sandbox_id: gone, sandboxer: TSBOX_HANDLER }), (err: Error & { code?: number }) => {
          assert.equal(err.code, 5, `NOT_FOUND: ${err.message}`);
          assert.match(err.message, /cgroup/);
          return true;
        });
        await removePod(gone, []);
      } finally {
        direct.close();
      }
      await removePod(ref, []);
      await assertNothingLeft(id, [c]);
    }));

  test("a container removed (containerd's Task Shutdown follows the delete): the pod's other container is served, a new one starts in the pod", () =>
    withLogs(async () => {
      const config = harness.env.podConfig('after-delete');
      const id = await runPod(config, TSBOX_TASK_HANDLER);
      const first = await startContainer(id, config, 'first', 'exec sleep 100000');
      const second = await startContainer(id, config, 'second', 'exec sleep 100000');
      const shutdowns = (): number =>
        harness.env.tsbox
          .logText()
          .split('\n')
          .filter((line) => line.includes('"rpc":"containerd.task.v3.Task/Shutdown"') && line.includes('"code":0')).length;
      const before = shutdowns();
      // The task is deleted once CRI sees it exit (StopContainer), Shutdown right after: awaited in tsbox's log.
      await harness.env.cri.call('StopContainer', { container_id: first, timeout: 0 });
      await harness.env.cri.call('RemoveContainer', { container_id: first });
      await waitFor(() => shutdowns() > before, { what: "containerd's Task API Shutdown after the delete, answered", timeoutMs: 10_000 });
      assert.equal((await sh(second, 'echo served')).trim(), 'served');
      const third = await startContainer(id, config, 'third', 'echo started > /tmp/mark; exec sleep 100000');
      assert.equal((await sh(third, 'cat /tmp/mark')).trim(), 'started');
      const { status } = await harness.env.cri.call('ContainerStatus', { container_id: second });
      assert.equal(status?.state, 'CONTAINER_RUNNING');
      await removePod(id, [second, third]);
      await assertNothingLeft(id, [first, second, third]);
    }));

  test('with disable_pause_image_pull on its handlers (as tsbox install sets it), a tsbox pod starts with no pause image on the node; doctor says so', () =>
    withLogs(async () => {
      await withoutPauseImages(harness.env, async () => {
        const r = await doctor(harness.env, RELEASE);
        assert.match(r.stdout, /^ok +containerd 2\.4\.0 pulls no sandbox image for tsbox pods \(disable_pause_image_pull on tsbox, tsbox-task\)$/m, r.stdout);
        assert.match(r.stdout, /^note +containerd 2\.4\.0 takes a pod's CPU and memory from tsbox's Metrics$/m);
        const config = harness.env.podConfig('no-pause');
        const id = await runPod(config, TSBOX_TASK_HANDLER);
        const c = await startContainer(id, config, 'main', 'exec sleep 100000');
        assert.equal((await sh(c, 'echo up')).trim(), 'up');
        // podsandbox runs the pause image: it still needs it.
        await assert.rejects(runPod(harness.env.podConfig('no-pause-runc'), RUNC_HANDLER), /pause:3\.10\.2/);
        await removePod(id, [c]);
        await assertNothingLeft(id, [c]);
      });
    }));
});
