import { Buffer } from 'node:buffer';
import { writeSync } from 'node:fs';
import { syncPath, type SyncFile } from './sync.js';
import { open, readFile, readdir, rename, unlink, type FileHandle } from 'node:fs/promises';
import { join } from 'node:path';
import * as zlib from 'node:zlib';
import type { Logger } from 'pino';
import { z } from 'zod';
import type { SandboxRecord } from '../controller/types.js';
import { messageOf } from '../errors.js';
import { recordSchema } from './record-schema.js';

/**
 * The write-ahead journal of record changes: `<stateDir>/journal`, append-only JSON lines
 *
 *   {"seq":N,"op":"save","record":{...},"crc":"xxxxxxxx"}
 *   {"seq":N,"op":"remove","namespace":"..","id":"..","crc":"xxxxxxxx"}
 *
 * where `crc` is the CRC-32 (hex) of the line's UTF-8 bytes without the crc member (that is,
 * of `{"seq":N,...}`), so a torn or damaged line is recognised. `seq` is one sequence for all
 * sandboxes. When the journal grows past its limits it is renamed to `journal.<generation>`
 * and a new empty `journal` takes its place; a retired journal is deleted once the record
 * files it covers are durable. A journal file starts out as zeros (prepared in the background
 * as `journal.new`), so appending overwrites blocks the file already has and each fdatasync
 * has only data to flush; readers stop at the zeros after the last line. Only the newest generations are ever on disk (they are
 * deleted oldest first), and replaying them in seq order over the record files gives the
 * state every acknowledged change left.
 */

export const JOURNAL_FILE = 'journal';
const RETIRED = /^journal\.(\d+)$/;
const FRESH_SUFFIX = '.new';

export type JournalEntry =
  | { readonly seq: number; readonly op: 'save'; readonly record: SandboxRecord }
  | { readonly seq: number; readonly op: 'remove'; readonly namespace: string; readonly id: string };

// --- CRC-32 (IEEE), native where Node has it --------------------------------------------

const nativeCrc32 = (zlib as { crc32?: (data: Uint8Array, value?: number) => number }).crc32;

let crcTable: Uint32Array | undefined;
function softCrc32(data: Uint8Array, value: number): number {
  if (crcTable === undefined) {
    crcTable = new Uint32Array(256);
    for (let n = 0; n < 256; n++) {
      let c = n;
      for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
      crcTable[n] = c >>> 0;
    }
  }
  let crc = ~value;
  for (const byte of data) crc = (crcTable[(crc ^ byte) & 0xff] as number) ^ (crc >>> 8);
  return ~crc >>> 0;
}

/** CRC-32 of `data`, continuing from `value` (the CRC of what came before). */
export function crc32(data: Uint8Array, value = 0): number {
  return nativeCrc32 !== undefined ? nativeCrc32(data, value) : softCrc32(data, value);
}

const hex8 = (n: number): string => (n >>> 0).toString(16).padStart(8, '0');

// --- Lines --------------------------------------------------------------------------------

/** The members of a save line after `seq`, from the record's JSON text. */
export const saveBody = (recordJson: string): string => `"op":"save","record":${recordJson}`;

/** The members of a remove line after `seq`. */
export const removeBody = (namespace: string, id: string): string =>
  `"op":"remove","namespace":${JSON.stringify(namespace)},"id":${JSON.stringify(id)}`;

/** One journal line, newline included: `{"seq":N,<body>,"crc":"xxxxxxxx"}\n`. */
export function encodeLine(seq: number, body: string): string {
  const head = `{"seq":${seq},${body}`;
  const crc = crc32(Buffer.from(`${head}}`, 'utf8'));
  return `${head},"crc":"${hex8(crc)}"}\n`;
}

export function encodeEntry(entry: JournalEntry): string {
  return encodeLine(
    entry.seq,
    entry.op === 'save' ? saveBody(JSON.stringify(entry.record)) : removeBody(entry.namespace, entry.id),
  );
}

