import { copyFile, mkdir, rm, writeFile } from 'node:fs/promises';
import { lstat } from '../base/fs-now.js';
import { hostname as hostHostname } from 'node:os';
import { join } from 'node:path';
import type { PodSpec } from '../controller/pod-spec.js';
import { TsboxError, allOrFirstError, ignoreError, isGone, messageOf, withPath } from '../base/errors.js';
import { type Helper, runHelper } from './helper-service.js';
import { isMountedAt } from './mountinfo.js';

/** podsandbox's /dev/shm size for a pod with its own IPC namespace (64 MiB). */
export const POD_SHM_BYTES = 64 * 1024 * 1024;

/** The CRI plugin's directories (containerd 2.x keeps the 1.x plugin name for them). */
export interface CriDirs {
  /** `<containerd root>/io.containerd.grpc.v1.cri`: hostname, hosts, resolv.conf. */
  readonly root: string;
  /** `<containerd state>/io.containerd.grpc.v1.cri`: the shm mount. */
  readonly state: string;
}

/** CRI's directories for containerd's root and state directories. */
export function criDirs(containerdRoot: string, containerdState: string): CriDirs {
  return { root: join(containerdRoot, 'io.containerd.grpc.v1.cri'), state: join(containerdState, 'io.containerd.grpc.v1.cri') };
}

/** Marks a sandbox directory as made by tsbox, so teardown never removes one it did not make. */
const MARK = '.tsbox';

/**
 * The files containerd's podsandbox makes for every pod, where CRI looks for them when it
 * creates a container (SPEC.md section 7): `hostname`, `hosts` and `resolv.conf` in CRI's
 * sandbox root directory, and a tmpfs for `/dev/shm` in its state directory when the pod has
 * its own IPC namespace. CRI bind-mounts each that exists into every container of the pod.
 */
export class PodFiles {
  readonly #dirs: CriDirs;
  readonly #helper: Helper;

  /** `helper` runs the supervisor binary's umount mode, which takes /dev/shm down at Stop. */
  constructor(dirs: CriDirs, helper: Helper) {
    this.#dirs = dirs;
    this.#helper = helper;
  }

  /** The sandbox root directory CRI reads for pod `id`. */
  rootDir(id: string): string {
    return join(this.#dirs.root, 'sandboxes', id);
  }

  /** The volatile directory holding the pod's shm mount. */
  stateDir(id: string): string {
    return join(this.#dirs.state, 'sandboxes', id);
  }

  shmPath(id: string): string {
    return join(this.stateDir(id), 'shm');
  }

  /**
   * Writes the files and, for a pod with its own IPC namespace, makes the directory for
   * /dev/shm and returns it: the supervisor mounts the tmpfs there before it starts the
   * sandbox (one process fewer per Start). Leaves nothing behind when it throws.
   */
  async create(id: string, pod: PodSpec): Promise<{ readonly shm?: string }> {
    try {
      // The two directories side by side; in each the marker comes first, so that whatever
      // is there after a crash is known to be tsbox's.
      const root = this.rootDir(id);
      const files = (async () => {
        await mkdir(root, { recursive: true, mode: 0o755 });
        await writeFile(join(root, MARK), '');
        const name = pod.hostname === '' ? hostHostname() : pod.hostname;
        await allOrFirstError([
          writeFile(join(root, 'hostname'), `${name}\n`, { mode: 0o644 }),
          copyFile('/etc/hosts', join(root, 'hosts')),
          pod.resolvConf === undefined ? copyFile('/etc/resolv.conf', join(root, 'resolv.conf')) : writeFile(join(root, 'resolv.conf'), pod.resolvConf, { mode: 0o644 }),
        ]);
      })();
      const shm = (async () => {
        if (pod.ipc !== 'pod') return undefined;
        const state = this.stateDir(id);
        await mkdir(state, { recursive: true, mode: 0o700 });
        await writeFile(join(state, MARK), '');
        await mkdir(this.shmPath(id), { recursive: true, mode: 0o700 });
        return this.shmPath(id);
      })();
      // Both settle before a failure is handled, so the clean-up below sees all they made.
      const [, shmPath] = await allOrFirstError([files, shm]);
      return shmPath === undefined ? {} : { shm: shmPath };
    } catch (err) {
      await this.remove(id).catch(ignoreError('the original failure is what the caller must hear'));
      throw err instanceof TsboxError ? err : new TsboxError('Internal', `set up pod files: ${messageOf(err)}`, { cause: err });
    }
  }

  /** Stop: unmounts /dev/shm and removes the three files. Idempotent. */
  async unmount(id: string): Promise<void> {
    // The two directories side by side; all settle before a failure is told.
    await allOrFirstError([
      (async () => {
        if ((await isOurs(this.stateDir(id))) && (await isMountPoint(this.shmPath(id)))) await this.#mountHelper(['umount', this.shmPath(id)]);
      })(),
      (async () => {
        if (await isOurs(this.rootDir(id))) await allOrFirstError(['hostname', 'hosts', 'resolv.conf'].map((name) => rm(join(this.rootDir(id), name), { force: true })));
      })(),
    ]);
  }

  /** Shutdown: all of the above, then both directories, if tsbox made them. Idempotent. */
  async remove(id: string): Promise<void> {
    await this.unmount(id);
    // The two directories side by side; all settle before a failure is told. /dev/shm was
    // unmounted above (unmount throws otherwise), so only tsbox's own files remain in them.
    await allOrFirstError(
      [this.stateDir(id), this.rootDir(id)].map(async (dir) => {
        if (await isOurs(dir)) await rm(dir, { recursive: true, force: true });
      }),
    );
  }

  async #mountHelper(args: string[]): Promise<void> {
    await runHelper(this.#helper, args, `${args[0] ?? ''} ${args[1] ?? ''}`, { timeoutMs: 10_000 });
  }
}

/** True when tsbox's mark is in `dir`; false when it or the directory is absent; throws (naming the path) when it cannot be checked. */
async function isOurs(dir: string): Promise<boolean> {
  const mark = join(dir, MARK);
  try {
    return (await lstat(mark)).isFile();
  } catch (err) {
    // No mark, no directory, or a file where a directory should be: not tsbox's to touch.
    if (isGone(err, ['ENOTDIR'])) return false;
    throw withPath(err, mark, 'check');
  }
}

/** True when something is mounted at `path` (per this mount namespace's mountinfo). */
async function isMountPoint(path: string): Promise<boolean> {
  return isMountedAt(path, { below: false });
}
