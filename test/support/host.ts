/**
 * What a sandbox left on the host, read from /proc and the cgroup hierarchies, independently
 * of tsbox's own records: its supervisors (`tsbox-shim` processes whose command line names a
 * directory of a state dir), their children, every process in the sandbox's cgroup, its cgroup
 * directories, and the pid and exit files of its directory. Both daemon harnesses use it.
 */
import { readFileSync, readdirSync } from 'node:fs';
import path from 'node:path';
import { killAndReap } from './processes.js';

/** A namespace no other run uses, so that its cgroups and records can be found and removed. */
export function uniqueNamespace(label: string): string {
  return `${label}-${process.pid}-${Math.random().toString(36).slice(2, 8)}`;
}

// ---------------------------------------------------------------------------------------------
// /proc

/** What the tests read from /proc/PID/stat. */
export interface ProcInfo {
  readonly pid: number;
  readonly ppid: number;
  /** Process state letter: R, S, D, Z, … */
  readonly state: string;
  /** Start time in clock ticks since boot: with the pid, names one process for good. */
  readonly startTime: string;
}

/** /proc/PID/stat of a process, or undefined when there is no such process. */
export function procInfo(pid: number): ProcInfo | undefined {
  try {
    const text = readFileSync(`/proc/${pid}/stat`, 'utf8');
    // Fields after the command name (in parentheses, may contain anything); rest[0] is field 3.
    const rest = text.slice(text.lastIndexOf(')') + 2).split(' ');
    return { pid, ppid: Number(rest[1]), state: rest[0] ?? '', startTime: rest[19] ?? '' };
  } catch {
    // the process is gone
    return undefined;
  }
}

/** The start time of a process (field 22 of /proc/PID/stat), or undefined when it is gone. */
export function processStartTime(pid: number): string | undefined {
  return procInfo(pid)?.startTime;
}

/** The command line of a process as its words ([] when it is gone). */
export function cmdlineOf(pid: number): string[] {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').filter((w) => w !== '');
  } catch {
    // the process is gone: it has no command line
    return [];
  }
}

/** Every pid in /proc. */
export function listPids(): number[] {
  return readdirSync('/proc')
    .filter((name) => /^\d+$/.test(name))
    .map(Number);
}

/** The container holders (`tsbox-ctr`) running now: each one's pid and the container id on its command line. */
export function containerHolders(): { readonly pid: number; readonly id: string }[] {
  const out: { pid: number; id: string }[] = [];
  for (const pid of listPids()) {
    const argv = cmdlineOf(pid); // [] when it ended meanwhile
    if (path.basename(argv[0] ?? '') === 'tsbox-ctr') out.push({ pid, id: argv[argv.indexOf('--id') + 1] ?? '?' });
  }
  return out;
}

/** The cgroup paths a process is in (one per hierarchy), e.g. `/tsbox/ns@id`. */
export function cgroupPathsOf(pid: number): string[] {
  try {
    return readFileSync(`/proc/${pid}/cgroup`, 'utf8')
      .split('\n')
      .filter((line) => line !== '')
      .map((line) => line.slice(line.indexOf(':', line.indexOf(':') + 1) + 1));
  } catch {
    // the process is gone: it is in no cgroup
    return [];
  }
}

/** Mount points of the cgroup v1 hierarchies and the v2 one. */
export function cgroupMounts(): string[] {
  const out: string[] = [];
  for (const line of readFileSync('/proc/self/mountinfo', 'utf8').split('\n')) {
    const [left, right] = line.split(' - ');
    const mountPoint = left?.split(' ')[4];
    const type = right?.split(' ')[0];
    if (mountPoint !== undefined && (type === 'cgroup' || type === 'cgroup2')) out.push(mountPoint);
  }
  return out;
}

/** Where the cgroup file systems of this node are mounted, and which kind tsbox uses here. */
export interface CgroupNode {
  /** v1 when the memory and cpuacct v1 hierarchies are mounted (hybrid nodes included), as tsbox decides. */
  readonly kind: 'v1' | 'v2';
  /** v1: the mount point of each controller; v2: every controller maps to the unified root. */
  readonly root: (controller: string) => string;
}

/**
 * The node's cgroup kind, decided as tsbox decides it (src/runtime/cgroups.ts). Throws when
 * it cannot be determined, so that a test that depends on it fails instead of passing.
 */
