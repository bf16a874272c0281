/**
 * For the ttrpc tests: a raw peer that writes frames a test builds and reads the server's
 * Responses (raw-socket.ts, with tsbox's own frame decoder), request frames built by hand, and
 * the methods of a test service that the in-process server (test/integration/ttrpc.test.ts)
 * and the server process of the hostile tier (ttrpc-test-server.ts) both serve.
 */
import type net from 'node:net';
import { TsboxError, abortError } from '../../src/base/errors.js';
import { TaskService } from '../../src/gen/containerd/task/v3/shim.js';
import { Request, Response } from '../../src/gen/ttrpc/request.js';
import { FrameDecoder, FrameType, encodeFrame } from '../../src/ttrpc/frame.js';
import type { TtrpcServer } from '../../src/ttrpc/server.js';
import { HEADER_BYTES } from '../../src/ttrpc/limits.js';
import { RawSocket } from './raw-socket.js';

/** The test service's name; its methods are below. */
export const TEST_SERVICE = 'tsbox.test.Echo';

/** The metadata key containerd's ttrpc client puts the namespace in. */
export const NAMESPACE_KEY = 'containerd-namespace-ttrpc';

/**
 * Serves on `server`: Echo (answers its payload), Hold (answers only when its signal fires,
 * with the signal's reason), HeldAtMost (answers the number of Holds held once it is at most
 * its payload, a decimal number), Fail (NOT_FOUND naming its payload), Crash (throws a plain Error,
 * whose message must not reach the caller), Namespace (answers the namespace metadata), and
 * the Task API's Connect (typed, through the generated definition).
 */
export function addTestMethods(server: TtrpcServer): void {
  server.register(TEST_SERVICE, 'Echo', (payload) => Promise.resolve(payload));
  let held = 0;
  const heldWaiters = new Set<() => void>();
  server.register(
    TEST_SERVICE,
    'Hold',
    (_payload, ctx) =>
      new Promise((_resolve, reject) => {
        const end = (): void => {
          held--;
          for (const waiter of heldWaiters) waiter();
          reject(abortError(ctx.signal));
        };
        held++;
        if (ctx.signal.aborted) end();
        else ctx.signal.addEventListener('abort', end, { once: true });
      }),
  );
  // Answers (with the count) once no more than its payload's number of Holds are held.
  server.register(
    TEST_SERVICE,
    'HeldAtMost',
    (payload, ctx) =>
      new Promise((resolve, reject) => {
        const most = Number(payload.toString());
        const check = (): void => {
          if (held > most) return;
          heldWaiters.delete(check);
          resolve(Buffer.from(String(held)));
        };
        heldWaiters.add(check);
        ctx.signal.addEventListener('abort', () => {
          heldWaiters.delete(check);
          reject(abortError(ctx.signal));
        }, { once: true });
        check();
      }),
  );
  server.register(TEST_SERVICE, 'Fail', (payload) => Promise.reject(new TsboxError('NotFound', `no such thing: ${payload.toString()}`)));
  server.register(TEST_SERVICE, 'Crash', () => Promise.reject(new Error('secret detail')));
  server.register(TEST_SERVICE, 'Namespace', (_payload, ctx) => Promise.resolve(Buffer.from((ctx.metadata.get(NAMESPACE_KEY) ?? []).join(','))));
  server.registerMethod(TaskService.connect, (request) => Promise.resolve({ shimPid: process.pid, taskPid: request.id.length, version: '' }));
}

/** A request frame, built by hand. */
export function requestFrame(streamId: number, service: string, method: string, payload: Uint8Array = Buffer.alloc(0), timeoutNano = 0): Buffer {
  const request = Request.encode({ service, method, payload: Buffer.from(payload), timeoutNano, metadata: [] }).finish();
  return encodeFrame(streamId, FrameType.Request, request);
}

/** A Response the server sent, with the stream it answered. */
export interface ServerResponse {
  readonly streamId: number;
  readonly code: number;
  readonly message: string;
  readonly payload: Buffer;
}

/** A raw ttrpc peer: writes anything, collects the server's Responses. */
export class RawTtrpc extends RawSocket {
  readonly responses: ServerResponse[] = [];
  /** Responses counted, kept or not. */
  answered = 0;
  readonly #decoder = new FrameDecoder();
  readonly #keep: boolean;

  private constructor(socket: net.Socket, keep: boolean) {
    super(socket, (chunk) => this.#parse(chunk));
    this.#keep = keep;
  }

  static async connect(path: string, options: { keepResponses?: boolean } = {}): Promise<RawTtrpc> {
    return new RawTtrpc(await RawSocket.open(path), options.keepResponses ?? true);
  }

  /** The Response on `streamId`, if it came. */
  response(streamId: number): ServerResponse | undefined {
    return this.responses.find((r) => r.streamId === streamId);
  }

  #parse(chunk: Buffer): void {
    for (const item of this.#decoder.push(chunk)) {
      if (item.kind !== 'frame' || item.frame.type !== FrameType.Response) continue;
      this.answered++;
      if (!this.#keep) continue;
      const response = Response.decode(item.frame.payload);
      this.responses.push({
        streamId: item.frame.streamId,
        code: response.status?.code ?? 0,
        message: response.status?.message ?? '',
        payload: response.payload,
      });
    }
  }
}

/** A frame header announcing `length` bytes, without them. */
export function frameHeader(length: number, streamId: number, type: number = FrameType.Request): Buffer {
  const bytes = Buffer.alloc(HEADER_BYTES);
  bytes.writeUInt32BE(length, 0);
  bytes.writeUInt32BE(streamId, 4);
  bytes[8] = type;
  return bytes;
}

/**
 * Floods `socketPath` from peers that never read, one after the other, for 5 s each: Echo
 * requests, requests on even stream ids, frames of an unknown type; `probe` runs after each.
 */
export async function floodWithoutReading(socketPath: string, probe: () => Promise<unknown>): Promise<void> {
  const makers: ((i: number) => Buffer)[] = [
    (i) => requestFrame(2 * i + 1, TEST_SERVICE, 'Echo', Buffer.alloc(512)),
    (i) => requestFrame(2 * i + 2, TEST_SERVICE, 'Echo'),
    (i) => encodeFrame(2 * i + 1, 0x7f, Buffer.alloc(64)),
  ];
  for (const make of makers) {
    const conn = await RawTtrpc.connect(socketPath, { keepResponses: false });
    try {
      conn.pause();
      const stopAt = Date.now() + 5000;
      let i = 0;
      while (!conn.closed && Date.now() < stopAt && i < 400_000) {
        const batch: Buffer[] = [];
        for (const end = i + 2000; i < end; i++) batch.push(make(i));
        await conn.write(Buffer.concat(batch), stopAt - Date.now());
      }
      await probe();
    } finally {
      conn.destroy();
    }
  }
}
