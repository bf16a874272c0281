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

/**
 * fsyncs of directories many sandboxes share (a namespace's directory, sandboxes/), coalesced:
 * a request joins the next sync of that path that has not begun, so every change made before
 * the request is covered, and concurrent Creates or removes in one namespace share one fsync
 * instead of queueing one each behind the disk.
 */
export class SharedDirSyncs {
  readonly #sync: SyncFile;
  /** The sync of each path that has not begun yet: later requests join it. */
  readonly #next = new Map<string, Promise<void>>();
  /** The sync of each path under way: a request made now needs the one after it. */
  readonly #running = new Map<string, Promise<void>>();

  constructor(sync: SyncFile = fsync) {
    this.#sync = sync;
  }

  sync(path: string): Promise<void> {
    const queued = this.#next.get(path);
    if (queued !== undefined) return queued;
    const before = this.#running.get(path) ?? Promise.resolve();
    const next = before
      .catch(() => /* that sync's failure went to its own callers; this one tries again */ undefined)
      .then(() => {
        this.#next.delete(path);
        const running = syncPath(path, this.#sync);
        this.#running.set(path, running);
        const forget = (): void => {
          if (this.#running.get(path) === running) this.#running.delete(path);
        };
        running.then(forget, forget);
        return running;
      });
    this.#next.set(path, next);
    return next;
  }
}
