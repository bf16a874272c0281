import { rmdirSync } from 'node:fs';
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
  /** ... or when it has entries this long after the last rotation; 0 turns it off. Default 30 s. */
  readonly checkpointIntervalMs?: number;
  /** fsyncs a checkpoint or a recovery runs at once. Default 4. */
  readonly syncConcurrency?: number;
  /** Record files written (without fsync) at once after their changes are durable. Default 8. */
  readonly applyConcurrency?: number;
  /**
   * How long a durable save waits before it is written to its record file, so that quick
   * successive saves of a sandbox are written once. Removes are applied at once. Default 20 ms.
   */
  readonly applyDelayMs?: number;
  /**
   * Which saves resolve only once their record file is written too (temp + rename; durable
   * through the journal until the next checkpoint): 'always' (no apply delay at all),
   * 'first' (a sandbox's first save, so that its directory and record exist before the
   * RPC that created it is answered; later saves follow after the apply delay), or
   * 'never'. Default 'never'.
   */
  readonly writeThrough?: 'always' | 'first' | 'never';
  /** Makes journal lines durable; default `handle.datasync()`. */
  readonly datasync?: (handle: FileHandle) => Promise<void>;
  /** Makes a file or directory durable; default `handle.sync()`. */
  readonly fsync?: SyncFile;
}

/** A durable change, as the journal carries it and as it is applied to the record files. */
type Change =
  | {
      readonly op: 'save';
      readonly namespace: string;
      readonly id: string;
      readonly json: string;
      /** With writeThrough: settled once the record file is written (or replaced by a later change). */
      applied: Deferred | undefined;
    }
  | {
      readonly op: 'remove';
      readonly namespace: string;
      readonly id: string;
      /** Settled once the sandbox directory is gone; only for a remove() still waiting. */
      applied: Deferred | undefined;
    };

interface Deferred {
  readonly promise: Promise<void>;
  readonly resolve: () => void;
  readonly reject: (err: unknown) => void;
}

function deferred(): Deferred {
  let resolve!: () => void;
  let reject!: (err: unknown) => void;
  const promise = new Promise<void>((res, rej) => {
    resolve = res;
    reject = rej;
  });
  promise.catch(() => undefined);
  return { promise, resolve, reject };
}