export function cgroupNode(): CgroupNode {
  const v1 = new Map<string, string>();
  let unified: string | undefined;
  for (const line of readFileSync('/proc/self/mountinfo', 'utf8').split('\n')) {
    const [left, right] = line.split(' - ');
    const point = left?.split(' ')[4];
    const [type, , options] = (right ?? '').split(' ');
    if (point === undefined) continue;
    if (type === 'cgroup') for (const c of (options ?? '').split(',')) if (!v1.has(c)) v1.set(c, point);
    if (type === 'cgroup2' && unified === undefined) unified = point;
  }
  if (v1.has('memory') && v1.has('cpuacct')) {
    return {
      kind: 'v1',
      root: (controller) => {
        const point = v1.get(controller);
        if (point === undefined) throw new Error(`this cgroup v1 node has no ${controller} hierarchy mounted`);
        return point;
      },
    };
  }
  if (unified !== undefined && readFileSync(path.join(unified, 'cgroup.controllers'), 'utf8').split(/\s+/).includes('memory')) {
    const root = unified;
    return { kind: 'v2', root: () => root };
  }
  throw new Error(
    `cannot tell this node's cgroup kind: v1 hierarchies [${[...v1.keys()].join(', ')}], cgroup2 ${unified ?? 'not mounted'} (tsbox needs v1 memory+cpuacct or a v2 root with memory)`,
  );
}

/** tsbox's cgroup name for a sandbox (src/runtime/cgroups.ts: `<parent>/<ns>@<id>`). */
export function sandboxCgroupName(namespace: string, id: string): string {
  return `${namespace}@${id}`;
}


/** Every cgroup directory tsbox may have made for a sandbox (default parent `tsbox`). */
export function sandboxCgroupDirs(namespace: string, id: string): string[] {
  return cgroupMounts().map((mount) => path.join(mount, 'tsbox', sandboxCgroupName(namespace, id)));
}

/** The cgroup directories of a sandbox that exist now, over every hierarchy. */
export function existingCgroupDirs(namespace: string, id: string): string[] {
  const out: string[] = [];
  for (const mount of cgroupMounts()) {
    const dir = path.join(mount, 'tsbox', sandboxCgroupName(namespace, id));
    try {
      readdirSync(dir);
      out.push(dir);
    } catch {
      // absent in this hierarchy
    }
  }
  return out;
}

/** Every cgroup directory left under any `<hierarchy>/tsbox/` for sandboxes of `namespace`. */
export function cgroupDirsOfNamespace(namespace: string): string[] {
  const out: string[] = [];
  for (const mount of cgroupMounts()) {
    const parent = path.join(mount, 'tsbox');
    let names: string[];
    try {
      names = readdirSync(parent);
    } catch {
      // no such cgroup parent on this host
      continue;
    }
    for (const name of names) if (name.startsWith(`${namespace}@`)) out.push(path.join(parent, name));
  }
  return out;
}

/** A live process that is not a zombie. */
function live(pid: number): boolean {
  const info = procInfo(pid);
  return info !== undefined && info.state !== 'Z' && info.state !== 'X';
}

/** What runs on the host for one sandbox, found without asking tsbox. */
export interface SandboxProcesses {
  /** Live supervisors whose command line names the sandbox's directory. */
  readonly supervisors: number[];
  /** Live processes that are not supervisors: children of its supervisors, members of its cgroup. */
  readonly sandbox: number[];
}

/** Finds the live processes of sandbox (ns, id) of a state dir. */
export function sandboxProcesses(stateDir: string, namespace: string, id: string): SandboxProcesses {
  const dir = path.join(stateDir, 'sandboxes', namespace, id);
  const cgroup = `/tsbox/${sandboxCgroupName(namespace, id)}`;
  const pids = listPids().filter((pid) => pid !== process.pid);
  // A supervisor names the directory on its command line, and so does the pause (its one
  // argument), the supervisor's child. The supervisor is the one whose parent does not name it, unless
  // the pid file names it as the sandbox's (a pause process whose supervisor was killed).
  const naming = pids.filter((pid) => cmdlineOf(pid).includes(dir) && live(pid));
  const recorded = readPidFile(dir)?.pid;
  const supervisors = naming.filter((pid) => pid !== recorded && !naming.includes(procInfo(pid)?.ppid ?? 0));
  const sandbox = new Set<number>();
  for (const pid of pids) {
    if (supervisors.includes(pid) || !live(pid)) continue;
    const info = procInfo(pid);
    const inCgroup = cgroupPathsOf(pid).some((p) => p === cgroup || p.startsWith(`${cgroup}/`));
    if (inCgroup || (info !== undefined && supervisors.includes(info.ppid))) sandbox.add(pid);
  }
  return { supervisors, sandbox: [...sandbox] };
}

