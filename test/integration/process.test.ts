/**
 * What runs inside a sandbox: the OCI process of `sandbox.spec` (or a pause), its exit as Wait
 * and Status report it without anyone calling Stop, its own pid and uts namespaces with the
 * pod's hostname, the network namespace it was given, and a Start that cannot run anything
 * (SPEC.md sections 2 and 3).
 */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { sandboxCgroupDirs, uniqueNamespace } from '../support/host.js';
import { GrpcStatus, expectCode, timestampMs } from '../support/grpc-client.js';
import { type TsboxDaemon, startSandboxerDaemon, startTsbox, tsboxSandboxer, tsboxShim, which } from '../support/tsbox-daemon.js';
import { alive, createAndStart, criMetadata, ociSpec, podSandboxConfig, procExists, waitFor, withLog } from './fixtures.js';

/** Pids of processes whose command line names `needle` (the sandbox's supervisor names its dir). */
function processesNaming(needle: string): number[] {
  const out: number[] = [];
  for (const name of spawnSync('ls', ['/proc'], { encoding: 'utf8' }).stdout.split('\n')) {
    if (!/^\d+$/.test(name) || Number(name) === process.pid) continue;
    try {
      if (readFileSync(`/proc/${name}/cmdline`, 'utf8').split('\0').some((arg) => arg.includes(needle))) out.push(Number(name));
    } catch {
      // gone meanwhile
    }
  }
  return out;
}

/** A persistent network namespace made for a test, and how to remove it. */
interface TestNetns {
  readonly path: string;
  remove(): void;
}

function createNetns(name: string, fallbackDir: string): TestNetns {
  if (which('ip') !== undefined) {
    const made = spawnSync('ip', ['netns', 'add', name], { encoding: 'utf8' });
    assert.equal(made.status, 0, `ip netns add ${name}: ${made.stderr}`);
    return {
      path: `/var/run/netns/${name}`,
      remove: () => void spawnSync('ip', ['netns', 'delete', name], { stdio: 'ignore' }),
    };
  }
  // No iproute2: a namespace kept alive by a bind mount on a file, as `ip netns add` does.
  const file = path.join(fallbackDir, `netns-${name}`);
  writeFileSync(file, '');
  const made = spawnSync('unshare', [`--net=${file}`, 'true'], { encoding: 'utf8' });
  assert.equal(made.status, 0, `unshare --net=${file}: ${made.stderr}`);
  return { path: file, remove: () => void spawnSync('umount', ['-l', file], { stdio: 'ignore' }) };
}

