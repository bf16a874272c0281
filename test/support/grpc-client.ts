/**
 * A promise-based client of the Sandbox Controller API for tests, built on the generated
 * grpc-js client (src/gen). Every call carries the `containerd-namespace` metadata the way
 * containerd sends it (SPEC.md section 1), may carry a deadline and an AbortSignal (which
 * cancels the call), and either resolves with the response or rejects with the grpc-js
 * ServiceError the server answered.
 */
import assert from 'node:assert/strict';
import {
  Metadata,
  credentials,
  status as GrpcStatus,
  type CallOptions as GrpcCallOptions,
  type ClientUnaryCall,
  type ServiceError,
} from '@grpc/grpc-js';
import {
  ControllerClient,
  ControllerCreateRequest,
  ControllerMetricsRequest,
  ControllerPlatformRequest,
  ControllerShutdownRequest,
  ControllerStartRequest,
  ControllerStatusRequest,
  ControllerStopRequest,
  ControllerUpdateRequest,
  ControllerWaitRequest,
  type ControllerCreateResponse,
  type ControllerMetricsResponse,
  type ControllerPlatformResponse,
  type ControllerShutdownResponse,
  type ControllerStartResponse,
  type ControllerStatusResponse,
  type ControllerStopResponse,
  type ControllerUpdateResponse,
  type ControllerWaitResponse,
  type DeepPartial,
} from '../../src/gen/containerd/services/sandbox/v1/sandbox.js';
import type { Timestamp } from '../../src/gen/google/protobuf/timestamp.js';

export { GrpcStatus, type ServiceError };

/** The metadata key containerd puts its namespace in. */
export const NAMESPACE_KEY = 'containerd-namespace';

/** Per-call options. */
export interface CallOptions {
  /**
   * The `containerd-namespace` to send; defaults to the client's namespace. `null` sends no
   * namespace at all (a client that gave containerd none).
   */
  readonly namespace?: string | null;
  /** Deadline, relative to now. */
  readonly timeoutMs?: number;
  /** Cancels the call when it fires. */
  readonly signal?: AbortSignal;
}

/** Starts one unary call of the generated client with the given metadata and options. */
type StartCall<Res> = (
  metadata: Metadata,
  options: Partial<GrpcCallOptions>,
  callback: (error: ServiceError | null, response: Res) => void,
) => ClientUnaryCall;

/** True when `err` is what grpc-js rejects a call with. */
export function isServiceError(err: unknown): err is ServiceError {
  return err instanceof Error && typeof (err as Partial<ServiceError>).code === 'number' && 'details' in err;
}

/** The name of a gRPC status code, for messages. */
export function codeName(code: number): string {
  return (GrpcStatus as unknown as Record<number, string>)[code] ?? String(code);
}

/**
 * Awaits `promise`, expecting it to fail with gRPC `code` (and, when given, a message
 * matching `message`); returns the error.
 */
export async function expectCode(
  promise: Promise<unknown>,
  code: GrpcStatus,
  message?: RegExp | string,
): Promise<ServiceError> {
  let result: unknown;
  try {
    result = await promise;
  } catch (err) {
    if (!isServiceError(err)) throw err;
    assert.equal(
      codeName(err.code),
      codeName(code),
      `expected ${codeName(code)}, got ${codeName(err.code)}: ${err.details}`,
    );
    if (message !== undefined) {
      if (typeof message === 'string') assert.ok(err.details.includes(message), `"${err.details}" should contain "${message}"`);
      else assert.match(err.details, message);
    }
    return err;
  }
  assert.fail(`expected ${codeName(code)}, but the call succeeded with ${JSON.stringify(result)}`);
}

/** Milliseconds since the epoch of a protobuf Timestamp (undefined stays undefined). */
export function timestampMs(t: Timestamp | undefined): number | undefined {
  return t === undefined ? undefined : t.seconds * 1000 + Math.floor(t.nanos / 1e6);
}

/** A Controller client on a unix socket, with one default namespace. */
export class SandboxClient {
  readonly #client: ControllerClient;
  readonly namespace: string;

