/**
 * Sandboxes are keyed by (containerd-namespace, sandbox_id) (SPEC.md section 3): the namespace
 * is required, both must be containerd identifiers, and the same id in two namespaces is two
 * sandboxes.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { uniqueNamespace } from '../support/host.js';
import { type TsboxDaemon, startTsbox } from '../support/tsbox-daemon.js';
import { GrpcStatus, expectCode } from '../support/grpc-client.js';
import { alive, createAndStart, withLog } from './fixtures.js';

describe('namespaces and sandbox ids', () => {
  let daemon: TsboxDaemon | undefined;
  const nsA = uniqueNamespace('ns-a');
  const nsB = uniqueNamespace('ns-b');

  before(async () => {
    daemon = await startTsbox('tsbox-ns');
  });

  after(async () => {
    await daemon?.teardown();
  });

  function d(): TsboxDaemon {
    assert.ok(daemon !== undefined, 'daemon not started');
    return daemon;
  }

  test('a call without containerd-namespace fails with FAILED_PRECONDITION "namespace is required"', () =>
    withLog(daemon, async () => {
      const client = d().client(nsA);
      const none = { namespace: null };
      await expectCode(client.create({ sandboxId: 'no-ns' }, none), GrpcStatus.FAILED_PRECONDITION, 'namespace is required');
      await expectCode(client.start({ sandboxId: 'no-ns' }, none), GrpcStatus.FAILED_PRECONDITION, 'namespace is required');
      await expectCode(client.status({ sandboxId: 'no-ns' }, none), GrpcStatus.FAILED_PRECONDITION, 'namespace is required');
      await expectCode(client.wait({ sandboxId: 'no-ns' }, none), GrpcStatus.FAILED_PRECONDITION, 'namespace is required');
      await expectCode(client.stop({ sandboxId: 'no-ns' }, none), GrpcStatus.FAILED_PRECONDITION, 'namespace is required');
      await expectCode(client.shutdown({ sandboxId: 'no-ns' }, none), GrpcStatus.FAILED_PRECONDITION, 'namespace is required');
      await expectCode(client.create({ sandboxId: 'no-ns' }, { namespace: '' }), GrpcStatus.FAILED_PRECONDITION, 'namespace is required');
      // Nothing was created in any namespace.
      await expectCode(client.status({ sandboxId: 'no-ns' }), GrpcStatus.NOT_FOUND);
    }));

  test('a malformed namespace or sandbox id is INVALID_ARGUMENT, for every RPC', () =>
    withLog(daemon, async () => {
      const client = d().client(nsA);
      for (const namespace of ['bad/ns', '-lead', 'trail-', 'dou..ble', 'sp ace', 'x'.repeat(77)]) {
        await expectCode(client.create({ sandboxId: 'ok-id' }, { namespace }), GrpcStatus.INVALID_ARGUMENT);
        await expectCode(client.status({ sandboxId: 'ok-id' }, { namespace }), GrpcStatus.INVALID_ARGUMENT);
        await expectCode(client.stop({ sandboxId: 'ok-id' }, { namespace }), GrpcStatus.INVALID_ARGUMENT);
      }
      for (const sandboxId of ['', 'bad/id', '../escape', 'a..b', '_x', 'with space', 'x'.repeat(77)]) {
        await expectCode(client.create({ sandboxId }), GrpcStatus.INVALID_ARGUMENT);
        await expectCode(client.start({ sandboxId }), GrpcStatus.INVALID_ARGUMENT);
        await expectCode(client.status({ sandboxId }), GrpcStatus.INVALID_ARGUMENT);
        await expectCode(client.wait({ sandboxId }), GrpcStatus.INVALID_ARGUMENT);
        await expectCode(client.stop({ sandboxId }), GrpcStatus.INVALID_ARGUMENT);
        await expectCode(client.shutdown({ sandboxId }), GrpcStatus.INVALID_ARGUMENT);
        await expectCode(client.platform({ sandboxId }), GrpcStatus.INVALID_ARGUMENT);
        await expectCode(client.metrics({ sandboxId }), GrpcStatus.INVALID_ARGUMENT);
        await expectCode(client.update({ sandboxId }), GrpcStatus.INVALID_ARGUMENT);
      }
      // The longest id containerd allows, and CRI's 64 hex digits, are fine.
      for (const sandboxId of ['a'.repeat(76), 'f'.repeat(64), 'A1.b_2-c']) {
        d().track(nsA, sandboxId);
        await client.create({ sandboxId });
        assert.equal((await client.status({ sandboxId })).state, 'SANDBOX_UNKNOWN');
        await client.shutdown({ sandboxId });
      }
    }));

  test('the same id in two namespaces is two independent sandboxes', () =>
    withLog(daemon, async () => {
      const a = d().client(nsA);
      const b = d().client(nsB);
      const id = 'shared-id';
      const startedA = await createAndStart(d(), a, id);
      await expectCode(b.status({ sandboxId: id }), GrpcStatus.NOT_FOUND);
      const startedB = await createAndStart(d(), b, id);
      assert.notEqual(startedA.pid, startedB.pid);
      assert.ok(alive(startedA.pid) && alive(startedB.pid));

      await a.stop({ sandboxId: id, timeoutSecs: 0 });
      assert.equal((await a.wait({ sandboxId: id })).exitStatus, 137);
      assert.equal((await a.status({ sandboxId: id })).state, 'SANDBOX_NOTREADY');
      const statusB = await b.status({ sandboxId: id });
      assert.equal(statusB.state, 'SANDBOX_READY');
      assert.equal(statusB.pid, startedB.pid);
      assert.ok(alive(startedB.pid), 'stopping it in one namespace must not touch the other');

      await a.shutdown({ sandboxId: id });
      await expectCode(a.status({ sandboxId: id }), GrpcStatus.NOT_FOUND);
      assert.equal((await b.status({ sandboxId: id })).state, 'SANDBOX_READY');
      assert.ok(alive(startedB.pid));

      await b.shutdown({ sandboxId: id });
      assert.equal(alive(startedB.pid), false);
    }));
});
