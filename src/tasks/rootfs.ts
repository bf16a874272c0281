import { realpath } from 'node:fs/promises';
import { isAbsolute, join, normalize, sep } from 'node:path';
import type { CallSignal } from '../controller/types.js';
import { TsboxError, isGone, messageOf, withPath } from '../base/errors.js';
import type { Mount } from '../gen/containerd/types/mount.js';
import { type Helper, runHelper } from '../runtime/helper-service.js';
import { isMountedAt } from '../runtime/mountinfo.js';

/**
 * A task's root file system. containerd hands the task server an empty `<bundle>/rootfs` and the
 * snapshotter's mounts, and mounting them there is the server's job, as is unmounting them at
 * Delete (the runc shim does both: `mount.All` in its Create, `UnmountRecursive` in its Delete).
 * Node has no mount(2): the supervisor binary's `mount` and `umount-all` helper modes make the
 * calls, translating options the way containerd's core/mount does.
 */

/**
 * The mount types tsbox mounts: what the overlayfs and native snapshotters hand out (an
 * overlay; a bind, read-only or not, for a snapshot of one layer) and a tmpfs. btrfs, erofs,
 * devmapper's block devices and fuse types are refused, as containerd types that tsbox does not
 * mount (task API research §7.4).
 */
export const ROOTFS_MOUNT_TYPES: readonly string[] = ['overlay', 'bind', 'tmpfs'];

/** How long one helper run may take; a mount or unmount is one or a few system calls. */
const HELPER_TIMEOUT_MS = 30_000;

/**
 * The reason an option is refused, or undefined. containerd acts on these itself before
 * mount(2) (a loop device, id-mapped mounts, the 2.2 mount manager's own options); passed on as
 * data they would be ignored by a bind, which would then not be what was asked for.
 */
function refusedOption(option: string): string | undefined {
  if (option === 'loop') return 'loop devices';
  if (option.startsWith('uidmap=') || option.startsWith('gidmap=')) return 'id-mapped mounts';
  if (option.startsWith('X-containerd.')) return "containerd's own mount options";
  return undefined;
}

/** Where a mount goes: containerd's `target` is inside the rootfs (empty: the rootfs itself). */
export function mountTarget(rootfs: string, mount: Mount): string {
  if (mount.target === '') return rootfs;
  return join(rootfs, normalize(join(sep, mount.target)));
}

/** `what` for messages: "rootfs mount 2 of 3 (bind /a/b)". */
function describe(mounts: readonly Mount[], index: number): string {
  const m = mounts[index];
  return `rootfs mount ${index + 1} of ${mounts.length} (${m?.type ?? ''} ${m?.source ?? ''}${m?.target ? ` at ${m.target}` : ''})`;
}

/**
 * Throws InvalidArgument, naming the mount, when any of `mounts` is one tsbox does not mount:
 * checked for all of them before anything is mounted.
 */
export function checkRootfsMounts(mounts: readonly Mount[]): void {
  mounts.forEach((m, i) => {
    const what = describe(mounts, i);
    if (!ROOTFS_MOUNT_TYPES.includes(m.type)) {
      throw new TsboxError('InvalidArgument', `${what}: type ${JSON.stringify(m.type)} is not one tsbox mounts (${ROOTFS_MOUNT_TYPES.join(', ')})`);
    }
    if ([m.type, m.source, m.target, ...m.options].some((s) => s.includes('\0'))) throw new TsboxError('InvalidArgument', `${what}: contains a NUL byte`);
    if (m.source === '') throw new TsboxError('InvalidArgument', `${what}: has no source`);
    for (const option of m.options) {
      const reason = refusedOption(option);
      if (reason !== undefined) throw new TsboxError('InvalidArgument', `${what}: option ${JSON.stringify(option)} asks for ${reason}, which tsbox does not mount`);
    }
    // The kernel takes a bind only with MS_BIND; containerd's type "bind" alone sets nothing.
    if (m.type === 'bind' && !m.options.includes('bind') && !m.options.includes('rbind')) {
      throw new TsboxError('InvalidArgument', `${what}: a bind mount needs the option bind or rbind`);
    }
  });
}

