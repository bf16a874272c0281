import { open, type FileHandle } from 'node:fs/promises';

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
