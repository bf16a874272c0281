/**
 * Pods whose containers tsbox runs itself: the CRI handler `tsbox-task` is on tsbox's Task API
 * route, so Start answers tsbox's task socket with version 3 and containerd speaks the Task API
 * to tsbox for every container, with no runc shim per pod. End to end through containerd's CRI
 * plugin: containers, exec, logs, exit codes, stop with a grace period, stats, OOM, restarts of
 * containerd with containers running, and nothing of the pod left after it. containerd's state
 * dir is on a tmpfs, as on a node.
 */
import assert from 'node:assert/strict';
import { existsSync, readFileSync, readdirSync } from 'node:fs';
import path from 'node:path';
import { before, describe, test } from 'node:test';
import { createSandboxClients } from '../support/containerd-clients.js';
import { type CriStream, openCriStream } from '../support/cri-stream.js';
import { cgroupNode, containerHolders } from '../support/host.js';
import { AWAIT_GO_AHEAD, GO_AHEAD, type PodEnv, RUNC_HANDLER, TSBOX_HANDLER, TSBOX_TASK_HANDLER, runcShimsOf, untilCriAnswers, usePodEnv } from '../support/pod-env.js';
import { createSandboxerDaemon, tsboxMain, tsboxSandboxer, waitFor } from '../support/tsbox-daemon.js';
import { stateLayout } from '../../src/state/layout.js';

const CRI_NS = 'k8s.io';

/** The container holders (tsbox-ctr) running now, by the container id on their command line. */
const holders = (): string[] => containerHolders().map((h) => h.id);

