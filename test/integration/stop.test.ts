/**
 * Stop with a grace period (tsbox's extension: SIGTERM, then SIGKILL after timeout_secs), and
 * what a client deadline or cancel does to Wait and Stop: it ends that one call and changes
 * nothing else (SPEC.md section 3).
 */
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { uniqueNamespace } from '../support/host.js';
import { type TsboxDaemon, startTsbox, waitFor } from '../support/tsbox-daemon.js';
import { GrpcStatus, expectCode, timestampMs } from '../support/grpc-client.js';
import { alive, createAndStart, delay, ociSpec, procExists, withLog } from './fixtures.js';
import { readdirSync, readlinkSync } from 'node:fs';

const TRAPS_TERM = 'trap "exit 0" TERM; while :; do sleep 0.1; done';
const IGNORES_TERM = 'trap "" TERM; while :; do sleep 0.1; done';

function shSandbox(id: string, script: string) {
  return { sandbox: { sandboxId: id, runtime: { name: 'io.containerd.tsbox.v1' }, spec: ociSpec(['sh', '-c', script]) } };
}

/** The sandbox's record as tsbox wrote it. */
function recordOf(daemon: TsboxDaemon, namespace: string, id: string): { state: string; killAt?: { seconds: number; nanos: number } } {
  return JSON.parse(readFileSync(path.join(daemon.sandboxDir(namespace, id), 'record.json'), 'utf8')) as { state: string; killAt?: { seconds: number; nanos: number } };
}

describe('Stop with a grace period', () => {
  let daemon: TsboxDaemon | undefined;
  const ns = uniqueNamespace('stop');

  before(async () => {
    daemon = await startTsbox('tsbox-stop');
  });

  after(async () => {
    await daemon?.teardown();
  });

  function d(): TsboxDaemon {
    assert.ok(daemon !== undefined, 'daemon not started');
    return daemon;
  }


  test('Stop(2) on a process that exits on SIGTERM: Wait returns its own status 0, not 137', () =>
    withLog(daemon, async () => {
      const client = d().client(ns);
      const id = 'traps-term';
      const { pid } = await createAndStart(d(), client, id, shSandbox(id, TRAPS_TERM));
      await client.stop({ sandboxId: id, timeoutSecs: 2 });
      assert.equal(procExists(pid), false, 'Stop returned before the process was gone');
      const answer = await client.wait({ sandboxId: id });
      // 0, not 137: the process ended on SIGTERM and never needed the SIGKILL.
      assert.equal(answer.exitStatus, 0);
      await client.shutdown({ sandboxId: id });
    }));

  test('Stop(2) on a process that ignores SIGTERM: killed after the grace period, Wait 137', () =>
    withLog(daemon, async () => {
      const client = d().client(ns);
      const id = 'ignores-term';
      const { pid } = await createAndStart(d(), client, id, shSandbox(id, IGNORES_TERM));
      const began = Date.now();
      const stopping = client.stop({ sandboxId: id, timeoutSecs: 2 });
      await delay(1000);
      const aliveAfterOneSecond = alive(pid);
      await stopping;
      const tookMs = Date.now() - began;
      assert.ok(aliveAfterOneSecond, 'the process was killed before its grace period was over');
      assert.equal(procExists(pid), false, 'Stop returned before the process was gone');
      assert.ok(tookMs >= 1500, `Stop returned after ${tookMs} ms, before the 2 s grace period`);
      const answer = await client.wait({ sandboxId: id });
      assert.equal(answer.exitStatus, 137);
      await client.shutdown({ sandboxId: id });
    }));

  test('Stop(2) on the default pause process: it exits 0 on SIGTERM', () =>
    withLog(daemon, async () => {
      const client = d().client(ns);
      const id = 'pause';
      const { pid } = await createAndStart(d(), client, id);
      await client.stop({ sandboxId: id, timeoutSecs: 2 });
      assert.equal(procExists(pid), false);
      assert.equal((await client.wait({ sandboxId: id })).exitStatus, 0);
      await client.shutdown({ sandboxId: id });
    }));

  test('Stop with a grace period beyond what a timer holds (2^32-1 s) still waits for the process; it never kills at once', () =>
    withLog(daemon, async () => {
      const client = d().client(ns);
      const id = 'huge-grace';
      const { pid } = await createAndStart(d(), client, id, shSandbox(id, IGNORES_TERM));
      await expectCode(client.stop({ sandboxId: id, timeoutSecs: 4_294_967_295 }, { timeoutMs: 1500 }), GrpcStatus.DEADLINE_EXCEEDED);
      assert.ok(alive(pid), 'SIGTERM is ignored and the grace period has not passed');
      assert.equal((await client.status({ sandboxId: id })).state, 'SANDBOX_READY');
      await client.stop({ sandboxId: id, timeoutSecs: 0 });
      assert.equal((await client.wait({ sandboxId: id })).exitStatus, 137);
      await client.shutdown({ sandboxId: id });
    }));

  test('Shutdown during a long graceful Stop kills the sandbox at once; Stop and Wait return', () =>
    withLog(daemon, async () => {
      const client = d().client(ns);
      const id = 'shutdown-during-stop';
      const { pid } = await createAndStart(d(), client, id, shSandbox(id, IGNORES_TERM));
      const waiting = client.wait({ sandboxId: id });
      const stopping = client.stop({ sandboxId: id, timeoutSecs: 30 });
      // The Stop has sent SIGTERM, which the process ignores; it would be killed only after 30 s.
      await client.status({ sandboxId: id });
      assert.ok(alive(pid));
      await client.shutdown({ sandboxId: id }, { timeoutMs: 10_000 });
      assert.equal(procExists(pid), false);
      await stopping;
      assert.equal((await waiting).exitStatus, 137);
      await expectCode(client.status({ sandboxId: id }), GrpcStatus.NOT_FOUND);
    }));
});

