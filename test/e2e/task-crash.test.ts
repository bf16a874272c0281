/**
 * Crashes of tsbox inside the Task API route's calls, with a real containerd and CRI: the crash
 * matrix of the sandboxes (test/integration/crash.test.ts), for containers. tsbox is SIGKILLed
 * at each named point of its task table (TASK_CRASH_POINTS) during a real StartContainer (the
 * task's Create and Start), ExecSync (the exec's Exec and Start) or StopContainer (the init's
 * exit and its task's Delete), and started again. What a user would notice must hold:
 * - the CRI call in flight answers as it would have had tsbox not died: the pod's process keeps
 *   containerd's task calls and gives them to the restarted tsbox, which finds what the dead
 *   one left (a Create undone and made anew, or found made; a Start, an Exec, a Delete found
 *   done or done again), so kubelet has nothing to retry;
 * - the container is then fully there: it runs with one holder (none left over from the dead
 *   tsbox's work), exec works, a stop gives its own exit code; an exit is never reported 255;
 * - once it is removed, nothing of it is left: processes, mounts, cgroups, runc's state, task
 *   records; once the pod is removed, nothing of the pod either.
 * One pod environment and one pod for the whole matrix, a container per point.
 */
import assert from 'node:assert/strict';
import { readdirSync } from 'node:fs';
import path from 'node:path';
import { before, describe, test } from 'node:test';
import { setTimeout as delay } from 'node:timers/promises';
import { TASK_CRASH_POINTS, type TaskCrashPoint } from '../../src/tasks/tasks.js';
import type { CriContainerConfig, PodSandboxConfig } from '../support/containerd-clients.js';
import { BUSYBOX_IMAGE } from '../support/images.js';
import { type PodEnv, TSBOX_TASK_HANDLER, containerLeftovers, containerState as criContainerState, untilCriAnswers, usePodEnv } from '../support/pod-env.js';
import { containerHolders } from '../support/host.js';
import { processAlive, waitFor } from '../support/tsbox-daemon.js';
import { within } from '../support/processes.js';

const CRI_NS = 'k8s.io';

/** The container of each point: runs until SIGTERM, then exits 3 (a stop gives that code). */
const SCRIPT = 'trap "exit 3" TERM; while true; do sleep 0.2; done';

/** Which CRI call runs into each point: its operation, before the colon. */
function phaseOf(point: TaskCrashPoint): 'start' | 'exec' | 'stop' {
  const op = point.split(':')[0];
  switch (op) {
    case 'task-create':
    case 'task-start':
      return 'start';
    case 'task-exec':
    case 'task-exec-start':
      return 'exec';
    case 'task-exit':
    case 'task-delete':
      return 'stop';
    default:
      return assert.fail(`no CRI call is known to reach crash point ${point}: give it one here`);
  }
}

type Outcome<T> = { readonly ok: true; readonly value: T } | { readonly ok: false; readonly err: unknown };


const messageOf = (err: unknown): string => (err instanceof Error ? err.message : String(err));

