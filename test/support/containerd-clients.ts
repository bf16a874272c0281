/**
 * gRPC clients for end-to-end tests, built at run time with @grpc/proto-loader from the
 * reference `.proto` files Debian ships (containerd's API and Kubernetes' CRI). They are
 * deliberately independent of tsbox's own generated code, so a wire-format mistake in tsbox
 * cannot hide behind the same mistake in the test client.
 *
 * Messages are plain objects as proto-loader decodes them: field names as in the `.proto`
 * (`keepCase`), int64 as decimal strings, enums as their names, unset message fields `null`,
 * `Any` as `{ type_url, value }`.
 */
import { existsSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';

const here = path.dirname(fileURLToPath(import.meta.url));

/** Repository root: this file compiles to `<repo>/dist/test/support/`. */
export const repoRoot = path.resolve(here, '..', '..', '..');

/** Environment variable that overrides where the Debian reference `.proto` tree lives. */
export const protoRootEnv = 'TSBOX_DEBIAN_PROTOS';

/**
 * The directory holding `github.com/containerd/containerd/api/...` and `k8s.io/cri-api/...`
 * (`usr/share/gocode/src` of the unpacked Debian packages; scripts/install-containerd.sh puts
 * them there). Throws with a hint when it is missing.
 */
export function debianProtoRoot(): string {
  const root =
    process.env[protoRootEnv] ??
    path.join(repoRoot, '.cache', 'debian-protos', 'root', 'usr', 'share', 'gocode', 'src');
  const probes = [sandboxProtoFile, criProtoFile].map((f) => path.join(root, f));
  const missing = probes.filter((p) => !existsSync(p));
  if (missing.length > 0) {
    throw new Error(
      `Debian reference .proto files not found: ${missing.join(', ')}. ` +
        `Run scripts/install-containerd.sh (as root) or set ${protoRootEnv} to a directory ` +
        'holding github.com/containerd/containerd/api and k8s.io/cri-api.',
    );
  }
  return root;
}

const sandboxProtoFile = 'github.com/containerd/containerd/api/services/sandbox/v1/sandbox.proto';
const criProtoFile = 'k8s.io/cri-api/pkg/apis/runtime/v1/api.proto';

const loaderOptions: protoLoader.Options = {
  keepCase: true,
  longs: String,
  enums: String,
  defaults: true,
  oneofs: true,
};

// containerd sends and accepts messages of up to 16 MiB (SPEC.md section 1).
const channelOptions: grpc.ChannelOptions = {
  'grpc.max_receive_message_length': 16 * 1024 * 1024,
  'grpc.max_send_message_length': 16 * 1024 * 1024,
};

type ServiceCtor = new (
  address: string,
  credentials: grpc.ChannelCredentials,
  options?: grpc.ChannelOptions,
) => grpc.Client;

let cachedPackages: { sandbox: grpc.GrpcObject; cri: grpc.GrpcObject } | undefined;

function loadPackages(): { sandbox: grpc.GrpcObject; cri: grpc.GrpcObject } {
  if (cachedPackages === undefined) {
    const root = debianProtoRoot();
    const opts = { ...loaderOptions, includeDirs: [root] };
    cachedPackages = {
      sandbox: grpc.loadPackageDefinition(protoLoader.loadSync(sandboxProtoFile, opts)),
      cri: grpc.loadPackageDefinition(protoLoader.loadSync(criProtoFile, opts)),
    };
  }
  return cachedPackages;
}

function lookupService(pkg: grpc.GrpcObject, dotted: string): ServiceCtor {
  let node: unknown = pkg;
  for (const part of dotted.split('.')) {
    node = (node as Record<string, unknown> | undefined)?.[part];
  }
  if (typeof node !== 'function') throw new Error(`service ${dotted} not found in the .proto files`);
  return node as ServiceCtor;
}

/** `unix:` target for a socket path (grpc-js wants an absolute path after `unix:`). */
export function unixTarget(socketPath: string): string {
  return `unix:${path.resolve(socketPath)}`;
}

// ---------------------------------------------------------------------------------------------
// Message shapes (only what the tests read or write; decoding fills the rest).

/** google.protobuf.Timestamp as decoded (seconds is int64, hence a string). */
export interface Timestamp {
  seconds: string;
  nanos: number;
}
/** google.protobuf.Any as decoded. */
export interface AnyMessage {
  type_url: string;
  value: Buffer;
}
/** containerd.types.Sandbox. */
export interface Sandbox {
  sandbox_id: string;
  runtime: { name: string; options?: AnyMessage | null } | null;
  spec?: AnyMessage | null;
  labels?: Record<string, string>;
  created_at?: Timestamp | null;
  updated_at?: Timestamp | null;
  extensions?: Record<string, AnyMessage>;
  sandboxer: string;
}

/** Methods of `containerd.services.sandbox.v1.Store` (containerd's metadata store). */
export interface StoreMethods {
  Create: [{ sandbox: Sandbox }, { sandbox: Sandbox }];
  Update: [{ sandbox: Sandbox; fields: string[] }, { sandbox: Sandbox }];
  Delete: [{ sandbox_id: string }, Record<string, never>];
  List: [{ filters?: string[] }, { list: Sandbox[] }];
  Get: [{ sandbox_id: string }, { sandbox: Sandbox }];
}

/** Methods of `containerd.services.sandbox.v1.Controller` (containerd's or a sandboxer's). */
export interface ControllerMethods {
  Create: [
    {
      sandbox_id: string;
      sandboxer: string;
      rootfs?: { type: string; source: string; target: string; options: string[] }[];
      options?: AnyMessage | null;
      netns_path?: string;
      annotations?: Record<string, string>;
      sandbox?: Sandbox | null;
    },
    { sandbox_id: string },
  ];
  Start: [
    { sandbox_id: string; sandboxer: string },
    {
      sandbox_id: string;
      pid: number;
      created_at: Timestamp | null;
      labels: Record<string, string>;
      address: string;
      version: number;
    },
  ];
  Platform: [
    { sandbox_id: string; sandboxer: string },
    { platform: { os: string; architecture: string; variant: string } | null },
  ];
  Stop: [{ sandbox_id: string; sandboxer: string; timeout_secs?: number }, Record<string, never>];
  Wait: [
    { sandbox_id: string; sandboxer: string },
    { exit_status: number; exited_at: Timestamp | null },
  ];
  Status: [
    { sandbox_id: string; sandboxer: string; verbose?: boolean },
    {
      sandbox_id: string;
      pid: number;
      state: string;
      info: Record<string, string>;
      created_at: Timestamp | null;
      exited_at: Timestamp | null;
      extra: AnyMessage | null;
      address: string;
      version: number;
    },
  ];
  Shutdown: [{ sandbox_id: string; sandboxer: string }, Record<string, never>];
  Metrics: [
    { sandbox_id: string; sandboxer: string },
    { metrics: { timestamp: Timestamp | null; id: string; data: AnyMessage | null } | null },
  ];
  Update: [
    { sandbox_id: string; sandboxer: string; sandbox: Sandbox; fields: string[] },
    Record<string, never>,
  ];
}

/** CRI LinuxContainerResources (int64 fields may be given as numbers). */
/** A pod's stats (PodSandboxStats, ListPodSandboxStats). */
export interface CriPodSandboxStats {
  attributes: { id: string } | null;
  linux: {
    cpu: { usage_core_nano_seconds: { value: string } | null } | null;
    memory: { working_set_bytes: { value: string } | null; usage_bytes: { value: string } | null } | null;
    containers: CriContainerStats[];
  } | null;
}

export interface CriResources {
  cpu_period?: number;
  cpu_quota?: number;
  cpu_shares?: number;
  memory_limit_in_bytes?: number;
  oom_score_adj?: number;
  cpuset_cpus?: string;
  memory_swap_limit_in_bytes?: number;
  unified?: Record<string, string>;
}

/** CRI PodSandboxConfig (the parts tests set). */
export interface PodSandboxConfig {
  metadata: { name: string; uid: string; namespace: string; attempt?: number };
  hostname?: string;
  log_directory?: string;
  dns_config?: { servers?: string[]; searches?: string[]; options?: string[] };
  labels?: Record<string, string>;
  annotations?: Record<string, string>;
  linux?: {
    cgroup_parent?: string;
    security_context?: {
      namespace_options?: { network?: NamespaceMode | number; pid?: NamespaceMode | number; ipc?: NamespaceMode | number };
      privileged?: boolean;
    };
    sysctls?: Record<string, string>;
    resources?: CriResources;
    overhead?: CriResources;
  };
}

/** CRI ContainerConfig (the parts tests set). */
export interface CriContainerConfig {
  metadata: { name: string; attempt?: number };
  image: { image: string };
  command?: string[];
  args?: string[];
  envs?: { key: string; value: string }[];
  log_path?: string;
  labels?: Record<string, string>;
  /** A terminal for the container's process; with `stdin`, CRI keeps its stdin open for Attach. */
  tty?: boolean;
  stdin?: boolean;
  linux?: {
    resources?: CriResources;
    security_context?: {
      namespace_options?: { network?: NamespaceMode | number; pid?: NamespaceMode | number; ipc?: NamespaceMode | number };
      privileged?: boolean;
    };
  };
}

/** CRI ContainerStatus as decoded. */
export interface CriContainerStatus {
  id: string;
  state: 'CONTAINER_CREATED' | 'CONTAINER_RUNNING' | 'CONTAINER_EXITED' | 'CONTAINER_UNKNOWN';
  exit_code: number;
  reason: string;
  message: string;
  log_path: string;
  mounts: { container_path: string; host_path: string }[];
}

/** CRI ContainerStats as decoded (values are wrapped UInt64Value, longs as strings). */
export interface CriContainerStats {
  attributes: { id: string; metadata: { name: string } | null } | null;
  cpu: { usage_core_nano_seconds: { value: string } | null } | null;
  memory: { working_set_bytes: { value: string } | null; usage_bytes: { value: string } | null } | null;
}

/** CRI NamespaceMode: POD = 0, CONTAINER = 1, NODE = 2, TARGET = 3. */
export type NamespaceMode = 'POD' | 'CONTAINER' | 'NODE' | 'TARGET';

/** CRI PodSandbox (ListPodSandbox entries). */
export interface CriPodSandbox {
  id: string;
  metadata: { name: string; uid: string; namespace: string; attempt: number } | null;
  state: 'SANDBOX_READY' | 'SANDBOX_NOTREADY';
  created_at: string;
  labels: Record<string, string>;
  annotations: Record<string, string>;
  runtime_handler: string;
}

/** Methods of `runtime.v1.RuntimeService` (Kubernetes CRI) used by the tests. */
export interface CriRuntimeMethods {
  Version: [{ version?: string }, { version: string; runtime_name: string; runtime_version: string; runtime_api_version: string }];
  Status: [
    { verbose?: boolean },
    { status: { conditions: { type: string; status: boolean; reason: string; message: string }[] } | null; info: Record<string, string> },
  ];
  RunPodSandbox: [{ config: PodSandboxConfig; runtime_handler: string }, { pod_sandbox_id: string }];
  StopPodSandbox: [{ pod_sandbox_id: string }, Record<string, never>];
  RemovePodSandbox: [{ pod_sandbox_id: string }, Record<string, never>];
  PodSandboxStatus: [
    { pod_sandbox_id: string; verbose?: boolean },
    {
      status: {
        id: string;
        metadata: { name: string; uid: string; namespace: string; attempt: number } | null;
        state: 'SANDBOX_READY' | 'SANDBOX_NOTREADY';
        created_at: string;
        runtime_handler: string;
      } | null;
      info: Record<string, string>;
    },
  ];
  ListPodSandbox: [
    { filter?: { id?: string; state?: { state: string } | null; label_selector?: Record<string, string> } | null },
    { items: CriPodSandbox[] },
  ];
  CreateContainer: [{ pod_sandbox_id: string; config: CriContainerConfig; sandbox_config: PodSandboxConfig }, { container_id: string }];
  StartContainer: [{ container_id: string }, Record<string, never>];
  StopContainer: [{ container_id: string; timeout: number }, Record<string, never>];
  RemoveContainer: [{ container_id: string }, Record<string, never>];
  ContainerStatus: [{ container_id: string; verbose?: boolean }, { status: CriContainerStatus | null; info: Record<string, string> }];
  ListContainers: [
    { filter?: { pod_sandbox_id?: string; id?: string } | null },
    { containers: { id: string; pod_sandbox_id: string; state: string }[] },
  ];
  ExecSync: [{ container_id: string; cmd: string[]; timeout?: number }, { stdout: Buffer; stderr: Buffer; exit_code: number }];
  /** The URL of CRI's streaming server for the session (test/support/cri-stream.ts). */
  Exec: [{ container_id: string; cmd: string[]; tty: boolean; stdin: boolean; stdout: boolean; stderr: boolean }, { url: string }];
  Attach: [{ container_id: string; tty: boolean; stdin: boolean; stdout: boolean; stderr: boolean }, { url: string }];
  ContainerStats: [{ container_id: string }, { stats: CriContainerStats | null }];
  UpdateContainerResources: [{ container_id: string; linux?: CriResources }, Record<string, never>];
  /** CRI v1.33 (containerd 2.3 and later). */
  UpdatePodSandboxResources: [{ pod_sandbox_id: string; overhead?: CriResources; resources?: CriResources }, Record<string, never>];
  ListContainerStats: [{ filter?: { pod_sandbox_id?: string; id?: string } | null }, { stats: CriContainerStats[] }];
  PodSandboxStats: [{ pod_sandbox_id: string }, { stats: CriPodSandboxStats | null }];
  ListPodSandboxStats: [{ filter?: { id?: string } | null }, { stats: CriPodSandboxStats[] }];
}

// ---------------------------------------------------------------------------------------------

/** Per-call options: a deadline relative to now, and/or a signal that cancels the call. */
export interface CallOptions {
  timeoutMs?: number;
  signal?: AbortSignal;
}

/** Default deadline of a unary call, so that a hung peer fails a test instead of hanging it. */
export const defaultCallTimeoutMs = 30_000;

/**
 * A typed unary client: `call('Status', req)` resolves with the decoded response or rejects
 * with grpc-js' `ServiceError` (check `.code` against `grpc.status`).
 */
export interface UnaryClient<M extends { [K in keyof M]: [unknown, unknown] }> {
  call<K extends keyof M & string>(method: K, request: M[K][0], options?: CallOptions): Promise<M[K][1]>;
  /** Closes the channel; pending calls fail with CANCELLED/UNAVAILABLE. */
  close(): void;
  readonly raw: grpc.Client;
}

function makeUnaryClient<M extends { [K in keyof M]: [unknown, unknown] }>(
  raw: grpc.Client,
  metadata: () => grpc.Metadata,
): UnaryClient<M> {
  return {
    raw,
    close: () => raw.close(),
    call<K extends keyof M & string>(method: K, request: M[K][0], options: CallOptions = {}): Promise<M[K][1]> {
      const fn = (raw as unknown as Record<string, unknown>)[method];
      if (typeof fn !== 'function') return Promise.reject(new Error(`no method ${method}`));
      const { signal } = options;
      if (signal?.aborted === true) return Promise.reject(new Error(`${method}: aborted before start`));
      // `timeoutMs: Infinity` (or 0) means no deadline, as CRI's long-lived Wait.
      const timeoutMs = options.timeoutMs ?? defaultCallTimeoutMs;
      const callOptions: grpc.CallOptions = {};
      if (Number.isFinite(timeoutMs) && timeoutMs > 0) callOptions.deadline = Date.now() + timeoutMs;
      return new Promise<M[K][1]>((resolve, reject) => {
        const onAbort = (): void => call.cancel();
        const call = (
          fn as (
            this: grpc.Client,
            req: unknown,
            md: grpc.Metadata,
            opts: grpc.CallOptions,
            cb: (err: grpc.ServiceError | null, res: unknown) => void,
          ) => grpc.ClientUnaryCall
        ).call(raw, request, metadata(), callOptions, (err, res) => {
          signal?.removeEventListener('abort', onAbort);
          if (err !== null) reject(err);
          else resolve(res);
        });
        signal?.addEventListener('abort', onAbort, { once: true });
      });
    },
  };
}

/** Clients of containerd's sandbox services (or a sandboxer's Controller) for one namespace. */
export interface SandboxClients {
  /** `containerd.services.sandbox.v1.Store` (containerd's metadata). */
  store: UnaryClient<StoreMethods>;
  /** `containerd.services.sandbox.v1.Controller`. */
  controller: UnaryClient<ControllerMethods>;
  readonly namespace: string;
  close(): void;
}

/**
 * Clients for containerd's sandbox Store and Controller on `socketPath`; every call carries
 * gRPC metadata `containerd-namespace: <namespace>` (SPEC.md section 1). Pointed at a
 * sandboxer's own socket, `controller` talks to the sandboxer directly (same service).
 */
export function createSandboxClients(socketPath: string, namespace: string): SandboxClients {
  const { sandbox } = loadPackages();
  const target = unixTarget(socketPath);
  const creds = grpc.credentials.createInsecure();
  const metadata = (): grpc.Metadata => {
    const md = new grpc.Metadata();
    md.set('containerd-namespace', namespace);
    return md;
  };
  const StoreCtor = lookupService(sandbox, 'containerd.services.sandbox.v1.Store');
  const ControllerCtor = lookupService(sandbox, 'containerd.services.sandbox.v1.Controller');
  const store = makeUnaryClient<StoreMethods>(new StoreCtor(target, creds, channelOptions), metadata);
  const controller = makeUnaryClient<ControllerMethods>(
    new ControllerCtor(target, creds, channelOptions),
    metadata,
  );
  return {
    store,
    controller,
    namespace,
    close: () => {
      store.close();
      controller.close();
    },
  };
}

/**
 * Client of Kubernetes CRI `runtime.v1.RuntimeService` on containerd's socket (containerd's
 * CRI plugin serves it there and always works in namespace `k8s.io`).
 */
export function createCriRuntimeClient(socketPath: string): UnaryClient<CriRuntimeMethods> {
  const { cri } = loadPackages();
  const Ctor = lookupService(cri, 'runtime.v1.RuntimeService');
  return makeUnaryClient<CriRuntimeMethods>(
    new Ctor(unixTarget(socketPath), grpc.credentials.createInsecure(), channelOptions),
    () => new grpc.Metadata(),
  );
}

/** The gRPC status code of an error from a call, or undefined when it is not a gRPC error. */
export function grpcCode(err: unknown): grpc.status | undefined {
  if (typeof err === 'object' && err !== null && 'code' in err && typeof err.code === 'number') {
    return err.code;
  }
  return undefined;
}

/** Resolves with the gRPC error code a call failed with; rejects if the call succeeded. */
export async function expectGrpcError(promise: Promise<unknown>): Promise<{ code: grpc.status | undefined; details: string }> {
  try {
    await promise;
  } catch (err) {
    const details = typeof err === 'object' && err !== null && 'details' in err ? String(err.details) : String(err);
    return { code: grpcCode(err), details };
  }
  throw new Error('expected the call to fail, it succeeded');
}

/** A Timestamp as milliseconds since the epoch (null/unset → undefined). */
export function timestampMs(ts: Timestamp | null | undefined): number | undefined {
  if (ts === null || ts === undefined) return undefined;
  const ms = Number(ts.seconds) * 1000 + Math.floor(ts.nanos / 1e6);
  return ms > 0 ? ms : undefined;
}

export { grpc };