  /**
   * Clients on the same socket share one connection (grpc-js pools subchannels) unless
   * `ownConnection` is set: then this client dials its own.
   */
  constructor(socketPath: string, namespace: string, options: { ownConnection?: boolean } = {}) {
    this.#client = new ControllerClient(`unix:${socketPath}`, credentials.createInsecure(), {
      // containerd sends up to 16 MiB (SPEC.md section 1); leave room above that.
      'grpc.max_send_message_length': 32 << 20,
      'grpc.max_receive_message_length': 32 << 20,
      ...(options.ownConnection === true && { 'grpc.use_local_subchannel_pool': 1 }),
    });
    this.namespace = namespace;
  }

  #invoke<Res>(startCall: StartCall<Res>, options: CallOptions = {}): Promise<Res> {
    const metadata = new Metadata();
    const namespace = options.namespace === undefined ? this.namespace : options.namespace;
    if (namespace !== null) metadata.set(NAMESPACE_KEY, namespace);
    const callOptions: Partial<GrpcCallOptions> = {};
    if (options.timeoutMs !== undefined) callOptions.deadline = Date.now() + options.timeoutMs;
    const { signal } = options;
    return new Promise<Res>((resolve, reject) => {
      if (signal?.aborted === true) {
        reject(new Error('call aborted before it was sent'));
        return;
      }
      const onAbort = (): void => call.cancel();
      const call = startCall(metadata, callOptions, (error, response) => {
        signal?.removeEventListener('abort', onAbort);
        if (error !== null) reject(error);
        else resolve(response);
      });
      signal?.addEventListener('abort', onAbort, { once: true });
    });
  }

  create(request: DeepPartial<ControllerCreateRequest>, options?: CallOptions): Promise<ControllerCreateResponse> {
    const message = ControllerCreateRequest.fromPartial(request);
    return this.#invoke<ControllerCreateResponse>((md, opts, cb) => this.#client.create(message, md, opts, cb), options);
  }

  start(request: DeepPartial<ControllerStartRequest>, options?: CallOptions): Promise<ControllerStartResponse> {
    const message = ControllerStartRequest.fromPartial(request);
    return this.#invoke<ControllerStartResponse>((md, opts, cb) => this.#client.start(message, md, opts, cb), options);
  }

  platform(request: DeepPartial<ControllerPlatformRequest>, options?: CallOptions): Promise<ControllerPlatformResponse> {
    const message = ControllerPlatformRequest.fromPartial(request);
    return this.#invoke<ControllerPlatformResponse>((md, opts, cb) => this.#client.platform(message, md, opts, cb), options);
  }

  stop(request: DeepPartial<ControllerStopRequest>, options?: CallOptions): Promise<ControllerStopResponse> {
    const message = ControllerStopRequest.fromPartial(request);
    return this.#invoke<ControllerStopResponse>((md, opts, cb) => this.#client.stop(message, md, opts, cb), options);
  }

  wait(request: DeepPartial<ControllerWaitRequest>, options?: CallOptions): Promise<ControllerWaitResponse> {
    const message = ControllerWaitRequest.fromPartial(request);
    return this.#invoke<ControllerWaitResponse>((md, opts, cb) => this.#client.wait(message, md, opts, cb), options);
  }

  status(request: DeepPartial<ControllerStatusRequest>, options?: CallOptions): Promise<ControllerStatusResponse> {
    const message = ControllerStatusRequest.fromPartial(request);
    return this.#invoke<ControllerStatusResponse>((md, opts, cb) => this.#client.status(message, md, opts, cb), options);
  }

  shutdown(request: DeepPartial<ControllerShutdownRequest>, options?: CallOptions): Promise<ControllerShutdownResponse> {
    const message = ControllerShutdownRequest.fromPartial(request);
    return this.#invoke<ControllerShutdownResponse>((md, opts, cb) => this.#client.shutdown(message, md, opts, cb), options);
  }

  metrics(request: DeepPartial<ControllerMetricsRequest>, options?: CallOptions): Promise<ControllerMetricsResponse> {
    const message = ControllerMetricsRequest.fromPartial(request);
    return this.#invoke<ControllerMetricsResponse>((md, opts, cb) => this.#client.metrics(message, md, opts, cb), options);
  }

  update(request: DeepPartial<ControllerUpdateRequest>, options?: CallOptions): Promise<ControllerUpdateResponse> {
    const message = ControllerUpdateRequest.fromPartial(request);
    return this.#invoke<ControllerUpdateResponse>((md, opts, cb) => this.#client.update(message, md, opts, cb), options);
  }

  /** Closes the channel; calls in flight fail. */
  close(): void {
    this.#client.close();
  }
}
