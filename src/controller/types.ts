import type { Resources } from './pod-spec.js';

/**
 * The domain types the controller speaks, and the interfaces its collaborators implement:
 * the runtime backend (runs sandboxes) and the record store (keeps them durable). Nothing
 * here knows gRPC, child processes or the file system. The record and the types it is made
 * of are inferred from its zod schema (record.ts).
 */
import type { ExitInfo, LaunchSpec, SandboxRecord, TaskEndpoint } from './record.js';
import type { SandboxPlacement } from './runtime-spec.js';

export type { SandboxPlacement };

export type { ExitInfo, LaunchSpec, SandboxRecord, TaskEndpoint, Timestamp } from './record.js';

/** A protobuf Any: a type URL and the encoded value. */
export interface AnyValue {
  readonly typeUrl: string;
  readonly value: Uint8Array;
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

/** What is torn down: at Stop the pod's files; at Shutdown everything of the pod. */
export type TeardownStage = 'stop' | 'shutdown';

/** Runs sandboxes. The process backend is the default; a no-process one serves benchmarks. */
export interface RuntimeBackend {
  readonly name: string;
  /**
   * Starts the sandbox; `signal` (the Start call's) abandons a start that takes too long.
   * Must leave nothing behind when it throws.
   */
  start(spec: LaunchSpec, signal: CallSignal): Promise<RunningSandbox>;
  /** The task endpoint containerd is told for this sandbox. */
  endpoint(spec: LaunchSpec): TaskEndpoint;
  /**
   * Removes what the backend made for the pod outside the sandbox process: at 'stop' the
   * pod's files and mounts (first of all, as podsandbox's Stop does), at 'shutdown' also
   * the task shim containerd ran for the pod's containers and the pod's directories.
   * Idempotent; works after a restart from the spec alone.
   */
  teardown(spec: LaunchSpec, stage: TeardownStage): Promise<void>;
  /** Applies new limits to a running sandbox (Update with resources). */
  updateResources(spec: LaunchSpec, sandbox: RunningSandbox, resources: Resources): Promise<void>;
  /** Finds a sandbox recorded as running again after a restart. */
  recover(spec: LaunchSpec, handle: unknown): Promise<Recovered>;
  /**
   * Removes whatever a Start that never answered may have left (crash during Start): ends
   * every process of the sandbox, which runs without a record of it. Bounded like kill().
   */
  abandon(spec: LaunchSpec, signal: CallSignal): Promise<void>;
  /** Sends SIGTERM to the sandbox: a graceful Stop, whose SIGKILL deadline the controller keeps. */
  terminate(sandbox: RunningSandbox): Promise<void>;
  /**
   * SIGKILLs the sandbox and resolves once its exit is known and its processes are gone.
   * Throws, naming what is left, when they outlive the configured bound (kill_timeout_ms);
   * rejects with the call's error when `signal` fires first.
   */
  kill(sandbox: RunningSandbox, signal: CallSignal): Promise<void>;
  /**
   * Releases what an exited sandbox held: ends whatever is still in its cgroup, then removes
   * it and its files. Idempotent; bounded like kill().
   */
  release(spec: LaunchSpec, signal: CallSignal): Promise<void>;
  /** cgroup statistics as an Any, or Unimplemented. */
  metrics(spec: LaunchSpec, sandbox: RunningSandbox | undefined): Promise<AnyValue>;
  /** Facts for verbose Status. */
  describe(sandbox: RunningSandbox): Record<string, unknown>;
  /** Where a running sandbox lives (its namespaces, cgroup, program): the pod's OCI spec says so. */
  placement(spec: LaunchSpec, sandbox: RunningSandbox): SandboxPlacement;
  /** Stops watching; leaves sandboxes running. */
  close(): void;
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

/**
 * Keeps records durable: a save or remove has reached the disk when its promise resolves,
 * and operations on one sandbox take effect in the order issued.
 */
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

/**
 * CRI's view of a pod's containers, which a Stop waits to settle
 * (src/containerd/cri-containers.ts says why); a fake implements it in unit tests.
 */
export interface PodContainers {
  /**
   * Resolves once CRI counts none of the pod's containers as running, once waiting no
   * longer helps (no CRI, the bound passed), or when `signal` fires. Never rejects.
   */
  settled(namespace: string, podId: string, signal: CallSignal): Promise<void>;
  close(): void;
}

/** Nothing to wait for: a Stop answers as soon as the sandbox has exited. */
export const NO_POD_CONTAINERS: PodContainers = {
  settled: () => Promise.resolve(),
  close: () => undefined,
};