describe('the sandbox process', () => {
  let daemon: TsboxDaemon | undefined;
  const ns = uniqueNamespace('proc');
  const netnsToRemove: TestNetns[] = [];

  before(async () => {
    daemon = await startTsbox('tsbox-proc');
  });

  after(async () => {
    try {
      await daemon?.teardown();
    } finally {
      for (const netns of netnsToRemove) netns.remove();
    }
  });

  function d(): TsboxDaemon {
    assert.ok(daemon !== undefined, 'daemon not started');
    return daemon;
  }

  test('an OCI process that exits 7 by itself: Wait returns 7 and Status turns NOTREADY, without a Stop', () =>
    withLog(daemon, async () => {
      const client = d().client(ns);
      const id = 'exits-seven';
      const gate = path.join(d().dir, 'exit-seven-now');
      const script = `while [ ! -e '${gate}' ]; do sleep 0.05; done; exit 7`;
      const { pid, createdAtMs } = await createAndStart(d(), client, id, {
        sandbox: { sandboxId: id, runtime: { name: 'io.containerd.tsbox.v1' }, spec: ociSpec(['sh', '-c', script]) },
      });
      assert.equal((await client.status({ sandboxId: id })).state, 'SANDBOX_READY');
      const waiting = client.wait({ sandboxId: id });

      writeFileSync(gate, '');
      const status = await waitFor(
        async () => {
          const s = await client.status({ sandboxId: id });
          return s.state === 'SANDBOX_NOTREADY' ? s : undefined;
        },
        { what: 'Status to turn SANDBOX_NOTREADY by itself', timeoutMs: 10_000 },
      );
      assert.equal(status.pid, 0);
      assert.equal(procExists(pid), false);

      const answer = await waiting;
      assert.equal(answer.exitStatus, 7);
      assert.deepEqual(status.exitedAt, answer.exitedAt);
      const exitedMs = timestampMs(answer.exitedAt);
      assert.ok(exitedMs !== undefined && exitedMs >= createdAtMs, 'exited_at is set and after the start');
      assert.deepEqual(await client.wait({ sandboxId: id }), answer);
      await client.shutdown({ sandboxId: id });
    }));

  test('once Status says NOTREADY it also says when the sandbox exited (exited_at = Wait\'s)', () =>
    withLog(daemon, async () => {
      const client = d().client(ns);
      // Status is read as fast as it answers while the exit is being recorded.
      const incomplete: string[] = [];
      for (let i = 0; i < 6; i++) {
        const id = `notready-${i}`;
        const gate = path.join(d().dir, `gate-${id}`);
        await createAndStart(d(), client, id, {
          sandbox: {
            sandboxId: id,
            runtime: { name: 'io.containerd.tsbox.v1' },
            spec: ociSpec(['sh', '-c', `while [ ! -e '${gate}' ]; do sleep 0.01; done; exit 7`]),
          },
        });
        writeFileSync(gate, '');
        const notReady = await waitFor(
          async () => {
            const s = await client.status({ sandboxId: id });
            return s.state === 'SANDBOX_NOTREADY' ? s : undefined;
          },
          { what: `${id} to turn SANDBOX_NOTREADY`, timeoutMs: 10_000, intervalMs: 0 },
        );
        const answer = await client.wait({ sandboxId: id });
        if (notReady.pid !== 0 || timestampMs(notReady.exitedAt) !== timestampMs(answer.exitedAt)) {
          incomplete.push(`${id}: pid ${notReady.pid}, exited_at ${JSON.stringify(notReady.exitedAt)} (Wait: ${JSON.stringify(answer.exitedAt)})`);
        }
        await client.shutdown({ sandboxId: id });
      }
      assert.deepEqual(incomplete, [], `NOTREADY answers without the exit:\n${incomplete.join('\n')}`);
    }));

  test('a process that exits at once still reports its own exit status (not 255)', () =>
    withLog(daemon, async () => {
      const client = d().client(ns);
      // An exit right after exec races with tsbox reading the new process; repeat to catch it.
      const answers: number[] = [];
      const runs = 16;
      for (let i = 0; i < runs; i++) {
        const id = `exits-at-once-${i}`;
        await createAndStart(d(), client, id, {
          sandbox: { sandboxId: id, runtime: { name: 'io.containerd.tsbox.v1' }, spec: ociSpec(['sh', '-c', 'exit 7']) },
        });
        const answer = await client.wait({ sandboxId: id }, { timeoutMs: 10_000 });
        assert.ok(answer.exitedAt !== undefined);
        assert.equal((await client.status({ sandboxId: id })).state, 'SANDBOX_NOTREADY');
        answers.push(answer.exitStatus);
        await client.shutdown({ sandboxId: id });
      }
      assert.deepEqual(answers, Array<number>(runs).fill(7), `exit statuses reported: ${answers.join(', ')}`);
    }));

  test('a process killed from outside (SIGKILL from the host) reports 137', () =>
    withLog(daemon, async () => {
      const client = d().client(ns);
      const id = 'killed-outside';
      const { pid } = await createAndStart(d(), client, id, {
        sandbox: { sandboxId: id, runtime: { name: 'io.containerd.tsbox.v1' }, spec: ociSpec(['sleep', '1000']) },
      });
      const waiting = client.wait({ sandboxId: id });
      process.kill(pid, 'SIGKILL');
      const answer = await waiting;
      assert.equal(answer.exitStatus, 137);
      assert.ok(answer.exitedAt !== undefined);
      const status = await client.status({ sandboxId: id });
      assert.equal(status.state, 'SANDBOX_NOTREADY');
      assert.equal(status.pid, 0);
      await client.shutdown({ sandboxId: id });
    }));

  test("the pod's hostname is what the sandbox sees, in its own pid namespace", () =>
    withLog(daemon, async () => {
      const client = d().client(ns);
      const id = 'hostname';
      const hostname = 'it-pod-host';
      // The scripts below outlive their Start; an exit within Start is the test above.
      assert.notEqual(os.hostname(), hostname);
      await createAndStart(d(), client, id, {
        options: podSandboxConfig({ name: 'hostname-pod', uid: 'uid-1', namespace: 'default', hostname }),
        sandbox: {
          sandboxId: id,
          runtime: { name: 'io.containerd.tsbox.v1' },
          spec: ociSpec(['sh', '-c', 'echo "hostname=$(cat /proc/sys/kernel/hostname)"; echo "pid=$$"; sleep 0.3']),
        },
      });
      assert.equal((await client.wait({ sandboxId: id }, { timeoutMs: 10_000 })).exitStatus, 0);
      const console = readFileSync(path.join(d().sandboxDir(ns, id), 'console.log'), 'utf8');
      assert.match(console, new RegExp(`^hostname=${hostname}$`, 'm'), `console.log: ${console}`);
      assert.match(console, /^pid=1$/m, `console.log: ${console}`);
      assert.notEqual(os.hostname(), hostname, "the host's own hostname must not change");
      await client.shutdown({ sandboxId: id });
    }));

  test("without a pod config, the OCI spec's hostname is used", () =>
    withLog(daemon, async () => {
      const client = d().client(ns);
      const id = 'oci-hostname';
      await createAndStart(d(), client, id, {
        sandbox: {
          sandboxId: id,
          runtime: { name: 'io.containerd.tsbox.v1' },
          spec: ociSpec(['sh', '-c', 'cat /proc/sys/kernel/hostname; sleep 0.3'], { hostname: 'oci-spec-host' }),
        },
      });
      assert.equal((await client.wait({ sandboxId: id }, { timeoutMs: 10_000 })).exitStatus, 0);
      const console = readFileSync(path.join(d().sandboxDir(ns, id), 'console.log'), 'utf8');
      assert.equal(console.trim(), 'oci-spec-host');
      await client.shutdown({ sandboxId: id });
    }));

  test("CRI's metadata extension alone gives the hostname", () =>
    withLog(daemon, async () => {
      const client = d().client(ns);
      const id = 'metadata-hostname';
      await createAndStart(d(), client, id, {
        sandbox: {
          sandboxId: id,
          runtime: { name: 'io.containerd.tsbox.v1' },
          spec: ociSpec(['sh', '-c', 'cat /proc/sys/kernel/hostname; sleep 0.3']),
          extensions: { metadata: criMetadata(id, 'metadata-host') },
        },
      });
      await client.wait({ sandboxId: id }, { timeoutMs: 10_000 });
      const console = readFileSync(path.join(d().sandboxDir(ns, id), 'console.log'), 'utf8');
      assert.equal(console.trim(), 'metadata-host');
      await client.shutdown({ sandboxId: id });
    }));

  test('a command that does not exist: Start fails with FAILED_PRECONDITION and leaves nothing running', () =>
    withLog(daemon, async () => {
      const client = d().client(ns);
      const id = 'no-such-command';
      const command = 'tsbox-it-no-such-command';
      d().track(ns, id);
      await client.create({
        sandboxId: id,
        sandbox: { sandboxId: id, runtime: { name: 'io.containerd.tsbox.v1' }, spec: ociSpec([command, '--flag']) },
      });
      const err = await expectCode(client.start({ sandboxId: id }), GrpcStatus.FAILED_PRECONDITION, command);
      assert.doesNotMatch(err.details, /internal/i);

      const dir = d().sandboxDir(ns, id);
      await waitFor(() => processesNaming(dir).length === 0, {
        what: `no process naming ${dir} after the failed Start`,
        timeoutMs: 5000,
        describe: () => `still there: ${processesNaming(dir).join(', ')}`,
      });
      for (const cgroup of sandboxCgroupDirs(ns, id)) assert.equal(existsSync(cgroup), false, `${cgroup} left behind`);

      const status = await client.status({ sandboxId: id });
      assert.equal(status.state, 'SANDBOX_UNKNOWN');
      assert.equal(status.pid, 0);
      assert.equal(status.createdAt, undefined);

      // It is still just created: another Start fails the same way, and a Stop is OK.
      await expectCode(client.start({ sandboxId: id }), GrpcStatus.FAILED_PRECONDITION, command);
      await client.stop({ sandboxId: id, timeoutSecs: 0 });
      const answer = await client.wait({ sandboxId: id }, { timeoutMs: 5000 });
      assert.ok(answer.exitedAt !== undefined);
      await client.shutdown({ sandboxId: id });
      await expectCode(client.status({ sandboxId: id }), GrpcStatus.NOT_FOUND);
    }));

  test('a network namespace that does not exist: Start fails and cleans up', () =>
    withLog(daemon, async () => {
      const client = d().client(ns);
      const id = 'bad-netns';
      const missing = path.join(d().dir, 'no-such-netns');
      d().track(ns, id);
      await client.create({ sandboxId: id, netnsPath: missing, sandbox: { sandboxId: id, runtime: { name: 'io.containerd.tsbox.v1' } } });
      const err = await expectCode(client.start({ sandboxId: id }), GrpcStatus.FAILED_PRECONDITION);
      assert.ok(err.details.includes(missing), `"${err.details}" should name ${missing}`);
      const dir = d().sandboxDir(ns, id);
      await waitFor(() => processesNaming(dir).length === 0, { what: `no process naming ${dir}`, timeoutMs: 5000 });
      for (const cgroup of sandboxCgroupDirs(ns, id)) assert.equal(existsSync(cgroup), false, `${cgroup} left behind`);
      assert.equal((await client.status({ sandboxId: id })).state, 'SANDBOX_UNKNOWN');
      await client.shutdown({ sandboxId: id });
    }));

  test('a netns_path that names a FIFO: Start fails at once naming it, Shutdown works, nothing is left', () =>
    withLog(daemon, async () => {
      const client = d().client(ns);
      const id = 'fifo-netns';
      const fifo = path.join(d().dir, 'not-a-netns');
      assert.equal(spawnSync('mkfifo', [fifo]).status, 0);
      d().track(ns, id);
      await client.create({ sandboxId: id, netnsPath: fifo, sandbox: { sandboxId: id, runtime: { name: 'io.containerd.tsbox.v1' } } });
      const err = await expectCode(client.start({ sandboxId: id }, { timeoutMs: 10_000 }), GrpcStatus.FAILED_PRECONDITION);
      assert.match(err.details, /is not a network namespace/);
      assert.ok(err.details.includes(fifo));
      const dir = d().sandboxDir(ns, id);
      await waitFor(() => processesNaming(dir).length === 0, { what: `no process naming ${dir}`, timeoutMs: 5000 });
      for (const cgroup of sandboxCgroupDirs(ns, id)) assert.equal(existsSync(cgroup), false, `${cgroup} left behind`);
      await client.shutdown({ sandboxId: id }, { timeoutMs: 5000 });
      await expectCode(client.status({ sandboxId: id }), GrpcStatus.NOT_FOUND);
    }));

  test('netns_path: the sandbox runs in the network namespace it was given', () =>
    withLog(daemon, async () => {
      const client = d().client(ns);
      const id = 'netns';
      const netns = createNetns(`tsbox-it-${process.pid}`, d().dir);
      netnsToRemove.push(netns);
      const { pid } = await createAndStart(d(), client, id, {
        netnsPath: netns.path,
        sandbox: { sandboxId: id, runtime: { name: 'io.containerd.tsbox.v1' } },
      });
      const sandboxNet = statSync(`/proc/${pid}/ns/net`).ino;
      assert.equal(sandboxNet, statSync(netns.path).ino, 'the sandbox should be in the given network namespace');
      assert.notEqual(sandboxNet, statSync('/proc/self/ns/net').ino);
      assert.ok(alive(pid));
      await client.stop({ sandboxId: id, timeoutSecs: 0 });
      assert.equal((await client.wait({ sandboxId: id })).exitStatus, 137);
      await client.shutdown({ sandboxId: id });
    }));
});