/** The helper's arguments for one mount at `target`. */
export function mountArgs(mount: Mount, target: string): string[] {
  return ['mount', target, mount.type, mount.source, ...mount.options];
}

/** Runs a helper mode within HELPER_TIMEOUT_MS; its stdout, or a TsboxError with its stderr. */
function run(helper: Helper, args: readonly string[], what: string, signal?: CallSignal): Promise<string> {
  return runHelper(helper, args, what, { timeoutMs: HELPER_TIMEOUT_MS, ...(signal === undefined ? {} : { signal }) });
}

/**
 * Mounts `mounts` onto `rootfs` in order (a nested mount's target must lie inside the rootfs
 * once the mounts before it are in place). A mount tsbox does not mount is InvalidArgument
 * before anything is mounted. On any later failure, or when `signal` aborts, everything at and
 * below `rootfs` is unmounted again before the error is thrown: nothing is left mounted.
 */
export async function mountRootfs(helper: Helper, mounts: readonly Mount[], rootfs: string, signal?: CallSignal): Promise<void> {
  if (!isAbsolute(rootfs)) throw new TsboxError('InvalidArgument', `rootfs ${rootfs} is not an absolute path`);
  checkRootfsMounts(mounts);
  const root = await realpath(rootfs).catch((err: unknown) => {
    throw withPath(err, rootfs, 'resolve the rootfs');
  });
  if (root === sep) throw new TsboxError('InvalidArgument', `rootfs ${rootfs} is /`);
  try {
    for (let i = 0; i < mounts.length; i++) {
      const mount = mounts[i] as Mount;
      const target = await insideRootfs(root, mountTarget(root, mount), describe(mounts, i));
      await run(helper, mountArgs(mount, target), `cannot mount ${describe(mounts, i)} on ${target}`, signal);
    }
  } catch (err) {
    // Without the signal: the clean-up must finish even when the call was cancelled.
    const undone = await unmountRootfs(helper, rootfs).then(
      () => undefined,
      (cleanup: unknown) => cleanup,
    );
    if (undone === undefined) throw err;
    const kind = err instanceof TsboxError ? err.kind : 'Internal';
    throw new TsboxError(kind, `${messageOf(err)}; unmounting the rootfs again failed too: ${messageOf(undone)}`, { cause: err });
  }
}

/**
 * The real path of a nested mount's target, which must stay inside the rootfs: the image's own
 * files (a symlink in a layer) must not send a mount to the host. containerd resolves such a
 * path as if the rootfs were `/`; tsbox refuses it instead.
 */
async function insideRootfs(root: string, target: string, what: string): Promise<string> {
  if (target === root) return root;
  const real = await realpath(target).catch((err: unknown) => {
    throw withPath(err, target, `resolve the target of ${what}`);
  });
  if (real !== root && !real.startsWith(root + sep)) {
    throw new TsboxError('InvalidArgument', `${what}: its target ${target} resolves to ${real}, outside the rootfs`);
  }
  return real;
}

/**
 * Unmounts everything at and below `rootfs`, deepest first (a task's Delete). Nothing mounted,
 * or no such directory, is success, so it can be called again. A mount still busy (something
 * outside the task holds a file in it) is detached lazily; its path is in `detached`.
 */
export async function unmountRootfs(
  helper: Helper,
  rootfs: string,
  signal?: CallSignal,
  options: { readonly helperOnlyWhenMounted?: boolean } = {},
): Promise<{ readonly detached: readonly string[] }> {
  if (options.helperOnlyWhenMounted === true) {
    // At a Delete the container's holder has most often unmounted it as the init ended: the
    // kernel's table says so for less than starting a helper to find nothing.
    const real = await realpath(rootfs).catch((err: unknown) => {
      if (isGone(err)) return undefined;
      throw withPath(err, rootfs, 'resolve the rootfs');
    });
    if (real === undefined || !(await isMountedAt(real, { below: true }))) return { detached: [] };
  }
  const out = await run(helper, ['umount-all', rootfs], `cannot unmount the rootfs ${rootfs}`, signal);
  const detached = out
    .split('\n')
    .filter((line) => line.startsWith('detached '))
    .map((line) => line.slice('detached '.length));
  return { detached };
}
