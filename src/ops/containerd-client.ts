/**
 * A gRPC client of containerd's own socket for the operator CLI: the sandbox Store (the
 * records `ctr sandboxes ls` lists) and containerd's Controller service, which forwards to
 * the sandboxer a call names (SPEC.md section 5). Every call carries the namespace as
 * `containerd-namespace` metadata and a deadline; failures come back as grpc-js
 * ServiceErrors, which ops/errors.ts turns into operator errors.
 */
import { existsSync } from 'node:fs';
import { resolve } from 'node:path';
import * as grpc from '@grpc/grpc-js';
import { ControllerClient } from '../gen/containerd/services/sandbox/v1/sandbox.js';
import { StoreClient } from '../gen/containerd/services/sandbox/v1/store.js';
import { ImagesClient } from '../gen/containerd/services/images/v1/images.js';
import { VersionClient } from '../gen/containerd/services/version/v1/version.js';

/** containerd's default gRPC socket (containerd's `defaults.DefaultAddress`). */
export const DEFAULT_CONTAINERD_ADDRESS = '/run/containerd/containerd.sock';

/** The namespace `ctr` uses when none is given. */
export const DEFAULT_NAMESPACE = 'default';

// containerd sends and accepts messages of up to 16 MiB (SPEC.md section 1).
const CHANNEL_OPTIONS: grpc.ClientOptions = {
  'grpc.max_receive_message_length': 16 * 1024 * 1024,
  'grpc.max_send_message_length': 16 * 1024 * 1024,
};

/** Deadline of a call that should answer at once (every call but Wait and Stop). */
const QUICK_CALL_MS = 15_000;

/** Which service a call went to: containerd's sandbox store, the sandboxer behind it, containerd's version or its images. */
export type CallTarget = 'store' | 'controller' | 'version' | 'images';

const SERVICE_NAMES: Record<CallTarget, string> = { store: 'Store', controller: 'Controller', version: 'Version', images: 'Images' };

/** A failed call, with which service and method it was. */
export class ContainerdCallError extends Error {
  override readonly name = 'ContainerdCallError';
  constructor(
    readonly target: CallTarget,
    readonly method: string,
    readonly code: grpc.status,
    readonly details: string,
  ) {
    super(`${SERVICE_NAMES[target]}.${method}: ${grpc.status[code] ?? code}: ${details}`);
  }
}

/** Options of one call. */
export interface CallOptions {
  /** Deadline from now; Infinity for none (Wait). */
  readonly timeoutMs?: number;
  /** Cancels the call (Ctrl-C on `logs -f`). */
  readonly signal?: AbortSignal;
}

type Callback<Res> = (err: grpc.ServiceError | null, res: Res) => void;
type UnaryMethod<Req, Res> = (req: Req, md: grpc.Metadata, opts: Partial<grpc.CallOptions>, cb: Callback<Res>) => grpc.ClientUnaryCall;

/** The two clients on one channel target, bound to a namespace. */
export interface ContainerdClient {
  readonly address: string;
  readonly namespace: string;
  readonly store: StoreClient;
  readonly controller: ControllerClient;
  readonly version: VersionClient;
  readonly images: ImagesClient;
  /** Calls `client.method(request)` as a promise; rejects with a ContainerdCallError. */
  call<Req, Res>(target: CallTarget, method: string, request: Req, options?: CallOptions): Promise<Res>;
  close(): void;
}

/** Opens clients to containerd at `address` (a path, or `unix:PATH`). Nothing is dialled yet. */
export function connectContainerd(address: string, namespace: string): ContainerdClient {
  const path = socketPathOf(address);
  const target = `unix:${path}`;
  const creds = grpc.credentials.createInsecure();
  const store = new StoreClient(target, creds, CHANNEL_OPTIONS);
  const controller = new ControllerClient(target, creds, CHANNEL_OPTIONS);
  const version = new VersionClient(target, creds, CHANNEL_OPTIONS);
  const images = new ImagesClient(target, creds, CHANNEL_OPTIONS);
  const clients = { store, controller, version, images };
  return {
    address: path,
    namespace,
    ...clients,
    call<Req, Res>(which: CallTarget, method: string, request: Req, options: CallOptions = {}): Promise<Res> {
      const client = clients[which] as unknown as Record<string, unknown>;
      const fn = client[method.charAt(0).toLowerCase() + method.slice(1)] as UnaryMethod<Req, Res> | undefined;
      if (typeof fn !== 'function') return Promise.reject(new Error(`no method ${which}.${method}`));
      const md = new grpc.Metadata();
      md.set('containerd-namespace', namespace);
      const timeoutMs = options.timeoutMs ?? QUICK_CALL_MS;
      const callOptions: Partial<grpc.CallOptions> = {};
      if (Number.isFinite(timeoutMs)) callOptions.deadline = Date.now() + timeoutMs;
      const { signal } = options;
      return new Promise<Res>((resolvePromise, reject) => {
        const call = fn.call(client, request, md, callOptions, (err, res) => {
          signal?.removeEventListener('abort', onAbort);
          if (err !== null) reject(new ContainerdCallError(which, method, err.code, err.details));
          else resolvePromise(res);
        });
        function onAbort(): void {
          call.cancel();
        }
        if (signal?.aborted === true) onAbort();
        else signal?.addEventListener('abort', onAbort, { once: true });
      });
    },
    close() {
      for (const client of Object.values(clients)) client.close();
    },
  };
}

/** The socket path of a containerd address (`unix:///x`, `unix:/x` or `/x`). */
function socketPathOf(address: string): string {
  return resolve(address.replace(/^unix:(\/\/)?/, ''));
}

/** Whether something exists at the socket path (containerd creates it when it starts). */
export function socketExists(address: string): boolean {
  return existsSync(socketPathOf(address));
}
