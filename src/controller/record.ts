import { z } from 'zod';
import { IDENTIFIER, MAX_IDENTIFIER_LENGTH } from './identifiers.js';
import { podSpecSchema } from './pod-spec.js';

/**
 * The durable record of one sandbox, version 1, as a zod schema: the one source of the
 * record's shape. The controller builds records of this type; the state layer writes them
 * as JSON and reads them back through this schema (anything else is quarantined, never
 * guessed at). The types below are inferred from it.
 */

/** A namespace or sandbox id: containerd's identifier rule (identifiers.ts). */
const identifier = z.string().max(MAX_IDENTIFIER_LENGTH).regex(IDENTIFIER);

/** A point in time as protobuf carries it. */
export const timestampSchema = z.object({ seconds: z.number().int(), nanos: z.number().int().min(0).max(999_999_999) });

/** How a sandbox ended. Recorded once; every Wait returns exactly this. */
export const exitSchema = z.object({
  /** The process's exit code, 128+signal for a signal, 255 when it cannot be known. */
  status: z.number().int().min(0).max(255),
  exitedAt: timestampSchema,
  /** Why, in words, for operators (verbose Status, logs). */
  reason: z.string(),
});

/** What to run, derived from the Create request (launch-spec.ts). */
export const launchSchema = z.object({
  hostname: z.string().optional(),
  /** Network namespace to join; absent for host-network pods. */
  netnsPath: z.string().optional(),
  /** The OCI process of `sandbox.spec`; absent means a pause process. */
  command: z.object({ args: z.array(z.string()).min(1), env: z.array(z.string()), cwd: z.string() }).optional(),
  /** What a Kubernetes pod asks for (CRI's PodSandboxConfig, pod-spec.ts); absent for other clients. */
  pod: podSpecSchema.optional(),
  /** The CRI runtime handler of a Kubernetes pod (CRI's sandbox metadata): its containers' route. */
  runtimeHandler: z.string().optional(),
});

/**
 * Where containerd creates the sandbox's containers (Start's and Status's `address` and
 * `version`, SPEC.md section 7). Version 3: tsbox's Task API socket (tsbox runs them). Version
 * 2: containerd runs the CRI handler's runtime shim itself, and the address names the socket
 * that shim serves for the pod. Kept in the record: a pod keeps its route across restarts and
 * changes of task_api_handlers.
 */
export const endpointSchema = z.object({ address: z.string(), version: z.number().int().min(0) });

export const recordSchema = z.object({
  version: z.literal(1),
  namespace: identifier,
  id: identifier,
  /** 'starting' is never written by this version; a record that says so is read as created. */
  state: z.enum(['created', 'starting', 'running', 'exited']),
  registeredAt: timestampSchema,
  startedAt: timestampSchema.optional(),
  pid: z.number().int().min(0).optional(),
  launch: launchSchema,
  labels: z.record(z.string(), z.string()),
  annotations: z.record(z.string(), z.string()),
  /** Create's and Update's extensions, their values base64. */
  extensions: z.record(z.string(), z.object({ typeUrl: z.string(), value: z.string() })),
  /** What the runtime backend needs to find the sandbox again after a restart; opaque here. */
  backend: z.unknown().optional(),
  /** Set at Start; Status returns it too, also after a restart. */
  endpoint: endpointSchema.optional(),
  /**
   * A graceful Stop's deadline: the sandbox is SIGKILLed then if it still runs, also by a
   * tsbox restarted meanwhile. Cleared once the exit is recorded.
   */
  killAt: timestampSchema.optional(),
  exit: exitSchema.optional(),
});

/** `T` with every property and element read-only, all the way down. */
export type DeepReadonly<T> = T extends (infer E)[]
  ? readonly DeepReadonly<E>[]
  : T extends object
    ? { readonly [K in keyof T]: DeepReadonly<T[K]> }
    : T;

export type Timestamp = DeepReadonly<z.output<typeof timestampSchema>>;
export type ExitInfo = DeepReadonly<z.output<typeof exitSchema>>;
export type TaskEndpoint = DeepReadonly<z.output<typeof endpointSchema>>;
export type SandboxRecord = DeepReadonly<z.output<typeof recordSchema>>;
/** What to run, with the sandbox it is for. */
export type LaunchSpec = DeepReadonly<{ namespace: string; id: string } & z.output<typeof launchSchema>>;
