import { z } from 'zod';
import { TsboxError, messageOf } from '../base/errors.js';
import type { LinuxContainerResources } from '../gen/runtime/v1/pod_sandbox_config.js';
import { resourcesOf, sandboxLimits, type Resources } from './pod-spec.js';
import { DEFAULT_PATH } from './launch-spec.js';
import type { LaunchSpec } from './record.js';

/**
 * What tsbox tells containerd of a running pod in OCI runtime-spec form, as podsandbox's pause
 * container spec has it: Start's `spec` (containerd 2.3 and later keep it; CRI builds NRI's view
 * of the pod from it: its namespaces, cgroups path, resources, annotations) and the
 * `runtimeSpec` of Status's verbose info (`crictl inspectp`). Where podsandbox's pause creates
 * a namespace, the spec names the one the sandbox's process holds (`/proc/PID/ns/...`), so a
 * plugin can enter it.
 */

/** containerd's type URL for an OCI runtime spec (JSON). */
export const OCI_SPEC_TYPE = 'types.containerd.io/opencontainers/runtime-spec/1/Spec';

/** Where a running sandbox lives on the host, as its backend knows it. */
export interface SandboxPlacement {
  /** The namespaces the sandbox holds of its own, each with the path that names it. */
  readonly namespaces: readonly { readonly type: string; readonly path: string }[];
  /** Its cgroup as runc names one: a path below the root, or `slice:prefix:name` under systemd. */
  readonly cgroupsPath?: string;
  /** The program holding the namespaces, with its arguments. */
  readonly args: readonly string[];
}

// CRI's annotations on a sandbox (containerd's internal/cri/annotations).
const CONTAINER_TYPE = 'io.kubernetes.cri.container-type';
const SANDBOX_ID = 'io.kubernetes.cri.sandbox-id';
const SANDBOX_NAME = 'io.kubernetes.cri.sandbox-name';
const SANDBOX_NAMESPACE = 'io.kubernetes.cri.sandbox-namespace';
const SANDBOX_UID = 'io.kubernetes.cri.sandbox-uid';
const SANDBOX_LOG_DIR = 'io.kubernetes.cri.sandbox-log-directory';
const SANDBOX_CPU_PERIOD = 'io.kubernetes.cri.sandbox-cpu-period';
const SANDBOX_CPU_QUOTA = 'io.kubernetes.cri.sandbox-cpu-quota';
const SANDBOX_CPU_SHARES = 'io.kubernetes.cri.sandbox-cpu-shares';
const SANDBOX_MEMORY = 'io.kubernetes.cri.sandbox-memory';

/** A pod's limits in the OCI spec's `linux.resources` form. */
export function ociResources(limits: Resources | undefined): Record<string, unknown> {
  if (limits === undefined) return {};
  const cpu = Object.fromEntries(
    Object.entries({ shares: limits.cpuShares, quota: limits.cpuQuota, period: limits.cpuPeriod, cpus: limits.cpusetCpus, mems: limits.cpusetMems }).filter(([, v]) => v !== undefined),
  );
  const memory = Object.fromEntries(Object.entries({ limit: limits.memoryLimitBytes, swap: limits.memorySwapLimitBytes }).filter(([, v]) => v !== undefined));
  return {
    ...(Object.keys(cpu).length === 0 ? {} : { cpu }),
    ...(Object.keys(memory).length === 0 ? {} : { memory }),
    ...(limits.unified === undefined ? {} : { unified: { ...limits.unified } }),
  };
}

