import { open, rename, unlink, type FileHandle } from 'node:fs/promises';
import { dirname } from 'node:path';

/** How a file or directory is made durable; injectable so tests can count or stall it. */
export type SyncFile = (handle: FileHandle, path: string) => Promise<void>;

const fsync: SyncFile = (handle) => handle.sync();

/** fsyncs a file or directory by path (a directory: so a rename or unlink in it survives a crash). */
export async function syncPath(path: string, sync: SyncFile = fsync): Promise<void> {
  const handle = await open(path, 'r');
  try {
    await sync(handle, path);
  } finally {
    await handle.close();
  }
}

/**
 * Replaces `path` with `data` so that a crash leaves either the old or the new content:
 * write a temp file, fsync it, rename it over the target, fsync the directory.
 */
export async function writeFileAtomic(path: string, data: string | Uint8Array): Promise<void> {
  const temp = `${path}.tmp`;
  const handle = await open(temp, 'w', 0o600);
  try {
    await handle.writeFile(data);
    await handle.sync();
  } catch (err) {
    await handle.close();
    await unlink(temp).catch(() => undefined);
    throw err;
  }
  await handle.close();
  await rename(temp, path);
  await syncPath(dirname(path));
}
