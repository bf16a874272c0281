/**
 * The ttrpc server and client (src/ttrpc/) over a real unix socket: calls typed and raw, the
 * statuses callers get for errors, deadlines, many calls at once on one connection, connections
 * lost from either side, stream-id rules, and the connection bound.
 */
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { pino } from 'pino';
import { GRPC_CODES, TsboxError, abortError } from '../../src/base/errors.js';
import { ConnectRequest, TaskService } from '../../src/gen/containerd/task/v3/shim.js';
import { TtrpcClient, TtrpcError } from '../../src/ttrpc/client.js';
import { TtrpcServer, type TtrpcCallContext } from '../../src/ttrpc/server.js';
import { makeTempDir, removeTree, waitFor } from '../support/processes.js';
import { NAMESPACE_KEY, RawTtrpc, TEST_SERVICE, addTestMethods, requestFrame } from '../support/ttrpc-peer.js';

const logger = pino({ level: 'silent' });

async function expectStatus(call: Promise<unknown>, code: number, message?: RegExp): Promise<TtrpcError> {
  const err = await call.then(
    () => assert.fail(`expected status ${code}, the call succeeded`),
    (e: unknown) => e,
  );
  assert.ok(err instanceof TtrpcError, `expected a TtrpcError, got ${String(err)}`);
  assert.equal(err.code, code, err.message);
  if (message !== undefined) assert.match(err.message, message);
  return err;
}

