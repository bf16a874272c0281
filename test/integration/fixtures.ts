/**
 * What the integration tests share: requests shaped the way containerd and CRI send them
 * (SPEC.md section 2), and small checks on processes.
 */
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { BinaryReader, BinaryWriter, WireType } from '@bufbuild/protobuf/wire';
import type { DeepPartial, ControllerCreateRequest } from '../../src/gen/containerd/services/sandbox/v1/sandbox.js';
import type { Any } from '../../src/gen/google/protobuf/any.js';
import { type TsboxClient, type TsboxDaemon, processAlive, waitFor } from '../support/tsbox-daemon.js';

export { waitFor };

/** Type URL of an OCI runtime spec as containerd sends it (no type.googleapis.com/ prefix). */
export const OCI_SPEC_TYPE = 'types.containerd.io/opencontainers/runtime-spec/1/Spec';
/** Type URL of CRI's pod config in Create's `options`. */
export const POD_SANDBOX_CONFIG_TYPE = 'runtime.v1.PodSandboxConfig';
/** Type URL of CRI's sandbox metadata extension (a JSON value). */
export const CRI_METADATA_TYPE = 'github.com/containerd/cri/pkg/store/sandbox/Metadata';
/** Go's zero time, which CRI sends as `sandbox.created_at` for host-network pods. */
export const GO_ZERO_TIME = { seconds: -62135596800, nanos: 0 };

/** `sandbox.spec`: an OCI runtime spec (JSON) whose process is `args`. */
export function ociSpec(args: readonly string[], extra: Record<string, unknown> = {}): Any {
  const spec = { ociVersion: '1.1.0', process: { args, env: [], cwd: '/' }, ...extra };
  return { typeUrl: OCI_SPEC_TYPE, value: Buffer.from(JSON.stringify(spec)) };
}

/** Encodes a runtime.v1.PodSandboxConfig: metadata{name=1, uid=2, namespace=3, attempt=4}, hostname=2. */
export function podSandboxConfig(config: { name: string; uid: string; namespace: string; hostname: string }): Any {
  const writer = new BinaryWriter();
  writer.uint32((1 << 3) | 2).fork();
  writer.uint32((1 << 3) | 2).string(config.name);
  writer.uint32((2 << 3) | 2).string(config.uid);
  writer.uint32((3 << 3) | 2).string(config.namespace);
  writer.uint32((4 << 3) | 0).uint32(0);
  writer.join();
  writer.uint32((2 << 3) | 2).string(config.hostname);
  writer.uint32((3 << 3) | 2).string(`/var/log/pods/${config.namespace}_${config.name}_${config.uid}`);
  return { typeUrl: POD_SANDBOX_CONFIG_TYPE, value: Buffer.from(writer.finish()) };
}

/** CRI's `metadata` extension: containerd's versioned JSON of the sandbox metadata. */
export function criMetadata(id: string, hostname: string): Any {
  const metadata = {
    Version: 'v1',
    Metadata: {
      ID: id,
      Name: `pod_default_${id}_0`,
      Config: { metadata: { name: id, uid: `uid-${id}`, namespace: 'default' }, hostname, labels: {}, annotations: {} },
      NetNSPath: '',
      RuntimeHandler: 'tsbox',
    },
  };
  return { typeUrl: CRI_METADATA_TYPE, value: Buffer.from(JSON.stringify(metadata)) };
}

/** A Create request as CRI sends it for a host-network pod (SPEC.md sections 2 and 5). */
export function criCreateRequest(id: string, hostname: string): DeepPartial<ControllerCreateRequest> {
  return {
    sandboxId: id,
    rootfs: [],
    options: podSandboxConfig({ name: `pod-${id}`, uid: `uid-${id}`, namespace: 'default', hostname }),
    netnsPath: '',
    annotations: {},
    sandbox: {
      sandboxId: id,
      runtime: { name: 'io.containerd.tsbox.v1' },
      labels: {},
      createdAt: GO_ZERO_TIME,
      extensions: { metadata: criMetadata(id, hostname) },
      sandboxer: 'tsbox',
    },
    sandboxer: 'tsbox',
  };
}

/** True while /proc/<pid> exists and is not a zombie. */
export const alive = processAlive;

/** `/proc/<pid>` exists at all (a zombie counts). */
export function procExists(pid: number): boolean {
  return existsSync(`/proc/${pid}`);
}

/**
 * Creates (with `request`'s extra fields) and starts a sandbox; the daemon's teardown will
 * remove it whatever happens. Returns Start's answer.
 */
export async function createAndStart(
  daemon: TsboxDaemon,
  client: TsboxClient,
  id: string,
  request: DeepPartial<ControllerCreateRequest> = {},
): Promise<{ pid: number; createdAtMs: number; labels: Record<string, string> }> {
  daemon.track(client.namespace, id);
  await client.create({ sandboxId: id, sandbox: { sandboxId: id, runtime: { name: 'io.containerd.tsbox.v1' } }, ...request });
  const started = await client.start({ sandboxId: id });
  daemon.track(client.namespace, id, started.pid);
  assert.ok(started.pid > 0, `Start returned pid ${started.pid}`);
  const createdAt = started.createdAt;
  assert.ok(createdAt !== undefined, 'Start returned no created_at');
  return {
    pid: started.pid,
    createdAtMs: createdAt.seconds * 1000 + Math.floor(createdAt.nanos / 1e6),
    labels: started.labels,
  };
}

/** Runs `body`; on failure, the tail of the daemon log joins the error message. */
export async function withLog(daemon: TsboxDaemon | undefined, body: () => Promise<void>): Promise<void> {
  try {
    await body();
  } catch (err) {
    if (err instanceof Error && daemon !== undefined) err.message = `${err.message}\n${daemon.logTail(30)}`;
    throw err;
  }
}

/** Resolves after `ms`; for measuring what happened meanwhile, never to make a test pass. */
export function delay(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/**
 * Reads one unsigned integer out of encoded protobuf bytes by its path of field numbers
 * (e.g. [4, 33, 1] is Metrics.memory.usage.usage of cgroups v1), as a bigint so that
 * 64-bit values such as an unlimited cgroup's limit survive. Undefined when absent.
 */
export function readUint64Path(bytes: Uint8Array, path: readonly number[]): bigint | undefined {
  const [head, ...rest] = path;
  if (head === undefined) return undefined;
  const reader = new BinaryReader(bytes);
  let found: bigint | Uint8Array | undefined;
  while (reader.pos < reader.len) {
    const [field, wireType] = reader.tag();
    if (field === head && rest.length === 0 && wireType === WireType.Varint) found = BigInt(reader.uint64());
    else if (field === head && rest.length > 0 && wireType === WireType.LengthDelimited) found = reader.bytes();
    else reader.skip(wireType);
  }
  if (found === undefined) return undefined;
  if (typeof found === 'bigint') return found;
  return readUint64Path(found, rest);
}
