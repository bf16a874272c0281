/**
 * A pod's relay (native/relay.c, run by the pod's supervisor native/tsbox-shim.c in relay mode)
 * between clients and a tsbox played by the test on the link socket, frame by frame: every new
 * link connection opens with the relay's Hello naming its protocol version; each request goes to
 * tsbox on a stream id of the relay's own and each answer back to the client's stream; a client
 * that closes with calls kept makes the relay send tsbox a Cancel request of its own
 * (src/ttrpc/pod-link.ts) naming them; a client that names the relay's service is closed, while
 * other requests, and bytes that are no request, are relayed; kept requests go to the next
 * tsbox, after its Hello, in the order they came. The pod's process outlives its sandbox: it
 * records the exit and goes on relaying until SIGTERM, which it ignores while the sandbox runs.
 */
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync } from 'node:fs';
import { connect, createServer, type Socket } from 'node:net';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { Request, Response } from '../../src/gen/ttrpc/request.js';
import { FrameDecoder, FrameType, encodeFrame, type Frame } from '../../src/ttrpc/frame.js';
import { POD_CANCEL, POD_HELLO, POD_PROTOCOL_VERSION, POD_SERVICE, decodeCancel } from '../../src/ttrpc/pod-link.js';
import { cmdlineOf, listPids, readExitFile } from '../support/host.js';
import { makeTempDir, processAlive, removeTree, signalPid, tailFile, waitFor } from '../support/processes.js';
import { type PodProcess, cancelPayload, spawnPod, startPod } from '../support/pod-relay.js';
import { RawTtrpc, TEST_SERVICE, requestFrame } from '../support/ttrpc-peer.js';

/**
 * tsbox as the relay sees it: one connection to the link socket, every frame it gets kept; the
 * first, the relay's Hello, apart.
 */
class FakeTsbox {
  hello: Frame | undefined;
  readonly frames: Frame[] = [];
  readonly #decoder = new FrameDecoder();
  closed = false;

  private constructor(readonly socket: Socket) {
    socket.on('data', (chunk: Buffer) => {
      for (const item of this.#decoder.push(chunk)) {
        if (item.kind !== 'frame') continue;
        if (this.hello === undefined) this.hello = item.frame;
        else this.frames.push(item.frame);
      }
    });
    socket.on('error', () => /* the test looks at `closed` */ undefined);
    socket.on('close', () => {
      this.closed = true;
    });
  }

  static connect(link: string): Promise<FakeTsbox> {
    return new Promise((resolve, reject) => {
      const socket = connect(link);
      socket.once('connect', () => resolve(new FakeTsbox(socket)));
      socket.once('error', reject);
    });
  }

  /** Waits until `n` frames came after the Hello; returns them all. */
  async received(n: number, log: string): Promise<Frame[]> {
    await waitFor(() => this.frames.length >= n, { what: `${n} frames relayed to tsbox (${this.frames.length} so far)`, timeoutMs: 5000, describe: () => tailFile(log) });
    return this.frames;
  }

