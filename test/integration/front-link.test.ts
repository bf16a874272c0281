/**
 * The task front (native/tsbox-front.c) between clients and a tsbox played by the test on the
 * backend socket, frame by frame: each request goes to tsbox on a stream id of the front's own
 * and each answer back to the client's stream; a client that closes with calls kept makes the
 * front send tsbox a Cancel request of its own (src/ttrpc/front-link.ts) naming them; a client
 * that names the front's service is closed, while other requests, and bytes that are no
 * request, are relayed; kept requests go to the next tsbox, numbered again from 1 in the order
 * they came.
 */
import assert from 'node:assert/strict';
import { connect, type Socket } from 'node:net';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { Request, Response } from '../../src/gen/ttrpc/request.js';
import { FrameDecoder, FrameType, encodeFrame, type Frame } from '../../src/ttrpc/frame.js';
import { FRONT_CANCEL, FRONT_SERVICE, decodeCancel } from '../../src/ttrpc/front-link.js';
import { type ManagedProcess, makeTempDir, removeTree, spawnLogged, stopProcess, tailFile, waitFor, waitForSocket } from '../support/processes.js';
import { cancelPayload, tsboxFront } from '../support/task-front.js';
import { RawTtrpc, TEST_SERVICE, requestFrame } from '../support/ttrpc-peer.js';

/** tsbox as the front sees it: one connection to the backend socket, every frame it gets kept. */
class FakeTsbox {
  readonly frames: Frame[] = [];
  readonly #decoder = new FrameDecoder();
  closed = false;

