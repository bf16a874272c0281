import { createHash } from 'node:crypto';
import { lstat, readFile, readdir, readlink, unlink } from 'node:fs/promises';
import { createConnection } from 'node:net';
import { basename, join } from 'node:path';
import type { Logger } from 'pino';
import { isGone, readIfPresent, withPath } from '../base/errors.js';
import { boundOf } from './bound.js';
import { processStartTime } from './proc.js';
import { endProcess } from './supervised.js';

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
 * serves a pod on (`-debug`: `…/<group id>/debug`, when containerd logs at debug level). The
 * directory is containerd's compiled-in state dir (`pkg/shim` socketRoot), whatever its config
 * says.
 */
export function shimSocketPath(containerdAddress: string, namespace: string, groupId: string, debug = false): string {
  const key = join(containerdAddress, namespace, groupId, ...(debug ? ['debug'] : []));
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
export async function findPodShims(namespace: string, groupId: string, containerdAddress?: string): Promise<PodShim[]> {
  const sockets = await unixSocketInodes();
  if (sockets.size === 0) return [];
  // Nobody listens where containerd's shim for the pod would: no process to look at (a scan of
  // every process's command line costs more the more processes the node runs).
  if (containerdAddress !== undefined && !sockets.has(shimSocketPath(containerdAddress, namespace, groupId))) return [];
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
export async function stopPodShims(namespace: string, groupId: string, log: Logger, options: { containerdAddress?: string; graceMs?: number } = {}): Promise<number> {
  const graceMs = options.graceMs ?? 5_000;
  const shims = await findPodShims(namespace, groupId, options.containerdAddress);
  for (const shim of shims) {
    log.info({ pid: shim.pid, socket: shim.socket }, 'ending the pod\'s runtime shim');
    // SIGTERM for graceMs, then SIGKILL and as long again.
    await endProcess({ pid: shim.pid, start: shim.startTime }, boundOf(2 * graceMs, new AbortController().signal), {
      gentle: true,
      onStubborn: () => log.warn({ pid: shim.pid }, 'the pod\'s runtime shim did not end on SIGTERM; killing it'),
    });
  }
  return shims.length;
}

/** How connecting to a unix socket file went: someone listens, no one does, or no socket is there. */
function probeUnixSocket(path: string): Promise<'listening' | 'refused' | 'absent' | 'retry'> {
  return new Promise((resolve, reject) => {
    const conn = createConnection({ path });
    conn.once('connect', () => {
      conn.destroy();
      resolve('listening');
    });
    conn.once('error', (err: NodeJS.ErrnoException) => {
      conn.destroy();
      if (err.code === 'ECONNREFUSED') resolve('refused');
      else if (err.code === 'ENOENT') resolve('absent');
      // A listener closing or a full backlog: the answer is not final yet.
      else if (err.code === 'ECONNRESET' || err.code === 'EAGAIN') resolve('retry');
      else reject(err);
    });
  });
}

/**
 * Removes a unix socket file once no process listens on it: only when connecting is refused,
 * so a socket someone still serves is never touched. A reset connection (a listener closing)
 * is tried again every 20 ms for up to `timeoutMs`; a listener, for up to `servedGraceMs` (a
 * process that is ending). Returns what it found.
 */
export async function removeStaleSocket(
  socket: string,
  log: Logger,
  timeoutMs = 5_000,
  servedGraceMs = 0,
): Promise<'removed' | 'absent' | 'served' | 'kept'> {
  const deadline = Date.now() + timeoutMs;
  const servedUntil = Date.now() + servedGraceMs;
  for (;;) {
    let answer;
    try {
      if (!(await lstat(socket)).isSocket()) {
        log.warn({ file: socket }, 'expected a unix socket here, found another kind of file: left as it is');
        return 'kept';
      }
      answer = await probeUnixSocket(socket);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') return 'absent';
      log.warn({ file: socket, err }, 'cannot tell whether a process serves this socket: left as it is');
      return 'kept';
    }
    if (answer === 'absent') return 'absent';
    if (answer === 'listening') {
      if (Date.now() >= servedUntil) return 'served';
      await sleep(20);
      continue;
    }
    if (answer === 'refused') {
      try {
        await unlink(socket);
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code === 'ENOENT') return 'absent';
        log.warn({ file: socket, err }, 'cannot remove a socket no process serves');
        return 'kept';
      }
      return 'removed';
    }
    if (Date.now() >= deadline) {
      log.warn({ file: socket, timeoutMs }, 'connections to this socket keep being reset: left as it is');
      return 'kept';
    }
    await sleep(20);
  }
}

/**
 * Removes the pod's shim sockets (and its debug socket) that no process serves any more.
 * containerd's runc shim leaves them: when it exits it removes the socket derived from its own
 * `-id` (the pod's first container) or named in that container's bundle, which containerd
 * deleted with the container, not the one it served the pod on, named after the pod's id
 * (containerd 2.1's `pkg/shim` cleanupSockets).
 */
export async function removeStaleShimSockets(containerdAddress: string, namespace: string, groupId: string, log: Logger): Promise<void> {
  for (const debug of [false, true]) {
    const socket = shimSocketPath(containerdAddress, namespace, groupId, debug);
    // A shim just ended may serve its socket a little longer: a Go process's leader can be gone
    // from /proc before its other threads have let go of its files.
    const outcome = await removeStaleSocket(socket, log, 5_000, 5_000);
    if (outcome === 'removed') log.debug({ file: socket }, 'removed the pod\'s shim socket that no process serves');
    else if (outcome === 'served') log.warn({ file: socket }, 'a process still serves the pod\'s shim socket after its shim was ended: left as it is');
  }
}