const CRC_TAIL = /^,"crc":"([0-9a-f]{8})"\}$/;
const CRC_TAIL_BYTES = ',"crc":"00000000"}'.length;
const CLOSE = Buffer.from('}');

type Decoded = { readonly ok: true; readonly entry: JournalEntry } | { readonly ok: false; readonly reason: string };

const entryShape = z.object({ seq: z.number().int().positive().max(Number.MAX_SAFE_INTEGER), op: z.string() });

/** Checks and parses one line (without its newline). */
export function decodeLine(line: Uint8Array): Decoded {
  if (line.length <= CRC_TAIL_BYTES) return { ok: false, reason: 'too short to be an entry' };
  const split = line.length - CRC_TAIL_BYTES;
  const tail = CRC_TAIL.exec(Buffer.from(line.buffer, line.byteOffset + split, CRC_TAIL_BYTES).toString('latin1'));
  if (tail === null) return { ok: false, reason: 'no checksum at the end of the line' };
  const head = line.subarray(0, split);
  if (hex8(crc32(CLOSE, crc32(head))) !== tail[1]) return { ok: false, reason: 'checksum mismatch' };
  let json: unknown;
  try {
    json = JSON.parse(`${Buffer.from(head.buffer, head.byteOffset, head.byteLength).toString('utf8')}}`);
  } catch (err) {
    return { ok: false, reason: `not JSON: ${messageOf(err)}` };
  }
  const shape = entryShape.safeParse(json);
  if (!shape.success) return { ok: false, reason: `not an entry: ${z.prettifyError(shape.error)}` };
  const { seq, op } = shape.data;
  const fields = json as Record<string, unknown>;
  if (op === 'save') {
    const record = recordSchema.safeParse(fields.record);
    if (!record.success) return { ok: false, reason: `not a version 1 record: ${z.prettifyError(record.error)}` };
    // The record as written (the schema's output would drop or reorder nothing today, but
    // what was saved is what gets restored).
    return { ok: true, entry: { seq, op, record: fields.record as SandboxRecord } };
  }
  if (op === 'remove') {
    const namespace = recordSchema.shape.namespace.safeParse(fields.namespace);
    const id = recordSchema.shape.id.safeParse(fields.id);
    if (!namespace.success || !id.success) return { ok: false, reason: 'remove without a valid namespace and id' };
    return { ok: true, entry: { seq, op, namespace: namespace.data, id: id.data } };
  }
  return { ok: false, reason: `unknown op ${JSON.stringify(op)}` };
}

export interface JournalProblem {
  /** 1-based line number. */
  readonly line: number;
  readonly reason: string;
}

export interface DecodedJournal {
  readonly entries: JournalEntry[];
  /** Unusable lines followed by good ones: damaged after they were written; skipped. */
  readonly corrupt: JournalProblem[];
  /**
   * The first of the unusable lines at the very end, if any: a write that never completed,
   * so none of them was ever acknowledged; ignored.
   */
  readonly torn: JournalProblem | undefined;
}

export function decodeJournal(data: Uint8Array): DecodedJournal {
  // A journal file is preallocated with zeros: what follows the last line is not a line.
  let length = data.length;
  while (length > 0 && data[length - 1] === 0) length--;
  const bytes = data.subarray(0, length);
  const lines: { line: number; decoded: Decoded }[] = [];
  let start = 0;
  while (start < bytes.length) {
    const newline = bytes.indexOf(0x0a, start);
    const end = newline === -1 ? bytes.length : newline;
    const decoded: Decoded =
      newline === -1 ? { ok: false, reason: 'the line has no end (torn write)' } : decodeLine(bytes.subarray(start, end));
    lines.push({ line: lines.length + 1, decoded });
    start = end + 1;
  }
  const lastGood = lines.findLastIndex((l) => l.decoded.ok);
  const entries: JournalEntry[] = [];
  const corrupt: JournalProblem[] = [];
  for (const { line, decoded } of lines.slice(0, lastGood + 1)) {
    if (decoded.ok) entries.push(decoded.entry);
    else corrupt.push({ line, reason: decoded.reason });
  }
  const first = lines[lastGood + 1];
  const torn = first === undefined || first.decoded.ok ? undefined : { line: first.line, reason: first.decoded.reason };
  return { entries, corrupt, torn };
}

