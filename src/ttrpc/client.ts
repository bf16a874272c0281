import { connect, type Socket } from 'node:net';
import { GRPC_CODES } from '../base/errors.js';
import { Request, Response } from '../gen/ttrpc/request.js';
import { FrameDecoder, FrameType, encodeFrame } from './frame.js';
import { splitPath, type TtrpcMethod } from './server.js';

/** How long past a call's deadline the client waits for the server's DEADLINE_EXCEEDED before failing it itself. */
const DEADLINE_GRACE_MS = 1000;

/** A call answered with a status other than OK, or ended without an answer. */
export class TtrpcError extends Error {
  override readonly name = 'TtrpcError';
  constructor(
    /** A gRPC status code (GRPC_CODES in src/base/errors.ts). */
    readonly code: number,
    message: string,
  ) {
    super(message);
  }
}

export interface TtrpcCallOptions {
  /** Sent as the request's timeout_nano; the call fails here too, DEADLINE_GRACE_MS later, if no answer came. */
  readonly timeoutMs?: number;
  readonly metadata?: Readonly<Record<string, string>>;
}

/** A method as ts-proto's generated service definitions describe it, seen from the caller. */
export interface TtrpcClientMethod<Req, Res> extends Pick<TtrpcMethod<Req, Res>, 'path'> {
  readonly requestSerialize: (value: Req) => Buffer;
  readonly responseDeserialize: (bytes: Buffer) => Res;
}

interface Pending {
  resolve(payload: Buffer): void;
  reject(err: TtrpcError): void;
}

/**
 * A ttrpc client on one unix-socket connection: calls go out as odd, increasing stream ids and
 * are answered in any order. When the connection closes, every pending call fails with
 * UNAVAILABLE, and so does every later one: like ttrpc's client, it does not redial.
 */
export class TtrpcClient {
  readonly #socket: Socket;
  readonly #decoder = new FrameDecoder();
  readonly #pending = new Map<number, Pending>();
  #nextStreamId = 1;
  #closed = false;
  readonly closed: Promise<void>;

  private constructor(socket: Socket) {
    this.#socket = socket;
    socket.on('data', (chunk: Buffer) => this.#onData(chunk));
    // The close that follows fails what is pending.
    socket.on('error', () => undefined);
    this.closed = new Promise((resolve) =>
      socket.once('close', () => {
        this.#closed = true;
        const gone = new TtrpcError(GRPC_CODES.Unavailable, 'ttrpc: the connection closed');
        for (const pending of this.#pending.values()) pending.reject(gone);
        this.#pending.clear();
        resolve();
      }),
    );
  }

  /** Connects to the server at `path`; rejects when nothing accepts there. */
  static connect(path: string): Promise<TtrpcClient> {
    return new Promise((resolve, reject) => {
      const socket = connect(path);
      socket.once('error', reject);
      socket.once('connect', () => {
        socket.off('error', reject);
        resolve(new TtrpcClient(socket));
      });
    });
  }

  /** Calls `service`/`method` with an encoded request; resolves with the encoded response. */
  call(service: string, method: string, payload: Uint8Array, options: TtrpcCallOptions = {}): Promise<Buffer> {
    if (this.#closed || this.#socket.destroyed) return Promise.reject(new TtrpcError(GRPC_CODES.Unavailable, 'ttrpc: the connection closed'));
    const streamId = this.#nextStreamId;
    this.#nextStreamId += 2;
    const request = Request.encode({
      service,
      method,
      payload: Buffer.from(payload.buffer, payload.byteOffset, payload.length),
      timeoutNano: options.timeoutMs === undefined ? 0 : Math.round(options.timeoutMs * 1e6),
      metadata: Object.entries(options.metadata ?? {}).map(([key, value]) => ({ key, value })),
    }).finish();
    return new Promise<Buffer>((resolve, reject) => {
      let timer: NodeJS.Timeout | undefined;
      const settle = (): void => {
        if (timer !== undefined) clearTimeout(timer);
        this.#pending.delete(streamId);
      };
      this.#pending.set(streamId, {
        resolve: (answer) => {
          settle();
          resolve(answer);
        },
        reject: (err) => {
          settle();
          reject(err);
        },
      });
      if (options.timeoutMs !== undefined) {
        // The server answers at the deadline; this is the backstop for one that does not.
        const backstopMs = options.timeoutMs + DEADLINE_GRACE_MS;
        timer = setTimeout(() => this.#pending.get(streamId)?.reject(new TtrpcError(GRPC_CODES.DeadlineExceeded, 'ttrpc: deadline exceeded')), backstopMs);
      }
      this.#socket.write(encodeFrame(streamId, FrameType.Request, request));
    });
  }

  /** Calls a generated method (e.g. TaskService.wait) with a typed request. */
  async request<Req, Res>(definition: TtrpcClientMethod<Req, Res>, request: Req, options: TtrpcCallOptions = {}): Promise<Res> {
    const { service, method } = splitPath(definition.path);
    return definition.responseDeserialize(await this.call(service, method, definition.requestSerialize(request), options));
  }

  /** Closes the connection; pending calls fail with UNAVAILABLE. */
  close(): void {
    this.#socket.destroy();
  }

  #onData(chunk: Buffer): void {
    for (const item of this.#decoder.push(chunk)) {
      if (item.kind === 'skipped') {
        if (item.reason === 'oversized') this.#pending.get(item.header.streamId)?.reject(new TtrpcError(GRPC_CODES.ResourceExhausted, 'ttrpc: the answer exceeds the message limit'));
        continue;
      }
      if (item.frame.type !== FrameType.Response) continue;
      const pending = this.#pending.get(item.frame.streamId);
      if (pending === undefined) continue;
      let response: Response;
      try {
        response = Response.decode(item.frame.payload);
      } catch (err) {
        pending.reject(new TtrpcError(GRPC_CODES.Internal, `ttrpc: cannot decode the response: ${String(err)}`));
        continue;
      }
      const status = response.status;
      if (status !== undefined && status.code !== 0) pending.reject(new TtrpcError(status.code, status.message));
      else pending.resolve(response.payload);
    }
  }
}