/** The live supervisors of any sandbox of a state dir, with the directory each one serves. */
export function supervisorsOfStateDir(stateDir: string): { pid: number; dir: string }[] {
  const prefix = `${path.join(stateDir, 'sandboxes')}${path.sep}`;
  const out: { pid: number; dir: string }[] = [];
  for (const pid of listPids()) {
    if (pid === process.pid) continue;
    const words = cmdlineOf(pid);
    const at = words.indexOf('--dir');
    const dir = at >= 0 ? words[at + 1] : undefined;
    if (dir !== undefined && dir.startsWith(prefix) && live(pid)) out.push({ pid, dir });
  }
  // A fork of a supervisor (the pause process) is a sandbox process, not a supervisor.
  const pids = new Set(out.map((s) => s.pid));
  return out.filter((s) => !pids.has(procInfo(s.pid)?.ppid ?? 0) && readPidFileQuietly(s.dir)?.pid !== s.pid);
}

/** Live processes in any cgroup of a sandbox of `namespace` (supervisors included). */
export function processesInNamespaceCgroups(namespace: string): number[] {
  const prefix = `/tsbox/${namespace}@`;
  return listPids().filter(
    (pid) => pid !== process.pid && live(pid) && cgroupPathsOf(pid).some((p) => p.startsWith(prefix)),
  );
}

/** The sandbox's pid file: "<supervisor pid> <sandbox pid>", or undefined when absent. */
export function readPidFile(sandboxDir: string): { shimPid: number; pid: number } | undefined {
  let text: string;
  try {
    text = readFileSync(path.join(sandboxDir, 'pid'), 'utf8');
  } catch {
    // no pid file: the supervisor never ran or its directory is gone
    return undefined;
  }
  const match = /^(\d+) (\d+)\n?$/.exec(text);
  if (match === null) throw new Error(`${sandboxDir}/pid is malformed: ${JSON.stringify(text)}`);
  return { shimPid: Number(match[1]), pid: Number(match[2]) };
}

function readPidFileQuietly(sandboxDir: string): { shimPid: number; pid: number } | undefined {
  try {
    return readPidFile(sandboxDir);
  } catch {
    // no pid file, or a torn one: nothing to name
    return undefined;
  }
}

/** The supervisor's exit file: "<status> <seconds> <nanoseconds>", or undefined when absent. */
export function readExitFile(sandboxDir: string): { status: number; seconds: number; nanos: number } | undefined {
  let text: string;
  try {
    text = readFileSync(path.join(sandboxDir, 'exit'), 'utf8');
  } catch {
    // no exit file: the sandbox has not exited (or has no directory)
    return undefined;
  }
  const match = /^(\d+) (-?\d+) (\d+)\n?$/.exec(text);
  if (match === null) throw new Error(`${sandboxDir}/exit is malformed: ${JSON.stringify(text)}`);
  return { status: Number(match[1]), seconds: Number(match[2]), nanos: Number(match[3]) };
}

/**
 * Everything still alive of the sandboxes of a state dir and of `namespaces`: supervisors,
 * their children, processes in the namespaces' sandbox cgroups, and the given pids (each
 * with the start time it was recorded with).
 */
export function sandboxLeftovers(
  stateDir: string,
  namespaces: readonly string[],
  pids: ReadonlyMap<number, string> = new Map(),
): number[] {
  const found = new Set<number>();
  const supervisors = supervisorsOfStateDir(stateDir).map((s) => s.pid);
  const prefix = `${path.join(stateDir, 'sandboxes')}${path.sep}`;
  for (const pid of listPids()) {
    const info = procInfo(pid);
    if (info === undefined || !live(pid)) continue;
    // Supervisors, their children, and a sandbox whose supervisor is gone (it keeps the
    // supervisor's command line).
    if (supervisors.includes(pid) || supervisors.includes(info.ppid)) found.add(pid);
    else if (cmdlineOf(pid).some((word) => word.startsWith(prefix))) found.add(pid);
  }
  for (const ns of namespaces) for (const pid of processesInNamespaceCgroups(ns)) found.add(pid);
  for (const [pid, startTime] of pids) if (procInfo(pid)?.startTime === startTime && live(pid)) found.add(pid);
  found.delete(process.pid);
  return [...found];
}

/** SIGKILLs {@link sandboxLeftovers} (each one's process group too) and waits until they are gone. */
export async function killSandboxLeftovers(
  stateDir: string,
  namespaces: readonly string[],
  pids: ReadonlyMap<number, string> = new Map(),
): Promise<number[]> {
  const victims = sandboxLeftovers(stateDir, namespaces, pids);
  for (const pid of victims) {
    try {
      process.kill(-pid, 'SIGKILL');
    } catch {
      // not a group leader, or gone: the pid itself is killed below
    }
  }
  if (victims.length > 0) await killAndReap(victims);
  return victims;
}