describe('kill -9 of tsbox at each crash point of the task table, under real CRI calls', { timeout: 600_000 }, () => {
  const harness = usePodEnv({ runOnTmpfs: true });
  const { withLogs, runPod, exec, removePod, assertNothingLeft } = harness;
  let env: PodEnv;
  let pod = '';
  let podConfig: PodSandboxConfig;
  /** Every container the matrix made, for the pod's final check. */
  const containers: string[] = [];

  before(async () => {
    env = harness.env;
    podConfig = env.podConfig('task-crash');
    pod = await runPod(podConfig, TSBOX_TASK_HANDLER);
  });

  const containerState = (id: string): ReturnType<typeof criContainerState> => criContainerState(env, id);

  /** CreateContainer, as kubelet calls it: retried while CRI's channel to a restarted tsbox redials. */
  async function createContainer(name: string): Promise<string> {
    const config: CriContainerConfig = { metadata: { name }, image: { image: BUSYBOX_IMAGE }, command: ['/bin/sh', '-c', SCRIPT], log_path: `${name}.log` };
    const { container_id: id } = await untilCriAnswers(() => env.cri.call('CreateContainer', { pod_sandbox_id: pod, config, sandbox_config: podConfig }, { timeoutMs: 120_000 }));
    containers.push(id);
    return id;
  }

  const startContainer = (id: string): Promise<unknown> => env.cri.call('StartContainer', { container_id: id }, { timeoutMs: 120_000 });
  const stopContainer = (id: string): Promise<unknown> => env.cri.call('StopContainer', { container_id: id, timeout: 10 }, { timeoutMs: 120_000 });

  /** tsbox stopped and started again with `point` armed (TSBOX_CRASH_AT). */
  async function arm(point: TaskCrashPoint): Promise<void> {
    await env.tsbox.stop();
    await env.tsbox.start({ crashAt: point });
  }

  /**
   * `call` runs into `point`: tsbox must die there by SIGKILL; it is started again (unarmed), as
   * systemd restarts it, and the call's outcome is returned, whatever it is.
   */
  async function throughCrash<T>(point: TaskCrashPoint, call: Promise<T>): Promise<Outcome<T>> {
    const outcome = call.then(
      (value): Outcome<T> => ({ ok: true, value }),
      (err: unknown): Outcome<T> => ({ ok: false, err }),
    );
    // A call that answers while tsbox lives on never reached the point.
    const died = await within(
      Promise.race([env.tsbox.exited(), outcome.then(() => delay(5000)).then(() => undefined)]),
      90_000,
      `tsbox to die at ${point}`,
    );
    if (died === undefined) {
      const answered = await outcome;
      assert.fail(`tsbox never reached ${point}: the call ${answered.ok ? 'answered' : `failed (${messageOf(answered.err)})`} and tsbox runs on`);
    }
    assert.equal(died.signal, 'SIGKILL', `tsbox died at ${point} by SIGKILL (exit ${died.code})`);
    await env.tsbox.start();
    return within(outcome, 150_000, `the CRI call in flight when tsbox died at ${point}`);
  }

  /**
   * The CRI call in flight at the crash answers as it would have: the pod's process kept
   * containerd's task call and gave it to the restarted tsbox, so kubelet never sees it fail.
   */
  function answered<T>(point: TaskCrashPoint, call: string, outcome: Outcome<T>): T {
    if (!outcome.ok) assert.fail(`${call} in flight when tsbox died at ${point} failed: ${messageOf(outcome.err)}`);
    return outcome.value;
  }

  /** The holders (tsbox-ctr) running for a container. */
  const holdersOf = (id: string): number[] => containerHolders().filter((h) => h.id === id).map((h) => h.pid);

  /** One holder for the running container, its init's: the crash left no second one (an exec's holder goes with its process). */
  async function assertOneHolder(id: string): Promise<void> {
    let holders = holdersOf(id);
    await waitFor(() => (holders = holdersOf(id)).length === 1, { what: `one holder for ${id}`, timeoutMs: 10_000, describe: () => `holders: ${holders.join(', ') || 'none'}` });
  }

  /** The container runs, is served (exec, its own exit code), and a stop ends it with its own code, 3. */
  async function assertFullyThere(id: string): Promise<void> {
    const running = await containerState(id);
    assert.equal(running.state, 'CONTAINER_RUNNING', `the container runs: ${JSON.stringify(running)}`);
    assert.ok(processAlive(running.pid), `its process ${running.pid} runs`);
    assert.deepEqual(await exec(id, ['/bin/sh', '-c', 'echo served; exit 4']), { stdout: 'served\n', stderr: '', code: 4 }, 'exec works, with its own exit code');
    await stopContainer(id);
    assert.deepEqual(await containerState(id).then((s) => [s.state, s.exitCode]), ['CONTAINER_EXITED', 3], "a stop gives the container's own exit code");
  }

  /** RemoveContainer, then nothing of the containers is left on the host (their pod runs on). */
  async function removeAndAssertGone(ids: readonly string[]): Promise<void> {
    for (const id of ids) await env.cri.call('RemoveContainer', { container_id: id }, { timeoutMs: 60_000 });
    let left = containerLeftovers(env, ids);
    await waitFor(
      () => {
        left = containerLeftovers(env, ids);
        return Object.values(left).every((list: string[]) => list.length === 0);
      },
      { what: `nothing of ${ids.join(', ')} left`, timeoutMs: 15_000, describe: () => JSON.stringify(left, null, 2) },
    );
  }

  for (const [i, point] of TASK_CRASH_POINTS.entries()) {
    test(point, () =>
      withLogs(async () => {
        const phase = phaseOf(point);
        const id = await createContainer(`c${i}`);
        if (phase === 'start') {
          await arm(point);
          answered(point, 'StartContainer', await throughCrash(point, startContainer(id)));
          await assertOneHolder(id);
          await assertFullyThere(id);
        } else if (phase === 'exec') {
          await startContainer(id);
          await arm(point);
          const ran = answered(point, 'ExecSync', await throughCrash(point, exec(id, ['/bin/sh', '-c', 'echo out; exit 5'])));
          assert.deepEqual(ran, { stdout: 'out\n', stderr: '', code: 5 }, "the exec's own output and exit code");
          await assertOneHolder(id);
          await assertFullyThere(id);
        } else {
          await startContainer(id);
          const pid = (await containerState(id)).pid;
          await arm(point);
          answered(point, 'StopContainer', await throughCrash(point, stopContainer(id)));
          const after = await containerState(id);
          assert.deepEqual([after.state, after.exitCode], ['CONTAINER_EXITED', 3], `the container's own exit code, never 255: ${JSON.stringify(after)}`);
          assert.equal(processAlive(pid), false, 'its process is gone');
        }
        await removeAndAssertGone([id]);
      }),
    );
  }

  test('the pod removed after the matrix: nothing of it or of any of its containers is left', () =>
    withLogs(async () => {
      // CRI's channel to tsbox's sandbox socket redials after the last restart, as kubelet sees.
      await untilCriAnswers(() => env.cri.call('StopPodSandbox', { pod_sandbox_id: pod }, { timeoutMs: 60_000 }));
      await removePod(pod, []);
      await assertNothingLeft(pod, containers);
      const tasks = path.join(env.containerd.paths.state, 'tsbox');
      assert.deepEqual(readdirSync(path.join(tasks, 'tasks')), [], 'no task record left');
      assert.deepEqual(readdirSync(path.join(tasks, 'runc', CRI_NS)), [], 'runc keeps no state of them');
    }));
});
