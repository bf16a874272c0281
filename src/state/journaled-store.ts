import { existsSync, rmdirSync } from 'node:fs';
import { mkdir, readdir, rename, rm, rmdir, unlink, writeFile, type FileHandle } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import type { Logger } from 'pino';
import type { LoadedRecords, RecordStore, SandboxRecord } from '../controller/types.js';
import { RecordFiles } from './record-files.js';
import { syncPath, type SyncFile } from './sync.js';
import { JOURNAL_FILE, Journal, readJournals, removeBody, saveBody, type Committed } from './journal.js';
import type { StateLayout } from './layout.js';

const RECORD_FILE = 'record.json';

export interface JournaledStoreOptions {
  /** Retire the journal (and checkpoint it) once it reaches this size. Default 4 MiB. */
  readonly checkpointBytes?: number;
  /** ... or this many entries. Default 16384. */
  readonly checkpointEntries?: number;
  /**
   * Zeros a journal file is written with before it takes lines (see state/journal.ts).
   * Default: what the limits above let a journal hold (4 MiB with the defaults).
   */
  readonly preallocateBytes?: number;
  /** ... or when it has entries this long after the last rotation; 0 turns it off. Default 30 s. */
  readonly checkpointIntervalMs?: number;
  /**
   * Record files a background checkpoint writes or fsyncs at once. Default 3: a checkpoint
   * leaves one of the thread pool's four threads to the journal's fdatasync, which every
   * durable RPC waits for.
   */
  readonly backgroundConcurrency?: number;
  /** ... at start-up, at close and when a checkpoint is awaited. Default 8. */
  readonly foregroundConcurrency?: number;
  /** Makes journal lines durable; default `handle.datasync()`. */
  readonly datasync?: (handle: FileHandle) => Promise<void>;
  /** Makes a file or directory durable; default `handle.sync()`. */
  readonly fsync?: SyncFile;
}

/** A durable change, as the journal carries it and as it is applied to the record files. */
type Change =
  | { readonly op: 'save'; readonly namespace: string; readonly id: string; readonly json: string }
  | { readonly op: 'remove'; readonly namespace: string; readonly id: string };

/** What the store knows of one sandbox's files between checkpoints. */
interface KeyState {
  readonly key: string;
  readonly namespace: string;
  readonly id: string;
  readonly dir: string;
  /** The newest durable change the files do not show yet. */
  pending: Change | undefined;
  /** The newest change the files show (written, not necessarily durable). */
  applied: Change | undefined;
  /** The sandbox directory is known to exist. */
  dirReady: boolean;
  /** Jobs queued or running on this sandbox's files. */
  jobs: number;
  /** Jobs on one sandbox's files run one after another. */
  tail: Promise<void>;
}

/** At most `max` functions running at once. */
class Limit {
  #active = 0;
  readonly #waiting: (() => void)[] = [];

  constructor(readonly max: number) {}

