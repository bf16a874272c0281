import { execFile } from 'node:child_process';
import { isAbsolute, join, normalize } from 'node:path';
import type { CallSignal } from '../controller/types.js';
import { TsboxError, abortError, ignoreError } from '../errors.js';
import type { Mount } from '../gen/containerd/types/mount.js';

/**
 * A task's root file system: containerd hands the task server an empty `<bundle>/rootfs` and
 * the snapshotter's mounts (an overlay, or a bind for a single read-only layer), and mounting
 * them is the server's job (the runc shim does it in its Create). Node has no mount(2), so the
 * supervisor binary's `mount` helper mode does each one.
 */

/** The mount types snapshotters hand out that tsbox mounts; anything else is refused up front. */
const MOUNT_TYPES = new Set(['overlay', 'bind', 'rbind', 'tmpfs']);

const HELPER_TIMEOUT_MS = 30_000;

function runHelper(helperPath: string, args: readonly string[], what: string, signal?: CallSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) {
      reject(abortError(signal));
      return;
    }
    execFile(helperPath, args, { timeout: HELPER_TIMEOUT_MS, ...(signal === undefined ? {} : { signal }) }, (err, _stdout, stderr) => {
      if (err === null) {
        resolve();
        return;
      }
      if (signal?.aborted) reject(abortError(signal));
      else reject(new TsboxError('Internal', `cannot ${what}: ${stderr.trim() || err.message}`, { cause: err }));
    });
  });
}

/** Where a mount goes: its target is relative to the rootfs (empty: the rootfs itself). */
function targetOf(rootfs: string, mount: Mount): string {
  if (mount.target === '') return rootfs;
  const inside = normalize(join('/', mount.target));
  return join(rootfs, inside);
}

/**
 * Mounts `mounts` in order onto `rootfs`. A type tsbox does not mount is InvalidArgument before
 * anything is mounted; a failure part-way unmounts what was mounted, so nothing is left.
 */
export async function mountRootfs(helperPath: string, mounts: readonly Mount[], rootfs: string, signal?: CallSignal): Promise<void> {
  if (!isAbsolute(rootfs)) throw new TsboxError('InvalidArgument', `rootfs ${rootfs} is not an absolute path`);
  for (const m of mounts) {
    if (!MOUNT_TYPES.has(m.type)) {
      throw new TsboxError('InvalidArgument', `rootfs mount of type ${JSON.stringify(m.type)} is not supported (tsbox mounts ${[...MOUNT_TYPES].join(', ')})`);
    }
    for (const text of [m.source, m.target, ...m.options]) {
      if (text.includes('\0')) throw new TsboxError('InvalidArgument', 'a rootfs mount contains a NUL byte');
    }
  }
  const done: string[] = [];
  try {
    for (const m of mounts) {
      const target = targetOf(rootfs, m);
      const options = m.type === 'rbind' ? ['rbind', ...m.options] : m.options;
      const type = m.type === 'rbind' ? 'bind' : m.type;
      await runHelper(helperPath, ['mount', target, type, m.source, ...options], `mount the rootfs (${m.type} ${m.source} on ${target})`, signal);
      done.push(target);
    }
  } catch (err) {
    for (const target of done.reverse()) await unmountRootfs(helperPath, target).catch(ignoreError('the mount failure is the error reported'));
    throw err;
  }
}

/** Unmounts everything mounted on `rootfs` (a task's Delete); nothing mounted is fine. */
export async function unmountRootfs(helperPath: string, rootfs: string, signal?: CallSignal): Promise<void> {
  await runHelper(helperPath, ['umount', rootfs, '--all'], `unmount the rootfs ${rootfs}`, signal);
}
