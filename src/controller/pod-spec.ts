import { z } from 'zod';
import { TsboxError } from '../base/errors.js';
import type { LinuxContainerResources, PodSandboxConfig } from '../gen/runtime/v1/pod_sandbox_config.js';

/**
 * What a Kubernetes pod asks of its sandbox, taken from CRI's PodSandboxConfig (Create's
 * `options`, SPEC.md section 7) and checked once, at Create: the namespace modes, the files
 * podsandbox makes for every pod (hostname, hosts, resolv.conf, /dev/shm), sysctls, and the
 * cgroup with its limits. It is part of the sandbox's record, so a restarted tsbox tears the
 * pod down exactly as it was set up.
 */

/** A pod's limits, in CRI's units; an absent field is not limited. */
export const resourcesSchema = z.object({
  cpuPeriod: z.number().int().positive().optional(),
  cpuQuota: z.number().int().positive().optional(),
  cpuShares: z.number().int().positive().optional(),
  memoryLimitBytes: z.number().int().positive().optional(),
  memorySwapLimitBytes: z.number().int().positive().optional(),
  oomScoreAdj: z.number().int().min(-1000).max(1000).optional(),
  cpusetCpus: z.string().optional(),
  cpusetMems: z.string().optional(),
  /** cgroup v2 files, written as they are (CRI's `unified`). */
  unified: z.record(z.string(), z.string()).optional(),
});
export type Resources = z.infer<typeof resourcesSchema>;

export const podSpecSchema = z.object({
  /** NODE: the host's network and UTS namespaces (no own hostname); POD: `netns_path`. */
  network: z.enum(['pod', 'node']),
  /** POD: the sandbox is pid 1 of the pod's pid namespace; CONTAINER: each container has its own; NODE: the host's. */
  pid: z.enum(['pod', 'container', 'node']),
  ipc: z.enum(['pod', 'node']),
  /** The pod's host name: its UTS name (network POD) and /etc/hostname; empty means the host's. */
  hostname: z.string(),
  /** resolv.conf content; absent: a copy of the host's. */
  resolvConf: z.string().optional(),
  sysctls: z.record(z.string(), z.string()),
  /** kubelet's pod cgroup, as CRI sends it (cgroupfs path or systemd slice). */
  cgroupParent: z.string().optional(),
  resources: resourcesSchema.optional(),
  overhead: resourcesSchema.optional(),
  /** Kubernetes' names for the pod, for operators. */
  pod: z.object({ name: z.string(), namespace: z.string(), uid: z.string() }).optional(),
  /** kubelet's log directory for the pod's containers (an annotation of the pod's OCI spec). */
  logDirectory: z.string().optional(),
});
export type PodSpec = z.infer<typeof podSpecSchema>;

// CRI's NamespaceMode numbers (api.proto).
const POD = 0;
const CONTAINER = 1;
const NODE = 2;
const TARGET = 3;
const MODE_NAMES: Record<number, string> = { [POD]: 'POD', [CONTAINER]: 'CONTAINER', [NODE]: 'NODE', [TARGET]: 'TARGET' };

const invalid = (message: string): TsboxError => new TsboxError('InvalidArgument', `PodSandboxConfig: ${message}`);

function mode(what: string, value: number, allowed: readonly number[]): number {
  if (!allowed.includes(value)) {
    const name = MODE_NAMES[value];
    throw invalid(
      name === undefined
        ? `unknown ${what} namespace mode ${value}`
        : `${what} namespace mode ${name} is not supported for a pod (use ${allowed.map((m) => MODE_NAMES[m]).join(' or ')})`,
    );
  }
  return value;
}

/** A piece of text that goes into a file or a kernel interface: no NUL, no line break. */
function oneLine(what: string, value: string): string {
  if (/[\0\r\n]/.test(value)) throw invalid(`${what} ${JSON.stringify(value)} contains a line break or NUL byte`);
  return value;
}

