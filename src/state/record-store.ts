import { mkdir, open, readdir, rename, rm, rmdir, unlink } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import type { Logger } from 'pino';
import type { LoadedRecords, RecordStore, SandboxRecord } from '../controller/types.js';
import { errnoOf, ignoreError } from '../base/errors.js';
import { SerialQueue } from '../base/serial-queue.js';
import type { StateLayout } from './layout.js';
import { RECORD_FILE, RecordFiles } from './record-files.js';
import { SharedDirSyncs, syncPath, type SyncFile } from './sync.js';

export interface FileRecordStoreOptions {
  /** Makes a file or directory durable; default `handle.sync()`. Tests count or stall it. */
  readonly fsync?: SyncFile;
}

/**
 * One record file per sandbox, `sandboxes/<ns>/<id>/record.json`, and nothing else: the file
 * is the whole truth, readable by an operator at any time (SPEC.md section 8).
 *
 * - save() writes the record to a temp file, fsyncs it, renames it over record.json and
 *   fsyncs the sandbox directory; the first save of a sandbox in this run also fsyncs its
 *   namespace's directory (the sandbox's entry may be new), and sandboxes/ and above when
 *   the namespace's own entry is not yet known durable in this run. It resolves once all of
 *   that is on disk, so an RPC answered after it survives a crash. The fsyncs of the shared
 *   directories are coalesced across sandboxes (SharedDirSyncs).
 * - Operations on one sandbox run one after another in the order issued, so a write never
 *   undoes an earlier one and a remove is never undone by a save issued before it; those of
 *   different sandboxes run in parallel.
 * - remove() deletes what the sandbox directory holds (the runtime's files too), then the
 *   directory, then the namespace directory once empty, and fsyncs the directory each was
 *   removed from before it resolves.
 * - loadAll() reads every record back through the schema; an unreadable one is moved to
 *   quarantine/ with a log line (state/record-files.ts).
 */
export class FileRecordStore implements RecordStore {
  readonly #layout: StateLayout;
  readonly #files: RecordFiles;
  readonly #fsync: SyncFile;
  /** The operations on each sandbox's files, keyed by its directory. */
  readonly #sandboxQueue = new SerialQueue();
  /** Sandboxes whose directory is known durable in this run: later saves sync less. */
  readonly #durableDirs = new Set<string>();
  /** Namespace directories whose entry in sandboxes/ is known durable in this run. */
  readonly #durableNamespaces = new Set<string>();
  readonly #shared: SharedDirSyncs;
  /** The creations and removals of each namespace directory. */
  readonly #namespaceQueue = new SerialQueue();
  #closed = false;

  constructor(layout: StateLayout, logger: Logger, options: FileRecordStoreOptions = {}) {
    this.#layout = layout;
    this.#files = new RecordFiles(layout, logger);
    this.#fsync = options.fsync ?? ((handle) => handle.sync());
    this.#shared = new SharedDirSyncs(this.#fsync);
  }

  save(record: SandboxRecord): Promise<void> {
    // Serialized now: later changes to the caller's objects cannot reach this write.
    const json = JSON.stringify(record);
    return this.#queue(record.namespace, record.id, (dir) => this.#write(dir, json));
  }

  remove(namespace: string, id: string): Promise<void> {
    return this.#queue(namespace, id, (dir) => this.#removeDir(dir));
  }

  loadAll(): Promise<LoadedRecords> {
    return this.#files.loadAll();
  }

  /** Waits for every queued operation; later saves and removes reject. */
  async close(): Promise<void> {
    this.#closed = true;
    await this.#sandboxQueue.settled();
  }

  #queue(namespace: string, id: string, operation: (dir: string) => Promise<void>): Promise<void> {
    if (this.#closed) return Promise.reject(new Error('the record store is closed'));
    const dir = this.#layout.sandboxDir(namespace, id);
    return this.#sandboxQueue.run(dir, () => operation(dir));
  }