/** What the store knows of one sandbox's files between checkpoints. */
interface KeyState {
  readonly key: string;
  readonly namespace: string;
  readonly id: string;
  readonly dir: string;
  /** Durable changes not yet applied to the files, in seq order. */
  pending: Change[];
  /** The last change applied: what the files show. */
  applied: Change | undefined;
  /** An apply job is queued that has not started yet. */
  scheduled: boolean;
  /** Waits in the apply delay window. */
  deferred: boolean;
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
 *   cover every change that arrived while the previous flush was on disk.
 * - The change is then applied to `sandboxes/<ns>/<id>/record.json` (temp + rename, no
 *   fsync), after `applyDelayMs` so that quick successive saves are written once; a remove
 *   deletes the sandbox directory at once and resolves only when it is gone, as the runtime
 *   may create it again for a new sandbox of the same id.
 * - A full journal is retired (renamed to journal.<n>; a new one takes changes at once) and
 *   checkpointed in the background: the files and directories its changes touched are
 *   fsynced, then it is deleted.
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
  readonly #applyLimit: Limit;
  readonly #syncLimit: Limit;
  readonly #intervalMs: number;
  readonly #applyDelayMs: number;
  readonly #writeThrough: 'always' | 'first' | 'never';
  /** Sandboxes whose saves wait in the apply delay window. */
  #deferred: KeyState[] = [];
  #applyTimer: NodeJS.Timeout | undefined;
  readonly #keys = new Map<string, KeyState>();
  /** Sandboxes changed in each journal generation not yet checkpointed. */
  readonly #dirty = new Map<number, Set<string>>();
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
    this.#applyLimit = new Limit(Math.max(1, options.applyConcurrency ?? 8));
    this.#syncLimit = new Limit(Math.max(1, options.syncConcurrency ?? 4));
    this.#intervalMs = options.checkpointIntervalMs ?? 30_000;
    this.#writeThrough = options.writeThrough ?? 'never';
    this.#applyDelayMs = this.#writeThrough === 'always' ? 0 : options.applyDelayMs ?? 20;
    this.#journal = new Journal<Change>({
      root: layout.root,
      logger,
      maxBytes: options.checkpointBytes ?? 4 * 1024 * 1024,
      maxEntries: options.checkpointEntries ?? 16_384,
      datasync: options.datasync ?? ((handle) => handle.datasync()),
      fsync: this.#fsync,
      onCommit: (committed, generation) => this.#committed(committed, generation),
      onRetire: () => this.#requestCheckpoint(),
    });
  }

  save(record: SandboxRecord): Promise<void> {
    if (this.#closed) return Promise.reject(new Error('the record store is closed'));
    const json = JSON.stringify(record);
    const applied = this.#writesThrough(record.namespace, record.id) ? deferred() : undefined;
    const change: Change = { op: 'save', namespace: record.namespace, id: record.id, json, applied };
    const durable = this.#journal.append(saveBody(json), change);
    void this.#start();
    return applied === undefined ? durable : durable.then(() => applied.promise);
  }

  #writesThrough(namespace: string, id: string): boolean {
    if (this.#writeThrough !== 'first') return this.#writeThrough === 'always';
    const ks = this.#keys.get(keyOf(namespace, id));
    // No file written by this store yet (or its directory removed since).
    return ks === undefined || ks.applied === undefined || ks.applied.op === 'remove';
  }

  async remove(namespace: string, id: string): Promise<void> {
    if (this.#closed) throw new Error('the record store is closed');
    const applied = deferred();
    const change: Change = { op: 'remove', namespace, id, applied };
    const durable = this.#journal.append(removeBody(namespace, id), change);
    void this.#start();
    await durable;
    await applied.promise;
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
  }

  /** Resolves once every durable change has reached the record files (not necessarily durably). */
  async settled(): Promise<void> {
    await this.#journal.idle();
    this.#applyDeferred();
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
    clearTimeout(this.#applyTimer);
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
          ? { op: 'save', namespace: entry.record.namespace, id: entry.record.id, json: JSON.stringify(entry.record), applied: undefined }
          : { op: 'remove', namespace: entry.namespace, id: entry.id, applied: undefined };
      const key = keyOf(change.namespace, change.id);
      last.delete(key);
      last.set(key, change);
    }
    const states: KeyState[] = [];
    for (const change of last.values()) {
      const ks = this.#keyState(change.namespace, change.id);
      ks.pending.push(change);
      states.push(ks);
    }
    if (states.length > 0) await this.#syncKeys(states, false);
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
        pending: [],
        applied: undefined,
        scheduled: false,
        deferred: false,
        dirReady: false,
        jobs: 0,
        tail: Promise.resolve(),
      };
      this.#keys.set(key, ks);
    }
    return ks;
  }

  /** Runs `fn` on the sandbox's files after every job queued on them before. */
  #onKey<R>(ks: KeyState, limit: Limit, fn: () => Promise<R>): Promise<R> {
    ks.jobs++;
    const run = ks.tail
      .then(() => limit.run(fn))
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
      ks.pending.push(change);
      dirty.add(ks.key);
      if (change.op === 'remove' || change.applied !== undefined || this.#applyDelayMs <= 0) this.#scheduleApply(ks);
      else if (!ks.deferred && !ks.scheduled) {
        ks.deferred = true;
        this.#deferred.push(ks);
        if (this.#applyTimer === undefined) {
          this.#applyTimer = setTimeout(() => this.#applyDeferred(), this.#applyDelayMs);
          this.#applyTimer.unref();
        }
      }
    }
  }

  /** Ends the apply delay window: every sandbox waiting in it gets its apply job. */
  #applyDeferred(): void {
    clearTimeout(this.#applyTimer);
    this.#applyTimer = undefined;
    for (const ks of this.#deferred.splice(0)) {
      ks.deferred = false;
      if (ks.pending.length > 0) this.#scheduleApply(ks);
    }
  }

  #scheduleApply(ks: KeyState): void {
    if (ks.scheduled) return;
    ks.scheduled = true;
    this.#onKey(ks, this.#applyLimit, () => {
      ks.scheduled = false;
      return this.#applyPending(ks);
    }).catch((err: unknown) => {
      this.#log.error(
        { ns: ks.namespace, id: ks.id, err },
        'cannot apply a journaled change to the record files; the next checkpoint tries again',
      );
    });
  }

  /**
   * Applies the sandbox's pending changes in order. A save followed by any later change is
   * skipped (the later one replaces or deletes what it would write); removes always run. On
   * failure the change and those after it stay pending.
   */
  async #applyPending(ks: KeyState): Promise<void> {
    const superseded: Deferred[] = [];
    while (ks.pending.length > 0) {
      const changes = ks.pending.splice(0);
      for (let i = 0; i < changes.length; i++) {
        const change = changes[i] as Change;
        if (change.op === 'save' && i + 1 < changes.length) {
          // A later change replaces what it would write: it is answered with that one.
          if (change.applied !== undefined) superseded.push(change.applied);
          change.applied = undefined;
          continue;
        }
        try {
          if (change.op === 'save') await this.#writeRecord(ks, change.json);
          else await this.#removeDir(ks);
        } catch (err) {
          ks.pending.unshift(...changes.slice(i));
          if (change.op === 'remove') change.applied?.reject(err);
          // A save is durable in the journal: its caller is answered; the file follows at
          // the next attempt or checkpoint.
          else change.applied?.resolve();
          change.applied = undefined;
          for (const d of superseded.splice(0)) d.resolve();
          throw err;
        }
        ks.applied = change;
        change.applied?.resolve();
        change.applied = undefined;
        for (const d of superseded.splice(0)) d.resolve();
      }
    }
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
    const takeAll = (path: string): Promise<void> => rm(path, { recursive: true, force: true });
    // Most often there is nothing (a short-lived sandbox whose saves were superseded before
    // they were applied) or an empty directory: one syscall each.
    try {
      rmdirSync(dir);
      try {
        rmdirSync(dirname(dir));
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
    await rmdir(dirname(dir)).catch(() => undefined);
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
    await this.#syncKeys(states, rewrite);
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
   * At most `syncConcurrency` sandboxes at once.
   */
  async #syncKeys(states: readonly KeyState[], rewrite: boolean): Promise<void> {
    const dirs = new Set<string>([this.#layout.sandboxes]);
    const results = await Promise.allSettled(states.map((ks) => this.#syncLimit.run(() => this.#syncKey(ks, dirs, rewrite))));
    const dirResults = await Promise.allSettled(
      [...dirs].map((dir) =>
        this.#syncLimit.run(() =>
          syncPath(dir, this.#fsync).catch((err: unknown) => {
            // Gone with a later remove, which a newer journal holds.
            if (!isMissing(err)) throw err;
          }),
        ),
      ),
    );
    for (const result of [...results, ...dirResults]) if (result.status === 'rejected') throw result.reason;
  }

  /**
   * Brings the sandbox's files up to date in its order, then fsyncs outside that order, so
   * a slow fsync never holds up a later change of the sandbox. A later change applied
   * meanwhile is in a newer journal, so whichever state the fsync catches is covered.
   */
  async #syncKey(ks: KeyState, dirs: Set<string>, rewrite: boolean): Promise<void> {
    const change = await this.#onKey(ks, this.#applyLimit, async () => {
      await this.#applyPending(ks);
      const applied = ks.applied;
      if (rewrite && applied !== undefined) {
        if (applied.op === 'save') await this.#writeRecord(ks, applied.json);
        else await this.#removeDir(ks);
      }
      return applied;
    });
    if (change === undefined) return;
    dirs.add(dirname(ks.dir));
    if (change.op === 'remove') return;
    dirs.add(ks.dir);
    const file = join(ks.dir, RECORD_FILE);
    try {
      await syncPath(file, this.#fsync);
    } catch (err) {
      if (!isMissing(err)) throw err;
      // Gone with a later remove (nothing to do), or deleted behind tsbox's back: the
      // journal still holds it, so it is written again.
      const restored = await this.#onKey(ks, this.#applyLimit, async () => {
        if (ks.applied !== change) return false;
        await this.#writeRecord(ks, change.json);
        return true;
      });
      if (restored) await syncPath(file, this.#fsync);
    }
  }

  #forgetIfIdle(key: string): void {
    const ks = this.#keys.get(key);
    if (ks === undefined || ks.jobs > 0 || ks.pending.length > 0) return;
    for (const dirty of this.#dirty.values()) if (dirty.has(key)) return;
    this.#keys.delete(key);
  }
}
