/**
 * The supervisor (native/tsbox-shim.c) and the pod's isolation. Its isolating syscalls fail
 * loudly: when making `/` private or mounting the pod's /proc fails, Start fails naming the call
 * and its errno, and nothing is left (no process, no mount, no cgroup, no running record); the
 * daemon serves on. The failures are provoked by test/fixtures/deny-mount.c, a seccomp filter in
 * front of the real supervisor. And the supervisor itself stays outside the pod: in the host's
 * namespaces, out of the pod's cgroup (--home), the parent of the sandbox process, which is pid 1
 * of the pod's pid namespace, and whose exit it records.
 */
import assert from 'node:assert/strict';
import { execFileSync, spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, readlinkSync, rmSync, rmdirSync, statSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { repoRoot } from '../support/containerd-clients.js';
import { GrpcStatus, expectCode } from '../support/grpc-client.js';
import { cgroupNode, cmdlineOf, listPids, procInfo, readExitFile, sandboxCgroupDirs, sandboxProcesses, uniqueNamespace } from '../support/host.js';
import { type PodProcess, startPod } from '../support/pod-relay.js';
import { makeTempDir, processAlive, removeTree, waitFor } from '../support/processes.js';
import { startSandboxerDaemon, tsboxSandboxer, tsboxShim } from '../support/tsbox-daemon.js';
import { withLog } from './fixtures.js';

/** The proc mounts of the host, as mountinfo lines: a pod's /proc must never appear here. */
function procMounts(): string[] {
  return readFileSync('/proc/self/mountinfo', 'utf8')
    .split('\n')
    .filter((line) => / - proc /.test(line));
}

const cases = [
  { mode: 'private', error: 'mount / MS_REC|MS_PRIVATE: Operation not permitted' },
  { mode: 'proc', error: 'mount proc at /proc: Operation not permitted' },
] as const;

describe('a supervisor whose mounts fail', () => {
  const scratch = mkdtempSync(path.join(os.tmpdir(), 'tsbox-deny-mount-'));
  const denyMount = path.join(scratch, 'deny-mount');

  before(() => {
    execFileSync(process.env['CC'] ?? 'cc', ['-O2', '-Wall', '-Wextra', '-Werror', '-o', denyMount, path.join(repoRoot, 'test', 'fixtures', 'deny-mount.c')]);
  });

  after(() => rmSync(scratch, { recursive: true, force: true }));

  for (const { mode, error } of cases) {
    test(`${mode}: Start fails with "${error}" and leaves nothing; the daemon serves on`, async () => {
      // The supervisor tsbox runs: the real one, behind the seccomp filter.
      const shim = path.join(scratch, `shim-deny-${mode}`);
      writeFileSync(shim, `#!/bin/sh\nexec ${denyMount} ${mode} ${tsboxShim} "$@"\n`, { mode: 0o755 });
      const daemon = await startSandboxerDaemon(tsboxSandboxer({ args: ['--shim-path', shim] }), { label: `tsbox-deny-${mode}-` });
      const ns = uniqueNamespace(`deny-${mode}`);
      try {
        await withLog(daemon, async () => {
          const client = daemon.client(ns);
          const id = `deny-${mode}`;
          daemon.track(ns, id);
          const mountsBefore = procMounts();
          await client.create({ sandboxId: id, sandbox: { sandboxId: id, runtime: { name: 'io.containerd.tsbox.v1' } } });
          const err = await expectCode(client.start({ sandboxId: id }, { timeoutMs: 10_000 }), GrpcStatus.FAILED_PRECONDITION);
          assert.ok(err.details.includes(error), `"${err.details}" should say "${error}"`);

          const left = sandboxProcesses(daemon.stateDir, ns, id);
          assert.deepEqual([...left.supervisors, ...left.sandbox], [], 'processes left by the failed Start');
          assert.deepEqual(procMounts(), mountsBefore, 'a proc mount appeared on the host');
          for (const cgroup of sandboxCgroupDirs(ns, id)) assert.equal(existsSync(cgroup), false, `${cgroup} left behind`);
          const status = await client.status({ sandboxId: id });
          assert.equal(status.state, 'SANDBOX_UNKNOWN', 'the sandbox should be just created again');
          assert.equal(status.pid, 0);

          await client.shutdown({ sandboxId: id }, { timeoutMs: 5000 });
          await expectCode(client.status({ sandboxId: id }), GrpcStatus.NOT_FOUND);
          assert.equal(existsSync(daemon.sandboxDir(ns, id)), false, 'the sandbox dir outlived Shutdown');
          // The daemon serves on: another sandbox is created and answered for.
          const next = `${id}-next`;
          daemon.track(ns, next);
          await client.create({ sandboxId: next, sandbox: { sandboxId: next, runtime: { name: 'io.containerd.tsbox.v1' } } });
          assert.equal((await client.status({ sandboxId: next })).state, 'SANDBOX_UNKNOWN');
          await client.shutdown({ sandboxId: next });
        });
      } finally {
        await daemon.teardown();
      }
    });
  }
});

describe('a supervisor without its pause', () => {
  test('Start fails naming the pause program it looked for, and leaves nothing; the daemon serves on', async () => {
    // The supervisor alone, copied where no tsbox-pause is beside it (it is a static program).
    const scratch = mkdtempSync(path.join(os.tmpdir(), 'tsbox-no-pause-'));
    const shim = path.join(scratch, 'tsbox-shim');
    execFileSync('cp', [tsboxShim, shim]);
    const daemon = await startSandboxerDaemon(tsboxSandboxer({ args: ['--shim-path', shim] }), { label: 'tsbox-no-pause-' });
    const ns = uniqueNamespace('no-pause');
    try {
      await withLog(daemon, async () => {
        const client = daemon.client(ns);
        daemon.track(ns, 'lonely');
        await client.create({ sandboxId: 'lonely', sandbox: { sandboxId: 'lonely', runtime: { name: 'io.containerd.tsbox.v1' } } });
        const err = await expectCode(client.start({ sandboxId: 'lonely' }, { timeoutMs: 10_000 }), GrpcStatus.FAILED_PRECONDITION);
        const expected = `the pause program ${path.join(scratch, 'tsbox-pause')}: No such file or directory`;
        assert.ok(err.details.includes(expected), `"${err.details}" should say "${expected}"`);
        const left = sandboxProcesses(daemon.stateDir, ns, 'lonely');
        assert.deepEqual([...left.supervisors, ...left.sandbox], [], 'processes left by the failed Start');
        for (const cgroup of sandboxCgroupDirs(ns, 'lonely')) assert.equal(existsSync(cgroup), false, `${cgroup} left behind`);
        await client.shutdown({ sandboxId: 'lonely' }, { timeoutMs: 5000 });
        await expectCode(client.status({ sandboxId: 'lonely' }), GrpcStatus.NOT_FOUND);
      });
    } finally {
      await daemon.teardown();
      rmSync(scratch, { recursive: true, force: true });
    }
  });
});

/** The namespace a process is in, as /proc/PID/ns/KIND names it ("pid:[4026531836]"). */
function nsOf(pid: number | 'self', kind: string): string {
  return readlinkSync(`/proc/${pid}/ns/${kind}`);
}

/** The cgroup of a process in the hierarchy of `controller` (v1), or the unified one (v2). */
function cgroupOf(pid: number, controller: string): string {
  for (const line of readFileSync(`/proc/${pid}/cgroup`, 'utf8').split('\n')) {
    const [, controllers, cgroup] = /^\d+:([^:]*):(.*)$/.exec(line) ?? [];
    if (cgroup !== undefined && (controllers === '' || controllers?.split(',').includes(controller))) return cgroup;
  }
  throw new Error(`process ${pid} is in no ${controller} cgroup`);
}

/** Pids of live processes whose command line names `needle` (a pod's processes name its dir). */
function processesNaming(needle: string): number[] {
  return listPids().filter((pid) => pid !== process.pid && processAlive(pid) && cmdlineOf(pid).some((arg) => arg.includes(needle)));
}

describe('the supervisor outside its pod', () => {
  const label = `tsbox-sv-${process.pid}`;
  // The pids hierarchy on v1, the unified one on v2: a pod's cgroup, and a home for the supervisor.
  const node = cgroupNode();
  const hierarchy = node.root('pids');
  const parent = path.join(hierarchy, label);
  const podCgroup = path.join(parent, 'pod');
  const homeCgroup = path.join(parent, 'home');
  let dir = '';
  const netnsName = label;
  const netns = `/var/run/netns/${netnsName}`;
  const pods: PodProcess[] = [];

  before(async () => {
    dir = await makeTempDir('tsbox-sv-');
    for (const cgroup of [parent, podCgroup, homeCgroup]) mkdirSync(cgroup);
    const made = spawnSync('ip', ['netns', 'add', netnsName], { encoding: 'utf8' });
    assert.equal(made.status, 0, `ip netns add ${netnsName}: ${made.stderr}`);
  });

  after(async () => {
    for (const pod of pods) await pod.stop();
    spawnSync('ip', ['netns', 'delete', netnsName], { stdio: 'ignore' });
    // Empty once their processes are gone; the kernel may take a moment to see it.
    for (const cgroup of [podCgroup, homeCgroup, parent]) {
      await waitFor(
        () => {
          try {
            rmdirSync(cgroup);
            return true;
          } catch (err) {
            if ((err as NodeJS.ErrnoException).code === 'ENOENT') return true;
            if ((err as NodeJS.ErrnoException).code === 'EBUSY') return false;
            throw err;
          }
        },
        { what: `${cgroup} removed`, timeoutMs: 10_000 },
      );
    }
    await removeTree(dir);
  });

  test('a pod with its pid, mnt, ipc, uts and network namespaces: the supervisor stays in the host\'s and leaves the pod\'s cgroup; the sandbox is pid 1 of its own, the supervisor\'s child, and its exit is recorded', async () => {
    const podDir = mkdtempSync(path.join(dir, 'ns-'));
    // As systemd puts a held supervisor into the pod's scope; it leaves for its home once the sandbox runs.
    const pod = await startPod(podDir, {
      unshare: ['pid', 'mnt', 'ipc', 'uts'],
      netns,
      homes: [homeCgroup],
      hold: (pid) => writeFileSync(path.join(podCgroup, 'cgroup.procs'), String(pid)),
    });
    pods.push(pod);
    const supervisor = pod.supervisor.pid;
    const sandbox = pod.sandboxPid;
    for (const kind of ['mnt', 'net', 'pid', 'ipc', 'uts']) {
      assert.equal(nsOf(supervisor, kind), nsOf('self', kind), `the supervisor's ${kind} namespace is the host's`);
      assert.notEqual(nsOf(sandbox, kind), nsOf('self', kind), `the sandbox's ${kind} namespace is its own`);
    }
    assert.equal(nsOf(sandbox, 'net'), `net:[${statSync(netns).ino}]`, 'the sandbox joined the pod\'s network namespace');
    assert.match(readFileSync(`/proc/${sandbox}/status`, 'utf8'), new RegExp(`^NSpid:\\t${sandbox}\\t1$`, 'm'), 'the sandbox is pid 1 of its namespace');
    assert.equal(procInfo(sandbox)?.ppid, supervisor, 'the sandbox process is the supervisor\'s child');
    assert.equal(path.basename(readlinkSync(`/proc/${sandbox}/exe`)), 'tsbox-pause', 'the sandbox process is the pause program');
    assert.deepEqual(readdirSync(`/proc/${sandbox}/fd`).sort(), ['0', '1', '2'], 'the pause holds its stdio alone (none of the pod\'s sockets)');
    const relative = (cgroup: string): string => `/${path.relative(hierarchy, cgroup)}`;
    assert.equal(cgroupOf(sandbox, 'pids'), relative(podCgroup), 'the sandbox is in the pod\'s cgroup');
    assert.equal(cgroupOf(supervisor, 'pids'), relative(homeCgroup), 'the supervisor left the pod\'s cgroup for its home');
    assert.equal(await pod.endSandbox(), 137, 'the exit file records the SIGKILL');
    assert.equal(pod.supervisor.exitInfo(), undefined, 'the supervisor (relay mode) outlives its sandbox');
    assert.deepEqual(await pod.stop(), { code: 0, signal: null, graceful: true });
  });

  test('the sandbox joins the pod\'s cgroup itself; the supervisor does not', async () => {
    const podDir = mkdtempSync(path.join(dir, 'cg-'));
    const pod = await startPod(podDir, { cgroups: [podCgroup] });
    pods.push(pod);
    assert.equal(cgroupOf(pod.sandboxPid, 'pids'), `/${path.relative(hierarchy, podCgroup)}`);
    assert.equal(cgroupOf(pod.supervisor.pid, 'pids'), cgroupOf(process.pid, 'pids'), 'the supervisor stays where it was started');
    await pod.stop();
  });

  /** The supervisor without relay mode: it answers, waits for its sandbox, records the exit and exits. */
  function runPlain(podDir: string, args: readonly string[]): { answer: string; status: number | null } {
    const run = spawnSync(tsboxShim, ['--dir', podDir, ...args], { encoding: 'utf8', timeout: 20_000 });
    return { answer: run.stdout, status: run.status };
  }

  test('without relay mode, in a pid namespace: the exit code of the command is recorded and the supervisor exits 0', () => {
    const podDir = mkdtempSync(path.join(dir, 'plain-'));
    const run = runPlain(podDir, ['--unshare', 'pid,mnt,ipc,uts', '--', '/bin/sh', '-c', 'exit 7']);
    assert.match(run.answer, /^ok \d+ \d+\n$/);
    assert.equal(run.status, 0);
    assert.equal(readExitFile(podDir)?.status, 7);
  });

  for (const { what, args, error } of [
    { what: 'a cgroup the sandbox cannot join', args: ['--cgroup', '/nonexistent/tsbox', '--unshare', 'pid,mnt'], error: 'join cgroup /nonexistent/tsbox: No such file or directory' },
    { what: 'a network namespace that is none', args: ['--netns', '/dev/null', '--unshare', 'pid,mnt'], error: '/dev/null is not a network namespace' },
    { what: 'a command that cannot run, in a pid namespace', args: ['--unshare', 'pid,mnt', '--', '/nonexistent'], error: 'start /nonexistent: No such file or directory' },
  ]) {
    test(`${what}: "error ${error}", and nothing is left running`, () => {
      const podDir = mkdtempSync(path.join(dir, 'fail-'));
      const run = runPlain(podDir, args);
      assert.equal(run.answer, `error ${error}\n`);
      assert.equal(run.status, 1);
      assert.deepEqual(processesNaming(podDir), [], 'processes left by the failed start');
      assert.equal(existsSync(path.join(podDir, 'pid')), false, 'a pid file names processes that never ran');
    });
  }
});
