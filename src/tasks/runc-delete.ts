import { rmdir } from 'node:fs/promises';
import { type ChangeCalls, readFile, readdirEntries, stat } from '../base/fs-now.js';
import { join } from 'node:path';
import type { Bound } from '../runtime/bound.js';
import { removeTree } from '../runtime/cgroups.js';
import { isRunning } from '../runtime/supervised.js';
import { allOrFirstError, isGone, withPath } from '../base/errors.js';

/**
 * What `runc delete` does to a container whose init has ended, done without running runc:
 * runc 1.1's destroy of a stopped container is to SIGKILL what is left in its cgroup when the
 * container has no pid namespace of its own, remove its cgroup directories and its state
 * directory, and run its poststop hooks. A runc process costs tens of milliseconds of every
 * pod's teardown; these are a few system calls.
 *
 * Only where that is the whole of it: runc's state says the init is gone, the container has
 * no poststop hooks, its cgroups are not systemd's (runc stops the unit over D-Bus) and it
 * has no Intel RDT group. Otherwise `'runc'`: the caller runs `runc delete --force`.
 */
export async function deleteStoppedContainer(options: {
  /** runc's state root (`--root`). */
  readonly root: string;
  readonly id: string;
  /** How runc's state directory is removed (at once where the root is held in memory). */
  readonly changes: ChangeCalls;
  /** Ends every process of a cgroup (tsbox's cgroup manager); none: runc does it all. */
  readonly kill: ((cgroup: string, bound: Bound) => Promise<void>) | undefined;
  readonly bound: Bound;
}): Promise<'deleted' | 'runc'> {
  const dir = join(options.root, options.id);
  let state: RuncState;
  try {
    state = JSON.parse(await readFile(join(dir, 'state.json'), 'utf8')) as RuncState;
  } catch (err) {
    // Deleted already (a Delete replayed, or runc's own delete of a failed create).
    if (isGone(err)) return (await exists(dir)) ? 'runc' : 'deleted';
    // Not a state this code knows: runc reads its own.
    return 'runc';
  }
  const config = state.config;
  const cgroupPaths = state.cgroup_paths;
  if (
    config === undefined ||
    cgroupPaths === undefined ||
    config.cgroups?.Systemd !== false ||
    typeof config.cgroups.path !== 'string' ||
    (config.Hooks?.poststop?.length ?? 0) > 0 ||
    (state.intel_rdt_path ?? '') !== '' ||
    state.rootless === true ||
    options.kill === undefined ||
    typeof state.init_process_pid !== 'number' ||
    // A live init is runc's to kill (delete --force).
    (await isRunning({ pid: state.init_process_pid, start: String(state.init_process_start) }))
  ) {
    return 'runc';
  }
  const dirs = [...new Set(Object.values(cgroupPaths))];
  // Emptied already, as a container's holder leaves it (it ends every process of the cgroup
  // before it writes the exit): one rmdir per hierarchy (a dozen on cgroup v1), side by side.
  if (!(await removedAll(dirs))) {
    const pidNamespace = config.namespaces?.find((n) => n.type === 'NEWPID');
    if (pidNamespace === undefined || pidNamespace.path !== '') {
      // Its processes outlive its init: runc kills them through the cgroup, and so does this.
      await options.kill(config.cgroups.path, options.bound);
    }
    // Whatever is left (cgroups below, processes still ending); all settle before a failure is told.
    await allOrFirstError(dirs.map((path) => removeTree(path, options.bound)));
  }
  // runc's state goes once the cgroups have: a failure above leaves it for the next Delete.
  await removeStateDir(dir, options.changes);
  return 'deleted';
}

/** rmdir of each directory, side by side: true when all are gone; false (nothing thrown) when one is not. */
async function removedAll(dirs: readonly string[]): Promise<boolean> {
  const results = await Promise.allSettled(dirs.map((d) => rmdir(d)));
  return results.every((r) => r.status === 'fulfilled' || isGone(r.reason));
}

/**
 * runc's state directory of a stopped container: its files (state.json; exec.fifo is gone once
 * started) unlinked side by side, then the directory; anything else in it, recursively.
 */
async function removeStateDir(dir: string, fs: ChangeCalls): Promise<void> {
  let entries;
  try {
    entries = await readdirEntries(dir);
  } catch (err) {
    if (isGone(err)) return;
    throw withPath(err, dir, 'list');
  }
  await allOrFirstError(entries.map((e) => (e.isDirectory() ? fs.rm(join(dir, e.name), { recursive: true, force: true }) : fs.unlink(join(dir, e.name)).catch(ignoreGone))));
  await fs.rmdir(dir).catch(ignoreGone);
}

function ignoreGone(err: unknown): void {
  if (!isGone(err)) throw err;
}

/** The parts of runc's `state.json` (runc 1.1's libcontainer State) this reads. */
interface RuncState {
  init_process_pid?: number;
  init_process_start?: number | string;
  rootless?: boolean;
  intel_rdt_path?: string;
  /** Every cgroup directory of the container, by controller ("" for the unified hierarchy). */
  cgroup_paths?: Record<string, string>;
  config?: {
    namespaces?: { type: string; path: string }[];
    cgroups?: { path?: string; Systemd?: boolean };
    Hooks?: { poststop?: unknown[] } | null;
  };
}

async function exists(path: string): Promise<boolean> {
  try {
    await stat(path);
    return true;
  } catch (err) {
    if (isGone(err)) return false;
    throw err;
  }
}
