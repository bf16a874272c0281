import { existsSync } from 'node:fs';
import { mkdir, readFile, readdir, rename, rm, rmdir } from 'node:fs/promises';
import { join } from 'node:path';
import type { Logger } from 'pino';
import { z } from 'zod';
import type { LoadedRecords, RecordStore, SandboxRecord } from '../controller/types.js';
import { messageOf } from '../errors.js';
import { syncPath, writeFileAtomic } from './atomic-file.js';
import type { StateLayout } from './layout.js';
import { recordSchema } from './record-schema.js';

const RECORD_FILE = 'record.json';

/**
 * Records on disk, one directory per sandbox, each written atomically. Writes of one
 * sandbox are chained so that the last save wins and two never share a temp file.
 */
export class FsRecordStore implements RecordStore {
  readonly #layout: StateLayout;
  readonly #log: Logger;
  readonly #chains = new Map<string, Promise<void>>();

  constructor(layout: StateLayout, logger: Logger) {
    this.#layout = layout;
    this.#log = logger;
  }

  #chain(key: string, operation: () => Promise<void>): Promise<void> {
    const previous = this.#chains.get(key) ?? Promise.resolve();
    const current = previous.then(operation, operation);
    this.#chains.set(key, current);
    const forget = (): void => {
      if (this.#chains.get(key) === current) this.#chains.delete(key);
    };
    current.then(forget, forget);
    return current;
  }

  save(record: SandboxRecord): Promise<void> {
    const dir = this.#layout.sandboxDir(record.namespace, record.id);
    return this.#chain(dir, async () => {
      let created: string | undefined;
      for (let attempt = 0; ; attempt++) {
        try {
          created = await mkdir(dir, { recursive: true, mode: 0o700 });
          await writeFileAtomic(join(dir, RECORD_FILE), JSON.stringify(record));
          break;
        } catch (err) {
          // The namespace directory may vanish under us when its last other sandbox is removed.
          const code = (err as NodeJS.ErrnoException).code;
          if ((code !== 'ENOENT' && code !== 'ENOTDIR') || attempt >= 2) throw err;
        }
      }
      // A new directory must itself survive a crash: sync the directories its entry (and a
      // new namespace directory's entry) were added to.
      if (created !== undefined) {
        const nsDir = join(dir, '..');
        await syncPath(nsDir);
        if (created !== dir) await syncPath(this.#layout.sandboxes);
      }
    });
  }

  remove(namespace: string, id: string): Promise<void> {
    const dir = this.#layout.sandboxDir(namespace, id);
    return this.#chain(dir, async () => {
      await rm(dir, { recursive: true, force: true });
      const nsDir = join(dir, '..');
      // The namespace directory goes with its last sandbox.
      await rmdir(nsDir).catch(() => undefined);
      await syncPath(existsSync(nsDir) ? nsDir : this.#layout.sandboxes).catch(() => undefined);
    });
  }

  async loadAll(): Promise<LoadedRecords> {
    await mkdir(this.#layout.sandboxes, { recursive: true, mode: 0o700 });
    const records: SandboxRecord[] = [];
    const quarantined: { namespace: string; id: string; leftover: boolean }[] = [];
    for (const namespace of await readdir(this.#layout.sandboxes)) {
      const nsDir = join(this.#layout.sandboxes, namespace);
      let ids: string[];
      try {
        ids = await readdir(nsDir);
      } catch (err) {
        this.#log.warn({ path: nsDir, err }, 'not a namespace directory; ignored');
        continue;
      }
      for (const id of ids) {
        const dir = join(nsDir, id);
        const result = await this.#read(dir, namespace, id);
        if (result.ok) records.push(result.record);
        else {
          const leftover = await this.#quarantine(dir, namespace, id, result.reason);
          quarantined.push({ namespace, id, leftover });
        }
      }
    }
    return { records, quarantined };
  }

  async #read(
    dir: string,
    namespace: string,
    id: string,
  ): Promise<{ ok: true; record: SandboxRecord } | { ok: false; reason: string }> {
    const file = join(dir, RECORD_FILE);
    let text: string;
    try {
      text = await readFile(file, 'utf8');
    } catch (err) {
      return { ok: false, reason: `cannot read ${RECORD_FILE}: ${messageOf(err)}` };
    }
    let json: unknown;
    try {
      json = JSON.parse(text);
    } catch (err) {
      return { ok: false, reason: `not JSON (torn or truncated?): ${messageOf(err)}` };
    }
    const parsed = recordSchema.safeParse(json);
    if (!parsed.success) return { ok: false, reason: `not a version 1 record: ${z.prettifyError(parsed.error)}` };
    if (parsed.data.namespace !== namespace || parsed.data.id !== id) {
      return { ok: false, reason: `record names ${parsed.data.namespace}/${parsed.data.id}, not its directory` };
    }
    return { ok: true, record: parsed.data as SandboxRecord };
  }

  /**
   * Moves an unreadable record to quarantine/ with a log line naming the file and the
   * reason. Returns true when the sandbox directory stays for the caller to clean up (its
   * name is a valid sandbox key); a directory that cannot be a sandbox's moves whole.
   */
  async #quarantine(dir: string, namespace: string, id: string, reason: string): Promise<boolean> {
    await mkdir(this.#layout.quarantine, { recursive: true, mode: 0o700 });
    const file = join(dir, RECORD_FILE);
    const valid = recordSchema.shape.namespace.safeParse(namespace).success && recordSchema.shape.id.safeParse(id).success;
    const target = join(this.#layout.quarantine, `${namespace}@${id}.${Date.now()}${valid ? '.json' : ''}`);
    try {
      await rename(valid ? file : dir, target);
      await syncPath(this.#layout.quarantine);
      this.#log.error({ file, movedTo: target, reason }, 'sandbox record quarantined: it cannot be read; the sandbox is not served');
      return valid;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT' && valid) {
        this.#log.error({ file, reason }, 'sandbox directory has no record; its leftovers are removed');
        return true;
      }
      this.#log.error({ file, reason, err }, 'sandbox record unreadable and cannot be moved aside; ignored');
      return false;
    }
  }
}
