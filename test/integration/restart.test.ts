/**
 * tsbox comes back from a restart with every sandbox and every recorded exit (SPEC.md sections
 * 3 and 5): an exit that happened while it was down is answered at once, with the time it
 * happened, the same every time; exits recorded before, sandboxes never started and sandboxes
 * still running are found again.
 */
import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { uniqueNamespace } from '../support/host.js';
import { type TsboxDaemon, startTsbox } from '../support/tsbox-daemon.js';
import { GrpcStatus, expectCode, timestampMs } from '../support/grpc-client.js';
import { alive, createAndStart, ociSpec, procExists, waitFor, withLog } from './fixtures.js';

describe('restart durability', () => {
  let daemon: TsboxDaemon | undefined;
  const ns = uniqueNamespace('restart');

  before(async () => {
    daemon = await startTsbox('tsbox-restart');
  });

  after(async () => {
    await daemon?.teardown();
  });

  function d(): TsboxDaemon {
    assert.ok(daemon !== undefined, 'daemon not started');
    return daemon;
  }

  /** A sandbox whose process exits with `code` once the returned gate file exists. */
  async function gatedSandbox(id: string, code: number): Promise<{ pid: number; gate: string }> {
    const gate = path.join(d().dir, `gate-${id}`);
    const script = `while [ ! -e '${gate}' ]; do sleep 0.05; done; exit ${code}`;
    const { pid } = await createAndStart(d(), d().client(ns), id, {
      sandbox: { sandboxId: id, runtime: { name: 'io.containerd.tsbox.v1' }, spec: ociSpec(['sh', '-c', script]) },
    });
    return { pid, gate };
  }

  async function exitWhileDown(how: 'SIGTERM' | 'SIGKILL', id: string): Promise<void> {
    const { pid, gate } = await gatedSandbox(id, 42);
    if (how === 'SIGTERM') assert.equal((await d().stop()).code, 0);
    else await d().kill9();

    writeFileSync(gate, '');
    await waitFor(() => !procExists(pid), { what: `sandbox process ${pid} to exit while tsbox is down`, timeoutMs: 10_000 });
    const restartedAt = Date.now();
    await d().start();

    const client = d().client(ns);
    const answer = await client.wait({ sandboxId: id }, { timeoutMs: 5000 });
    assert.equal(answer.exitStatus, 42);
    const exitedMs = timestampMs(answer.exitedAt);
    assert.ok(exitedMs !== undefined, 'exited_at is always set');
    assert.ok(exitedMs < restartedAt, `exited_at ${new Date(exitedMs).toISOString()} should be before the restart`);

    const again = await Promise.all([client.wait({ sandboxId: id }), d().newClient(ns).wait({ sandboxId: id })]);
    for (const a of again) assert.deepEqual(a, answer);

    const status = await client.status({ sandboxId: id });
    assert.equal(status.state, 'SANDBOX_NOTREADY');
    assert.equal(status.pid, 0);
    assert.deepEqual(status.exitedAt, answer.exitedAt);

    // It stays so across one more restart.
    await d().stop();
    await d().start();
    assert.deepEqual(await d().client(ns).wait({ sandboxId: id }, { timeoutMs: 5000 }), answer);
    await d().client(ns).shutdown({ sandboxId: id });
  }

  test('an exit (42) while tsbox was stopped by SIGTERM is answered at once after the restart', () =>
    withLog(daemon, () => exitWhileDown('SIGTERM', 'exit-while-stopped')));

  test('an exit (42) while tsbox was killed (-9) is answered at once after the restart', () =>
    withLog(daemon, () => exitWhileDown('SIGKILL', 'exit-while-crashed')));

  test('a sandbox still running after a restart: its later exit reaches a pending Wait', () =>
    withLog(daemon, async () => {
      const id = 'exit-after-restart';
      const { pid, gate } = await gatedSandbox(id, 42);
      await d().stop();
      await d().start();
      const client = d().client(ns);
      const status = await client.status({ sandboxId: id });
      assert.equal(status.state, 'SANDBOX_READY');
      assert.equal(status.pid, pid);
      assert.ok(alive(pid));

      const waiting = client.wait({ sandboxId: id });
      await client.status({ sandboxId: id });
      writeFileSync(gate, '');
      const answer = await waiting;
      assert.equal(answer.exitStatus, 42);
      assert.equal((await client.status({ sandboxId: id })).state, 'SANDBOX_NOTREADY');
      await client.shutdown({ sandboxId: id });
    }));

  test('a recorded exit, a created sandbox and a removed one are as they were after a restart', () =>
    withLog(daemon, async () => {
      const client = d().client(ns);
      const stopped = 'stopped-before';
      await createAndStart(d(), client, stopped);
      await client.stop({ sandboxId: stopped, timeoutSecs: 0 });
      const before = await client.wait({ sandboxId: stopped });
      assert.equal(before.exitStatus, 137);

      const created = 'created-only';
      d().track(ns, created);
      await client.create({ sandboxId: created, sandbox: { sandboxId: created, runtime: { name: 'io.containerd.tsbox.v1' } } });

      const removed = 'removed-before';
      await createAndStart(d(), client, removed);
      await client.shutdown({ sandboxId: removed });

      await d().stop();
      await d().start();
      const fresh = d().client(ns);

      assert.deepEqual(await fresh.wait({ sandboxId: stopped }, { timeoutMs: 5000 }), before);
      assert.equal((await fresh.status({ sandboxId: stopped })).state, 'SANDBOX_NOTREADY');

      const createdStatus = await fresh.status({ sandboxId: created });
      assert.equal(createdStatus.state, 'SANDBOX_UNKNOWN');
      assert.equal(createdStatus.createdAt, undefined);
      const { pid } = await fresh.start({ sandboxId: created });
      d().track(ns, created, pid);
      assert.ok(pid > 0 && alive(pid));

      await expectCode(fresh.status({ sandboxId: removed }), GrpcStatus.NOT_FOUND);

      await fresh.shutdown({ sandboxId: stopped });
      await fresh.shutdown({ sandboxId: created });
      assert.equal(procExists(pid), false);
    }));
});