describe('pods whose containers tsbox runs (CRI, Task API v3, no runc shim)', { timeout: 600_000 }, () => {
  // containerd's state dir on a tmpfs, as /run/containerd on a node: the tasks' files below it
  // are changed at once there (the integration tier has them on disk, through the pool).
  const harness = usePodEnv({ runOnTmpfs: true });
  const { withLogs, runPod, startContainer, exec, sh, removePod, assertNothingLeft } = harness;
  let env: PodEnv;
  before(() => {
    env = harness.env;
  });

  async function containerState(id: string): Promise<{ state: string; exitCode: number; reason: string; pid: number }> {
    const { status, info } = await env.cri.call('ContainerStatus', { container_id: id, verbose: true });
    assert.ok(status);
    const pid = (JSON.parse(info['info'] ?? '{}') as { pid?: number }).pid ?? 0;
    return { state: status.state, exitCode: status.exit_code, reason: status.reason, pid };
  }


  /** The pod's own task socket, which its process binds below tsbox's state dir. */
  const taskSocket = (id: string): string => stateLayout(env.tsbox.stateDir).podSockets(CRI_NS, id).task;

  /** The pid of the pod's process (its supervisor), from the file it writes. */
  const supervisorOf = (id: string): number => Number(readFileSync(path.join(stateLayout(env.tsbox.stateDir).sandboxDir(CRI_NS, id), 'pid'), 'utf8').split(' ')[0]);

  test('containers run with no runc shim: the task endpoint is the pod\'s own socket, version 3; exec, logs, exit codes, stats, resources updated, SIGTERM on stop; nothing left', () =>
    withLogs(async () => {
      const config = env.podConfig('direct');
      const id = await runPod(config, TSBOX_TASK_HANDLER);
      const direct = createSandboxClients(env.tsbox.socketPath, CRI_NS);
      try {
        const status = await direct.controller.call('Status', { sandbox_id: id, sandboxer: TSBOX_HANDLER });
        assert.equal(status.address, `ttrpc+unix://${taskSocket(id)}`);
        assert.equal(status.version, 3);
      } finally {
        direct.close();
      }

      const c1 = await startContainer(id, config, 'c1', 'echo hello-from-c1; trap "echo got-term; exit 3" TERM; while true; do sleep 0.2; done');
      const c2 = await startContainer(id, config, 'c2', 'exec sleep 100000');
      assert.deepEqual(runcShimsOf(env), [], 'containerd started no runc shim');
      assert.deepEqual(holders().filter((h) => h === c1 || h === c2).sort(), [c1, c2].sort(), 'one holder per container');
      assert.equal((await containerState(c1)).state, 'CONTAINER_RUNNING');
      const pid2 = (await containerState(c2)).pid;
      // The pid is the container's init from its start; what it runs changes as it execs (runc
      // init, then sh, then sleep), after StartContainer has answered, as with runc's own start.
      const cmdline = (): string => readFileSync(`/proc/${pid2}/cmdline`, 'utf8').split('\0').join(' ').trim();
      await waitFor(() => cmdline() === 'sleep 100000', { what: `process ${pid2} to run the container's command`, describe: () => `it runs: ${cmdline()}` });
      assert.equal(cmdline(), 'sleep 100000', 'ContainerStatus names the container\'s own process');

      // In the pod's namespaces, with pid 1 the sandbox process.
      assert.match(await sh(c1, 'cat /proc/1/cmdline | tr "\\0" " "'), /^tsbox-pause \/.*\/sandboxes\/k8s\.io\/[0-9a-f]{64} $/);
      assert.match(await sh(c1, 'ps -o pid,args'), /sleep 100000/, 'c1 sees c2\'s process');
      const ns = async (c: string): Promise<string> => sh(c, 'for n in net ipc uts pid; do readlink /proc/self/ns/$n; done');
      assert.equal(await ns(c1), await ns(c2));

      // Exec: exit codes and both streams.
      const r = await exec(c1, ['/bin/sh', '-c', 'echo out; echo err >&2; exit 7']);
      assert.deepEqual(r, { stdout: 'out\n', stderr: 'err\n', code: 7 });

      // Logs in CRI's format.
      const log1 = path.join(config.log_directory ?? '', 'c1.log');
      await waitFor(() => readFileSync(log1, 'utf8').includes('hello-from-c1'), { what: 'c1 log line' });
      assert.match(readFileSync(log1, 'utf8'), /^\S+ stdout F hello-from-c1$/m);

      // Stats from the container's cgroup.
      const stats = await env.cri.call('ContainerStats', { container_id: c1 });
      assert.equal(stats.stats?.attributes?.id, c1);
      assert.ok(Number(stats.stats?.memory?.working_set_bytes?.value ?? 0) > 0, `c1 memory: ${JSON.stringify(stats.stats?.memory)}`);

      // UpdateContainerResources reaches the container's cgroup (runc update).
      await env.cri.call('UpdateContainerResources', { container_id: c2, linux: { memory_limit_in_bytes: 96 * 1024 * 1024, cpu_shares: 512 } });
      const limit = await sh(c2, 'cat /sys/fs/cgroup/memory.max 2>/dev/null || cat /sys/fs/cgroup/memory/memory.limit_in_bytes');
      assert.equal(limit.trim(), String(96 * 1024 * 1024), 'the new memory limit is the cgroup\'s');

      // StopContainer with a grace period: SIGTERM first, the container's own exit code.
      await env.cri.call('StopContainer', { container_id: c1, timeout: 20 }, { timeoutMs: 60_000 });
      const stopped = await containerState(c1);
      assert.equal(stopped.state, 'CONTAINER_EXITED');
      assert.equal(stopped.exitCode, 3);
      await waitFor(() => readFileSync(log1, 'utf8').includes('got-term'), { what: 'c1 logged its SIGTERM' });
      assert.equal((await containerState(c2)).state, 'CONTAINER_RUNNING', 'the other container is untouched');

      await removePod(id, [c1, c2]);
      await assertNothingLeft(id, [c1, c2]);
      assert.deepEqual(holders().filter((h) => h === c1 || h === c2), [], 'no holder left');
      assert.deepEqual(readdirSync(path.join(env.containerd.paths.state, 'tsbox', 'tasks')), [], 'no task record left');
      assert.deepEqual(readdirSync(path.join(env.containerd.paths.state, 'tsbox', 'runc', CRI_NS)), [], 'runc keeps no state of them');
    }));

  test('exec and attach with a tty, as kubectl does (CRI streaming): the process has a terminal, a resize reaches it, input goes in, exit codes come back', () =>
    withLogs(async () => {
      const config = env.podConfig('tty');
      const id = await runPod(config, TSBOX_TASK_HANDLER);
      const c1 = await startContainer(id, config, 'c1', 'exec sleep 100000');
      // The terminal's size is asked again until the resize has reached it: the resize and
      // the input take different ways (ResizePty to the holder; stdin through the FIFO).
      const untilSize = async (stream: CriStream, width: number, height: number): Promise<void> => {
        stream.resize(width, height);
        await waitFor(
          () => {
            if (new RegExp(`^${height} ${width}\\r?$`, 'm').test(stream.stdout())) return true;
            stream.write('stty size\n');
            return false;
          },
          { what: `the terminal ${width}x${height}`, intervalMs: 200, describe: () => JSON.stringify(stream.stdout()) },
        );
      };

      // Exec with a tty: the shell's terminal is a pty, the exit code comes back.
      const { url } = await env.cri.call('Exec', { container_id: c1, cmd: ['/bin/sh'], tty: true, stdin: true, stdout: true, stderr: false });
      const exec = await openCriStream(url);
      await untilSize(exec, 91, 33);
      exec.write('tty; exit 3\n');
      const execEnd = await exec.ended;
      assert.equal(execEnd.exitCode, 3, `the exec's exit code: ${execEnd.status}`);
      assert.match(exec.stdout(), /^\/dev\/pts\/\d+\r?$/m, 'the exec\'s stdin and stdout are a terminal');

      // Attach to a container whose process has a tty and stdin: input reaches its shell, the
      // resize its terminal, and its exit ends the session and the container with its code.
      const c2 = await startContainer(id, config, 'c2', '', { command: ['/bin/sh'], tty: true, stdin: true });
      const attach = await openCriStream((await env.cri.call('Attach', { container_id: c2, tty: true, stdin: true, stdout: true, stderr: false })).url);
      await untilSize(attach, 77, 22);
      attach.write('echo attached-$((6*7)); exit 5\n');
      await attach.ended;
      assert.match(attach.stdout(), /attached-42/);
      await waitFor(async () => (await containerState(c2)).state === 'CONTAINER_EXITED', { what: 'c2 exited' });
      assert.equal((await containerState(c2)).exitCode, 5);
      // CRI logs a tty's output too.
      const log2 = path.join(config.log_directory ?? '', 'c2.log');
      await waitFor(() => readFileSync(log2, 'utf8').includes('attached-42'), { what: 'c2\'s log has its output' });

      await removePod(id, [c1, c2]);
      await assertNothingLeft(id, [c1, c2]);
    }));

  test('a container past its memory limit, killed by the OOM killer at once, is reported OOMKilled with code 137', () =>
    withLogs(async () => {
      const config = env.podConfig('oom', { linux: { cgroup_parent: `/tsbox-e2e-${process.pid}/oom-task` } });
      const id = await runPod(config, TSBOX_TASK_HANDLER);
      // busybox dd allocates its 32 MiB block first: against a 16 MiB limit it is killed as it
      // starts. tsbox reads the kernel's OOM count of the container's cgroup when the init ends
      // and has CRI told (TaskOOM) before it answers the exit.
      const c = await startContainer(id, config, 'hog', 'exec dd if=/dev/zero of=/dev/null bs=32M count=1', {
        linux: { resources: { memory_limit_in_bytes: 16 * 1024 * 1024 } },
      });
      await waitFor(async () => (await containerState(c)).state === 'CONTAINER_EXITED', { what: 'the container over its limit ends' });
      const { reason, exitCode } = await containerState(c);
      assert.deepEqual({ reason, exitCode }, { reason: 'OOMKilled', exitCode: 137 }, 'the reason is there as soon as the exit is');
      await removePod(id, [c]);
      await assertNothingLeft(id, [c]);
    }));

  test('a process of a running container killed by the OOM killer: CRI reports the container OOMKilled while it runs, as podsandbox does', (t) =>
    withLogs(async () => {
      // dd is the shell's child and the one past the limit; the shell (the init) goes on. dd
      // starts on an exec's go-ahead, once StartContainer has answered: the container runs, and
      // the runc shim watches its cgroup only from the end of its Start (a kill before that it
      // never reports; seen once on this machine's podsandbox).
      const script = `${AWAIT_GO_AHEAD}; dd if=/dev/zero of=/dev/null bs=32M count=1; echo "dd ended: $?"; exec sleep 100000`;
      const oomKilledChild = async (handler: string): Promise<{ state: string; reason: string }> => {
        const config = env.podConfig(`oom-child-${handler}`, { linux: { cgroup_parent: `/tsbox-e2e-${process.pid}/oom-child-${handler}` } });
        const id = await runPod(config, handler);
        const c = await startContainer(id, config, 'worker', script, { linux: { resources: { memory_limit_in_bytes: 16 * 1024 * 1024 } } });
        assert.equal((await exec(c, GO_AHEAD)).code, 0);
        const log = path.join(config.log_directory ?? '', 'worker.log');
        await waitFor(() => readFileSync(log, 'utf8').includes('dd ended: 137'), { what: `${handler}: dd killed`, describe: () => readFileSync(log, 'utf8') });
        // CRI hears of the kill through containerd's events (TaskOOM), a moment after the shell.
        // Up to 10 s; no reason at all is checked below, against what podsandbox says.
        const until = Date.now() + 10_000;
        let last = await containerState(c);
        while (last.reason === '' && Date.now() < until) {
          await new Promise((resolve) => setTimeout(resolve, 100));
          last = await containerState(c);
        }
        await removePod(id, [c]);
        await assertNothingLeft(id, [c]);
        return { state: last.state, reason: last.reason };
      };
      const tsbox = await oomKilledChild(TSBOX_TASK_HANDLER);
      assert.deepEqual(tsbox, { state: 'CONTAINER_RUNNING', reason: 'OOMKilled' });
      const podsandbox = await oomKilledChild(RUNC_HANDLER);
      // podsandbox's runc shim re-reads memory.events on inotify on cgroup v2 and was seen to
      // miss kills on the slow user-mode Linux node (README): there it is only reported.
      if (cgroupNode().kind === 'v1') assert.deepEqual(podsandbox, tsbox, 'podsandbox, which the Task API route follows');
      else t.diagnostic(`podsandbox's container on this node: ${podsandbox.state}, reason ${podsandbox.reason || '(none)'}`);
    }));

  test('a container that exits by itself reports its code; containerd restarted with a container running keeps it: exec, stop after', () =>
    withLogs(async () => {
      const config = env.podConfig('restart');
      const id = await runPod(config, TSBOX_TASK_HANDLER);
      const quick = await startContainer(id, config, 'quick', 'exit 42');
      await waitFor(async () => (await containerState(quick)).state === 'CONTAINER_EXITED', { what: 'quick exited' });
      assert.equal((await containerState(quick)).exitCode, 42);
      const c = await startContainer(id, config, 'long', 'trap "exit 0" TERM; while true; do sleep 0.2; done');
      const pid = (await containerState(c)).pid;
      await env.containerd.restart();
      await untilCriAnswers(() => containerState(c));
      assert.equal((await containerState(c)).state, 'CONTAINER_RUNNING', 'still running after containerd restarted');
      assert.equal((await containerState(c)).pid, pid, 'the same process');
      assert.equal((await exec(c, ['/bin/sh', '-c', 'exit 4'])).code, 4, 'exec works after the restart');
      await env.cri.call('StopContainer', { container_id: c, timeout: 10 }, { timeoutMs: 60_000 });
      assert.equal((await containerState(c)).exitCode, 0, 'the exit after the restart reached CRI with its own code');
      await removePod(id, [quick, c]);
      await assertNothingLeft(id, [quick, c]);
    }));

  test("the tasks' files live below containerd's state dir; a second tsbox for the same containerd serving tasks exits 2 naming that directory and the first tsbox, one serving no tasks starts and serves; the first keeps serving", () =>
    withLogs(async () => {
      const config = env.podConfig('one-tsbox');
      const id = await runPod(config, TSBOX_TASK_HANDLER);
      const c = await startContainer(id, config, 'main', 'sleep 1000');
      const tasksDir = path.join(env.containerd.paths.state, 'tsbox');
      assert.equal(readdirSync(path.join(tasksDir, 'runc', CRI_NS)).includes(c), true, "runc's state of the container is below containerd's state dir");
      assert.equal(readdirSync(path.join(tasksDir, 'tasks')).length, 1, 'one task recorded there');
      // containerd's state dir is a tmpfs here, as on a node: tsbox changes those files at once.
      const placed = readFileSync(env.tsbox.logPath, 'utf8')
        .split('\n')
        .filter((line) => line.includes('task files: changed at once where held in memory'))
        .map((line) => JSON.parse(line) as { dir?: string; atOnce?: boolean; runcRootAtOnce?: boolean });
      assert.deepEqual(placed.at(-1), { ...placed.at(-1), dir: path.join(tasksDir, 'tasks'), atOnce: true, runcRootAtOnce: true }, `tsbox's log says where it changes task files: ${JSON.stringify(placed)}`);
      const other = path.join(env.tsbox.dir, 'second');
      const second = await env.tsbox.run([tsboxMain, 'serve', '--socket', `${other}.sock`, '--state-dir', other, '--containerd-config', env.containerd.paths.configPath, '--task-api-handlers', TSBOX_TASK_HANDLER], 30_000);
      assert.equal(second.code, 2, `exit ${second.code}; stderr: ${second.stderr}`);
      assert.ok(second.stderr.includes(tasksDir) && second.stderr.includes(`pid ${env.tsbox.pid}`), `the error names ${tasksDir} and pid ${env.tsbox.pid}: ${second.stderr}`);
      // A tsbox of its own state dir and no Task API handler (the shim route only) takes none of
      // those tasks for its own: it starts and answers while the first one's tasks run.
      const third = await createSandboxerDaemon(tsboxSandboxer({ args: ['--containerd-config', env.containerd.paths.configPath] }), { label: 'tsbox-third-' });
      try {
        await third.start();
        const status = await third.client(CRI_NS).status({ sandboxId: 'absent' }).catch((err: { code?: number }) => err.code);
        assert.equal(status, 5, 'it serves (NotFound for a sandbox it does not have)');
        assert.equal(existsSync(path.join(third.stateDir, 'tasks-served')), false, 'it has served no tasks');
      } finally {
        await third.teardown();
      }
      assert.equal((await containerState(c)).state, 'CONTAINER_RUNNING');
      const { code, stdout } = await exec(c, ['echo', 'still served']);
      assert.equal(code, 0);
      assert.equal(stdout, 'still served\n');
      await removePod(id, [c]);
      await assertNothingLeft(id, [c]);
    }));

  test('tsbox restarted (SIGTERM) and killed (kill -9) with containers running: CRI marks none exited, same pids, a later exit reaches CRI with its own code', () =>
    withLogs(async () => {
      const config = env.podConfig('survivor');
      const id = await runPod(config, TSBOX_TASK_HANDLER);
      const a = await startContainer(id, config, 'a', 'trap "exit 0" TERM; while true; do sleep 0.2; done');
      const b = await startContainer(id, config, 'b', `${AWAIT_GO_AHEAD} && exit 9`);
      const pids = { a: (await containerState(a)).pid, b: (await containerState(b)).pid };
      const supervisor = supervisorOf(id);

      await env.tsbox.restart();
      assert.equal((await exec(a, ['/bin/sh', '-c', 'exit 6'])).code, 6, 'exec after tsbox restarted');
      await env.tsbox.kill9();
      // While tsbox is down, containerd's pending Waits stay with the pod's process.
      await env.tsbox.start();
      assert.equal(supervisorOf(id), supervisor, "the same pod process, through both restarts");
      assert.ok(existsSync(`/proc/${supervisor}`), 'which runs');
      for (const [name, c] of [['a', a], ['b', b]] as const) {
        const s = await containerState(c);
        assert.equal(s.state, 'CONTAINER_RUNNING', `${name} still running for CRI`);
        assert.equal(s.pid, pids[name], `${name}: the same process`);
      }
      assert.equal((await exec(b, GO_AHEAD)).code, 0);
      await waitFor(async () => (await containerState(b)).state === 'CONTAINER_EXITED', { what: 'b exited after the restarts' });
      assert.equal((await containerState(b)).exitCode, 9, 'b\'s own exit code, not 255');
      await env.cri.call('StopContainer', { container_id: a, timeout: 10 }, { timeoutMs: 60_000 });
      assert.equal((await containerState(a)).exitCode, 0);
      // containerd's channel to tsbox's sandbox socket backs off after the restarts (at most
      // 3 s in containerd 2.1); its calls fail UNAVAILABLE until it redials, as kubelet sees.
      assert.equal(await untilCriAnswers(async () => (await env.cri.call('PodSandboxStatus', { pod_sandbox_id: id })).status?.state), 'SANDBOX_READY');
      await removePod(id, [a, b]);
      await assertNothingLeft(id, [a, b]);
    }));

  test("kill -9 of one pod's process ends that pod alone: CRI reports its containers exited and its sandbox not ready, none of its processes is left; another pod's containers run on and are served", () =>
    withLogs(async () => {
      const configA = env.podConfig('lost');
      const a = await runPod(configA, TSBOX_TASK_HANDLER);
      const a1 = await startContainer(a, configA, 'a1', 'exec sleep 100000');
      const a2 = await startContainer(a, configA, 'a2', 'trap "" TERM; while true; do sleep 0.2; done');
      const configB = env.podConfig('bystander');
      const b = await runPod(configB, TSBOX_TASK_HANDLER);
      const b1 = await startContainer(b, configB, 'b1', `${AWAIT_GO_AHEAD} && exit 7`);
      const pidsA = [(await containerState(a1)).pid, (await containerState(a2)).pid];
      const supervisorB = supervisorOf(b);

      process.kill(supervisorOf(a), 'SIGKILL');
      for (const c of [a1, a2]) {
        await waitFor(async () => (await containerState(c)).state === 'CONTAINER_EXITED', { what: `container ${c} of the lost pod exited for CRI` });
      }
      await waitFor(async () => (await env.cri.call('PodSandboxStatus', { pod_sandbox_id: a })).status?.state === 'SANDBOX_NOTREADY', { what: 'the lost pod not ready for CRI' });
      let left: string[] = [];
      await waitFor(
        () => {
          left = [...pidsA.filter((pid) => existsSync(`/proc/${pid}`)).map((pid) => `container process ${pid}`), ...holders().filter((h) => h === a1 || h === a2).map((h) => `holder of ${h}`)];
          return left.length === 0;
        },
        { what: "no process of the lost pod's containers left", describe: () => left.join(', ') },
      );

      // The other pod noticed nothing: same process, its container served (exec, its own exit code).
      assert.equal(supervisorOf(b), supervisorB);
      assert.equal((await env.cri.call('PodSandboxStatus', { pod_sandbox_id: b })).status?.state, 'SANDBOX_READY');
      assert.equal((await containerState(b1)).state, 'CONTAINER_RUNNING');
      assert.equal((await exec(b1, GO_AHEAD)).code, 0);
      await waitFor(async () => (await containerState(b1)).state === 'CONTAINER_EXITED', { what: 'b1 exited' });
      assert.equal((await containerState(b1)).exitCode, 7, "the other pod's container's own exit code");

      await removePod(a, [a1, a2]);
      await removePod(b, [b1]);
      await assertNothingLeft(a, [a1, a2]);
      await assertNothingLeft(b, [b1]);
    }));

  test("a pod's process that stops answering (SIGSTOP) holds up that pod's calls alone, each within its caller's deadline; the other pod is served; once it runs again so is its pod", () =>
    withLogs(async () => {
      const configA = env.podConfig('stopped');
      const a = await runPod(configA, TSBOX_TASK_HANDLER);
      const a1 = await startContainer(a, configA, 'a1', 'exec sleep 100000');
      const configB = env.podConfig('served');
      const b = await runPod(configB, TSBOX_TASK_HANDLER);
      const b1 = await startContainer(b, configB, 'b1', 'exec sleep 100000');
      const stopped = supervisorOf(a);

      process.kill(stopped, 'SIGSTOP');
      try {
        // A call to the stopped pod's containers waits for it, until its caller's deadline.
        const held = await env.cri.call('ExecSync', { container_id: a1, cmd: ['/bin/sh', '-c', 'exit 2'], timeout: 0 }, { timeoutMs: 3000 }).then(
          (r) => `answered: exit ${r.exit_code}`,
          (err: { code?: number; message?: string }) => `failed: ${err.code} ${err.message}`,
        );
        // Ended by its deadline: DEADLINE_EXCEEDED, or CANCELLED when containerd's end of the
        // call sees its context end first.
        assert.match(held, /^failed: (4|1) /, 'the call waits for the stopped process until its deadline');
        // The other pod is served meanwhile, and tsbox answers for the stopped pod's sandbox.
        assert.equal((await exec(b1, ['/bin/sh', '-c', 'exit 3'])).code, 3);
        assert.equal((await env.cri.call('PodSandboxStatus', { pod_sandbox_id: a })).status?.state, 'SANDBOX_READY');
      } finally {
        process.kill(stopped, 'SIGCONT');
      }
      // Running again: the same process serves its pod.
      assert.equal((await exec(a1, ['/bin/sh', '-c', 'exit 5'])).code, 5);
      assert.equal(supervisorOf(a), stopped);
      assert.equal((await containerState(a1)).state, 'CONTAINER_RUNNING');

      await removePod(a, [a1]);
      await removePod(b, [b1]);
      await assertNothingLeft(a, [a1]);
      await assertNothingLeft(b, [b1]);
    }));
});

