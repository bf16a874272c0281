import { z } from 'zod';
import { TsboxError, messageOf } from '../base/errors.js';
import { PodSandboxConfig } from '../gen/runtime/v1/pod_sandbox_config.js';
import { podSpecFromConfig, type PodSpec } from './pod-spec.js';
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

/** The PATH a sandbox's process gets when its spec names none. */
export const DEFAULT_PATH = 'PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin';

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
    Metadata: z.object({ Config: criConfigSchema.nullish(), RuntimeHandler: z.string().optional() }).loose().optional(),
    Config: criConfigSchema.nullish(),
  })
  .loose();

const HOSTNAME = /^[A-Za-z0-9](?:[A-Za-z0-9.-]{0,62})$/;

/** Decodes CRI's PodSandboxConfig (Create's `options`) and checks what it asks of the pod. */
export function podSpecFromOptions(bytes: Uint8Array): PodSpec {
  let config: PodSandboxConfig;
  try {
    config = PodSandboxConfig.decode(bytes);
  } catch (err) {
    throw new TsboxError('InvalidArgument', `options: malformed ${POD_SANDBOX_CONFIG}: ${messageOf(err)}`);
  }
  return podSpecFromConfig(config);
}

/** Text that reaches execve, a path or the kernel: a NUL byte would cut it short there. */
function noNul(what: string, value: string): string {
  if (value.includes('\0')) throw new TsboxError('InvalidArgument', `${what} contains a NUL byte`);
  return value;
}

function parseJson(what: string, bytes: Uint8Array): unknown {
  try {
    return JSON.parse(Buffer.from(bytes).toString('utf8'));
  } catch (err) {
    throw new TsboxError('InvalidArgument', `${what}: not valid JSON: ${messageOf(err)}`);
  }
}

/**
 * Derives what to run from a Create request: for a Kubernetes pod, CRI's PodSandboxConfig in
 * `options` (namespace modes, hostname, DNS, sysctls, cgroup, limits); else the hostname from
 * the `metadata` extension or the OCI spec; the network namespace; and the OCI spec's
 * process when `sandbox.spec` carries one. Throws InvalidArgument for a known type whose
 * content is malformed or asks for what tsbox cannot do; ignores types it does not know.
 */
export function deriveLaunchSpec(namespace: string, id: string, input: CreateInput): LaunchSpec {
  let hostname: string | undefined;
  let command: LaunchSpec['command'];
  let pod: PodSpec | undefined;

  if (input.options !== undefined && isType(input.options.typeUrl, POD_SANDBOX_CONFIG)) {
    pod = podSpecFromOptions(input.options.value);
    // A host-network pod keeps the host's UTS namespace, so it has no name of its own.
    if (pod.network === 'pod' && pod.hostname !== '') hostname = pod.hostname;
  }
  const metadata = input.extensions['metadata'];
  let runtimeHandler: string | undefined;
  if (metadata !== undefined && isType(metadata.typeUrl, CRI_METADATA)) {
    const parsed = criMetadataSchema.safeParse(parseJson('extensions["metadata"]', metadata.value));
    if (parsed.success) {
      // The CRI runtime handler the pod was asked on: it decides the route of its containers.
      if (parsed.data.Metadata?.RuntimeHandler) runtimeHandler = parsed.data.Metadata.RuntimeHandler;
      const config = parsed.data.Metadata?.Config ?? parsed.data.Config;
      if (pod === undefined && config?.hostname !== undefined && config.hostname !== '') hostname = config.hostname;
    }
  }
  if (input.spec !== undefined && isType(input.spec.typeUrl, OCI_SPEC)) {
    const parsed = ociSpecSchema.safeParse(parseJson('sandbox.spec', input.spec.value));
    if (!parsed.success) {
      throw new TsboxError('InvalidArgument', `sandbox.spec: not an OCI runtime spec: ${z.prettifyError(parsed.error)}`);
    }
    const process = parsed.data.process;
    if (process?.args !== undefined && process.args.length > 0) {
      const env = (process.env ?? []).map((e, i) => noNul(`sandbox.spec process.env[${i}]`, e));
      command = {
        args: process.args.map((a, i) => noNul(`sandbox.spec process.args[${i}]`, a)),
        env: env.some((e) => e.startsWith('PATH=')) ? env : [DEFAULT_PATH, ...env],
        cwd: noNul('sandbox.spec process.cwd', process.cwd ?? '/'),
      };
    }
    if (hostname === undefined && pod === undefined && parsed.data.hostname) hostname = parsed.data.hostname;
  }
  if (hostname !== undefined && !HOSTNAME.test(hostname)) {
    throw new TsboxError('InvalidArgument', `hostname ${JSON.stringify(hostname)} is not a valid host name`);
  }
  noNul('netns_path', input.netnsPath);
  if (input.netnsPath !== '' && !input.netnsPath.startsWith('/')) {
    throw new TsboxError('InvalidArgument', `netns_path ${JSON.stringify(input.netnsPath)} is not an absolute path`);
  }
  if (pod?.network === 'node' && input.netnsPath !== '') {
    throw new TsboxError('InvalidArgument', 'netns_path is set, but the pod asks for the host network (namespace_options.network NODE)');
  }
  return {
    namespace,
    id,
    ...(hostname === undefined ? {} : { hostname }),
    ...(runtimeHandler === undefined ? {} : { runtimeHandler }),
    ...(input.netnsPath === '' ? {} : { netnsPath: input.netnsPath }),
    ...(command === undefined ? {} : { command }),
    ...(pod === undefined ? {} : { pod }),
  };
}
