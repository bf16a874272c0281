// The HTTP/2 gRPC server at the protocol level, without the daemon: a GrpcH2Server with a
// test handler on a temporary unix socket. Two kinds of peers talk to it. grpc-js clients
// do what real clients (containerd's grpc-go, grpc-js) do: metadata, large messages both
// ways under flow control, thousands of concurrent calls, statuses, deadlines, cancels and
// shutdown. A raw client writes frames by hand to check the wire itself and what a broken
// or hostile peer gets: bad prefaces, oversized frames, invalid streams, CONTINUATION,
// padding, malformed gRPC framing, resets and tiny flow-control windows.
import assert from 'node:assert/strict';
import { createHash, randomBytes } from 'node:crypto';
import { existsSync } from 'node:fs';
import { mkdtemp, readdir, rm } from 'node:fs/promises';
import type { Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, test, type TestContext } from 'node:test';
import {
  Client,
  Metadata,
  credentials,
  status as GrpcStatus,
  type ChannelOptions,
  type ClientUnaryCall,
  type ServiceError,
} from '@grpc/grpc-js';
import {
  DEFAULT_MAX_FRAME,
  DEFAULT_WINDOW,
  ErrorCode,
  Flag,
  FrameType,
  MAX_WINDOW,
  PREFACE,
  Setting,
  frame,
  settingsFrame,
} from '../../src/transport/h2/frames.js';
import { GrpcCode, GrpcH2Server, type GrpcCall, type GrpcServerOptions } from '../../src/transport/h2/grpc-server.js';
import {
  RawH2Client,
  WAIT_MS,
  describeFrame,
  grpcFrame,
  headerValue,
  requestHeaders,
  type RawConnectOptions,
  type RawFrame,
  type RawResponse,
} from '../support/h2-raw-client.js';

const MiB = 1024 * 1024;
/** What the server advertises as its largest frame (SETTINGS_MAX_FRAME_SIZE). */
const SERVER_MAX_FRAME = 1 << 20;
const ECHO = '/test.Echo/Echo';