describe('deadlines and cancellation', () => {
  let daemon: TsboxDaemon | undefined;
  const ns = uniqueNamespace('deadline');

  before(async () => {
    daemon = await startTsbox('tsbox-deadline');
  });

  after(async () => {
    await daemon?.teardown();
  });

  function d(): TsboxDaemon {
    assert.ok(daemon !== undefined, 'daemon not started');
    return daemon;
  }

  test('Wait with a 200 ms deadline ends DEADLINE_EXCEEDED and changes nothing', () =>
    withLog(daemon, async () => {
      const client = d().client(ns);
      const id = 'wait-deadline';
      const { pid } = await createAndStart(d(), client, id);
      await expectCode(client.wait({ sandboxId: id }, { timeoutMs: 200 }), GrpcStatus.DEADLINE_EXCEEDED);
      const status = await client.status({ sandboxId: id });
      assert.equal(status.state, 'SANDBOX_READY');
      assert.equal(status.pid, pid);
      assert.ok(alive(pid));

      // A later Wait still gets the exit.
      const waiting = client.wait({ sandboxId: id });
      await client.stop({ sandboxId: id, timeoutSecs: 0 });
      assert.equal((await waiting).exitStatus, 137);
      await client.shutdown({ sandboxId: id });
    }));

  test('a Wait whose 1 s deadline passes is answered by tsbox before the deadline, so that a proxy in between can pass DEADLINE_EXCEEDED on', () =>
    withLog(daemon, async () => {
      const client = d().client(ns);
      const id = 'wait-answered-early';
      await createAndStart(d(), client, id);
      // grpc-js's client says "Deadline exceeded after ..." when its own timer ends the call;
      // tsbox's answer says "deadline exceeded". containerd's server resets its caller's
      // stream at the same deadline: only an answer from tsbox that comes first lets
      // containerd's caller see DEADLINE_EXCEEDED rather than CANCELLED.
      for (let i = 0; i < 5; i++) {
        const err = await expectCode(client.wait({ sandboxId: id }, { timeoutMs: 1000 }), GrpcStatus.DEADLINE_EXCEEDED);
        assert.equal(err.details, 'deadline exceeded', `Wait ${i + 1} was ended by the client's own timer: ${err.details}`);
      }
      await client.stop({ sandboxId: id, timeoutSecs: 0 });
      await client.shutdown({ sandboxId: id });
    }));

  test('a cancelled Wait ends CANCELLED; the other waiters still get the exit', () =>
    withLog(daemon, async () => {
      const client = d().client(ns);
      const id = 'wait-cancel';
      const { pid } = await createAndStart(d(), client, id);
      const other = d().newClient(ns).wait({ sandboxId: id });
      const abort = new AbortController();
      const cancelled = client.wait({ sandboxId: id }, { signal: abort.signal });
      // Let the call reach the server before cancelling it.
      await client.status({ sandboxId: id });
      abort.abort();
      await expectCode(cancelled, GrpcStatus.CANCELLED);

      const status = await client.status({ sandboxId: id });
      assert.equal(status.state, 'SANDBOX_READY');
      assert.equal(status.pid, pid);
      await client.stop({ sandboxId: id, timeoutSecs: 0 });
      assert.equal((await other).exitStatus, 137);
      await client.shutdown({ sandboxId: id });
    }));

  test('Stop with a 300 ms deadline on a slow process ends DEADLINE_EXCEEDED; a Stop(0) then stops it', () =>
    withLog(daemon, async () => {
      const client = d().client(ns);
      const id = 'stop-deadline';
      const { pid } = await createAndStart(d(), client, id, {
        sandbox: { sandboxId: id, runtime: { name: 'io.containerd.tsbox.v1' }, spec: ociSpec(['sh', '-c', IGNORES_TERM]) },
      });
      const waiting = client.wait({ sandboxId: id });
      await expectCode(client.stop({ sandboxId: id, timeoutSecs: 30 }, { timeoutMs: 300 }), GrpcStatus.DEADLINE_EXCEEDED);
      assert.ok(alive(pid), 'the process ignores SIGTERM and has 30 s of grace');
      assert.equal((await client.status({ sandboxId: id })).state, 'SANDBOX_READY');

      const began = Date.now();
      await client.stop({ sandboxId: id, timeoutSecs: 0 }, { timeoutMs: 10_000 });
      assert.ok(Date.now() - began < 10_000);
      assert.equal(procExists(pid), false);
      const answer = await waiting;
      assert.equal(answer.exitStatus, 137);
      assert.equal((await client.status({ sandboxId: id })).state, 'SANDBOX_NOTREADY');
      await client.shutdown({ sandboxId: id });
    }));
});