  async run<R>(fn: () => Promise<R>): Promise<R> {
    if (this.#active < this.max) this.#active++;
    else await new Promise<void>((resolve) => this.#waiting.push(resolve));
    try {
      return await fn();
    } finally {
      const next = this.#waiting.shift();
      if (next !== undefined) next();
      else this.#active--;
    }
  }
}

const keyOf = (namespace: string, id: string): string => `${namespace}/${id}`;

const codeOf = (err: unknown): string | undefined => (err as NodeJS.ErrnoException).code;
const isMissing = (err: unknown): boolean => codeOf(err) === 'ENOENT';

/**
 * Records kept durable by a group-commit write-ahead journal (state/journal.ts) in front of
 * the per-sandbox record files (state/record-files.ts reads them).
 *
 * - save()/remove() resolve once their journal line is durable: one write and one fdatasync
 *   cover every change that arrived while the previous flush was on disk. Between
 *   checkpoints the journal alone holds a save: a sandbox that lives and goes within one
 *   journal generation never costs a file, a directory or an fsync.
 * - remove() also deletes the sandbox directory (whatever is in it, such as the runtime's
 *   files) and its namespace directory once empty, before it resolves, as the runtime may
 *   create it again for a new sandbox of the same id.
 * - A full journal is retired (renamed to journal.<n>; a new one takes changes at once) and
 *   checkpointed in the background: the newest state of every sandbox it touched is written
 *   to `sandboxes/<ns>/<id>/record.json` (temp + rename), fsynced with its directories, and
 *   then the retired journal is deleted.
 * - loadAll() replays the journals a crash left over the record files, makes the result
 *   durable, starts an empty journal, then reads the files through RecordFiles
 *   (schema, quarantine, log lines). A record the journal holds heals a torn file.
 * - close() ends with a checkpoint: after a clean stop the record files alone hold the state.
 */
export class JournaledRecordStore implements RecordStore {
  readonly #layout: StateLayout;
  readonly #log: Logger;
  readonly #files: RecordFiles;
  readonly #journal: Journal<Change>;
  readonly #fsync: SyncFile;
  readonly #background: Limit;
  readonly #foreground: Limit;
  /** Directory removals of remove(): not held up by a checkpoint's writes. */
  readonly #removals = new Limit(8);
  /** Callers waiting for a checkpoint: it runs at foreground speed. */
  #hurry = 0;
  readonly #intervalMs: number;
  readonly #keys = new Map<string, KeyState>();
  /** Sandboxes changed in each journal generation not yet checkpointed. */
  readonly #dirty = new Map<number, Set<string>>();
  /** Directories an entry was removed from since the last checkpoint. */
  #removedFrom = new Set<string>();
  #started: Promise<void> | undefined;
  #closed = false;
  #closing: Promise<void> | undefined;
  #checkpointRunning = false;
  #checkpointAgain = false;
  #checkpointDone: Promise<void> = Promise.resolve();
  #checkpointError: Error | undefined;
  /** After a failed checkpoint the page cache is not trusted: files are written again. */
  #rewrite = false;
  #retryDelayMs = 1000;
  #retryTimer: NodeJS.Timeout | undefined;
  #intervalTimer: NodeJS.Timeout | undefined;

  constructor(layout: StateLayout, logger: Logger, options: JournaledStoreOptions = {}) {
    this.#layout = layout;
    this.#log = logger;
    this.#files = new RecordFiles(layout, logger);
    this.#fsync = options.fsync ?? ((handle) => handle.sync());
    this.#background = new Limit(Math.max(1, options.backgroundConcurrency ?? 3));
    this.#foreground = new Limit(Math.max(1, options.foregroundConcurrency ?? 8));
    this.#intervalMs = options.checkpointIntervalMs ?? 30_000;
    const maxBytes = options.checkpointBytes ?? 4 * 1024 * 1024;
    const maxEntries = options.checkpointEntries ?? 16_384;
    this.#journal = new Journal<Change>({
      root: layout.root,
      logger,
      maxBytes,
      maxEntries,
      preallocateBytes: options.preallocateBytes ?? Math.min(maxBytes, maxEntries * 512) + 64 * 1024,
      datasync: options.datasync ?? ((handle) => handle.datasync()),
      fsync: this.#fsync,
      onCommit: (committed, generation) => this.#committed(committed, generation),
      onRetire: () => this.#requestCheckpoint(),
    });
  }