/** The pod's OCI runtime spec, from its launch spec and where its process runs. */
export function podRuntimeSpec(spec: LaunchSpec, placement: SandboxPlacement, annotations: Readonly<Record<string, string>>): Record<string, unknown> {
  const pod = spec.pod;
  const limits = pod === undefined ? undefined : sandboxLimits(pod);
  const cri: Record<string, string> = { [CONTAINER_TYPE]: 'sandbox', [SANDBOX_ID]: spec.id };
  if (pod?.pod !== undefined) {
    cri[SANDBOX_NAME] = pod.pod.name;
    cri[SANDBOX_NAMESPACE] = pod.pod.namespace;
    cri[SANDBOX_UID] = pod.pod.uid;
  }
  if (pod?.logDirectory !== undefined) cri[SANDBOX_LOG_DIR] = pod.logDirectory;
  // As podsandbox: the pod's own resources (not the overhead) as annotations, for runtimes that size a VM.
  const own = pod?.resources;
  if (own !== undefined) {
    cri[SANDBOX_CPU_PERIOD] = String(own.cpuPeriod ?? 0);
    cri[SANDBOX_CPU_QUOTA] = String(own.cpuQuota ?? 0);
    cri[SANDBOX_CPU_SHARES] = String(own.cpuShares ?? 0);
    cri[SANDBOX_MEMORY] = String(own.memoryLimitBytes ?? 0);
  }
  const linux: Record<string, unknown> = {
    namespaces: placement.namespaces.map((ns) => ({ type: ns.type, path: ns.path })),
    resources: ociResources(limits),
  };
  if (placement.cgroupsPath !== undefined) linux['cgroupsPath'] = placement.cgroupsPath;
  if (pod !== undefined && Object.keys(pod.sysctls).length > 0) linux['sysctl'] = { ...pod.sysctls };
  return {
    ociVersion: '1.2.0',
    process: {
      user: { uid: 0, gid: 0 },
      args: [...placement.args],
      env: [DEFAULT_PATH],
      cwd: '/',
      ...(limits?.oomScoreAdj === undefined ? {} : { oomScoreAdj: limits.oomScoreAdj }),
    },
    ...(spec.hostname === undefined ? {} : { hostname: spec.hostname }),
    annotations: { ...annotations, ...cri },
    linux,
  };
}

/** containerd 2.3's extension for UpdatePodSandboxResources (CRI v1.33), and its type. */
export const UPDATED_RESOURCES_KEY = 'updated-resources';
export const UPDATED_RESOURCES_TYPE = 'io.containerd.cri.v1/UpdatedResources';

// CRI's LinuxContainerResources as Go's encoding/json writes it (snake_case, empty fields left out).
const goResources = z
  .object({
    cpu_period: z.number().int().optional(),
    cpu_quota: z.number().int().optional(),
    cpu_shares: z.number().int().optional(),
    memory_limit_in_bytes: z.number().int().optional(),
    oom_score_adj: z.number().int().optional(),
    cpuset_cpus: z.string().optional(),
    cpuset_mems: z.string().optional(),
    hugepage_limits: z.array(z.object({ page_size: z.string().optional(), limit: z.number().optional() })).nullish(),
    unified: z.record(z.string(), z.string()).nullish(),
    memory_swap_limit_in_bytes: z.number().int().optional(),
  })
  .nullish();
const updatedResourcesSchema = z.object({ Overhead: goResources, Resources: goResources });

function fromGo(r: z.output<typeof goResources>): LinuxContainerResources | undefined {
  if (r === undefined || r === null) return undefined;
  return {
    cpuPeriod: r.cpu_period ?? 0,
    cpuQuota: r.cpu_quota ?? 0,
    cpuShares: r.cpu_shares ?? 0,
    memoryLimitInBytes: r.memory_limit_in_bytes ?? 0,
    oomScoreAdj: r.oom_score_adj ?? 0,
    cpusetCpus: r.cpuset_cpus ?? '',
    cpusetMems: r.cpuset_mems ?? '',
    hugepageLimits: (r.hugepage_limits ?? []).map((h) => ({ pageSize: h.page_size ?? '', limit: h.limit ?? 0 })),
    unified: { ...(r.unified ?? {}) },
    memorySwapLimitInBytes: r.memory_swap_limit_in_bytes ?? 0,
  };
}

/** The pod's new resources and overhead from containerd's `updated-resources` extension (JSON). */
export function updatedResourcesOf(value: Uint8Array): { resources: Resources | undefined; overhead: Resources | undefined } {
  const what = `extensions["${UPDATED_RESOURCES_KEY}"]`;
  let json: unknown;
  try {
    json = JSON.parse(Buffer.from(value).toString('utf8'));
  } catch (err) {
    throw new TsboxError('InvalidArgument', `${what}: not valid JSON: ${messageOf(err)}`);
  }
  const parsed = updatedResourcesSchema.safeParse(json);
  if (!parsed.success) throw new TsboxError('InvalidArgument', `${what}: not an ${UPDATED_RESOURCES_TYPE}: ${z.prettifyError(parsed.error)}`);
  return {
    resources: resourcesOf(fromGo(parsed.data.Resources), 'resources'),
    overhead: resourcesOf(fromGo(parsed.data.Overhead), 'overhead'),
  };
}
