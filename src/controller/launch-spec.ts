import { BinaryReader, WireType } from '@bufbuild/protobuf/wire';
import { z } from 'zod';
import { TsboxError, messageOf } from '../errors.js';
import type { AnyValue, LaunchSpec } from './types.js';

/** What a Create request says about how to run the sandbox. */
export interface CreateInput {
  readonly netnsPath: string;
  readonly options: AnyValue | undefined;
  readonly spec: AnyValue | undefined;
  readonly extensions: Readonly<Record<string, AnyValue>>;
}

// Type URLs as real peers send them, usually without the type.googleapis.com/ prefix
// (SPEC.md section 2). Anything else is kept but not interpreted.
const POD_SANDBOX_CONFIG = 'runtime.v1.PodSandboxConfig';
const CRI_METADATA = 'github.com/containerd/cri/pkg/store/sandbox/Metadata';
const OCI_SPEC = 'types.containerd.io/opencontainers/runtime-spec/1/Spec';

const DEFAULT_PATH = 'PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin';

/** Does `typeUrl` name `fullName`, with or without a host prefix? */
export function isType(typeUrl: string, fullName: string): boolean {
  return typeUrl === fullName || typeUrl.endsWith(`/${fullName}`);
}

const ociSpecSchema = z.object({
  hostname: z.string().optional(),
  process: z
    .object({
      args: z.array(z.string()).optional(),
      env: z.array(z.string()).optional(),
      cwd: z.string().optional(),
    })
    .optional(),
});

// containerd stores CRI's sandbox metadata as versioned JSON; the pod config inside uses
// the protobuf JSON names (hostname, metadata.name).
const criConfigSchema = z.object({ hostname: z.string().optional() }).loose();
const criMetadataSchema = z
  .object({
    Metadata: z.object({ Config: criConfigSchema.nullish() }).loose().optional(),
    Config: criConfigSchema.nullish(),
  })
  .loose();

const HOSTNAME = /^[A-Za-z0-9](?:[A-Za-z0-9.-]{0,62})$/;

/** Reads `hostname` (field 2) from an encoded runtime.v1.PodSandboxConfig. */
export function hostnameFromPodSandboxConfig(bytes: Uint8Array): string | undefined {
  const reader = new BinaryReader(bytes);
  let hostname: string | undefined;
  while (reader.pos < reader.len) {
    const [field, wireType] = reader.tag();
    if (field === 2 && wireType === WireType.LengthDelimited) hostname = reader.string();
    else reader.skip(wireType);
  }
  return hostname === '' ? undefined : hostname;
}

function parseJson(what: string, bytes: Uint8Array): unknown {
  try {
    return JSON.parse(Buffer.from(bytes).toString('utf8'));
  } catch (err) {
    throw new TsboxError('InvalidArgument', `${what}: not valid JSON: ${messageOf(err)}`);
  }
}

/**
 * Derives what to run from a Create request: the pod's hostname (CRI's PodSandboxConfig in
 * `options`, else the `metadata` extension, else the OCI spec), the network namespace, and
 * the OCI spec's process when `sandbox.spec` carries one. Throws InvalidArgument for a known
 * type whose content is malformed; ignores types it does not know.
 */
export function deriveLaunchSpec(namespace: string, id: string, input: CreateInput): LaunchSpec {
  let hostname: string | undefined;
  let command: LaunchSpec['command'];

  if (input.options !== undefined && isType(input.options.typeUrl, POD_SANDBOX_CONFIG)) {
    try {
      hostname = hostnameFromPodSandboxConfig(input.options.value);
    } catch (err) {
      throw new TsboxError('InvalidArgument', `options: malformed ${POD_SANDBOX_CONFIG}: ${messageOf(err)}`);
    }
  }
  const metadata = input.extensions['metadata'];
  if (hostname === undefined && metadata !== undefined && isType(metadata.typeUrl, CRI_METADATA)) {
    const parsed = criMetadataSchema.safeParse(parseJson('extensions["metadata"]', metadata.value));
    if (parsed.success) {
      const config = parsed.data.Metadata?.Config ?? parsed.data.Config;
      if (config?.hostname !== undefined && config.hostname !== '') hostname = config.hostname;
    }
  }
  if (input.spec !== undefined && isType(input.spec.typeUrl, OCI_SPEC)) {
    const parsed = ociSpecSchema.safeParse(parseJson('sandbox.spec', input.spec.value));
    if (!parsed.success) {
      throw new TsboxError('InvalidArgument', `sandbox.spec: not an OCI runtime spec: ${z.prettifyError(parsed.error)}`);
    }
    const process = parsed.data.process;
    if (process?.args !== undefined && process.args.length > 0) {
      const env = process.env ?? [];
      command = {
        args: process.args,
        env: env.some((e) => e.startsWith('PATH=')) ? env : [DEFAULT_PATH, ...env],
        cwd: process.cwd ?? '/',
      };
    }
    if (hostname === undefined && parsed.data.hostname) hostname = parsed.data.hostname;
  }
  if (hostname !== undefined && !HOSTNAME.test(hostname)) {
    throw new TsboxError('InvalidArgument', `hostname ${JSON.stringify(hostname)} is not a valid host name`);
  }
  return {
    namespace,
    id,
    ...(hostname === undefined ? {} : { hostname }),
    ...(input.netnsPath === '' ? {} : { netnsPath: input.netnsPath }),
    ...(command === undefined ? {} : { command }),
  };
}