// glibc reads at most this many nameservers; more would be silently ignored by every
// program in the pod, so they are refused instead.
const MAX_NAMESERVERS = 3;
const DNS_WORD = /^[^\s#;]+$/;

/** resolv.conf as podsandbox writes it: search, nameserver lines, options. */
export function resolvConfOf(dns: { servers: readonly string[]; searches: readonly string[]; options: readonly string[] }): string {
  const word = (what: string, value: string): string => {
    oneLine(`dns_config ${what}`, value);
    if (!DNS_WORD.test(value)) throw invalid(`dns_config ${what} ${JSON.stringify(value)} does not fit in resolv.conf (empty, blank or a comment character)`);
    return value;
  };
  if (dns.servers.length > MAX_NAMESERVERS) {
    throw invalid(`dns_config has ${dns.servers.length} servers; resolv.conf takes at most ${MAX_NAMESERVERS}`);
  }
  let out = '';
  if (dns.searches.length > 0) out += `search ${dns.searches.map((s) => word('search', s)).join(' ')}\n`;
  for (const server of dns.servers) out += `nameserver ${word('server', server)}\n`;
  if (dns.options.length > 0) out += `options ${dns.options.map((o) => word('option', o)).join(' ')}\n`;
  return out;
}

/** sysctls that the kernel keeps per IPC namespace (and Kubernetes allows as pod sysctls). */
function isIpcSysctl(key: string): boolean {
  return /^kernel\.(shm(max|all|mni|_rmid_forced)|msg(max|mnb|mni)|sem)$/.test(key) || key.startsWith('fs.mqueue.');
}

const SYSCTL_KEY = /^[a-z0-9_]+(?:\.[A-Za-z0-9_\-/]+)+$/;

function checkSysctls(sysctls: Record<string, string>, network: 'pod' | 'node', ipc: 'pod' | 'node'): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [key, value] of Object.entries(sysctls)) {
    if (!SYSCTL_KEY.test(key) || key.split(/[./]/).some((part) => part === '..' || part === '')) {
      throw invalid(`sysctl ${JSON.stringify(key)} is not a sysctl name`);
    }
    oneLine(`sysctl ${key} value`, value);
    if (key.startsWith('net.')) {
      if (network === 'node') throw invalid(`sysctl ${key} would change the host's network settings: the pod uses the host network`);
    } else if (isIpcSysctl(key)) {
      if (ipc === 'node') throw invalid(`sysctl ${key} would change the host's IPC settings: the pod uses the host IPC namespace`);
    } else if (key === 'kernel.domainname') {
      if (network === 'node') throw invalid(`sysctl ${key} would change the host's domain name: the pod uses the host network`);
    } else {
      throw invalid(`sysctl ${key} is not namespaced: it would change the whole node, so a pod may not set it`);
    }
    out[key] = value;
  }
  return out;
}

/** The cgroup parent as CRI may send it: an absolute path or a systemd slice, never leaving the root. */
function checkCgroupParent(parent: string): string | undefined {
  if (parent === '') return undefined;
  oneLine('cgroup_parent', parent);
  const parts = parent.split('/');
  if (parts.includes('..') || parts.includes('.')) throw invalid(`cgroup_parent ${JSON.stringify(parent)} leaves the cgroup root`);
  const base = parts[parts.length - 1] ?? '';
  if (base.endsWith('.slice') && !/^[A-Za-z0-9_.:\\-]+\.slice$/.test(base)) {
    throw invalid(`cgroup_parent ${JSON.stringify(parent)} is not a systemd slice name`);
  }
  return parent;
}

/** CRI's LinuxContainerResources as tsbox keeps them: zero and empty mean "not set". */
export function resourcesOf(r: LinuxContainerResources | undefined, what = 'resources'): Resources | undefined {
  if (r === undefined) return undefined;
  const positive = (name: string, v: number): number | undefined => {
    if (v < 0) throw invalid(`${what}.${name} is negative (${v})`);
    return v === 0 ? undefined : v;
  };
  if (r.oomScoreAdj < -1000 || r.oomScoreAdj > 1000) throw invalid(`${what}.oom_score_adj ${r.oomScoreAdj} is outside -1000..1000`);
  const cpuset = (name: string, v: string): string | undefined => {
    if (v !== '' && !/^[0-9]+(?:-[0-9]+)?(?:,[0-9]+(?:-[0-9]+)?)*$/.test(v)) throw invalid(`${what}.${name} ${JSON.stringify(v)} is not a CPU or node list`);
    return v === '' ? undefined : v;
  };
  for (const [key, value] of Object.entries(r.unified)) {
    if (!/^[a-z]+\.[a-z0-9_.]+$/.test(key)) throw invalid(`${what}.unified key ${JSON.stringify(key)} is not a cgroup file name`);
    oneLine(`${what}.unified ${key}`, value);
  }
  const out: Resources = Object.fromEntries(
    Object.entries({
      cpuPeriod: positive('cpu_period', r.cpuPeriod),
      cpuQuota: r.cpuQuota <= 0 ? undefined : r.cpuQuota, // -1 is CRI's "no quota"
      cpuShares: positive('cpu_shares', r.cpuShares),
      memoryLimitBytes: positive('memory_limit_in_bytes', r.memoryLimitInBytes),
      memorySwapLimitBytes: r.memorySwapLimitInBytes <= 0 ? undefined : r.memorySwapLimitInBytes,
      oomScoreAdj: r.oomScoreAdj === 0 ? undefined : r.oomScoreAdj,
      cpusetCpus: cpuset('cpuset_cpus', r.cpusetCpus),
      cpusetMems: cpuset('cpuset_mems', r.cpusetMems),
      unified: Object.keys(r.unified).length === 0 ? undefined : { ...r.unified },
    }).filter(([, v]) => v !== undefined),
  );
  return Object.keys(out).length === 0 ? undefined : out;
}

