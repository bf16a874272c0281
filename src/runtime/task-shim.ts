import { createHash } from 'node:crypto';
import { readFile, readdir, readlink, unlink } from 'node:fs/promises';
import { basename, join } from 'node:path';
import type { Logger } from 'pino';
import { ignoreError, isGone, readIfPresent, withPath } from '../errors.js';
import { isSameProcess, processStartTime, signalProcess } from './proc.js';

/**
 * The runtime shim containerd runs for a pod's containers (containerd-shim-runc-v2 for
 * `io.containerd.runc.v2`). With a version-2 task endpoint containerd starts it itself and
 * the shim groups all containers of the pod by their sandbox id; it serves them on a socket
 * whose name containerd's `pkg/shim` derives from containerd's address, the namespace and that
 * grouping id. With podsandbox the shim ends with the pause task; for a proxy sandboxer it
 * stays after the last container is gone, so the sandboxer ends it (SPEC.md section 7).
 */

/**
 * `/run/containerd/s/<sha256 of "<address>/<namespace>/<group id>">`: the socket the runc shim
 * serves a pod on. The directory is containerd's compiled-in state dir, whatever its config says.
 */
export function shimSocketPath(containerdAddress: string, namespace: string, groupId: string): string {
  const key = join(containerdAddress, namespace, groupId);
  return `/run/containerd/s/${createHash('sha256').update(key).digest('hex')}`;
}

/** The value after `-name` or `--name` (or in `-name=value`) in a Go flag command line. */
function flag(argv: readonly string[], name: string): string | undefined {
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i] ?? '';
    for (const prefix of [`-${name}`, `--${name}`]) {
      if (arg === prefix) return argv[i + 1];
      if (arg.startsWith(`${prefix}=`)) return arg.slice(prefix.length + 1);
    }
  }
  return undefined;
}

/** Listening unix socket paths of this network namespace, with their inodes. */
async function unixSocketInodes(): Promise<Map<string, Set<string>>> {
  const out = new Map<string, Set<string>>();
  const text = await readFile('/proc/net/unix', 'utf8');
  for (const line of text.split('\n').slice(1)) {
    const fields = line.trim().split(/\s+/);
    const inode = fields[6];
    const path = fields[7];
    if (inode === undefined || path === undefined || !path.startsWith('/run/containerd/s/')) continue;
    let set = out.get(path);
    if (set === undefined) out.set(path, (set = new Set()));
    set.add(inode);
  }
  return out;
}

async function holdsSocket(pid: number, inodes: ReadonlySet<string>): Promise<boolean> {
  let fds: string[];
  try {
    fds = await readdir(`/proc/${pid}/fd`);
  } catch (err) {
    if (isGone(err)) return false; // the process is gone
    throw withPath(err, `/proc/${pid}/fd`, 'list');
  }
  for (const fd of fds) {
    const path = `/proc/${pid}/fd/${fd}`;
    const target = await readlink(path).catch((err: unknown) => {
      if (isGone(err)) return ''; // closed meanwhile
      throw withPath(err, path, 'read link');
    });
    const match = /^socket:\[(\d+)\]$/.exec(target);
    if (match !== null && inodes.has(match[1] as string)) return true;
  }
  return false;
}

/** A runtime shim found serving a pod. */
export interface PodShim {
  readonly pid: number;
  readonly startTime: string;
  readonly socket: string;
}

/**
 * The shims serving pod `groupId` of containerd namespace `namespace`: processes named
 * containerd-shim* whose own `-namespace` matches and that hold the listening socket derived
 * from their own `-address` and the pod's id. A shim of another pod, another namespace or
 * another containerd never matches.
 */
export async function findPodShims(namespace: string, groupId: string): Promise<PodShim[]> {
  const sockets = await unixSocketInodes();
  if (sockets.size === 0) return [];
  const found: PodShim[] = [];
  for (const entry of await readdir('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    const pid = Number(entry);
    const raw = (await readIfPresent(`/proc/${pid}/cmdline`)) ?? ''; // '' when gone meanwhile
    const argv = raw.split('\0').filter((a) => a !== '');
    if (!basename(argv[0] ?? '').startsWith('containerd-shim')) continue;
    const address = flag(argv, 'address');
    if (flag(argv, 'namespace') !== namespace || address === undefined) continue;
    const socket = shimSocketPath(address, namespace, groupId);
    const inodes = sockets.get(socket);
    if (inodes === undefined || !(await holdsSocket(pid, inodes))) continue;
    const startTime = await processStartTime(pid);
    if (startTime !== undefined) found.push({ pid, startTime, socket });
  }
  return found;
}

const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

/**
 * Ends the pod's shims: SIGTERM (the shim then closes its socket and exits), SIGKILL after
 * `graceMs`, and removes a socket file a killed shim left. Signals go only to the process
 * found, checked by its start time.
 */
export async function stopPodShims(namespace: string, groupId: string, log: Logger, graceMs = 5_000): Promise<number> {
  const shims = await findPodShims(namespace, groupId);
  for (const shim of shims) {
    log.info({ pid: shim.pid, socket: shim.socket }, 'ending the pod\'s runtime shim');
    const signal = (sig: NodeJS.Signals): void => signalProcess(shim.pid, sig);
    signal('SIGTERM');
    const deadline = Date.now() + graceMs;
    while (Date.now() < deadline && (await isSameProcess(shim.pid, shim.startTime))) await sleep(20);
    if (await isSameProcess(shim.pid, shim.startTime)) {
      log.warn({ pid: shim.pid }, 'the pod\'s runtime shim did not end on SIGTERM; killing it');
      signal('SIGKILL');
      for (let i = 0; i < 250 && (await isSameProcess(shim.pid, shim.startTime)); i++) await sleep(20);
    }
    if (!(await unixSocketInodes()).has(shim.socket)) {
      await unlink(shim.socket).catch(ignoreError('the shim removed it itself, as it does on SIGTERM'));
    }
  }
  return shims.length;
}