describe('ttrpc over a unix socket', () => {
  let dir = '';
  let socketPath = '';
  let server: TtrpcServer;
  let client: TtrpcClient;
  /** Signals of the Gate calls, in order; each call waits until released. */
  const gates: { release(): void; ctx: TtrpcCallContext }[] = [];

  before(async () => {
    dir = await makeTempDir('tsbox-ttrpc-');
    socketPath = path.join(dir, 'task.sock');
    server = new TtrpcServer({ logger, maxConnections: 8 });
    addTestMethods(server);
    server.register(
      TEST_SERVICE,
      'Gate',
      (payload, ctx) =>
        new Promise((resolve, reject) => {
          gates.push({ release: () => resolve(payload), ctx });
          ctx.signal.addEventListener('abort', () => reject(abortError(ctx.signal)), { once: true });
        }),
    );
    await server.listen(socketPath, 0o600);
    client = await TtrpcClient.connect(socketPath);
  });

  after(async () => {
    client.close();
    await server.close(1000);
    await removeTree(dir);
  });

  test('a typed Task API call and a raw call with metadata are answered', async () => {
    const connected = await client.request(TaskService.connect, ConnectRequest.fromPartial({ id: 'c0ffee' }));
    assert.deepEqual(connected, { shimPid: process.pid, taskPid: 6, version: '' });
    const echoed = await client.call(TEST_SERVICE, 'Echo', Buffer.from('ping'));
    assert.equal(echoed.toString(), 'ping');
    const ns = await client.call(TEST_SERVICE, 'Namespace', Buffer.alloc(0), { metadata: { [NAMESPACE_KEY]: 'k8s.io' } });
    assert.equal(ns.toString(), 'k8s.io');
  });

  test('errors reach the caller as statuses: the error kind, INTERNAL without internals, UNIMPLEMENTED, INVALID_ARGUMENT', async () => {
    await expectStatus(client.call(TEST_SERVICE, 'Fail', Buffer.from('task x')), GRPC_CODES.NotFound, /^no such thing: task x$/);
    const crash = await expectStatus(client.call(TEST_SERVICE, 'Crash', Buffer.alloc(0)), GRPC_CODES.Internal);
    assert.doesNotMatch(crash.message, /secret/);
    await expectStatus(client.call(TEST_SERVICE, 'NoSuchMethod', Buffer.alloc(0)), GRPC_CODES.Unimplemented, /NoSuchMethod/);
    await expectStatus(client.call('containerd.task.v3.Task', 'Checkpoint', Buffer.alloc(0)), GRPC_CODES.Unimplemented);
    await expectStatus(client.call('no.such.Service', 'Echo', Buffer.alloc(0)), GRPC_CODES.Unimplemented);
    // A Connect request that does not decode (a truncated field).
    await expectStatus(client.call('containerd.task.v3.Task', 'Connect', Buffer.from([0x0a, 0x05, 0x61])), GRPC_CODES.InvalidArgument);
    // The connection serves on.
    assert.equal((await client.call(TEST_SERVICE, 'Echo', Buffer.from('still'))).toString(), 'still');
  });

  test("a call past its timeout is answered DEADLINE_EXCEEDED by the server, and its handler's signal fires", async () => {
    const err = await expectStatus(client.call(TEST_SERVICE, 'Gate', Buffer.alloc(0), { timeoutMs: 200 }), GRPC_CODES.DeadlineExceeded);
    // The server's answer, not the client's backstop timer.
    assert.equal(err.message, 'deadline exceeded');
    const gate = gates.at(-1);
    assert.ok(gate !== undefined);
    assert.ok(gate.ctx.signal.aborted);
    assert.ok(gate.ctx.signal.reason instanceof TsboxError && gate.ctx.signal.reason.kind === 'DeadlineExceeded');
    await waitFor(() => server.callsInFlight === 0, { what: 'the timed-out call to end' });
  });

  test('a hundred calls at once on one connection, answered in reverse order, each with its own answer', async () => {
    const before = gates.length;
    const calls = Array.from({ length: 100 }, (_, i) => client.call(TEST_SERVICE, 'Gate', Buffer.from(`call ${i}`)));
    await waitFor(() => gates.length - before === 100, { what: 'all hundred calls in their handlers' });
    assert.equal(server.callsInFlight, 100);
    // A quick call is not held up by the hundred pending ones.
    assert.equal((await client.call(TEST_SERVICE, 'Echo', Buffer.from('quick'))).toString(), 'quick');
    for (const gate of gates.slice(before).reverse()) gate.release();
    const answers = await Promise.all(calls);
    assert.deepEqual(
      answers.map((a) => a.toString()),
      Array.from({ length: 100 }, (_, i) => `call ${i}`),
    );
  });

  test('a client that goes away: its calls fail UNAVAILABLE on its side and their handlers are cancelled', async () => {
    const other = await TtrpcClient.connect(socketPath);
    const before = gates.length;
    const held = other.call(TEST_SERVICE, 'Gate', Buffer.alloc(0));
    await waitFor(() => gates.length > before, { what: 'the call in its handler' });
    other.close();
    await expectStatus(held, GRPC_CODES.Unavailable);
    await expectStatus(other.call(TEST_SERVICE, 'Echo', Buffer.alloc(0)), GRPC_CODES.Unavailable);
    const gate = gates.at(-1);
    await waitFor(() => gate?.ctx.signal.aborted === true, { what: "the handler's signal" });
    assert.ok(gate?.ctx.signal.reason instanceof TsboxError && gate.ctx.signal.reason.kind === 'Cancelled');
    await waitFor(() => server.callsInFlight === 0, { what: 'the cancelled call to end' });
  });

  test('stream ids: an even id and a reused id are refused INVALID_ARGUMENT on that stream; the connection serves on', async () => {
    const raw = await RawTtrpc.connect(socketPath);
    try {
      await raw.write(requestFrame(2, TEST_SERVICE, 'Echo', Buffer.from('even')));
      await raw.write(requestFrame(5, TEST_SERVICE, 'Echo', Buffer.from('five')));
      await raw.write(requestFrame(3, TEST_SERVICE, 'Echo', Buffer.from('back')));
      await raw.write(requestFrame(7, TEST_SERVICE, 'Echo', Buffer.from('seven')));
      assert.ok(await raw.until(() => raw.responses.length === 4, 5000), `answers: ${JSON.stringify(raw.responses)}`);
      assert.equal(raw.response(2)?.code, GRPC_CODES.InvalidArgument);
      assert.equal(raw.response(3)?.code, GRPC_CODES.InvalidArgument);
      assert.equal(raw.response(5)?.payload.toString(), 'five');
      assert.equal(raw.response(7)?.payload.toString(), 'seven');
      assert.equal(raw.closed, false);
    } finally {
      raw.destroy();
    }
  });

  test('when every slot is taken, the longest-idle connection makes room; connections carrying calls are kept', async () => {
    await waitFor(() => server.connectionCount === 1, { what: 'only the test client connected' });
    const idle = await Promise.all(Array.from({ length: 7 }, () => RawTtrpc.connect(socketPath)));
    try {
      await waitFor(() => server.connectionCount === 8, { what: 'eight connections' });
      // The test client holds a call, so the idle ones are the ones to go.
      const before = gates.length;
      const held = client.call(TEST_SERVICE, 'Gate', Buffer.from('held'));
      await waitFor(() => gates.length > before, { what: 'the held call' });
      const fresh = await TtrpcClient.connect(socketPath);
      try {
        assert.equal((await fresh.call(TEST_SERVICE, 'Echo', Buffer.from('in'), { timeoutMs: 1000 })).toString(), 'in');
      } finally {
        fresh.close();
      }
      assert.ok(await idle[0]?.closedWithin(1000), 'the longest-idle connection was not the one closed');
      gates.at(-1)?.release();
      assert.equal((await held).toString(), 'held');
    } finally {
      for (const raw of idle) raw.destroy();
    }
  });

  test('shutdown answers pending calls UNAVAILABLE, refuses new connections and removes the socket', async () => {
    const own = new TtrpcServer({ logger });
    addTestMethods(own);
    const ownPath = path.join(dir, 'closing.sock');
    await own.listen(ownPath, 0o600);
    const caller = await TtrpcClient.connect(ownPath);
    const held = caller.call(TEST_SERVICE, 'Hold', Buffer.alloc(0));
    await waitFor(() => own.callsInFlight === 1, { what: 'the held call' });
    const refused = expectStatus(held, GRPC_CODES.Unavailable, /shutting down/);
    await own.close(1000);
    await refused;
    assert.equal(existsSync(ownPath), false);
    await caller.closed;
    await assert.rejects(TtrpcClient.connect(ownPath));
  });
});