  save(record: SandboxRecord): Promise<void> {
    if (this.#closed) return Promise.reject(new Error('the record store is closed'));
    const json = JSON.stringify(record);
    const change: Change = { op: 'save', namespace: record.namespace, id: record.id, json };
    if (this.#started === undefined) void this.#start();
    return this.#journal.append(saveBody(json), change);
  }

  async remove(namespace: string, id: string): Promise<void> {
    if (this.#closed) throw new Error('the record store is closed');
    const change: Change = { op: 'remove', namespace, id };
    if (this.#started === undefined) void this.#start();
    await this.#journal.append(removeBody(namespace, id), change);
    const ks = this.#keys.get(keyOf(namespace, id));
    if (ks === undefined) return;
    // A checkpoint took the change up meanwhile: done once its job is.
    if (ks.pending !== change) return ks.tail;
    if (ks.jobs === 0 && !ks.dirReady && !existsSync(ks.dir)) {
      // Nothing on disk (a sandbox that lived within one journal generation, with no
      // runtime files): the common case costs one stat.
      ks.pending = undefined;
      ks.applied = change;
      return;
    }
    await this.#onKey(ks, this.#removals, () => this.#applyPending(ks));
  }

  async loadAll(): Promise<LoadedRecords> {
    await this.#start();
    await this.checkpoint();
    return this.#files.loadAll();
  }

  /**
   * Makes every change acknowledged so far durable in the record files and empties the
   * journal (changes arriving meanwhile go to the new one).
   */
  async checkpoint(): Promise<void> {
    if (this.#closed) throw new Error('the record store is closed');
    await this.#checkpointAll();
  }

  async #checkpointAll(): Promise<void> {
    this.#hurry++;
    try {
      await this.#start();
      await this.#journal.rotate();
      const target = Math.max(0, ...this.#journal.retired());
      const outstanding = (): boolean => this.#journal.retired().some((g) => g <= target);
      while (outstanding()) {
        if (!this.#checkpointRunning) {
          this.#checkpointError = undefined;
          this.#requestCheckpoint();
        }
        await this.#checkpointDone;
        if (!this.#checkpointRunning && outstanding() && this.#checkpointError !== undefined) throw this.#checkpointError;
      }
    } finally {
      this.#hurry--;
    }
  }

  /** Resolves once nothing is being written to the journal or the record files. */
  async settled(): Promise<void> {
    await this.#journal.idle();
    await Promise.all([...this.#keys.values()].map((ks) => ks.tail));
  }

  /**
   * Writes what is queued (those saves and removes still resolve), then checkpoints
   * everything, so that after a clean stop the record files alone hold the state (what an
   * operator edits while tsbox is stopped is what the next start reads) and the journal is
   * empty; stops the timers. Later saves and removes reject. Exiting before it resolves is
   * safe: the journal keeps whatever is not checkpointed and the next start replays it.
   */
  close(): Promise<void> {
    if (this.#closing === undefined) {
      this.#closed = true;
      clearInterval(this.#intervalTimer);
      clearTimeout(this.#retryTimer);
      this.#closing = this.#shutDown();
    }
    return this.#closing;
  }

  async #shutDown(): Promise<void> {
    await this.#started?.catch(() => undefined);
    if (this.#started !== undefined) {
      try {
        await this.#checkpointAll();
      } catch (err) {
        this.#log.error({ err }, 'final checkpoint failed; the journal keeps the changes for the next start');
      }
      await this.settled();
    }
    await this.#journal.close();
  }

  // --- start-up ---------------------------------------------------------------------------

  #start(): Promise<void> {
    if (this.#started === undefined) {
      const started = this.#recover();
      this.#started = started;
      started.catch((err: unknown) => {
        if (this.#started === started) this.#started = undefined;
        this.#journal.failQueued(err);
      });
    }
    return this.#started;
  }

  /**
   * Replays the journals of the last run: the last change of each sandbox is applied to its
   * files and made durable, the journals are deleted and an empty one is started.
   */
  async #recover(): Promise<void> {
    const begin = process.hrtime.bigint();
    await mkdir(this.#layout.sandboxes, { recursive: true, mode: 0o700 });
    const found = await readJournals(this.#layout.root, this.#log);
    // Only the last change of each sandbox: replaying an earlier remove could delete the
    // files of a later sandbox with the same id.
    const last = new Map<string, Change>();
    for (const entry of found.entries) {
      const change: Change =
        entry.op === 'save'
          ? { op: 'save', namespace: entry.record.namespace, id: entry.record.id, json: JSON.stringify(entry.record) }
          : { op: 'remove', namespace: entry.namespace, id: entry.id };
      const key = keyOf(change.namespace, change.id);
      last.delete(key);
      last.set(key, change);
    }
    const states: KeyState[] = [];
    for (const change of last.values()) {
      const ks = this.#keyState(change.namespace, change.id);
      ks.pending = change;
      states.push(ks);
    }
    if (states.length > 0) await this.#syncKeys(states, false, this.#foreground);
    for (const ks of states) this.#forgetIfIdle(ks.key);
    // Oldest first, so that a crash in between leaves the newest generations only.
    const retired = found.files.filter((f) => f !== join(this.#layout.root, JOURNAL_FILE));
    for (const file of retired) {
      await rm(file, { force: true });
      await syncPath(this.#layout.root, this.#fsync);
    }
    await this.#journal.start(found.lastSeq, found.lastGeneration + 1);
    if (found.files.length > 0) {
      let saved = 0;
      for (const change of last.values()) if (change.op === 'save') saved++;
      this.#log.info(
        {
          files: found.files.length,
          entries: found.entries.length,
          saved,
          removed: last.size - saved,
          ms: Number(process.hrtime.bigint() - begin) / 1e6,
        },
        'journal replayed into the record files',
      );
    }
    if (this.#intervalMs > 0 && !this.#closed) {
      this.#intervalTimer = setInterval(() => {
        if (this.#journal.entries > 0) this.#journal.rotate().catch(() => undefined);
      }, this.#intervalMs);
      this.#intervalTimer.unref();
    }
  }

  // --- applying durable changes to the files ------------------------------------------------

  #keyState(namespace: string, id: string): KeyState {
    const key = keyOf(namespace, id);
    let ks = this.#keys.get(key);
    if (ks === undefined) {
      ks = {
        key,
        namespace,
        id,
        dir: this.#layout.sandboxDir(namespace, id),
        pending: undefined,
        applied: undefined,
        dirReady: false,
        jobs: 0,
        tail: Promise.resolve(),
      };
      this.#keys.set(key, ks);
    }
    return ks;
  }

  /** Runs `fn` on the sandbox's files after every job queued on them before. */
  #onKey<R>(ks: KeyState, limit: Limit | undefined, fn: () => Promise<R>): Promise<R> {
    ks.jobs++;
    const run = ks.tail
      .then(() => (limit === undefined ? fn() : limit.run(fn)))
      .finally(() => {
        ks.jobs--;
      });
    ks.tail = run.then(
      () => undefined,
      () => undefined,
    );
    return run;
  }

  #committed(committed: readonly Committed<Change>[], generation: number): void {
    let dirty = this.#dirty.get(generation);
    if (dirty === undefined) {
      dirty = new Set();
      this.#dirty.set(generation, dirty);
    }
    for (const { item: change } of committed) {
      const ks = this.#keyState(change.namespace, change.id);
      ks.pending = change;
      dirty.add(ks.key);
    }
  }

  /**
   * Brings the sandbox's files up to its newest durable change. On failure the change stays
   * pending (unless a newer one replaced it meanwhile).
   */
  async #applyPending(ks: KeyState): Promise<void> {
    for (let change = ks.pending; change !== undefined; change = ks.pending) {
      await this.#apply(ks, change);
      if (ks.pending === change) ks.pending = undefined;
      ks.applied = change;
    }
  }

  #apply(ks: KeyState, change: Change): Promise<void> {
    return change.op === 'save' ? this.#writeRecord(ks, change.json) : this.#removeDir(ks);
  }

  /** record.json replaced atomically (temp + rename); not yet durable. */
  async #writeRecord(ks: KeyState, json: string): Promise<void> {
    const file = join(ks.dir, RECORD_FILE);
    const temp = `${file}.tmp`;
    for (let attempt = 0; ; attempt++) {
      try {
        if (!ks.dirReady) await mkdir(ks.dir, { recursive: true, mode: 0o700 });
        ks.dirReady = true;
        await writeFile(temp, json, { mode: 0o600 });
        await rename(temp, file);
        return;
      } catch (err) {
        // The directory vanished with its namespace's last other sandbox (a racing mkdir
        // may then report ENOTDIR): create it again.
        ks.dirReady = false;
        if ((!isMissing(err) && codeOf(err) !== 'ENOTDIR') || attempt >= 3) throw err;
      }
    }
  }

  /**
   * The sandbox directory goes (whatever is in it), and its namespace directory with its
   * last sandbox. Cheaper than rm -r for the usual flat directory of files.
   */
  async #removeDir(ks: KeyState): Promise<void> {
    ks.dirReady = false;
    const { dir } = ks;
    const parent = dirname(dir);
    if (!existsSync(dir)) return;
    this.#removedFrom.add(parent);
    this.#removedFrom.add(this.#layout.sandboxes);
    const takeAll = (path: string): Promise<void> => rm(path, { recursive: true, force: true });
    // Most often an empty directory: one syscall.
    try {
      rmdirSync(dir);
      try {
        rmdirSync(parent);
      } catch {
        // other sandboxes of the namespace remain
      }
      return;
    } catch (err) {
      if (isMissing(err)) return;
    }
    let names: string[] | undefined;
    try {
      names = await readdir(dir);
    } catch (err) {
      if (!isMissing(err)) await takeAll(dir);
    }
    if (names !== undefined) {
      await Promise.all(
        names.map((name) =>
          unlink(join(dir, name)).catch(async (err: unknown) => {
            if (!isMissing(err)) await takeAll(join(dir, name));
          }),
        ),
      );
      // Anything added meanwhile goes too.
      await rmdir(dir).catch(async (err: unknown) => {
        if (!isMissing(err)) await takeAll(dir);
      });
    }
    await rmdir(parent).catch(() => undefined);
  }

  // --- checkpoints ------------------------------------------------------------------------

  #requestCheckpoint(): void {
    if (this.#checkpointRunning) {
      this.#checkpointAgain = true;
      return;
    }
    this.#checkpointRunning = true;
    this.#checkpointDone = this.#runCheckpoints();
  }

  async #runCheckpoints(): Promise<void> {
    await Promise.resolve();
    for (;;) {
      this.#checkpointAgain = false;
      const generations = [...this.#journal.retired()];
      if (generations.length === 0) break;
      try {
        await this.#checkpoint(generations);
        this.#retryDelayMs = 1000;
      } catch (err) {
        this.#checkpointError = err instanceof Error ? err : new Error(String(err));
        this.#rewrite = true;
        this.#log.error({ err, generations, retryInMs: this.#retryDelayMs }, 'checkpoint failed; the journal is kept and the checkpoint retried');
        if (!this.#closed) {
          clearTimeout(this.#retryTimer);
          this.#retryTimer = setTimeout(() => this.#requestCheckpoint(), this.#retryDelayMs);
          this.#retryTimer.unref();
          this.#retryDelayMs = Math.min(this.#retryDelayMs * 2, 30_000);
        }
        break;
      }
      if (!this.#checkpointAgain && this.#journal.retired().length === 0) break;
    }
    this.#checkpointRunning = false;
  }

  /** Makes the files of every change in `generations` durable, then deletes those journals. */
  async #checkpoint(generations: readonly number[]): Promise<void> {
    const begin = process.hrtime.bigint();
    const keys = new Set<string>();
    for (const generation of generations) for (const key of this.#dirty.get(generation) ?? []) keys.add(key);
    const states = [...keys].map((key) => this.#keys.get(key)).filter((ks): ks is KeyState => ks !== undefined);
    const rewrite = this.#rewrite;
    await this.#syncKeys(states, rewrite, this.#hurry > 0 || this.#closed ? this.#foreground : this.#background);
    this.#rewrite = false;
    await this.#journal.discard(generations);
    for (const generation of generations) this.#dirty.delete(generation);
    for (const key of keys) this.#forgetIfIdle(key);
    this.#log.debug(
      { generations, sandboxes: keys.size, rewrite, ms: Number(process.hrtime.bigint() - begin) / 1e6 },
      'checkpoint done',
    );
  }

  /**
   * Applies what is pending for each sandbox and fsyncs its record file, then every directory
   * involved: the sandbox's, its namespace's and sandboxes/ (for an entry added or removed).
   * At most `limit` files at once.
   */
  async #syncKeys(states: readonly KeyState[], rewrite: boolean, limit: Limit): Promise<void> {
    const dirs = new Set<string>();
    const results = await Promise.allSettled(
      states.map(async (ks) => {
        // Gone within the generations (removed, nothing on disk): nothing to write or sync.
        if (!rewrite && ks.pending === undefined && ks.jobs === 0 && ks.applied?.op !== 'save') return;
        await this.#syncKey(ks, dirs, rewrite, limit);
      }),
    );
    // Removals applied up to here are made durable by this checkpoint; later ones by the next.
    const removedFrom = this.#removedFrom;
    this.#removedFrom = new Set();
    for (const dir of removedFrom) dirs.add(dir);
    const dirResults = await Promise.allSettled(
      [...dirs].map((dir) =>
        limit.run(() =>
          syncPath(dir, this.#fsync).catch((err: unknown) => {
            // Gone with a later remove, which a newer journal holds.
            if (!isMissing(err)) throw err;
          }),
        ),
      ),
    );
    for (const result of [...results, ...dirResults]) {
      if (result.status === 'rejected') {
        for (const dir of removedFrom) this.#removedFrom.add(dir);
        throw result.reason;
      }
    }
  }

  /**
   * Brings the sandbox's files up to date in its order, then fsyncs outside that order, so
   * a slow fsync never holds up a later change of the sandbox. A later change applied
   * meanwhile is in a newer journal, so whichever state the fsync catches is covered.
   */
  async #syncKey(ks: KeyState, dirs: Set<string>, rewrite: boolean, limit: Limit): Promise<void> {
    // The turn is taken before the sandbox's queue is joined, so that a remove() never waits
    // behind the checkpoint's backlog.
    const change = await limit.run(() =>
      this.#onKey(ks, undefined, async () => {
        await this.#applyPending(ks);
        const applied = ks.applied;
        if (rewrite && applied !== undefined) await this.#apply(ks, applied);
        return applied;
      }),
    );
    if (change === undefined || change.op === 'remove') return;
    dirs.add(this.#layout.sandboxes);
    dirs.add(dirname(ks.dir));
    dirs.add(ks.dir);
    const file = join(ks.dir, RECORD_FILE);
    try {
      await limit.run(() => syncPath(file, this.#fsync));
    } catch (err) {
      if (!isMissing(err)) throw err;
      // Gone with a later remove (nothing to do), or deleted behind tsbox's back: the
      // journal still holds it, so it is written again.
      const restored = await limit.run(() =>
        this.#onKey(ks, undefined, async () => {
          if (ks.applied !== change) return false;
          await this.#writeRecord(ks, change.json);
          return true;
        }),
      );
      if (restored) await limit.run(() => syncPath(file, this.#fsync));
    }
  }

  #forgetIfIdle(key: string): void {
    const ks = this.#keys.get(key);
    if (ks === undefined || ks.jobs > 0 || ks.pending !== undefined) return;
    for (const dirty of this.#dirty.values()) if (dirty.has(key)) return;
    this.#keys.delete(key);
  }
}
