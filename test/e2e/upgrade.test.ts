/**
 * Upgrading tsbox with pods running, as an operator does: pods started by the earlier build
 * (NODE_WIDE_FRONT_BUILD, made from the repository's history: its pods' task calls go through
 * one node-wide task front) keep running and stay fully served by this build (exec, exit codes,
 * stop), new pods get a process of their own that relays their task calls, and once every pod
 * is gone and tsbox stopped, no process of tsbox is left on the node.
 */
import assert from 'node:assert/strict';
import { existsSync, readFileSync, readdirSync } from 'node:fs';
import path from 'node:path';
import { before, describe, test } from 'node:test';
import { stateLayout } from '../../src/state/layout.js';
import { taskDirs } from '../../src/tasks/serve.js';
import { taskDirName } from '../../src/tasks/task-record.js';
import { NODE_WIDE_FRONT_BUILD, formerBuild } from '../support/former-build.js';
import { createSandboxClients } from '../support/containerd-clients.js';
import { AWAIT_GO_AHEAD, GO_AHEAD, type PodEnv, TSBOX_HANDLER, TSBOX_TASK_HANDLER, containerState as criContainerState, untilCriAnswers, usePodEnv } from '../support/pod-env.js';
import { tsboxSandboxer, waitFor } from '../support/tsbox-daemon.js';

const CRI_NS = 'k8s.io';

/** Processes of tsbox's programs (Node running a tsbox main.js, tsbox-shim, tsbox-ctr, tsbox-front) that name one of `dirs` on their command line. */
function tsboxProcesses(dirs: readonly string[]): string[] {
  const out: string[] = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const argv = readFileSync(`/proc/${entry}/cmdline`, 'utf8').split('\0');
      const program = argv.slice(0, 2).join(' ');
      if (/tsbox-(shim|ctr|front)|main\.js/.test(program) && argv.some((a) => dirs.some((dir) => a.includes(dir)))) out.push(`${entry}: ${argv.join(' ').slice(0, 200)}`);
    } catch {
      continue; // ended meanwhile
    }
  }
  return out;
}

describe('upgrading tsbox with pods running', { timeout: 600_000 }, () => {
  const builds = { former: '', current: '' };
  let running: 'former' | 'current' = 'former';
  const harness = usePodEnv({
    runOnTmpfs: true,
    precondition: () => {
      builds.former = formerBuild(NODE_WIDE_FRONT_BUILD);
    },
    tsboxCommand: (paths) => tsboxSandboxer(running === 'former' ? { main: builds.former } : {}).command(paths),
  });
  const { withLogs, runPod, startContainer, exec, removePod, assertNothingLeft } = harness;
  let env: PodEnv;
  before(() => {
    env = harness.env;
  });

  const containerState = (id: string): ReturnType<typeof criContainerState> => criContainerState(env, id);

  /** The task address tsbox gives containerd for the pod (Status on tsbox's own socket). */
  async function address(pod: string): Promise<string> {
    const direct = createSandboxClients(env.tsbox.socketPath, CRI_NS);
    try {
      return (await direct.controller.call('Status', { sandbox_id: pod, sandboxer: TSBOX_HANDLER })).address;
    } finally {
      direct.close();
    }
  }

  test("the earlier build's pods stay served after the upgrade (exec, exit codes, stop); its task front goes with its last pod; new pods have their own process; nothing of tsbox is left", () =>
    withLogs(async () => {
      assert.ok(readFileSync(path.join(path.dirname(builds.former), '..', '..', 'native', 'tsbox-front.c'), 'utf8').length > 0, 'the earlier build has the node-wide task front');
      const oldConfig = env.podConfig('before-upgrade');
      const old = await runPod(oldConfig, TSBOX_TASK_HANDLER);
      const keeps = await startContainer(old, oldConfig, 'keeps', 'trap "exit 0" TERM; while true; do sleep 0.2; done');
      const exits = await startContainer(old, oldConfig, 'exits', `${AWAIT_GO_AHEAD} && exit 9`);
      const pids = { keeps: (await containerState(keeps)).pid, exits: (await containerState(exits)).pid };
      assert.equal(await address(old), `ttrpc+unix://${path.join(path.dirname(env.tsbox.socketPath), 'task.sock')}`, 'the node-wide task socket');
      const frontPid = Number(readFileSync(path.join(env.tsbox.stateDir, 'task-front.pid'), 'utf8').trim());
      assert.ok(existsSync(`/proc/${frontPid}`), "the earlier build's node-wide task front runs");

      // The earlier build's task records have no version: this build reads them as version 1.
      for (const c of [keeps, exits]) {
        const record = JSON.parse(readFileSync(path.join(taskDirs(env.containerd.paths.state).tasks, taskDirName(CRI_NS, c), 'task.json'), 'utf8')) as Record<string, unknown>;
        assert.equal(record['id'], c);
        assert.equal('version' in record, false, "the earlier build's task record has no version");
      }

      // The upgrade: the earlier tsbox stops (SIGTERM), this build starts on the same state.
      await env.tsbox.stop();
      running = 'current';
      await env.tsbox.start();

      for (const [name, c] of [['keeps', keeps], ['exits', exits]] as const) {
        const s = await containerState(c);
        assert.equal(s.state, 'CONTAINER_RUNNING', `${name} still running for CRI`);
        assert.equal(s.pid, pids[name], `${name}: the same process`);
      }
      assert.equal((await exec(keeps, ['/bin/sh', '-c', 'exit 6'])).code, 6, "exec in the earlier build's pod");
      assert.equal((await exec(exits, GO_AHEAD)).code, 0);
      await waitFor(async () => (await containerState(exits)).state === 'CONTAINER_EXITED', { what: 'the container exited after the upgrade' });
      assert.equal((await containerState(exits)).exitCode, 9, 'its own exit code');

      // containerd's channel to tsbox's sandbox socket backs off after the restart: CRI's calls
      // that reach tsbox fail UNAVAILABLE until it redials, and kubelet retries them.
      await untilCriAnswers(() => env.cri.call('PodSandboxStatus', { pod_sandbox_id: old }));
      // A pod started now has a process of its own, whose socket containerd is told.
      const newConfig = env.podConfig('after-upgrade');
      const fresh = await runPod(newConfig, TSBOX_TASK_HANDLER);
      const c = await startContainer(fresh, newConfig, 'c', 'exec sleep 100000');
      assert.equal(await address(fresh), `ttrpc+unix://${stateLayout(env.tsbox.stateDir).podSockets(CRI_NS, fresh).task}`);
      assert.equal((await exec(c, ['echo', 'served'])).stdout, 'served\n');

      await env.cri.call('StopContainer', { container_id: keeps, timeout: 10 }, { timeoutMs: 60_000 });
      assert.equal((await containerState(keeps)).exitCode, 0, 'SIGTERM reached it: exit 0');
      await removePod(old, [keeps, exits]);
      await assertNothingLeft(old, [keeps, exits]);
      await waitFor(() => !existsSync(`/proc/${frontPid}`), { what: "the earlier build's task front ended with its last pod" });

      await removePod(fresh, [c]);
      await assertNothingLeft(fresh, [c]);
      await env.tsbox.stop();
      assert.deepEqual(tsboxProcesses([env.tsbox.dir, env.containerd.paths.state]), [], 'no process of tsbox left once its pods are gone and it stopped');
      await env.tsbox.start();
    }));
});