describe('a supervisor that never answers its start handshake', () => {
  test('fails that Start after start_timeout_ms, kills what it started, and frees the sandbox for Shutdown', async () => {
    const scratch = mkdtempSync(path.join(os.tmpdir(), 'tsbox-mute-'));
    const mute = path.join(scratch, 'mute-supervisor');
    // Takes the supervisor's place: runs, never answers, never exits by itself (the state
    // dir lock and the serving processes that start supervisors are still the real binary's).
    const sleep = '7431.25'; // a duration nothing else on the machine sleeps for
    writeFileSync(mute, `#!/bin/sh\ncase "$1" in lock|serve) exec ${tsboxShim} "$@";; esac\nexec sleep ${sleep}\n`, { mode: 0o755 });
    const daemon = await startSandboxerDaemon(tsboxSandboxer({ args: ['--shim-path', mute, '--start-timeout-ms', '400'] }), { label: 'tsbox-mute-' });
    const ns = uniqueNamespace('mute');
    try {
      await withLog(daemon, async () => {
        const client = daemon.client(ns);
        const id = 'mute';
        daemon.track(ns, id);
        await client.create({ sandboxId: id, sandbox: { sandboxId: id, runtime: { name: 'io.containerd.tsbox.v1' } } });
        const err = await expectCode(client.start({ sandboxId: id }, { timeoutMs: 10_000 }), GrpcStatus.FAILED_PRECONDITION);
        assert.match(err.details, /did not answer within 400 ms/);
        await waitFor(() => processesNaming(sleep).length === 0, {
          what: 'the mute supervisor killed',
          timeoutMs: 5000,
          describe: () => `still running: ${processesNaming(sleep).join(', ')}`,
        });
        assert.equal((await client.status({ sandboxId: id })).state, 'SANDBOX_UNKNOWN', 'still just created');
        await client.shutdown({ sandboxId: id }, { timeoutMs: 5000 });
        await expectCode(client.status({ sandboxId: id }), GrpcStatus.NOT_FOUND);
      });
    } finally {
      await daemon.teardown();
      rmSync(scratch, { recursive: true, force: true });
    }
  });

  test('that Start also ends a child the sandbox forked into a session of its own, and removes the cgroup', async () => {
    const scratch = mkdtempSync(path.join(os.tmpdir(), 'tsbox-mute-'));
    const mute = path.join(scratch, 'mute-forking-supervisor');
    // Takes the supervisor's place: joins the cgroups it is given, as the real one does, then
    // forks a child that leaves its process group (so only the cgroup holds it) and ignores
    // SIGTERM, and never answers.
    const child = '7431.5';
    const supervisor = '7431.75';
    writeFileSync(
      mute,
      [
        '#!/bin/sh',
        // The state dir lock and the serving processes are still the real binary's.
        `case "$1" in lock|serve) exec ${tsboxShim} "$@";; esac`,
        'while [ $# -gt 0 ]; do',
        '  if [ "$1" = --cgroup ]; then echo $$ > "$2/cgroup.procs"; shift; fi',
        '  shift',
        'done',
        `setsid sh -c 'trap "" TERM; exec sleep ${child}' &`,
        `exec sleep ${supervisor}`,
        '',
      ].join('\n'),
      { mode: 0o755 },
    );
    const daemon = await startSandboxerDaemon(tsboxSandboxer({ args: ['--shim-path', mute, '--start-timeout-ms', '500'] }), { label: 'tsbox-mute-' });
    const ns = uniqueNamespace('mutefork');
    try {
      await withLog(daemon, async () => {
        const client = daemon.client(ns);
        const id = 'forks';
        daemon.track(ns, id);
        await client.create({ sandboxId: id, sandbox: { sandboxId: id, runtime: { name: 'io.containerd.tsbox.v1' } } });
        const err = await expectCode(client.start({ sandboxId: id }, { timeoutMs: 15_000 }), GrpcStatus.FAILED_PRECONDITION);
        assert.match(err.details, /did not answer within 500 ms/);
        // The Start answers only once its clean-up is over: nothing of it is left by then.
        assert.deepEqual(processesNaming(child), [], 'the forked child outlived the failed Start');
        assert.deepEqual(processesNaming(supervisor), [], 'the supervisor outlived the failed Start');
        for (const cgroup of sandboxCgroupDirs(ns, id)) assert.equal(existsSync(cgroup), false, `${cgroup} left behind`);
        await client.shutdown({ sandboxId: id }, { timeoutMs: 5000 });
        await expectCode(client.status({ sandboxId: id }), GrpcStatus.NOT_FOUND);
      });
    } finally {
      await daemon.teardown();
      rmSync(scratch, { recursive: true, force: true });
    }
  });
});