// --- Files --------------------------------------------------------------------------------


export interface FoundJournals {
  /** Every journal file, oldest generation first, the active `journal` last. */
  readonly files: string[];
  /** Their good entries in seq order. */
  readonly entries: JournalEntry[];
  readonly lastSeq: number;
  readonly lastGeneration: number;
}

/**
 * Reads every journal under `root`, logging a torn end (warn) and each corrupt line (error,
 * with its line number). A leftover `journal.new` (an empty journal never put in place) is
 * deleted.
 */
export async function readJournals(root: string, log: Logger): Promise<FoundJournals> {
  let names: string[];
  try {
    names = await readdir(root);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return { files: [], entries: [], lastSeq: 0, lastGeneration: 0 };
    throw err;
  }
  if (names.includes(JOURNAL_FILE + FRESH_SUFFIX)) await unlink(join(root, JOURNAL_FILE + FRESH_SUFFIX)).catch(() => undefined);
  const generations = names
    .map((name) => RETIRED.exec(name)?.[1])
    .filter((g): g is string => g !== undefined)
    .map(Number)
    .sort((a, b) => a - b);
  const files = generations.map((g) => join(root, `${JOURNAL_FILE}.${g}`));
  if (names.includes(JOURNAL_FILE)) files.push(join(root, JOURNAL_FILE));
  const entries: JournalEntry[] = [];
  for (const file of files) {
    const decoded = decodeJournal(await readFile(file));
    for (const { line, reason } of decoded.corrupt) {
      log.error({ file, line, reason }, 'journal entry is corrupt; skipped');
    }
    if (decoded.torn !== undefined) {
      log.warn({ file, line: decoded.torn.line, reason: decoded.torn.reason }, 'journal ends in an incomplete write, never acknowledged; ignored');
    }
    entries.push(...decoded.entries);
  }
  entries.sort((a, b) => a.seq - b.seq);
  return {
    files,
    entries,
    lastSeq: entries.at(-1)?.seq ?? 0,
    lastGeneration: generations.at(-1) ?? 0,
  };
}

// --- The group-commit writer -------------------------------------------------------------

export interface Committed<T> {
  readonly seq: number;
  readonly item: T;
}

export interface JournalOptions<T> {
  /** The state dir: `journal` lives here. */
  readonly root: string;
  readonly logger: Logger;
  /** The journal is retired after a write that takes it to this many bytes or entries. */
  readonly maxBytes: number;
  readonly maxEntries: number;
  /**
   * Bytes of zeros a new journal file is written with before it takes lines, so that an
   * append overwrites blocks the file already has and fdatasync has no metadata to commit.
   * 0 turns it off.
   */
  readonly preallocateBytes: number;
  /** Makes appended lines durable (fdatasync). */
  readonly datasync: (handle: FileHandle) => Promise<void>;
  /** Makes a file or directory durable (fsync). */
  readonly fsync: SyncFile;
  /**
   * Called once per flush, after the flush is durable and before its appends resolve, with
   * the journal generation the lines went to.
   */
  readonly onCommit: (committed: readonly Committed<T>[], generation: number) => void;
  /** Called when a journal file is retired as `journal.<generation>`. */
  readonly onRetire: (generation: number) => void;
}

interface Queued<T> {
  readonly body: string;
  readonly item: T;
  readonly resolve: () => void;
  readonly reject: (err: unknown) => void;
}

interface Flight {
  /** Settles once the flush is answered: its appends resolved, or refused. */
  readonly landed: Promise<void>;
}

/** At most this many flushes on disk at once: a batch that arrives while one is in flight starts the next. */
const MAX_FLIGHTS = 2;

interface Waiter {
  readonly resolve: () => void;
  readonly reject: (err: unknown) => void;
}

