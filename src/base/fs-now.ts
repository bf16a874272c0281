import { type Dirent, type Stats, lstatSync, mkdirSync, readFileSync, readdirSync, renameSync, rmSync, rmdirSync, statSync, statfsSync, unlinkSync, writeFileSync } from 'node:fs';
import * as pool from 'node:fs/promises';
import { dirname } from 'node:path';

/**
 * File calls made at once on tsbox's own thread, with the signatures of node:fs/promises (a
 * failure is a rejected promise, as there): reads of small files (tsbox's own, cgroupfs, a
 * process's /proc stat or cgroup, a bundle's config.json, runc's state) and lookups in tsbox's
 * own directories, and writes to procfs. Never for what can wait on another process or a device:
 * another process's cmdline (its memory map's lock), anything inside a container's rootfs (a
 * FUSE snapshotter waits for its daemon). The page cache or the kernel answers each in
 * microseconds; through libuv's thread pool the same call costs tsbox 0.1 to 0.4 ms of CPU in
 * hand-offs (a 12-byte readFile: 297 us of CPU, against 7 us at once, here).
 *
 * What changes a disk file system stays in the pool, however small: a create, mkdir, rename
 * or unlink on ext4 waits for the journal, which other processes' fsyncs hold (1 to 3 ms a
 * call with four pods starting at once, here), and tsbox's thread must not wait for that. On a
 * file system held in memory (tmpfs, ramfs: /run on a node, where the Task API route keeps its
 * tasks' files) there is no journal to wait for: changesFor() makes them at once there too.
 */

/** `call()` made now, its result or failure as a settled promise. */
function now<T>(call: () => T): Promise<T> {
  return new Promise<T>((resolve) => resolve(call()));
}

export function readFile(path: string, encoding: 'utf8'): Promise<string> {
  return now(() => readFileSync(path, encoding));
}

/** A write to a procfs file (a process's oom_score_adj). */
export function writeProcFile(path: string, data: string): Promise<void> {
  return now(() => writeFileSync(path, data));
}

export function lstat(path: string): Promise<Stats> {
  return now(() => lstatSync(path));
}

export function stat(path: string): Promise<Stats> {
  return now(() => statSync(path));
}

export function readdirEntries(path: string): Promise<Dirent[]> {
  return now(() => readdirSync(path, { withFileTypes: true }));
}

/** The calls that change a directory's contents, made at once or through libuv's pool. */
export interface ChangeCalls {
  /** True when the calls are made at once (the directory is in memory). */
  readonly now: boolean;
  mkdir(path: string, options: { readonly recursive: true; readonly mode: number }): Promise<unknown>;
  rm(path: string, options: { readonly recursive: true; readonly force: true }): Promise<void>;
  writeFile(path: string, data: string, options: { readonly mode: number }): Promise<void>;
  rename(from: string, to: string): Promise<void>;
  unlink(path: string): Promise<void>;
  rmdir(path: string): Promise<void>;
}

export const poolCalls: ChangeCalls = {
  now: false,
  mkdir: (path, options) => pool.mkdir(path, options),
  rm: (path, options) => pool.rm(path, options),
  writeFile: (path, data, options) => pool.writeFile(path, data, options),
  rename: (from, to) => pool.rename(from, to),
  unlink: (path) => pool.unlink(path),
  rmdir: (path) => pool.rmdir(path),
};

const nowCalls: ChangeCalls = {
  now: true,
  mkdir: (path, options) => now(() => mkdirSync(path, options)),
  rm: (path, options) => now(() => rmSync(path, options)),
  writeFile: (path, data, options) => now(() => writeFileSync(path, data, options)),
  rename: (from, to) => now(() => renameSync(from, to)),
  unlink: (path) => now(() => unlinkSync(path)),
  rmdir: (path) => now(() => rmdirSync(path)),
};

/** statfs(2) f_type of the file systems held in memory: tmpfs, ramfs. */
const MEMORY_FILE_SYSTEMS: ReadonlySet<number> = new Set([0x01021994, 0x858458f6]);

/**
 * The change calls for files at and below `dir` (or its nearest existing ancestor, when it is
 * not made yet): at once on a file system held in memory, through the pool on any other, or
 * when statfs fails (told to `onError`; the calls' own failures then say what is wrong). Asked
 * once: a file system mounted at or below `dir` later is not seen.
 */
export function changesFor(dir: string, onError: (err: unknown, path: string) => void): ChangeCalls {
  for (let at = dir; ; at = dirname(at)) {
    try {
      return MEMORY_FILE_SYSTEMS.has(Number(statfsSync(at).type)) ? nowCalls : poolCalls;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT' && at !== dirname(at)) continue;
      onError(err, at);
      return poolCalls;
    }
  }
}

/**
 * The change calls for `path`: those of the first of `places` it lies at or below, else
 * through the pool.
 */
export function changesAt(path: string, places: readonly { readonly dir: string; readonly calls: ChangeCalls }[]): ChangeCalls {
  for (const { dir, calls } of places) if (path === dir || path.startsWith(`${dir}/`)) return calls;
  return poolCalls;
}