  async #write(dir: string, json: string): Promise<void> {
    // A directory known durable is there (only a remove, queued behind this save, takes it).
    const created = this.#durableDirs.has(dir) ? [] : await this.#makeDir(dir);
    const file = join(dir, RECORD_FILE);
    const temp = `${file}.tmp`;
    const handle = await open(temp, 'w', 0o600);
    try {
      await handle.writeFile(json);
      await this.#fsync(handle, temp);
    } catch (err) {
      await handle.close().catch(ignoreError('the write already failed; that failure is the one reported'));
      await unlink(temp).catch(ignoreError('a leftover temp file is ignored at start-up and replaced by the next save'));
      throw err;
    }
    await handle.close();
    await rename(temp, file);
    await syncPath(dir, this.#fsync);
    if (!this.#durableDirs.has(dir)) {
      // The entries of directories created for it (or by a run that crashed before its first
      // save of the sandbox was durable) must survive a crash too.
      for (const parent of created) await this.#shared.sync(parent);
      this.#durableDirs.add(dir);
      this.#durableNamespaces.add(dirname(dir));
    }
  }

  /**
   * Makes the sandbox directory; returns the directories whose entries must be synced on
   * the first save in this run: the parents of what was created, at least the namespace
   * directory, and sandboxes/ unless the namespace directory's entry is known durable. Runs
   * under the namespace's lock, so the namespace directory cannot vanish meanwhile and what
   * is known of it is exact.
   */
  #makeDir(dir: string): Promise<string[]> {
    const nsDir = dirname(dir);
    return this.#underNamespace(nsDir, async () => {
      const parents = new Set([nsDir]);
      const first = await mkdir(dir, { recursive: true, mode: 0o700 });
      if (first !== undefined) {
        this.#durableDirs.delete(dir);
        // Every directory from the first one created down to the sandbox's has a new entry
        // in its parent.
        for (let path = dir; path.length >= first.length; path = dirname(path)) parents.add(dirname(path));
      }
      if (!this.#durableNamespaces.has(nsDir)) parents.add(this.#layout.sandboxes);
      // Deepest first: a directory's own entry is synced before the entry that leads to it.
      return [...parents].sort((a, b) => b.length - a.length);
    });
  }

  /** Runs `body` alone among the creations and removals of the namespace's directory. */
  #underNamespace<T>(nsDir: string, body: () => Promise<T>): Promise<T> {
    return this.#namespaceQueue.run(nsDir, body);
  }

  /** Everything in the sandbox directory, then the directory, then an empty namespace directory. */
  async #removeDir(dir: string): Promise<void> {
    this.#durableDirs.delete(dir);
    const nsDir = dirname(dir);
    let names: string[];
    try {
      names = await readdir(dir);
    } catch (err) {
      if (errnoOf(err) === 'ENOENT') return;
      throw err;
    }
    await Promise.all(
      names.map((name) =>
        unlink(join(dir, name)).catch(async (err: unknown) => {
          if (errnoOf(err) === 'ENOENT') return;
          // A directory, or a file the runtime made read-only: take it whole.
          await rm(join(dir, name), { recursive: true, force: true });
        }),
      ),
    );
    // Whatever the runtime added meanwhile goes too.
    await rmdir(dir).catch(async (err: unknown) => {
      if (errnoOf(err) !== 'ENOENT') await rm(dir, { recursive: true, force: true });
    });
    const removed = await this.#underNamespace(nsDir, async () => {
      try {
        await rmdir(nsDir);
        this.#durableNamespaces.delete(nsDir);
        return true;
      } catch (err) {
        const code = errnoOf(err);
        if (code === 'ENOENT') this.#durableNamespaces.delete(nsDir);
        if (code !== 'ENOTEMPTY' && code !== 'EEXIST' && code !== 'ENOENT') throw err;
        return code === 'ENOENT';
      }
    });
    // Other sandboxes of the namespace remain: its directory keeps its entry and holds the
    // removal. Gone (also when the last of the others went meanwhile): sandboxes/ holds it.
    if (!removed) {
      try {
        await this.#shared.sync(nsDir);
        return;
      } catch (err) {
        if (errnoOf(err) !== 'ENOENT') throw err;
      }
    }
    await this.#shared.sync(this.#layout.sandboxes);
  }
}