  private constructor(readonly socket: Socket) {
    socket.on('data', (chunk: Buffer) => {
      for (const item of this.#decoder.push(chunk)) if (item.kind === 'frame') this.frames.push(item.frame);
    });
    socket.on('error', () => /* the test looks at `closed` */ undefined);
    socket.on('close', () => {
      this.closed = true;
    });
  }

  static connect(backend: string): Promise<FakeTsbox> {
    return new Promise((resolve, reject) => {
      const socket = connect(backend);
      socket.once('connect', () => resolve(new FakeTsbox(socket)));
      socket.once('error', reject);
    });
  }

  /** Waits until `n` frames came; returns them all. */
  async received(n: number, log: string): Promise<Frame[]> {
    await waitFor(() => this.frames.length >= n, { what: `${n} frames relayed to tsbox (${this.frames.length} so far)`, timeoutMs: 5000, describe: () => tailFile(log) });
    return this.frames;
  }

  answer(streamId: number, payload: Buffer, flags = 0): void {
    this.socket.write(encodeFrame(streamId, FrameType.Response, Response.encode({ status: undefined, payload }).finish(), flags));
  }

  close(): void {
    this.socket.destroy();
  }
}

/** The request a relayed frame carries. */
function requestOf(frame: Frame): Request {
  return Request.decode(frame.payload);
}

describe('the task front between clients and tsbox', () => {
  let dir = '';
  let socketPath = '';
  let backendPath = '';
  let logPath = '';
  let front: ManagedProcess | undefined;
  const opened: { destroy(): void }[] = [];

  before(async () => {
    dir = await makeTempDir('tsbox-front-link-');
    socketPath = path.join(dir, 'task.sock');
    backendPath = path.join(dir, 'backend.sock');
    logPath = path.join(dir, 'front.log');
    front = await spawnLogged(tsboxFront, ['--listen', socketPath, '--backend', backendPath, '--log-level', 'debug'], { logPath });
    await waitForSocket(front, socketPath, { name: 'task front', logTail: () => tailFile(logPath) });
  });

  after(async () => {
    for (const o of opened) o.destroy();
    if (front !== undefined) await stopProcess(front, { graceMs: 5000 });
    await removeTree(dir);
  });

  async function tsboxConnects(): Promise<FakeTsbox> {
    const tsbox = await FakeTsbox.connect(backendPath);
    opened.push(tsbox.socket);
    return tsbox;
  }

  async function client(): Promise<RawTtrpc> {
    const c = await RawTtrpc.connect(socketPath);
    opened.push(c);
    return c;
  }

  test('each request goes to tsbox on an odd, increasing stream id of the front\'s; each answer back to the client\'s stream', async () => {
    const tsbox = await tsboxConnects();
    const a = await client();
    const b = await client();
    await a.write(Buffer.concat([requestFrame(1, TEST_SERVICE, 'Echo', Buffer.from('a1')), requestFrame(3, TEST_SERVICE, 'Echo', Buffer.from('a3'))]));
    await tsbox.received(2, logPath);
    await b.write(requestFrame(1, TEST_SERVICE, 'Echo', Buffer.from('b1')));
    const frames = await tsbox.received(3, logPath);
    const ids = frames.map((f) => f.streamId);
    assert.deepEqual(ids.map((id) => id % 2), [1, 1, 1], `odd stream ids: ${ids.join(', ')}`);
    assert.ok(ids[0]! < ids[1]! && ids[1]! < ids[2]!, `increasing stream ids: ${ids.join(', ')}`);
    assert.deepEqual(frames.map((f) => requestOf(f).payload.toString()), ['a1', 'a3', 'b1'], 'each request relayed as it came');
    // Answered out of order: each reaches the stream it answers.
    tsbox.answer(ids[2]!, Buffer.from('to b1'));
    tsbox.answer(ids[1]!, Buffer.from('to a3'));
    tsbox.answer(ids[0]!, Buffer.from('to a1'));
    await waitFor(() => a.responses.length === 2 && b.responses.length === 1, { what: 'the three answers', timeoutMs: 5000 });
    assert.deepEqual(a.responses.map((r) => [r.streamId, r.payload.toString()]), [[3, 'to a3'], [1, 'to a1']]);
    assert.deepEqual(b.responses.map((r) => [r.streamId, r.payload.toString()]), [[1, 'to b1']]);
    tsbox.close();
  });

  test('a client that closes with calls kept: tsbox gets a Cancel request of the front\'s own naming their stream ids', async () => {
    const tsbox = await tsboxConnects();
    const c = await client();
    await c.write(Buffer.concat([requestFrame(1, TEST_SERVICE, 'Hold'), requestFrame(3, TEST_SERVICE, 'Hold'), requestFrame(5, TEST_SERVICE, 'Echo')]));
    const relayed = await tsbox.received(3, logPath);
    const ids = relayed.map((f) => f.streamId);
    // One is answered: only the two kept are named.
    tsbox.answer(ids[2]!, Buffer.alloc(0));
    await waitFor(() => c.responses.length === 1, { what: 'the Echo answered', timeoutMs: 5000 });
    c.destroy();
    const frames = await tsbox.received(4, logPath);
    const cancel = frames[3]!;
    assert.equal(cancel.type, FrameType.Request);
    assert.equal(cancel.streamId % 2, 1, 'on an odd stream id');
    assert.ok(cancel.streamId > ids[2]!, 'on a stream id of its own, after the calls it names');
    const request = requestOf(cancel);
    assert.equal(`${request.service}/${request.method}`, `${FRONT_SERVICE}/${FRONT_CANCEL}`);
    assert.deepEqual(decodeCancel(request.payload)?.sort((x, y) => x - y), [ids[0], ids[1]]);
    tsbox.close();
  });

  test('a client naming the front\'s own service is closed; other requests, and bytes that are no request, are relayed', async () => {
    const tsbox = await tsboxConnects();
    const c = await client();
    await c.write(requestFrame(1, 'containerd.task.v3.Task', 'Wait'));
    await c.write(encodeFrame(3, FrameType.Request, Buffer.from([0xff, 0xff, 0xff])));
    const frames = await tsbox.received(2, logPath);
    assert.equal(requestOf(frames[0]!).service, 'containerd.task.v3.Task');
    assert.deepEqual([...frames[1]!.payload], [0xff, 0xff, 0xff]);
    assert.equal(c.closed, false, 'a client whose bytes are no request is not closed for them');
    const hostile = await client();
    await hostile.write(requestFrame(1, FRONT_SERVICE, FRONT_CANCEL, cancelPayload([frames[0]!.streamId])));
    assert.ok(await hostile.closedWithin(5000), 'the client naming the front\'s service stayed open');
    assert.equal(tsbox.frames.length, 2, 'its request was not relayed');
    assert.match(tailFile(logPath), /called the front's own service/);
    // The two relayed calls end with their client (tsbox is told), so that none is left for the next test.
    c.destroy();
    const cancel = (await tsbox.received(3, logPath))[2]!;
    assert.equal(requestOf(cancel).service, FRONT_SERVICE);
    tsbox.close();
  });

  test('kept requests go to the next tsbox, numbered again from 1 in the order they came, and its answers reach the clients', async () => {
    const first = await tsboxConnects();
    const c = await client();
    await c.write(Buffer.concat([requestFrame(1, TEST_SERVICE, 'Echo', Buffer.from('one')), requestFrame(3, TEST_SERVICE, 'Echo', Buffer.from('two'))]));
    await first.received(2, logPath);
    first.close();
    await waitFor(() => first.closed, { what: 'the first tsbox gone', timeoutMs: 5000 });
    // Asked while no tsbox is there: kept for the next one.
    await c.write(requestFrame(5, TEST_SERVICE, 'Echo', Buffer.from('three')));
    const second = await tsboxConnects();
    const frames = await second.received(3, logPath);
    assert.deepEqual(frames.map((f) => f.streamId), [1, 3, 5]);
    assert.deepEqual(frames.map((f) => requestOf(f).payload.toString()), ['one', 'two', 'three']);
    for (const f of frames) second.answer(f.streamId, Buffer.from(`re ${requestOf(f).payload.toString()}`));
    await waitFor(() => c.responses.length === 3, { what: 'the three answers', timeoutMs: 5000 });
    assert.deepEqual(c.responses.map((r) => [r.streamId, r.payload.toString()]), [[1, 're one'], [3, 're two'], [5, 're three']]);
    assert.match(tailFile(logPath), /"replayed":3,"msg":"tsbox connected"/);
    second.close();
  });
});
