import { type Dirent, type Stats, lstatSync, readFileSync, readdirSync, statSync, writeFileSync } from 'node:fs';

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
 * call with four pods starting at once, here), and tsbox's thread must not wait for that.
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