/**
 * Checks and condenses a PodSandboxConfig. Throws InvalidArgument, naming the field, for
 * what tsbox cannot give the pod: a namespace mode it does not know or support, DNS
 * settings that do not fit resolv.conf, a sysctl that is not namespaced or would change the
 * host, a cgroup parent outside the cgroup root, limits out of range.
 */
export function podSpecFromConfig(config: PodSandboxConfig): PodSpec {
  const linux = config.linux;
  const ns = linux?.securityContext?.namespaceOptions;
  const network = mode('network', ns?.network ?? POD, [POD, NODE]) === NODE ? 'node' : 'pod';
  const pidMode = mode('pid', ns?.pid ?? POD, [POD, CONTAINER, NODE, TARGET]);
  // TARGET names a container's pid namespace: that is the container's business (CRI puts it
  // in the container spec); the sandbox itself keeps a pid namespace of its own.
  const pid = pidMode === NODE ? 'node' : pidMode === POD ? 'pod' : 'container';
  const ipc = mode('ipc', ns?.ipc ?? POD, [POD, NODE]) === NODE ? 'node' : 'pod';
  const userns = ns?.usernsOptions;
  if (userns !== undefined && (userns.mode as number) !== NODE) {
    throw new TsboxError('Unimplemented', `PodSandboxConfig: user namespace mode ${MODE_NAMES[userns.mode] ?? userns.mode} is not supported by tsbox; use NODE`);
  }
  const hostname = oneLine('hostname', config.hostname);
  const dns = config.dnsConfig;
  const spec: PodSpec = {
    network,
    pid,
    ipc,
    hostname,
    ...(dns === undefined ? {} : { resolvConf: resolvConfOf(dns) }),
    sysctls: checkSysctls(linux?.sysctls ?? {}, network, ipc),
  };
  const cgroupParent = checkCgroupParent(linux?.cgroupParent ?? '');
  const resources = resourcesOf(linux?.resources);
  const overhead = resourcesOf(linux?.overhead, 'overhead');
  const meta = config.metadata;
  return {
    ...spec,
    ...(cgroupParent === undefined ? {} : { cgroupParent }),
    ...(resources === undefined ? {} : { resources }),
    ...(overhead === undefined ? {} : { overhead }),
    ...(meta === undefined ? {} : { pod: { name: meta.name, namespace: meta.namespace, uid: meta.uid } }),
    ...(config.logDirectory === '' ? {} : { logDirectory: config.logDirectory }),
  };
}

/**
 * The limits the sandbox's cgroup gets: the pod's resources plus its overhead, field by
 * field (an absent field on either side leaves the other's value; CPU period and cpusets
 * are not sums and come from `resources` first).
 */
export function sandboxLimits(spec: Pick<PodSpec, 'resources' | 'overhead'>): Resources | undefined {
  const { resources: r, overhead: o } = spec;
  if (r === undefined || o === undefined) return r ?? o;
  const sum = (a: number | undefined, b: number | undefined): number | undefined => (a === undefined ? b : b === undefined ? a : a + b);
  const out: Resources = Object.fromEntries(
    Object.entries({
      cpuPeriod: r.cpuPeriod ?? o.cpuPeriod,
      cpuQuota: sum(r.cpuQuota, o.cpuQuota),
      cpuShares: sum(r.cpuShares, o.cpuShares),
      memoryLimitBytes: sum(r.memoryLimitBytes, o.memoryLimitBytes),
      memorySwapLimitBytes: sum(r.memorySwapLimitBytes, o.memorySwapLimitBytes),
      oomScoreAdj: r.oomScoreAdj ?? o.oomScoreAdj,
      cpusetCpus: r.cpusetCpus ?? o.cpusetCpus,
      cpusetMems: r.cpusetMems ?? o.cpusetMems,
      unified: r.unified === undefined && o.unified === undefined ? undefined : { ...o.unified, ...r.unified },
    }).filter(([, v]) => v !== undefined),
  );
  return out;
}