/**
 * Appends with group commit: whatever is appended while a flush is in progress goes into the
 * next one, which is one write of all its lines and one fdatasync; then all of them resolve.
 * Lines are numbered (seq) in the order they were appended. Nothing is written before
 * `start()`; appends made earlier wait for it.
 */
export class Journal<T> {
  readonly #opts: JournalOptions<T>;
  readonly #path: string;
  #state: 'new' | 'open' | 'closed' = 'new';
  #closing = false;
  #handle: FileHandle | undefined;
  /** Generation of the active file: the number it gets when retired. */
  #generation = 1;
  #seq = 0;
  #bytes = 0;
  #entries = 0;
  /** A write or fdatasync failed: nothing more may follow it in this file. */
  #broken = false;
  #rotateWanted = false;
  #rotationWaiters: Waiter[] = [];
  #queue: Queued<T>[] = [];
  #running = false;
  #loop: Promise<void> = Promise.resolve();
  /** Flushes whose fdatasync has not landed yet, oldest first. */
  readonly #flights: Flight[] = [];
  /** Wakes the writer waiting on a flush in flight when an append arrives. */
  #wake: (() => void) | undefined;
  /** Where the refused lines of a failed flush begin. */
  #cutAt: number | undefined;
  /** The next journal file, preallocated in the background as journal.new. */
  #spare: Promise<FileHandle | undefined> | undefined;
  readonly #retired: number[] = [];

  constructor(options: JournalOptions<T>) {
    this.#opts = options;
    this.#path = join(options.root, JOURNAL_FILE);
  }

  /** Entries in the active journal file. */
  get entries(): number {
    return this.#entries;
  }

  /** Bytes in the active journal file. */
  get bytes(): number {
    return this.#bytes;
  }

  /** Generations retired and not yet discarded, oldest first. */
  retired(): readonly number[] {
    return this.#retired;
  }