/** Settles with `promise`, or fails after `ms` naming what was awaited. */
async function within<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_resolve, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms waiting for ${what}`)), ms);
  });
  try {
    return await Promise.race([promise, timeout]);
  } finally {
    clearTimeout(timer);
  }
}

/** A promise and the function that resolves it. */
function signal<T = void>(): { promise: Promise<T>; resolve: (value: T) => void } {
  let resolve!: (value: T) => void;
  const promise = new Promise<T>((r) => (resolve = r));
  return { promise, resolve };
}

type Handler = (call: GrpcCall) => void;

/** Request headers the fixture records for each call (a call keeps them only during the handler). */
const RECORDED_HEADERS = ['grpc-timeout', 'x-i', 'containerd-namespace'] as const;

/** A call as the handler first saw it. */
interface SeenCall {
  readonly call: GrpcCall;
  readonly method: string;
  readonly message: Buffer;
  readonly deadline: number;
  readonly headers: ReadonlyMap<string, string | undefined>;
}

/** The default handler: answers with the request message. */
const echo: Handler = (call) => call.respond(call.message);

interface Fixture {
  readonly server: GrpcH2Server;
  readonly path: string;
  /** Every call handed to the handler, in order, as it arrived. */
  readonly calls: SeenCall[];
  /** What the server reported through onConnectionError. */
  readonly errors: Error[];
  /** Waits until the handler has received `n` calls in all. */
  waitCalls(n: number, timeoutMs?: number): Promise<SeenCall[]>;
  /** A grpc-js client on the socket, closed after the test. */
  grpc(options?: ChannelOptions): Client;
  /** A raw HTTP/2 client on the socket, closed after the test. */
  raw(options?: RawConnectOptions): Promise<RawH2Client>;
  /** The server side of every connection accepted so far. */
  serverSockets(): Socket[];
}

/** Starts a server with `handler` on a fresh socket; everything is torn down after the test. */
async function serve(t: TestContext, handler: Handler = echo, options: Partial<GrpcServerOptions> = {}): Promise<Fixture> {
  const dir = await mkdtemp(join(tmpdir(), 'tsbox-h2-'));
  const path = join(dir, 'grpc.sock');
  const calls: SeenCall[] = [];
  const errors: Error[] = [];
  const callWaiters = new Set<() => void>();
  const clients: Client[] = [];
  const raws: RawH2Client[] = [];
  const sockets: Socket[] = [];
  const server = new GrpcH2Server(
    (call) => {
      calls.push({
        call,
        method: call.method,
        message: call.message,
        deadline: call.deadline,
        headers: new Map(RECORDED_HEADERS.map((name) => [name, call.header(name)])),
      });
      for (const wake of [...callWaiters]) wake();
      handler(call);
    },
    { maxMessageBytes: 16 * MiB, onConnectionError: (err) => errors.push(err), ...options },
  );
  await server.listen(path);
  const track = (): void => {
    for (const connection of server.connections) if (!sockets.includes(connection.socket)) sockets.push(connection.socket);
  };

  t.after(async () => {
    for (const client of clients) client.close();
    await Promise.all(raws.map((raw) => raw.close()));
    track();
    server.stopAccepting();
    server.destroy();
    await within(
      Promise.all(sockets.map((s) => (s.destroyed && s.closed ? Promise.resolve() : new Promise((r) => s.once('close', r))))),
      WAIT_MS,
      'server sockets to close',
    );
    assert.equal(server.connections.size, 0, 'connections left open');
    assert.equal(existsSync(path), false, `socket file ${path} left behind`);
    assert.deepEqual(await readdir(dir), []);
    await rm(dir, { recursive: true, force: true });
  });

  return {
    server,
    path,
    calls,
    errors,
    waitCalls(n, timeoutMs = WAIT_MS) {
      if (calls.length >= n) return Promise.resolve(calls.slice(0, n));
      const arrived = new Promise<SeenCall[]>((resolve) => {
        const wake = (): void => {
          if (calls.length < n) return;
          callWaiters.delete(wake);
          resolve(calls.slice(0, n));
        };
        callWaiters.add(wake);
      });
      return within(arrived, timeoutMs, `${n} calls (got ${calls.length})`);
    },
    grpc(channelOptions = {}) {
      const client = new Client(`unix:${path}`, credentials.createInsecure(), {
        'grpc.use_local_subchannel_pool': 1,
        ...channelOptions,
      });
      clients.push(client);
      return client;
    },
    async raw(rawOptions = {}) {
      const raw = await RawH2Client.connect(path, rawOptions);
      raws.push(raw);
      return raw;
    },
    serverSockets() {
      track();
      return [...sockets];
    },
  };
}

const identity = (b: Buffer): Buffer => b;

/** Starts a unary call with grpc-js; `result` settles with the response or the ServiceError. */
function unary(
  client: Client,
  method: string,
  message: Buffer,
  options: { metadata?: Metadata; deadline?: number } = {},
): { call: ClientUnaryCall; result: Promise<Buffer> } {
  let call!: ClientUnaryCall;
  const result = new Promise<Buffer>((resolve, reject) => {
    call = client.makeUnaryRequest(
      method,
      identity,
      identity,
      message,
      options.metadata ?? new Metadata(),
      options.deadline === undefined ? {} : { deadline: options.deadline },
      (err, response) => {
        if (err) reject(err);
        else if (response === undefined) reject(new Error('no response'));
        else resolve(response);
      },
    );
  });
  return { call, result };
}

/** Awaits a call that must fail with `code` (and `details`, when given); returns the error. */
async function expectStatus(result: Promise<Buffer>, code: number, details?: string | RegExp): Promise<ServiceError> {
  try {
    const response = await within(result, 3 * WAIT_MS, `status ${code}`);
    assert.fail(`expected status ${code}, got a response of ${response.length} bytes`);
  } catch (err) {
    const e = err as ServiceError;
    assert.equal(typeof e.code, 'number', `not a gRPC error: ${String(err)}`);
    assert.equal(e.code, code, `expected status ${code}, got ${e.code}: ${e.details}`);
    if (typeof details === 'string') assert.equal(e.details, details);
    else if (details !== undefined) assert.match(e.details, details);
    return e;
  }
}

/** The grpc-status of a raw response. */
function statusOf(response: RawResponse): number {
  const value = headerValue(response.trailers, 'grpc-status');
  assert.notEqual(value, undefined, 'no grpc-status in the trailers');
  return Number(value);
}

/** The single message of a raw response, checking its gRPC framing. */
function messageOf(response: RawResponse): Buffer {
  const body = response.body;
  assert.ok(body.length >= 5, `response body of ${body.length} bytes`);
  assert.equal(body[0], 0, 'compressed flag set in the response');
  assert.equal(body.readUInt32BE(1), body.length - 5, 'response length prefix');
  return body.subarray(5);
}

/** Expects GOAWAY with `code` from the server, then the connection's close. */
async function expectGoAway(raw: RawH2Client, code: number, lastStreamId = 0, timeoutMs = WAIT_MS): Promise<void> {
  const goAway = await raw.goAway(timeoutMs);
  assert.equal(goAway.code, code, `GOAWAY code ${goAway.code} (${goAway.debug})`);
  assert.equal(goAway.lastStreamId, lastStreamId);
  await raw.waitClosed();
}

const sha256 = (b: Uint8Array): string => createHash('sha256').update(b).digest('hex');

describe('GrpcH2Server with grpc-js clients', () => {
  test('a unary call round trip carries the request metadata to the handler', async (t) => {
    const f = await serve(t, (call) => {
      if (call.method === ECHO) {
        call.respond(call.message);
        return;
      }
      call.respond(
        Buffer.from(
          JSON.stringify({
            method: call.method,
            message: call.message.toString('utf8'),
            ns: call.header('containerd-namespace'),
            custom: call.header('x-custom'),
            bin: call.header('x-blob-bin'),
            contentType: call.header('content-type'),
            te: call.header('te'),
            httpMethod: call.header(':method'),
            userAgent: call.header('user-agent'),
            missing: call.header('x-missing') ?? null,
            deadline: call.deadline,
          }),
        ),
      );
    });
    const client = f.grpc();
    const metadata = new Metadata();
    metadata.set('containerd-namespace', 'k8s.io');
    metadata.set('x-custom', 'a value, with; punctuation');
    metadata.set('x-blob-bin', Buffer.from([0, 1, 2, 0xfe, 0xff]));
    const response = await unary(client, '/containerd.services.sandbox.v1.Controller/Status', Buffer.from('héllo'), {
      metadata,
    }).result;
    const seen = JSON.parse(response.toString('utf8')) as Record<string, unknown>;
    assert.equal(seen.method, '/containerd.services.sandbox.v1.Controller/Status');
    assert.equal(seen.message, 'héllo');
    assert.equal(seen.ns, 'k8s.io');
    assert.equal(seen.custom, 'a value, with; punctuation');
    assert.deepEqual(Buffer.from(seen.bin as string, 'base64'), Buffer.from([0, 1, 2, 0xfe, 0xff]));
    assert.equal(seen.contentType, 'application/grpc');
    assert.equal(seen.te, 'trailers');
    assert.equal(seen.httpMethod, 'POST');
    assert.match(seen.userAgent as string, /^grpc-node-js\//);
    assert.equal(seen.missing, null);
    assert.equal(seen.deadline, null, 'no deadline: Infinity (JSON null)');

    // An empty message both ways, on the same connection.
    const empty = await unary(client, ECHO, Buffer.alloc(0)).result;
    assert.equal(empty.length, 0);
    assert.equal(f.server.connections.size, 1);
  });

  test('a pending call keeps its method and deadline, not its message and headers', async (t) => {
    const f = await serve(t, () => undefined);
    const client = f.grpc();
    const metadata = new Metadata();
    metadata.set('containerd-namespace', 'default');
    const pending = unary(client, '/test.Echo/Hold', Buffer.from('payload'), { metadata, deadline: Date.now() + 60_000 }).result;
    const [seen] = await f.waitCalls(1);
    assert.ok(seen !== undefined);
    assert.deepEqual(seen.message, Buffer.from('payload'));
    assert.equal(seen.headers.get('containerd-namespace'), 'default');
    // After the handler's first call: the method and deadline stay, the rest is released.
    assert.equal(seen.call.method, '/test.Echo/Hold');
    assert.equal(seen.call.deadline, seen.deadline);
    assert.equal(seen.call.message.length, 0);
    assert.equal(seen.call.header('containerd-namespace'), undefined);
    seen.call.respond(Buffer.from('done'));
    assert.deepEqual(await pending, Buffer.from('done'));
  });

  test('a 12 MiB request arrives intact through flow control', async (t) => {
    const f = await serve(t, (call) => call.respond(Buffer.from(`${call.message.length} ${sha256(call.message)}`)));
    const client = f.grpc({ 'grpc.max_send_message_length': 32 * MiB });
    const request = randomBytes(12 * MiB);
    const response = await within(unary(client, ECHO, request).result, 30_000, 'the 12 MiB call');
    assert.equal(response.toString(), `${request.length} ${sha256(request)}`);
    // The connection goes on serving calls.
    const after = Buffer.from('after');
    assert.equal((await unary(client, ECHO, after).result).toString(), `5 ${sha256(after)}`);
    assert.equal(f.server.connections.size, 1);
  });

  test('a 2 MiB response reaches the client intact within its windows and frame size', async (t) => {
    const payload = randomBytes(2 * MiB);
    const f = await serve(t, (call) => call.respond(payload));
    const client = f.grpc();
    const response = await within(unary(client, ECHO, Buffer.from('big')).result, 30_000, 'the 2 MiB response');
    assert.equal(response.length, payload.length);
    assert.ok(response.equals(payload), 'response bytes differ');
    // Twice more at once: several blocked streams share the connection window.
    const [a, b] = await within(
      Promise.all([unary(client, ECHO, Buffer.from('a')).result, unary(client, ECHO, Buffer.from('b')).result]),
      30_000,
      'two 2 MiB responses',
    );
    assert.ok(a.equals(payload) && b.equals(payload), 'concurrent responses differ');
  });

  test('2000 concurrent calls held by the handler are all answered correctly at once', async (t) => {
    const COUNT = 2000;
    const f = await serve(t, () => undefined);
    const client = f.grpc();
    const started = Array.from({ length: COUNT }, (_, i) => {
      const request = Buffer.from(`request ${i} ${'x'.repeat(i % 97)}`);
      return { request, result: unary(client, `/test.Echo/Call${i % 7}`, request).result };
    });
    const calls = await f.waitCalls(COUNT, 30_000);
    assert.equal(f.server.connections.size, 1, 'all calls on one connection');
    // Answer in an order unrelated to arrival, all in one turn of the event loop.
    for (let i = 0; i < calls.length; i++) {
      const { call, method, message } = calls[(i * 7919) % COUNT] as SeenCall;
      call.respond(Buffer.concat([Buffer.from(`${method}|`), message]));
    }
    const responses = await within(Promise.all(started.map((s) => s.result)), 30_000, 'all responses');
    responses.forEach((response, i) => {
      const { request } = started[i] as { request: Buffer };
      assert.deepEqual(response, Buffer.concat([Buffer.from(`/test.Echo/Call${i % 7}|`), request]), `call ${i}`);
    });
  });

  test('a failed call carries its code and exact message, non-ASCII and % included', async (t) => {
    const messages = [
      'sandbox "ünïcødé ✓ 日本" not found: 100% gone, %41 stays literal',
      'plain ASCII message',
      'tab\tnewline\nend',
      '',
      '#$&+,/:;=?@ reserved characters',
    ];
    const f = await serve(t, (call) => call.fail(5, messages[Number(call.message.toString())] ?? 'bad index'));
    const client = f.grpc();
    for (const [i, message] of messages.entries()) {
      const err = await expectStatus(unary(client, ECHO, Buffer.from(String(i))).result, GrpcStatus.NOT_FOUND);
      assert.equal(err.details, message, `message ${i}`);
    }
  });

  test('a call past its deadline ends as DEADLINE_EXCEEDED and the handler is cancelled', async (t) => {
    const cancelled = signal();
    let cancels = 0;
    const f = await serve(t, (call) =>
      call.onCancel(() => {
        cancels++;
        cancelled.resolve();
      }),
    );
    const client = f.grpc();
    const startedAt = Date.now();
    await expectStatus(unary(client, ECHO, Buffer.from('wait'), { deadline: startedAt + 300 }).result, GrpcStatus.DEADLINE_EXCEEDED);
    assert.ok(Date.now() - startedAt >= 250, 'ended before its deadline');
    await within(cancelled.promise, WAIT_MS, 'onCancel after the deadline');
    assert.equal(cancels, 1);
    const [seen] = f.calls;
    assert.ok(seen !== undefined && Math.abs(seen.deadline - (startedAt + 300)) < 100, `deadline ${seen?.deadline}`);
    assert.equal(seen.call.deadline, seen.deadline, 'the deadline stays with a pending call');
  });

  test('a client cancel runs the onCancel listener once, and a later answer is dropped', async (t) => {
    const cancelled = signal();
    let cancels = 0;
    let removedRan = false;
    const f = await serve(t, (call) => {
      if (call.method !== ECHO) {
        const removed = (): void => {
          removedRan = true;
        };
        call.onCancel(removed);
        call.onCancel(() => {
          cancels++;
          cancelled.resolve();
        });
        call.offCancel(removed);
        return;
      }
      call.respond(call.message);
    });
    const client = f.grpc();
    const { call, result } = unary(client, '/test.Echo/Hold', Buffer.from('hold'));
    const [held] = await f.waitCalls(1);
    call.cancel();
    await expectStatus(result, GrpcStatus.CANCELLED);
    await within(cancelled.promise, WAIT_MS, 'onCancel after the client cancel');
    assert.equal(cancels, 1);
    assert.equal(removedRan, false, 'a listener removed with offCancel ran');
    // Answering (or failing) a cancelled call does nothing, and the connection goes on.
    held?.call.respond(Buffer.from('too late'));
    held?.call.fail(13, 'too late');
    assert.deepEqual(await unary(client, ECHO, Buffer.from('next')).result, Buffer.from('next'));
    // Closing the connection later does not run the listener again.
    const [socket] = f.serverSockets();
    client.close();
    if (socket !== undefined && !socket.closed) await within(new Promise((r) => socket.once('close', r)), WAIT_MS, 'close');
    assert.equal(cancels, 1);
  });

  test('an unknown method is UNIMPLEMENTED', async (t) => {
    const f = await serve(t, (call) => {
      if (call.method === ECHO) call.respond(call.message);
      else call.fail(GrpcCode.Unimplemented, `unknown method ${call.method}`);
    });
    const client = f.grpc();
    await expectStatus(unary(client, '/no.Such/Method', Buffer.from('x')).result, GrpcStatus.UNIMPLEMENTED, 'unknown method /no.Such/Method');
    assert.deepEqual(await unary(client, ECHO, Buffer.from('ok')).result, Buffer.from('ok'));
  });

  test('a request over maxMessageBytes is RESOURCE_EXHAUSTED and the connection stays usable', async (t) => {
    const max = 1 * MiB;
    const f = await serve(t, (call) => call.respond(Buffer.from(String(call.message.length))), { maxMessageBytes: max });
    const client = f.grpc({ 'grpc.max_send_message_length': 32 * MiB });
    await expectStatus(unary(client, ECHO, randomBytes(max + 1)).result, GrpcStatus.RESOURCE_EXHAUSTED, /larger than 1048576 bytes/);
    await expectStatus(unary(client, ECHO, randomBytes(3 * max)).result, GrpcStatus.RESOURCE_EXHAUSTED);
    assert.equal(f.calls.length, 0, 'the handler saw an oversized request');
    // Exactly the limit is accepted, and so is the next small call, on the same connection.
    assert.equal((await unary(client, ECHO, randomBytes(max)).result).toString(), String(max));
    assert.equal((await unary(client, ECHO, Buffer.from('small')).result).toString(), '5');
    assert.equal(f.server.connections.size, 1);
  });

  test('stopAccepting then destroy with a call pending: the client sees UNAVAILABLE', async (t) => {
    const cancelled = signal();
    const f = await serve(t, (call) => {
      if (call.method === ECHO) call.respond(call.message);
      else call.onCancel(() => cancelled.resolve());
    });
    const client = f.grpc();
    assert.deepEqual(await unary(client, ECHO, Buffer.from('warm')).result, Buffer.from('warm'));
    const pending = unary(client, '/test.Echo/Hold', Buffer.from('hold')).result;
    await f.waitCalls(2);
    f.server.stopAccepting();
    assert.equal(existsSync(f.path), false, 'the socket file outlived stopAccepting');
    f.server.destroy();
    await expectStatus(pending, GrpcStatus.UNAVAILABLE);
    await within(cancelled.promise, WAIT_MS, 'onCancel of the pending call');
    // Nobody listens any more: a new call cannot connect.
    await expectStatus(unary(client, ECHO, Buffer.from('late'), { deadline: Date.now() + 2000 }).result, GrpcStatus.UNAVAILABLE);
  });

  test('grpc-timeout from a client deadline becomes call.deadline', async (t) => {
    const f = await serve(t);
    const client = f.grpc();
    for (const ms of [50, 5000, 3_600_000, 40 * 24 * 3_600_000]) {
      const deadline = Date.now() + ms;
      await unary(client, ECHO, Buffer.from(String(ms)), { deadline }).result;
      const call = f.calls.at(-1);
      assert.ok(call !== undefined);
      assert.match(call.headers.get('grpc-timeout') ?? '', /^\d{1,8}[mS]$/);
      // grpc-js rounds up to its unit (ms below 1e8 ms, then seconds); the server adds it to its clock.
      const slack = ms < 1e8 ? 100 : 1100;
      assert.ok(call.deadline >= deadline - 1 && call.deadline <= deadline + slack, `${ms} ms: deadline off by ${call.deadline - deadline} ms`);
    }
    await unary(client, ECHO, Buffer.from('none')).result;
    assert.equal(f.calls.at(-1)?.deadline, Infinity);
  });
});

describe('GrpcH2Server with a raw HTTP/2 client', () => {
  test('the server starts with SETTINGS, then a connection WINDOW_UPDATE', async (t) => {
    const f = await serve(t);
    const raw = await f.raw({ preface: false, settings: false });
    const settings = await raw.nextOf(FrameType.Settings);
    const update = await raw.nextOf(FrameType.WindowUpdate);
    assert.equal(raw.received[0], settings, `first frame: ${raw.received[0] && describeFrame(raw.received[0])}`);
    assert.equal(raw.received[1], update);
    assert.equal(settings.streamId, 0);
    assert.equal(settings.flags & Flag.Ack, 0);
    const values = new Map<number, number>();
    for (let i = 0; i < settings.payload.length; i += 6) values.set(settings.payload.readUInt16BE(i), settings.payload.readUInt32BE(i + 2));
    assert.equal(values.get(Setting.MaxFrameSize), SERVER_MAX_FRAME);
    assert.equal(values.get(Setting.EnablePush), 0);
    assert.ok((values.get(Setting.InitialWindowSize) ?? 0) >= 1 * MiB, 'stream window for large requests');
    assert.equal(update.streamId, 0);
    assert.equal(update.payload.readUInt32BE(0), MAX_WINDOW - DEFAULT_WINDOW);
    // The connection works once the client's preface follows.
    await raw.write(Buffer.concat([PREFACE, settingsFrame([])]));
    await raw.call(1, ECHO, Buffer.from('late preface'));
    assert.deepEqual(messageOf(await raw.response(1)), Buffer.from('late preface'));
  });

  test('the server ACKs every client SETTINGS, and only those', async (t) => {
    const f = await serve(t);
    const raw = await f.raw({ settings: [[Setting.InitialWindowSize, 1000], [Setting.MaxFrameSize, 20_000]] });
    const ack = await raw.next((x) => x.type === FrameType.Settings && (x.flags & Flag.Ack) !== 0, 'SETTINGS ACK');
    assert.equal(ack.streamId, 0);
    assert.equal(ack.payload.length, 0);
    await raw.write(settingsFrame([[Setting.HeaderTableSize, 0]]));
    await raw.next((x) => x.type === FrameType.Settings && (x.flags & Flag.Ack) !== 0, 'second SETTINGS ACK');
    await raw.write(settingsFrame([]));
    await raw.next((x) => x.type === FrameType.Settings && (x.flags & Flag.Ack) !== 0, 'ACK of empty SETTINGS');
    // An ACK from the client (of the server's SETTINGS) is not answered.
    await raw.write(frame(FrameType.Settings, Flag.Ack, 0));
    await raw.barrier();
    const acks = raw.received.filter((x) => x.type === FrameType.Settings && (x.flags & Flag.Ack) !== 0);
    assert.equal(acks.length, 3);
  });

  test('PING gets a PING ACK with the same 8 bytes; a PING ACK gets nothing', async (t) => {
    const f = await serve(t);
    const raw = await f.raw();
    const data = Buffer.from('8bytes!!');
    await raw.write(frame(FrameType.Ping, 0, 0, data));
    const ack = await raw.nextOf(FrameType.Ping);
    assert.equal(ack.flags, Flag.Ack);
    assert.equal(ack.streamId, 0);
    assert.deepEqual(ack.payload, data);
    await raw.write(frame(FrameType.Ping, Flag.Ack, 0, Buffer.from('unasked!')));
    await raw.barrier();
    assert.equal(raw.received.filter((x) => x.type === FrameType.Ping).length, 2, 'only our two PINGs were answered');
  });

  test('a PING of the wrong size is a FRAME_SIZE_ERROR', async (t) => {
    const f = await serve(t);
    const raw = await f.raw();
    await raw.write(frame(FrameType.Ping, 0, 0, Buffer.from('short')));
    await expectGoAway(raw, ErrorCode.FrameSizeError);
  });

  for (const [name, preface] of [
    ['an HTTP/1.1 request', Buffer.from('GET / HTTP/1.1\r\nHost: localhost\r\n\r\n')],
    ['a preface one byte off', Buffer.from('PRI * HTTP/2.0\r\n\r\nSM\r\n\r\r', 'latin1')],
    ['24 zero bytes', Buffer.alloc(24)],
  ] as const) {
    test(`a bad connection preface (${name}) closes the connection`, async (t) => {
      const f = await serve(t);
      const raw = await f.raw({ preface, settings: false });
      // The server may already have closed the socket: a failed write is expected then.
      await raw.write(frame(FrameType.Headers, Flag.EndHeaders | Flag.EndStream, 1, raw.block(requestHeaders(ECHO)))).catch(() => undefined);
      await raw.waitClosed();
      assert.equal(f.calls.length, 0);
      assert.equal(
        raw.received.some((x) => x.type === FrameType.Headers),
        false,
        'the server answered a request after a bad preface',
      );
    });
  }

  test('a preface and frames delivered one byte at a time make a call', async (t) => {
    const f = await serve(t);
    const raw = await f.raw({ preface: false, settings: false });
    const bytes = Buffer.concat([
      PREFACE,
      settingsFrame([]),
      frame(FrameType.Headers, Flag.EndHeaders, 1, raw.block(requestHeaders(ECHO))),
      frame(FrameType.Data, Flag.EndStream, 1, grpcFrame(Buffer.from('one byte at a time'))),
    ]);
    for (let i = 0; i < bytes.length; i++) await raw.write(bytes.subarray(i, i + 1));
    assert.deepEqual(messageOf(await raw.response(1)), Buffer.from('one byte at a time'));
  });

  test('a HEADERS block split over CONTINUATION frames makes a call', async (t) => {
    const f = await serve(t, (call) => call.respond(Buffer.from(`${call.header('x-long') ?? ''}|${call.message.toString()}`)));
    const raw = await f.raw();
    const long = 'v'.repeat(3000);
    const block = raw.block(requestHeaders(ECHO, [['x-long', long]]));
    const a = Math.floor(block.length / 3);
    const b = Math.floor((2 * block.length) / 3);
    await raw.write(
      Buffer.concat([
        frame(FrameType.Headers, 0, 1, block.subarray(0, a)),
        frame(FrameType.Continuation, 0, 1, block.subarray(a, b)),
        frame(FrameType.Continuation, 0, 1, Buffer.alloc(0)),
        frame(FrameType.Continuation, Flag.EndHeaders, 1, block.subarray(b)),
        frame(FrameType.Data, Flag.EndStream, 1, grpcFrame(Buffer.from('body'))),
      ]),
    );
    const response = await raw.response(1);
    assert.equal(statusOf(response), 0);
    assert.equal(messageOf(response).toString(), `${long}|body`);
    // END_STREAM on the HEADERS frame holds across its CONTINUATIONs: a call with no body.
    const block3 = raw.block(requestHeaders(ECHO));
    await raw.write(
      Buffer.concat([
        frame(FrameType.Headers, Flag.EndStream, 3, block3.subarray(0, 4)),
        frame(FrameType.Continuation, Flag.EndHeaders, 3, block3.subarray(4)),
      ]),
    );
    const empty = await raw.response(3);
    assert.equal(empty.trailersOnly, true);
    assert.equal(statusOf(empty), GrpcCode.InvalidArgument);
  });

  test('a frame other than CONTINUATION inside a header block is a PROTOCOL_ERROR', async (t) => {
    const f = await serve(t);
    const raw = await f.raw();
    const block = raw.block(requestHeaders(ECHO));
    await raw.write(
      Buffer.concat([
        frame(FrameType.Headers, 0, 1, block.subarray(0, 5)),
        frame(FrameType.Ping, 0, 0, Buffer.alloc(8)),
      ]),
    );
    await expectGoAway(raw, ErrorCode.ProtocolError);
  });

  test('a CONTINUATION on another stream, or with no header block open, is a PROTOCOL_ERROR', async (t) => {
    const f = await serve(t);
    const raw = await f.raw();
    const block = raw.block(requestHeaders(ECHO));
    await raw.write(
      Buffer.concat([
        frame(FrameType.Headers, 0, 1, block.subarray(0, 5)),
        frame(FrameType.Continuation, Flag.EndHeaders, 3, block.subarray(5)),
      ]),
    );
    await expectGoAway(raw, ErrorCode.ProtocolError);
    const raw2 = await f.raw();
    await raw2.write(frame(FrameType.Continuation, Flag.EndHeaders, 1, block));
    await expectGoAway(raw2, ErrorCode.ProtocolError);
    assert.equal(f.calls.length, 0);
  });

  test('a frame longer than the advertised max frame size is a FRAME_SIZE_ERROR', async (t) => {
    const f = await serve(t);
    const raw = await f.raw();
    await raw.call(1, ECHO, Buffer.from('before'));
    assert.deepEqual(messageOf(await raw.response(1)), Buffer.from('before'));
    // Only the frame header: the server must not wait for a megabyte to reject it.
    const header = frame(FrameType.Data, 0, 3, Buffer.alloc(0));
    header.writeUIntBE(SERVER_MAX_FRAME + 1, 0, 3);
    await raw.write(Buffer.concat([frame(FrameType.Headers, Flag.EndHeaders, 3, raw.block(requestHeaders(ECHO))), header]));
    await expectGoAway(raw, ErrorCode.FrameSizeError, 3);
    assert.ok(f.errors.some((e) => /too large/.test(e.message)), 'reported to onConnectionError');
  });

  test('a DATA frame of exactly the advertised max frame size is accepted', async (t) => {
    const f = await serve(t, (call) => call.respond(Buffer.from(sha256(call.message))));
    const raw = await f.raw();
    // Wait for the server's SETTINGS (its 4 MiB stream window) before sending a large frame.
    await raw.nextOf(FrameType.Settings);
    await raw.write(frame(FrameType.Settings, Flag.Ack, 0));
    const message = randomBytes(SERVER_MAX_FRAME - 5);
    await raw.write(
      Buffer.concat([
        frame(FrameType.Headers, Flag.EndHeaders, 1, raw.block(requestHeaders(ECHO))),
        frame(FrameType.Data, Flag.EndStream, 1, grpcFrame(message)),
      ]),
    );
    assert.equal(messageOf(await raw.response(1)).toString(), sha256(message));
  });

  for (const [name, streamId] of [
    ['stream 0', 0],
    ['an even stream', 2],
  ] as const) {
    test(`HEADERS on ${name} is a PROTOCOL_ERROR`, async (t) => {
      const f = await serve(t);
      const raw = await f.raw();
      await raw.write(frame(FrameType.Headers, Flag.EndHeaders | Flag.EndStream, streamId, raw.block(requestHeaders(ECHO))));
      await expectGoAway(raw, ErrorCode.ProtocolError);
      assert.equal(f.calls.length, 0);
    });
  }

  test('a stream id lower than one already used is a PROTOCOL_ERROR', async (t) => {
    const f = await serve(t);
    const raw = await f.raw();
    await raw.call(5, ECHO, Buffer.from('five'));
    assert.deepEqual(messageOf(await raw.response(5)), Buffer.from('five'));
    await raw.call(3, ECHO, Buffer.from('three'));
    await expectGoAway(raw, ErrorCode.ProtocolError, 5);
    assert.equal(f.calls.length, 1);
  });

  test('an undecodable header block is a COMPRESSION_ERROR', async (t) => {
    const f = await serve(t);
    const raw = await f.raw();
    // Indexed field 0 does not exist (RFC 7541 section 6.1).
    await raw.write(frame(FrameType.Headers, Flag.EndHeaders | Flag.EndStream, 1, Buffer.from([0x80])));
    await expectGoAway(raw, ErrorCode.CompressionError);
  });

  test('PUSH_PROMISE from a client is a PROTOCOL_ERROR', async (t) => {
    const f = await serve(t);
    const raw = await f.raw();
    await raw.write(frame(FrameType.PushPromise, Flag.EndHeaders, 1, Buffer.alloc(4)));
    await expectGoAway(raw, ErrorCode.ProtocolError);
  });

  test('unknown frame types, PRIORITY and GOAWAY from the client are ignored', async (t) => {
    const f = await serve(t);
    const raw = await f.raw();
    await raw.write(
      Buffer.concat([
        frame(0xfa, 0xff, 1, Buffer.from('extension frame')),
        frame(FrameType.Priority, 0, 1, Buffer.alloc(5)),
        frame(0x0b, 0, 0, Buffer.alloc(0)),
      ]),
    );
    await raw.call(1, ECHO, Buffer.from('still fine'));
    assert.deepEqual(messageOf(await raw.response(1)), Buffer.from('still fine'));
  });

  test('SETTINGS whose length is not a multiple of 6 is a FRAME_SIZE_ERROR', async (t) => {
    const f = await serve(t);
    const raw = await f.raw({ settings: false });
    await raw.write(frame(FrameType.Settings, 0, 0, Buffer.alloc(7)));
    await expectGoAway(raw, ErrorCode.FrameSizeError);
  });

  test('an INITIAL_WINDOW_SIZE above 2^31-1 is a FLOW_CONTROL_ERROR', async (t) => {
    const f = await serve(t);
    const raw = await f.raw({ settings: [[Setting.InitialWindowSize, 2 ** 31]] });
    await expectGoAway(raw, ErrorCode.FlowControlError);
  });

  test('a message with the compressed flag gets a trailers-only grpc-status 12', async (t) => {
    const f = await serve(t);
    const raw = await f.raw();
    await raw.request(1, ECHO, grpcFrame(Buffer.from('gzip?'), { compressed: true }), [['grpc-encoding', 'gzip']]);
    const response = await raw.response(1);
    assert.equal(response.trailersOnly, true);
    assert.equal(response.frames.length, 1, 'a single HEADERS frame');
    assert.equal(headerValue(response.headers, ':status'), '200');
    assert.equal(headerValue(response.headers, 'content-type'), 'application/grpc');
    assert.equal(statusOf(response), GrpcCode.Unimplemented);
    assert.match(headerValue(response.headers, 'grpc-message') ?? '', /compress/);
    assert.equal(f.calls.length, 0);
    // A stream error only: the connection serves the next call.
    await raw.call(3, ECHO, Buffer.from('plain'));
    assert.deepEqual(messageOf(await raw.response(3)), Buffer.from('plain'));
  });

  test('malformed gRPC framing is INVALID_ARGUMENT, stream by stream', async (t) => {
    const f = await serve(t);
    const raw = await f.raw();
    const five = Buffer.from('12345');
    const cases: [string, number, () => Promise<void>][] = [
      ['prefix longer than the body', 1, () => raw.request(1, ECHO, grpcFrame(five, { declaredLength: 10 }))],
      ['prefix shorter than the body', 3, () => raw.request(3, ECHO, grpcFrame(five, { declaredLength: 2 }))],
      ['two messages', 5, () => raw.request(5, ECHO, Buffer.concat([grpcFrame(five), grpcFrame(five)]))],
      ['a body shorter than the prefix', 7, () => raw.request(7, ECHO, Buffer.from([0, 0, 0]))],
      [
        'no body at all',
        9,
        () => raw.write(frame(FrameType.Headers, Flag.EndHeaders | Flag.EndStream, 9, raw.block(requestHeaders(ECHO)))),
      ],
    ];
    for (const [name, streamId, send] of cases) {
      await send();
      const response = await raw.response(streamId);
      assert.equal(response.trailersOnly, true, name);
      assert.equal(statusOf(response), GrpcCode.InvalidArgument, name);
    }
    assert.equal(f.calls.length, 0);
    await raw.call(11, ECHO, five);
    assert.deepEqual(messageOf(await raw.response(11)), five);
  });

  test('a message split over many DATA frames, the length prefix too, is reassembled', async (t) => {
    const f = await serve(t);
    const raw = await f.raw();
    const body = grpcFrame(randomBytes(1000));
    const frames = [frame(FrameType.Headers, Flag.EndHeaders, 1, raw.block(requestHeaders(ECHO)))];
    for (const [start, end] of [
      [0, 1],
      [1, 3],
      [3, 5],
      [5, 6],
      [6, 600],
    ] as const) {
      frames.push(frame(FrameType.Data, 0, 1, body.subarray(start, end)));
    }
    frames.push(frame(FrameType.Data, 0, 1, Buffer.alloc(0)));
    frames.push(frame(FrameType.Data, Flag.EndStream, 1, body.subarray(600)));
    await raw.write(Buffer.concat(frames));
    assert.deepEqual(messageOf(await raw.response(1)), body.subarray(5));
  });

  test('padded DATA and padded, prioritised HEADERS are handled', async (t) => {
    const f = await serve(t, (call) => call.respond(Buffer.from(`${call.header('x-tag') ?? ''}|${call.message.toString('hex')}`)));
    const raw = await f.raw();
    const message = randomBytes(300);
    const body = grpcFrame(message);
    const padded = (data: Buffer, pad: number): Buffer => Buffer.concat([Buffer.from([pad]), data, Buffer.alloc(pad, 0xee)]);
    const block = raw.block(requestHeaders(ECHO, [['x-tag', 'padded']]));
    // HEADERS payload: pad length, 5 priority bytes, block, padding.
    const headersPayload = Buffer.concat([Buffer.from([7]), Buffer.from([0, 0, 0, 0, 15]), block, Buffer.alloc(7)]);
    await raw.write(
      Buffer.concat([
        frame(FrameType.Headers, Flag.EndHeaders | Flag.Padded | Flag.Priority, 1, headersPayload),
        frame(FrameType.Data, Flag.Padded, 1, padded(body.subarray(0, 100), 255)),
        frame(FrameType.Data, Flag.Padded, 1, padded(body.subarray(100, 200), 0)),
        frame(FrameType.Data, Flag.Padded, 1, padded(Buffer.alloc(0), 20)),
        frame(FrameType.Data, Flag.Padded | Flag.EndStream, 1, padded(body.subarray(200), 3)),
      ]),
    );
    const response = await raw.response(1);
    assert.equal(statusOf(response), 0, headerValue(response.trailers, 'grpc-message'));
    assert.equal(messageOf(response).toString(), `padded|${message.toString('hex')}`);
  });

  test('RST_STREAM from the client runs onCancel of the pending call once', async (t) => {
    const cancelled = signal();
    let cancels = 0;
    const f = await serve(t, (call) => {
      if (call.method === ECHO) call.respond(call.message);
      else
        call.onCancel(() => {
          cancels++;
          cancelled.resolve();
        });
    });
    const raw = await f.raw();
    await raw.call(1, '/test.Echo/Hold', Buffer.from('hold'));
    const [held] = await f.waitCalls(1);
    await raw.rstStream(1, ErrorCode.Cancel);
    await within(cancelled.promise, WAIT_MS, 'onCancel after RST_STREAM');
    assert.equal(cancels, 1);
    // A late answer puts nothing on the wire for that stream.
    held?.call.respond(Buffer.from('too late'));
    await raw.barrier();
    assert.deepEqual(raw.drain(1).map(describeFrame), []);
    // A second RST_STREAM, and DATA for the reset stream, are harmless.
    await raw.rstStream(1, ErrorCode.Cancel);
    await raw.write(frame(FrameType.Data, Flag.EndStream, 1, grpcFrame(Buffer.from('stray'))));
    await raw.call(3, ECHO, Buffer.from('next'));
    assert.deepEqual(messageOf(await raw.response(3)), Buffer.from('next'));
    await raw.close();
    const [socket] = f.serverSockets();
    if (socket !== undefined && !socket.closed) await within(new Promise((r) => socket.once('close', r)), WAIT_MS, 'close');
    assert.equal(cancels, 1);
  });

  test('closing the connection runs onCancel of every pending call', async (t) => {
    let cancels = 0;
    const all = signal();
    const f = await serve(t, (call) =>
      call.onCancel(() => {
        if (++cancels === 3) all.resolve();
      }),
    );
    const raw = await f.raw();
    for (const id of [1, 3, 5]) await raw.call(id, '/test.Echo/Hold', Buffer.from(String(id)));
    await f.waitCalls(3);
    await raw.close();
    await within(all.promise, WAIT_MS, 'three onCancel calls');
    assert.equal(cancels, 3);
  });

  test('a response to a client with a 10-byte stream window goes out only as WINDOW_UPDATEs allow', async (t) => {
    const payload = randomBytes(200);
    const f = await serve(t, (call) => call.respond(payload));
    const raw = await f.raw({ settings: [[Setting.InitialWindowSize, 10]] });
    await raw.call(1, ECHO, Buffer.from('go'));
    const expected = grpcFrame(payload);
    const increments = [1, 7, 2, 30, 13, 64];
    let granted = 10;
    let received = 0;
    const data: Buffer[] = [];
    let trailers: RawFrame | undefined;
    let headers: RawFrame | undefined;
    for (let round = 0; trailers === undefined; round++) {
      assert.ok(round < 100, 'too many rounds');
      await raw.barrier();
      for (const x of raw.drain(1)) {
        if (x.type === FrameType.Headers && headers === undefined) headers = x;
        else if (x.type === FrameType.Data) {
          assert.equal(trailers, undefined, 'DATA after the trailers');
          assert.equal(x.flags & Flag.EndStream, 0);
          received += x.payload.length;
          data.push(x.payload);
          assert.ok(received <= granted, `round ${round}: ${received} bytes sent with a window of ${granted}`);
        } else if (x.type === FrameType.Headers) trailers = x;
        else assert.fail(`unexpected ${describeFrame(x)}`);
      }
      assert.ok(headers !== undefined, 'response headers come regardless of the window');
      if (trailers !== undefined) break;
      // Everything the window allowed went out at once.
      assert.equal(received, Math.min(granted, expected.length), `round ${round}`);
      const increment = increments[round % increments.length] as number;
      granted += increment;
      await raw.windowUpdate(1, increment);
    }
    assert.equal(received, expected.length);
    assert.deepEqual(Buffer.concat(data), expected);
    assert.equal(headerValue(trailers.headers ?? [], 'grpc-status'), '0');
  });

  test('a larger INITIAL_WINDOW_SIZE in new SETTINGS releases a blocked response', async (t) => {
    const payload = randomBytes(3000);
    const f = await serve(t, (call) => call.respond(payload));
    const raw = await f.raw({ settings: [[Setting.InitialWindowSize, 10]] });
    await raw.call(1, ECHO, Buffer.from('go'));
    await raw.barrier();
    const sent = (): number => raw.received.filter((x) => x.type === FrameType.Data && x.streamId === 1).reduce((n, x) => n + x.payload.length, 0);
    assert.equal(sent(), 10);
    await raw.write(settingsFrame([[Setting.InitialWindowSize, 1000]]));
    await raw.barrier();
    assert.equal(sent(), 1000);
    await raw.write(settingsFrame([[Setting.InitialWindowSize, 1 << 20]]));
    const response = await raw.response(1);
    assert.deepEqual(messageOf(response), payload);
  });

  test('a smaller INITIAL_WINDOW_SIZE can make a stream window negative; sending waits until it is positive', async (t) => {
    const payload = randomBytes(500);
    const f = await serve(t, (call) => call.respond(payload));
    const raw = await f.raw({ settings: [[Setting.InitialWindowSize, 100]] });
    await raw.call(1, ECHO, Buffer.from('go'));
    await raw.barrier();
    const sent = (): number => raw.received.filter((x) => x.type === FrameType.Data && x.streamId === 1).reduce((n, x) => n + x.payload.length, 0);
    assert.equal(sent(), 100);
    // The window drops by 60: it is now -60 (RFC 9113 section 6.9.2).
    await raw.write(settingsFrame([[Setting.InitialWindowSize, 40]]));
    await raw.windowUpdate(1, 50);
    await raw.barrier();
    assert.equal(sent(), 100, 'data sent on a negative window');
    await raw.windowUpdate(1, 30);
    await raw.barrier();
    assert.equal(sent(), 120);
    await raw.windowUpdate(1, 1 << 20);
    assert.deepEqual(messageOf(await raw.response(1)), payload);
  });

  test("the response respects the client's connection window", async (t) => {
    const payload = randomBytes(100_000);
    const f = await serve(t, (call) => call.respond(payload));
    const raw = await f.raw({ settings: [[Setting.InitialWindowSize, 1 << 20]] });
    await raw.call(1, ECHO, Buffer.from('go'));
    await raw.barrier();
    const sent = (): number => raw.received.filter((x) => x.type === FrameType.Data).reduce((n, x) => n + x.payload.length, 0);
    assert.equal(sent(), DEFAULT_WINDOW);
    // A second call on the same connection has no connection window left either.
    await raw.call(3, ECHO, Buffer.from('go'));
    await raw.barrier();
    assert.equal(sent(), DEFAULT_WINDOW);
    await raw.windowUpdate(0, 100);
    await raw.barrier();
    assert.equal(sent(), DEFAULT_WINDOW + 100);
    await raw.windowUpdate(0, 1 << 20);
    assert.deepEqual(messageOf(await raw.response(1)), payload);
    assert.deepEqual(messageOf(await raw.response(3)), payload);
  });

  for (const maxFrame of [DEFAULT_MAX_FRAME, 32_768]) {
    test(`DATA frames never exceed the client's max frame size (${maxFrame})`, async (t) => {
      const payload = randomBytes(200_000);
      const f = await serve(t, (call) => call.respond(payload));
      const settings: [number, number][] = [[Setting.InitialWindowSize, 1 << 20]];
      if (maxFrame !== DEFAULT_MAX_FRAME) settings.push([Setting.MaxFrameSize, maxFrame]);
      const raw = await f.raw({ settings });
      await raw.windowUpdate(0, 1 << 20);
      await raw.call(1, ECHO, Buffer.from('go'));
      const response = await raw.response(1);
      assert.deepEqual(messageOf(response), payload);
      const sizes = response.frames.filter((x) => x.type === FrameType.Data).map((x) => x.payload.length);
      assert.ok(Math.max(...sizes) <= maxFrame, `largest DATA frame ${Math.max(...sizes)}`);
      assert.equal(Math.max(...sizes), maxFrame, 'frames are filled up to the limit');
      for (const x of response.frames) assert.ok(x.payload.length <= maxFrame, describeFrame(x));
    });
  }

  test('grpc-timeout is parsed in every unit; malformed values mean no deadline', async (t) => {
    const f = await serve(t);
    const raw = await f.raw();
    const cases: [string | undefined, number][] = [
      ['1500m', 1500],
      ['2S', 2000],
      ['3M', 180_000],
      ['1H', 3_600_000],
      ['250000u', 250],
      ['99999999n', 99.999999],
      ['99999999H', 99_999_999 * 3_600_000],
      ['0m', 0],
      ['123456789S', Infinity],
      ['10s', Infinity],
      ['-1S', Infinity],
      ['1.5S', Infinity],
      ['S', Infinity],
      ['', Infinity],
      [' 1S', Infinity],
      [undefined, Infinity],
    ];
    let streamId = 1;
    for (const [value, ms] of cases) {
      const before = Date.now();
      await raw.call(streamId, ECHO, Buffer.alloc(0), value === undefined ? [] : [['grpc-timeout', value]]);
      await raw.response(streamId);
      const after = Date.now();
      const call = f.calls.at(-1);
      assert.ok(call !== undefined);
      assert.equal(call.headers.get('grpc-timeout'), value);
      if (ms === Infinity) assert.equal(call.deadline, Infinity, `grpc-timeout ${JSON.stringify(value)}`);
      else assert.ok(call.deadline >= before + ms && call.deadline <= after + ms, `grpc-timeout ${value}: ${call.deadline - before - ms}`);
      streamId += 2;
    }
  });

  test('after stopAccepting: GOAWAY, calls in flight finish, new streams are refused', async (t) => {
    const f = await serve(t, (call) => {
      if (call.method === ECHO) call.respond(call.message);
    });
    const raw = await f.raw();
    await raw.call(1, ECHO, Buffer.from('one'));
    assert.deepEqual(messageOf(await raw.response(1)), Buffer.from('one'));
    await raw.call(3, '/test.Echo/Hold', Buffer.from('held'));
    const [, held] = await f.waitCalls(2);
    f.server.stopAccepting();
    assert.equal(existsSync(f.path), false);
    const goAway = await raw.goAway();
    assert.equal(goAway.code, ErrorCode.NoError);
    assert.equal(goAway.lastStreamId, 3);
    await raw.call(5, ECHO, Buffer.from('refused'));
    const rst = await raw.nextOf(FrameType.RstStream, 5);
    assert.equal(rst.payload.readUInt32BE(0), ErrorCode.RefusedStream);
    assert.equal(f.calls.length, 2, 'a stream above the GOAWAY reached the handler');
    held?.call.respond(Buffer.from('finished'));
    assert.deepEqual(messageOf(await raw.response(3)), Buffer.from('finished'));
    assert.equal(raw.isClosed, false);
  });

  test('an answer before the request ends resets the rest of the request with NO_ERROR', async (t) => {
    const f = await serve(t, undefined, { maxMessageBytes: 1000 });
    const raw = await f.raw();
    await raw.write(
      Buffer.concat([
        frame(FrameType.Headers, Flag.EndHeaders, 1, raw.block(requestHeaders(ECHO))),
        frame(FrameType.Data, 0, 1, grpcFrame(randomBytes(2000))),
        frame(FrameType.Data, Flag.EndStream, 1, Buffer.alloc(0)),
      ]),
    );
    const response = await raw.response(1);
    assert.equal(statusOf(response), GrpcCode.ResourceExhausted);
    await raw.call(3, ECHO, Buffer.from('ok'));
    assert.deepEqual(messageOf(await raw.response(3)), Buffer.from('ok'));
  });

  test('thousands of streams answered in one batch on a raw connection', async (t) => {
    const COUNT = 3000;
    const f = await serve(t, () => undefined);
    const raw = await f.raw({ settings: [[Setting.InitialWindowSize, 1 << 20]] });
    await raw.windowUpdate(0, 64 * MiB);
    const frames: Buffer[] = [];
    for (let i = 0; i < COUNT; i++) {
      const id = 2 * i + 1;
      frames.push(frame(FrameType.Headers, Flag.EndHeaders, id, raw.block(requestHeaders(ECHO, [['x-i', String(i)]]))));
      frames.push(frame(FrameType.Data, Flag.EndStream, id, grpcFrame(Buffer.from(`m${i}`))));
    }
    await raw.write(Buffer.concat(frames));
    const calls = await f.waitCalls(COUNT, 20_000);
    for (const { call, headers, message } of [...calls].reverse()) {
      call.respond(Buffer.concat([Buffer.from(`${headers.get('x-i')}:`), message]));
    }
    for (let i = 0; i < COUNT; i++) {
      const response = await raw.response(2 * i + 1);
      assert.equal(messageOf(response).toString(), `${i}:m${i}`);
    }
  });
});

