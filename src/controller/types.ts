/**
 * The domain types the controller speaks, and the interfaces its collaborators implement:
 * the runtime backend (runs sandboxes) and the record store (keeps them durable). Nothing
 * here knows gRPC, child processes or the file system.
 */

/** A point in time as protobuf carries it. */
export interface Timestamp {
  readonly seconds: number;
  readonly nanos: number;
}

/** A protobuf Any: a type URL and the encoded value. */
export interface AnyValue {
  readonly typeUrl: string;
  readonly value: Uint8Array;
}

/** How a sandbox ended. Recorded once; every Wait returns exactly this. */
export interface ExitInfo {
  /** The process's exit code, 128+signal for a signal, 255 when it cannot be known. */
  readonly status: number;
  readonly exitedAt: Timestamp;
  /** Why, in words, for operators (verbose Status, logs). */
  readonly reason: string;
}

/** What to run, derived from the Create request (see launch-spec.ts). */
export interface LaunchSpec {
  readonly namespace: string;
  readonly id: string;
  readonly hostname?: string;
  /** Network namespace to join; absent for host-network pods. */
  readonly netnsPath?: string;
  /** The OCI process of `sandbox.spec`; absent means a pause process. */
  readonly command?: {
    readonly args: readonly string[];
    readonly env: readonly string[];
    readonly cwd: string;
  };
}

/**
 * A running sandbox as a backend sees it. `handle` is what the backend needs to find it
 * again after a restart; the controller persists it as an opaque JSON value.
 */
export interface RunningSandbox {
  /** Host pid of the sandbox's main process (0 when the backend runs no process). */
  readonly pid: number;
  readonly handle: unknown;
  /** Calls `listener` once when the sandbox exits (at once if it already has). */
  onExit(listener: (exit: ExitInfo) => void): void;
}

/** What recovering a recorded sandbox found. */
export type Recovered =
  | { readonly kind: 'running'; readonly sandbox: RunningSandbox }
  | { readonly kind: 'exited'; readonly exit: ExitInfo };

/** Runs sandboxes. The process backend is the default; a no-process one serves benchmarks. */
export interface RuntimeBackend {
  readonly name: string;
  /** Starts the sandbox. Must leave nothing behind when it throws. */
  start(spec: LaunchSpec): Promise<RunningSandbox>;
  /** Finds a sandbox recorded as running again after a restart. */
  recover(spec: LaunchSpec, handle: unknown): Promise<Recovered>;
  /**
   * Removes whatever a Start that never answered may have left (crash during Start):
   * kills a process that runs without a record of it.
   */
  abandon(spec: LaunchSpec): Promise<void>;
  /**
   * Signals the sandbox: SIGKILL now when graceSeconds is 0, else SIGTERM then SIGKILL
   * after graceSeconds. Resolves once the first signal is sent.
   */
  kill(sandbox: RunningSandbox, graceSeconds: number): Promise<void>;
  /** Releases what an exited sandbox held (cgroups, files). Idempotent. */
  release(spec: LaunchSpec): Promise<void>;
  /** cgroup statistics as an Any, or Unimplemented. */
  metrics(spec: LaunchSpec, sandbox: RunningSandbox | undefined): Promise<AnyValue>;
  /** Facts for verbose Status. */
  describe(sandbox: RunningSandbox): Record<string, unknown>;
  /** Stops watching; leaves sandboxes running. */
  close(): void;
}

/** The durable record of one sandbox; see state/record.ts for the schema. */
export interface SandboxRecord {
  readonly version: 1;
  readonly namespace: string;
  readonly id: string;
  readonly state: 'created' | 'starting' | 'running' | 'exited';
  readonly registeredAt: Timestamp;
  readonly startedAt?: Timestamp;
  readonly pid?: number;
  readonly launch: Omit<LaunchSpec, 'namespace' | 'id'>;
  readonly labels: Readonly<Record<string, string>>;
  readonly annotations: Readonly<Record<string, string>>;
  readonly extensions: Readonly<Record<string, { typeUrl: string; value: string }>>;
  readonly backend?: unknown;
  readonly exit?: ExitInfo;
}

/** What the store found on disk at start-up. */
export interface LoadedRecords {
  readonly records: SandboxRecord[];
  /**
   * Sandboxes whose record could not be read and was moved aside. When `leftover`, their
   * directory stays for the controller to clean up: their processes must not run without
   * a record.
   */
  readonly quarantined: readonly { readonly namespace: string; readonly id: string; readonly leftover: boolean }[];
}

/** The signal of a call: fires on client cancel, deadline or daemon shutdown (transport/call-context.ts). */
export type CallSignal = AbortSignal;

/** A function, or an object whose handleEvent() is called (as EventTarget allows). */
export type AbortListener = (() => void) | { handleEvent(): void };

/** Keeps records durable: a save has reached the disk when its promise resolves. */
export interface RecordStore {
  save(record: SandboxRecord): Promise<void>;
  remove(namespace: string, id: string): Promise<void>;
  loadAll(): Promise<LoadedRecords>;
}

/** The host platform, in Go/OCI names. */
export interface HostPlatform {
  readonly os: string;
  readonly architecture: string;
  readonly variant: string;
}
