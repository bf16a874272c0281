import { open, rename, unlink } from 'node:fs/promises';
import { dirname } from 'node:path';

/** fsyncs a directory, so a rename or unlink in it survives a crash. */
export async function syncDir(dir: string): Promise<void> {
  const handle = await open(dir, 'r');
  try {
    await handle.sync();
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
  await syncDir(dirname(path));
}