  /** Waits for the relay's Hello. */
  async greeted(log: string): Promise<Frame> {
    return waitFor(() => this.hello, { what: 'the relay\'s Hello', timeoutMs: 5000, describe: () => tailFile(log) });
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

describe('a pod\'s relay between clients and tsbox', () => {
  let dir = '';
  let socketPath = '';
  let linkPath = '';
  let logPath = '';
  let pod: PodProcess | undefined;
  const opened: { destroy(): void }[] = [];

  before(async () => {
    dir = await makeTempDir('tsbox-relay-link-');
    pod = await startPod(dir);
    socketPath = pod.taskSocket;
    linkPath = pod.link;
    logPath = pod.relayLog;
  });

  after(async () => {
    for (const o of opened) o.destroy();
    if (pod !== undefined) await pod.stop();
    await removeTree(dir);
  });

  async function tsboxConnects(): Promise<FakeTsbox> {
    const tsbox = await FakeTsbox.connect(linkPath);
    opened.push(tsbox.socket);
    return tsbox;
  }

  async function client(): Promise<RawTtrpc> {
    const c = await RawTtrpc.connect(socketPath);
    opened.push(c);
    return c;
  }

  test(`every new link connection opens with the relay's Hello: ${POD_SERVICE}/${POD_HELLO} on stream 1, version "${POD_PROTOCOL_VERSION}"`, async () => {
    for (let n = 0; n < 2; n++) {
      const tsbox = await tsboxConnects();
      const hello = await tsbox.greeted(logPath);
      assert.equal(hello.type, FrameType.Request);
      assert.equal(hello.streamId, 1);
      const request = requestOf(hello);
      assert.equal(`${request.service}/${request.method}`, `${POD_SERVICE}/${POD_HELLO}`);
      assert.equal(Buffer.from(request.payload).toString('latin1'), String(POD_PROTOCOL_VERSION));
      // Its answer, OK or a refusal, matches no call: dropped, and the link goes on.
      tsbox.socket.write(encodeFrame(1, FrameType.Response, Response.encode({ status: { code: 9, message: 'refused', details: [] }, payload: Buffer.alloc(0) }).finish()));
      const c = await client();
      await c.write(requestFrame(1, TEST_SERVICE, 'Echo', Buffer.from(`after hello ${n}`)));
      const [relayed] = await tsbox.received(1, logPath);
      assert.equal(requestOf(relayed!).payload.toString(), `after hello ${n}`);
      assert.ok(relayed!.streamId > 1, 'calls come after the Hello');
      tsbox.answer(relayed!.streamId, Buffer.from('back'));
      await waitFor(() => c.responses.length === 1, { what: 'the answer', timeoutMs: 5000 });
      assert.deepEqual(c.responses.map((r) => [r.streamId, r.payload.toString()]), [[1, 'back']]);
      assert.equal(c.closed, false);
      c.destroy();
      tsbox.close();
      await waitFor(() => tsbox.closed, { what: 'the fake tsbox closed', timeoutMs: 5000 });
    }
  });

  test('each request goes to tsbox on an odd, increasing stream id of the relay\'s; each answer back to the client\'s stream', async () => {
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

  test('a client that closes with calls kept: tsbox gets a Cancel request of the relay\'s own naming their stream ids', async () => {
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
    assert.equal(`${request.service}/${request.method}`, `${POD_SERVICE}/${POD_CANCEL}`);
    assert.deepEqual(decodeCancel(request.payload)?.sort((x, y) => x - y), [ids[0], ids[1]]);
    tsbox.close();
  });

  test('a client naming the relay\'s own service is closed; other requests, and bytes that are no request, are relayed', async () => {
    const tsbox = await tsboxConnects();
    const c = await client();
    await c.write(requestFrame(1, 'containerd.task.v3.Task', 'Wait'));
    await c.write(encodeFrame(3, FrameType.Request, Buffer.from([0xff, 0xff, 0xff])));
    const frames = await tsbox.received(2, logPath);
    assert.equal(requestOf(frames[0]!).service, 'containerd.task.v3.Task');
    assert.deepEqual([...frames[1]!.payload], [0xff, 0xff, 0xff]);
    assert.equal(c.closed, false, 'a client whose bytes are no request is not closed for them');
    const hostile = await client();
    await hostile.write(requestFrame(1, POD_SERVICE, POD_CANCEL, cancelPayload([frames[0]!.streamId])));
    assert.ok(await hostile.closedWithin(5000), 'the client naming the relay\'s service stayed open');
    assert.equal(tsbox.frames.length, 2, 'its request was not relayed');
    assert.match(tailFile(logPath), /called the relay's own service/);
    // The two relayed calls end with their client (tsbox is told), so that none is left for the next test.
    c.destroy();
    const cancel = (await tsbox.received(3, logPath))[2]!;
    assert.equal(requestOf(cancel).service, POD_SERVICE);
    tsbox.close();
  });

  test('kept requests go to the next tsbox after its Hello, numbered again from 3 in the order they came, and its answers reach the clients', async () => {
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
    assert.equal(second.hello?.streamId, 1, 'the Hello first, on stream 1');
    assert.deepEqual(frames.map((f) => f.streamId), [3, 5, 7]);
    assert.deepEqual(frames.map((f) => requestOf(f).payload.toString()), ['one', 'two', 'three']);
    for (const f of frames) second.answer(f.streamId, Buffer.from(`re ${requestOf(f).payload.toString()}`));
    await waitFor(() => c.responses.length === 3, { what: 'the three answers', timeoutMs: 5000 });
    assert.deepEqual(c.responses.map((r) => [r.streamId, r.payload.toString()]), [[1, 're one'], [3, 're two'], [5, 're three']]);
    assert.match(tailFile(logPath), /"replayed":3,"msg":"tsbox connected"/);
    second.close();
  });

  test('a client naming the former node-wide front\'s service is closed as well (tsbox serves it on its links)', async () => {
    const tsbox = await tsboxConnects();
    const hostile = await client();
    await hostile.write(requestFrame(1, 'tsbox.front.v1.Front', POD_CANCEL, cancelPayload([1])));
    assert.ok(await hostile.closedWithin(5000), 'the client naming the former front\'s service stayed open');
    assert.equal(tsbox.frames.length, 0, 'its request was not relayed');
    tsbox.close();
  });
});

/** Pids of live processes whose command line names `needle` (a pod's processes name its dir). */
function processesNaming(needle: string): number[] {
  return listPids().filter((pid) => pid !== process.pid && processAlive(pid) && cmdlineOf(pid).some((arg) => arg.includes(needle)));
}

describe('a pod\'s process around its sandbox\'s end', () => {
  let dir = '';
  const pods: PodProcess[] = [];

  before(async () => {
    dir = await makeTempDir('tsbox-relay-life-');
  });

  after(async () => {
    for (const pod of pods) await pod.stop();
    await removeTree(dir);
  });

  async function podIn(name: string): Promise<PodProcess> {
    const pod = await startPod(mkdtempSync(path.join(dir, `${name}-`)));
    pods.push(pod);
    return pod;
  }

  test('SIGTERM while the sandbox runs is ignored: the process goes on relaying', async () => {
    const pod = await podIn('runs');
    const tsbox = await FakeTsbox.connect(pod.link);
    try {
      signalPid(pod.supervisor.pid, 'SIGTERM');
      await waitFor(() => tailFile(pod.relayLog).includes('SIGTERM ignored'), { what: 'the SIGTERM logged as ignored', timeoutMs: 5000, describe: () => tailFile(pod.relayLog) });
      assert.equal(pod.supervisor.exitInfo(), undefined, 'the pod\'s process ended');
      assert.ok(processAlive(pod.sandboxPid), 'the sandbox process ended');
      const c = await RawTtrpc.connect(pod.taskSocket);
      try {
        await c.write(requestFrame(1, TEST_SERVICE, 'Echo', Buffer.from('still')));
        const [relayed] = await tsbox.received(1, pod.relayLog);
        tsbox.answer(relayed!.streamId, Buffer.from('served'));
        await waitFor(() => c.responses[0], { what: 'the answer', timeoutMs: 5000 });
      } finally {
        c.destroy();
      }
    } finally {
      tsbox.close();
    }
  });

  test('the sandbox ends: its exit is recorded, the task socket still relays; then SIGTERM ends the process and removes both sockets', async () => {
    const pod = await podIn('ends');
    const tsbox = await FakeTsbox.connect(pod.link);
    try {
      assert.equal(await pod.endSandbox(), 137, 'the exit file records SIGKILL');
      assert.equal(pod.supervisor.exitInfo(), undefined, 'the pod\'s process ended with its sandbox');
      // containerd may still call the pod's other tasks: a new connection is relayed and answered.
      const c = await RawTtrpc.connect(pod.taskSocket);
      try {
        await c.write(requestFrame(1, TEST_SERVICE, 'Echo', Buffer.from('after the end')));
        const [relayed] = await tsbox.received(1, pod.relayLog);
        assert.equal(requestOf(relayed!).payload.toString(), 'after the end');
        tsbox.answer(relayed!.streamId, Buffer.from('answered'));
        await waitFor(() => c.responses[0], { what: 'the answer', timeoutMs: 5000 });
        assert.equal(c.responses[0]?.payload.toString(), 'answered');
      } finally {
        c.destroy();
      }
      signalPid(pod.supervisor.pid, 'SIGTERM');
      const exit = await pod.supervisor.exited;
      assert.deepEqual(exit, { code: 0, signal: null });
      assert.equal(existsSync(pod.taskSocket), false, 'the task socket is left');
      assert.equal(existsSync(pod.link), false, 'the link socket is left');
      assert.equal(readExitFile(pod.dir)?.status, 137, 'the exit file is kept');
      assert.match(tailFile(pod.relayLog), /SIGTERM: the pod's process ends/);
    } finally {
      tsbox.close();
    }
  });

  test('a live server on the task socket\'s path: the start fails naming it, and nothing is left running or bound', async () => {
    const podDir = mkdtempSync(path.join(dir, 'taken-'));
    const taskSocket = path.join(podDir, 'task.sock');
    const squatter = createServer();
    await new Promise<void>((resolve, reject) => {
      squatter.once('error', reject);
      squatter.listen(taskSocket, resolve);
    });
    try {
      const spawned = await spawnPod(podDir, { taskSocket });
      assert.equal(spawned.answer, `error another server is already listening on ${taskSocket}\n`);
      assert.deepEqual(await spawned.supervisor.exited, { code: 1, signal: null });
      assert.deepEqual(processesNaming(podDir), [], 'processes left by the failed start');
      assert.equal(existsSync(spawned.link), false, 'the link socket is left');
      assert.equal(existsSync(path.join(podDir, 'pid')), false, 'a pid file names processes that never ran');
      assert.ok(existsSync(taskSocket), 'the live server\'s socket was removed');
      // The live server is untouched: it still accepts.
      await new Promise<void>((resolve, reject) => {
        const probe = connect(taskSocket);
        probe.once('connect', () => {
          probe.destroy();
          resolve();
        });
        probe.once('error', reject);
      });
    } finally {
      await new Promise<void>((resolve) => squatter.close(() => resolve()));
    }
  });
});