describe('GrpcH2Server: limits and malformed frames', () => {
  test(
    'a trailers-only answer with a long message fits the client max frame size',
    async (t) => {
      const long = `no such sandbox: ${'é'.repeat(6000)}`;
      const f = await serve(t, (call) => call.fail(5, long));
      const raw = await f.raw();
      await raw.call(1, ECHO, Buffer.from('x'));
      const response = await raw.response(1);
      for (const x of response.frames) {
        for (const size of x.wireSizes ?? [x.payload.length]) assert.ok(size <= DEFAULT_MAX_FRAME, `${describeFrame(x)}: a frame of ${size} bytes exceeds ${DEFAULT_MAX_FRAME}`);
      }
      const headers = response.frames.find((x) => x.headers !== undefined)?.headers ?? [];
      assert.equal(headers.find(([n]) => n === 'grpc-status')?.[1], '5');
    },
  );

  test(
    'a grpc-js client gets a long failure message without losing the connection',
    async (t) => {
      // What launch-spec.ts answers for a Create whose spec has a 20 KB invalid hostname.
      const long = `hostname "${'x'.repeat(20_000)}!" is not a valid host name`;
      const f = await serve(t, (call) => (call.method === ECHO ? call.respond(call.message) : call.fail(3, long)));
      const client = f.grpc();
      const deadline = (): number => Date.now() + 1500;
      // Long messages are cut to 4 KiB (and marked), never sent in a frame the client refuses.
      const err = await unary(client, '/test.Echo/Fail', Buffer.from('x'), { deadline: deadline() }).result.then(
        () => assert.fail('the call should fail'),
        (e: unknown) => e as { code: number; details: string },
      );
      assert.equal(err.code, GrpcStatus.INVALID_ARGUMENT);
      assert.ok(long.startsWith(err.details.slice(0, -1)) && err.details.endsWith('…') && err.details.length <= 4097, err.details.slice(0, 80));
      assert.deepEqual(await unary(client, ECHO, Buffer.from('next'), { deadline: deadline() }).result, Buffer.from('next'));
    },
  );

  test(
    'a header block that keeps growing over CONTINUATION frames ends the connection',
    async (t) => {
      const f = await serve(t);
      const raw = await f.raw();
      const block = raw.block(requestHeaders(ECHO));
      await raw.write(frame(FrameType.Headers, 0, 1, block));
      const chunk = frame(FrameType.Continuation, 0, 1, Buffer.alloc(SERVER_MAX_FRAME, 0x40));
      // 32 MiB of header block, never ended: far beyond any sane header list size.
      for (let i = 0; i < 32 && !raw.isClosed; i++) await raw.write(chunk).catch(() => undefined);
      await raw.waitClosed(1000);
    },
  );

  test(
    'DATA whose padding length exceeds the frame is a PROTOCOL_ERROR',
    async (t) => {
      const f = await serve(t);
      const raw = await f.raw();
      await raw.write(
        Buffer.concat([
          frame(FrameType.Headers, Flag.EndHeaders, 1, raw.block(requestHeaders(ECHO))),
          frame(FrameType.Data, Flag.Padded | Flag.EndStream, 1, Buffer.from([200, 1, 2, 3])),
        ]),
      );
      // Stream 1 was opened (its HEADERS processed), so it is the last stream id.
      await expectGoAway(raw, ErrorCode.ProtocolError, 1, 1000);
    },
  );

  test(
    'SETTINGS on a non-zero stream is a PROTOCOL_ERROR',
    async (t) => {
      const f = await serve(t);
      const raw = await f.raw({ settings: false });
      await raw.write(frame(FrameType.Settings, 0, 1, Buffer.alloc(0)));
      await expectGoAway(raw, ErrorCode.ProtocolError);
    },
  );
});