describe('a graceful Stop across a restart of tsbox', () => {
  test('the SIGKILL comes at the deadline in the record although tsbox was killed during the grace period', async () => {
    const daemon = await startTsbox('tsbox-stop-restart', { closeClientsOnExit: true });
    const ns = uniqueNamespace('stoprestart');
    try {
      await withLog(daemon, async () => {
        const client = daemon.client(ns);
        const id = 'grace-restart';
        const { pid } = await createAndStart(daemon, client, id, shSandbox(id, IGNORES_TERM));
        const stopping = client.stop({ sandboxId: id, timeoutSecs: 3 }).then(
          () => 'answered',
          (err: unknown) => `failed: ${(err as Error).message}`,
        );
        // The deadline is durable before the SIGTERM is sent.
        const killAt = await waitFor(() => recordOf(daemon, ns, id).killAt, { what: 'the kill deadline in the record', timeoutMs: 5000 });
        const killAtMs = killAt.seconds * 1000 + Math.floor(killAt.nanos / 1e6);
        await daemon.kill9();
        assert.match(await stopping, /^failed: /, 'the Stop in flight ends with the daemon');
        assert.ok(alive(pid), 'the sandbox ignores SIGTERM and its grace period has not passed');
        await daemon.start();
        const exit = await client.wait({ sandboxId: id }, { timeoutMs: 15_000 });
        assert.equal(exit.exitStatus, 137, 'killed by the SIGKILL at the deadline');
        assert.ok((timestampMs(exit.exitedAt) ?? 0) >= killAtMs, `exited at ${exit.exitedAt?.seconds}, before the deadline ${killAtMs} ms`);
        assert.equal(procExists(pid), false);
        const record = recordOf(daemon, ns, id);
        assert.equal(record.state, 'exited');
        assert.equal(record.killAt, undefined, 'the deadline is spent once the exit is recorded');
        await client.shutdown({ sandboxId: id });
      });
    } finally {
      await daemon.teardown();
    }
  });

  test('after kill -9 and a restart, Stops with the longest grace periods cut by their deadline, Shutdowns, a sandbox come and gone: tsbox holds no descriptor more than before', async () => {
    const daemon = await startTsbox('tsbox-stop-fds', { closeClientsOnExit: true });
    const ns = uniqueNamespace('stopfds');
    /** What tsbox's descriptors point at. */
    const fds = (): string[] => {
      assert.ok(daemon.pid !== undefined, 'tsbox runs');
      const pid = daemon.pid;
      return readdirSync(`/proc/${pid}/fd`).flatMap((fd) => {
        try {
          return [readlinkSync(`/proc/${pid}/fd/${fd}`)];
        } catch {
          return []; // closed meanwhile
        }
      });
    };
    try {
      await withLog(daemon, async () => {
        const client = daemon.client(ns);
        const ids = ['fds-a', 'fds-b'];
        const pids: number[] = [];
        for (const id of ids) pids.push((await createAndStart(daemon, client, id, shSandbox(id, IGNORES_TERM))).pid);
        await daemon.kill9();
        await daemon.start();
        // As a client sees it ready: a Status of each answered.
        for (const id of ids) assert.equal((await client.status({ sandboxId: id })).state, 'SANDBOX_READY');
        const before = fds();
        await Promise.all(
          [3_000_000, 4_294_967_295].map((timeoutSecs, i) =>
            expectCode(client.stop({ sandboxId: ids[i] as string, timeoutSecs }, { timeoutMs: 3000 }), GrpcStatus.DEADLINE_EXCEEDED),
          ),
        );
        for (const pid of pids) assert.ok(alive(pid), 'SIGTERM is ignored and the grace period has not passed');
        for (const id of ids) await client.shutdown({ sandboxId: id }, { timeoutMs: 10_000 });
        for (const pid of pids) assert.equal(procExists(pid), false, 'Shutdown ended the sandbox');
        // A sandbox started and removed after them: what it needs of tsbox is there already.
        await createAndStart(daemon, client, 'fds-c', shSandbox('fds-c', IGNORES_TERM));
        await client.shutdown({ sandboxId: 'fds-c' }, { timeoutMs: 10_000 });
        let after: string[] = [];
        await waitFor(
          () => {
            after = fds();
            return after.length <= before.length;
          },
          {
            what: `tsbox's descriptors back to ${before.length}`,
            timeoutMs: 10_000,
            describe: () => `now ${after.length}; new: ${after.filter((d) => !before.includes(d)).join(', ')}`,
          },
        );
      });
    } finally {
      await daemon.teardown();
    }
  });
});