  /** Resolves when the line (`{"seq":N,<body>}`) is durable. */
  append(body: string, item: T): Promise<void> {
    if (this.#closing) return Promise.reject(new Error('the journal is closed'));
    return new Promise<void>((resolve, reject) => {
      this.#queue.push({ body, item, resolve, reject });
      this.#kick();
    });
  }

  /** Rejects every append still waiting for `start()`. */
  failQueued(err: unknown): void {
    if (this.#state !== 'new') return;
    for (const queued of this.#queue.splice(0)) queued.reject(err);
  }

  /**
   * Puts an empty journal in place (any `journal` there is replaced atomically: the caller
   * has made its content durable elsewhere) and starts writing. Seqs continue after
   * `lastSeq`; the new file's generation is `generation`.
   */
  async start(lastSeq: number, generation: number): Promise<void> {
    this.#seq = lastSeq;
    this.#generation = generation;
    this.#handle = await this.#createEmpty();
    this.#state = 'open';
    this.#kick();
  }

  /**
   * Retires the active journal (if it holds anything) and starts a new one; resolves when the
   * new one is in place.
   */
  rotate(): Promise<void> {
    if (this.#state !== 'open' || this.#closing) return Promise.resolve();
    return new Promise<void>((resolve, reject) => {
      this.#rotationWaiters.push({ resolve, reject });
      this.#rotateWanted = true;
      this.#kick();
    });
  }

  /**
   * Deletes retired journals, oldest first, each deletion durable before the next, so that
   * what stays on disk is always the newest generations.
   */
  async discard(generations: readonly number[]): Promise<void> {
    for (const generation of [...generations].sort((a, b) => a - b)) {
      await unlink(join(this.#opts.root, `${JOURNAL_FILE}.${generation}`)).catch((err: unknown) => {
        if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
      });
      await syncPath(this.#opts.root, this.#opts.fsync);
      const at = this.#retired.indexOf(generation);
      if (at !== -1) this.#retired.splice(at, 1);
    }
  }

  /** Resolves when nothing is queued or being written. */
  async idle(): Promise<void> {
    while (this.#running) await this.#loop;
  }

  /** Writes what is queued, then closes the file; later appends reject. */
  async close(): Promise<void> {
    this.#closing = true;
    await this.idle();
    this.failQueued(new Error('the journal is closed'));
    this.#state = 'closed';
    const handle = this.#handle;
    this.#handle = undefined;
    await handle?.close();
    const spare = await this.#spare;
    this.#spare = undefined;
    if (spare !== undefined) {
      await spare.close().catch(() => undefined);
      await unlink(join(this.#opts.root, JOURNAL_FILE + FRESH_SUFFIX)).catch(() => undefined);
    }
  }

  #kick(): void {
    const wake = this.#wake;
    this.#wake = undefined;
    wake?.();
    if (this.#state !== 'open' || this.#running) return;
    this.#running = true;
    this.#loop = this.#run();
  }

  async #run(): Promise<void> {
    // Let the appends of the current turn join the first flush.
    await Promise.resolve();
    for (;;) {
      if (this.#handle === undefined || this.#broken || this.#rotateWanted) {
        // Nothing may be in flight on a file that is renamed, truncated or closed.
        await this.#landAll();
        if (this.#broken) await this.#cutRefused();
        const waiters = this.#rotationWaiters.splice(0);
        try {
          await this.#rotate();
          for (const waiter of waiters) waiter.resolve();
        } catch (err) {
          this.#opts.logger.error({ err }, 'cannot start a new journal file');
          for (const waiter of waiters) waiter.reject(err);
          // A journal that failed a write cannot take more lines; one that is merely full can.
          if (this.#handle === undefined || this.#broken) {
            for (const queued of this.#queue.splice(0)) queued.reject(err);
            this.#running = false;
            return;
          }
        }
        // A rotation asked for meanwhile is done before anything else.
        continue;
      }
      const oldest = this.#flights[0];
      if (this.#queue.length > 0 && this.#flights.length < MAX_FLIGHTS) {
        this.#launch(this.#queue.splice(0));
      } else if (oldest !== undefined) {
        // Until the oldest flush lands, or (with room for another) until an append arrives.
        if (this.#flights.length < MAX_FLIGHTS) {
          await Promise.race([oldest.landed, new Promise<void>((resolve) => (this.#wake = resolve))]);
          this.#wake = undefined;
        } else {
          await oldest.landed;
        }
      } else {
        this.#running = false;
        return;
      }
    }
  }

  /** Resolves once every flush in flight has landed (succeeded or failed). */
  async #landAll(): Promise<void> {
    while (this.#flights.length > 0) await (this.#flights.at(-1) as Flight).landed;
  }

  /**
   * Writes the batch at the end of the file (a page-cache copy: done here, it saves a round
   * trip through the thread pool) and starts its fdatasync, while an earlier one may still be
   * on disk: a change never waits for a flush it is not part of. Flushes land in order: a
   * batch is answered only after every earlier one, and if one fails, every later one in
   * flight is refused with it.
   */
  #launch(batch: Queued<T>[]): void {
    const handle = this.#handle as FileHandle;
    const committed: Committed<T>[] = [];
    let text = '';
    for (const queued of batch) {
      const seq = ++this.#seq;
      committed.push({ seq, item: queued.item });
      text += encodeLine(seq, queued.body);
    }
    const data = Buffer.from(text, 'utf8');
    const start = this.#bytes;
    const generation = this.#generation;
    let synced: Promise<unknown>;
    try {
      let offset = 0;
      while (offset < data.length) {
        const written = writeSync(handle.fd, data, offset, data.length - offset, start + offset);
        if (written <= 0) throw new Error('the journal write made no progress');
        offset += written;
      }
      synced = this.#opts.datasync(handle).then(
        () => undefined,
        (err: unknown) => err ?? new Error('fdatasync failed'),
      );
    } catch (err) {
      synced = Promise.resolve(err);
    }
    this.#bytes += data.length;
    this.#entries += batch.length;
    if (this.#bytes >= this.#opts.maxBytes || this.#entries >= this.#opts.maxEntries) this.#rotateWanted = true;
    const previous = this.#flights.at(-1)?.landed;
    const flight: Flight = {
      landed: (async () => {
        const err = await synced;
        if (previous !== undefined) await previous;
        this.#flights.shift();
        if (err !== undefined || this.#broken) {
          this.#refuse(batch, start, err ?? new Error('an earlier journal write failed'));
          return;
        }
        try {
          this.#opts.onCommit(committed, generation);
        } catch (hookErr) {
          this.#opts.logger.error({ err: hookErr }, 'journal commit hook failed');
        }
        for (const queued of batch) queued.resolve();
      })(),
    };
    this.#flights.push(flight);
  }

  /**
   * A write or fdatasync failed: what reached the file is unknown (and after a failed
   * fdatasync, so is the page cache). This file takes nothing more, the next flush goes to a
   * new one, and the refused lines are cut off again before that (#cutRefused).
   */
  #refuse(batch: Queued<T>[], start: number, err: unknown): void {
    if (!this.#broken) {
      this.#broken = true;
      this.#opts.logger.error({ err, entries: batch.length }, 'journal write failed; the changes are refused');
    }
    this.#cutAt = Math.min(this.#cutAt ?? start, start);
    for (const queued of batch) queued.reject(err);
  }

  /** Takes refused lines back out where the disk still allows it, so a restart does not replay them. */
  async #cutRefused(): Promise<void> {
    const handle = this.#handle;
    const cut = this.#cutAt;
    this.#cutAt = undefined;
    if (handle === undefined || cut === undefined) return;
    this.#bytes = cut;
    await handle
      .truncate(cut)
      .then(() => this.#opts.datasync(handle))
      .catch(() => undefined);
  }

  /** Retires the active file (unless it is empty and sound), then puts a new one in place. */
  async #rotate(): Promise<void> {
    this.#rotateWanted = false;
    const old = this.#handle;
    if (old !== undefined) {
      if (this.#bytes === 0 && !this.#broken) return;
      const generation = this.#generation;
      await rename(this.#path, join(this.#opts.root, `${JOURNAL_FILE}.${generation}`));
      this.#handle = undefined;
      this.#retired.push(generation);
      this.#generation = generation + 1;
      this.#bytes = 0;
      this.#entries = 0;
      this.#broken = false;
      this.#opts.onRetire(generation);
      await old.close().catch(() => undefined);
    }
    this.#handle = await this.#createEmpty();
  }

  /**
   * An empty journal, durable under its name: the spare prepared in the background (or, if
   * there is none, one prepared now) is renamed into place and the directory fsynced; then
   * the next spare is started.
   */
  async #createEmpty(): Promise<FileHandle> {
    const fresh = this.#path + FRESH_SUFFIX;
    const spare = this.#spare;
    this.#spare = undefined;
    const handle = (spare === undefined ? undefined : await spare) ?? (await this.#prepare());
    try {
      await rename(fresh, this.#path);
      await syncPath(this.#opts.root, this.#opts.fsync);
    } catch (err) {
      await handle.close();
      throw err;
    }
    if (!this.#closing) {
      this.#spare = this.#prepare().catch((err: unknown) => {
        this.#opts.logger.warn({ err }, 'cannot prepare the next journal file; it is made when it is needed');
        return undefined;
      });
    }
    return handle;
  }

  /** journal.new, preallocated with zeros and fsynced. */
  async #prepare(): Promise<FileHandle> {
    const fresh = this.#path + FRESH_SUFFIX;
    const handle = await open(fresh, 'w', 0o600);
    try {
      const size = this.#opts.preallocateBytes;
      const zeros = Buffer.alloc(Math.min(size, 1 << 20));
      for (let offset = 0; offset < size; offset += zeros.length) {
        await handle.write(zeros, 0, Math.min(zeros.length, size - offset), offset);
      }
      await this.#opts.fsync(handle, fresh);
    } catch (err) {
      await handle.close();
      throw err;
    }
    return handle;
  }
}
