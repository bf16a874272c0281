import { mkdir, readFile, readdir, rename } from 'node:fs/promises';
import { join } from 'node:path';
import type { Logger } from 'pino';
import { z } from 'zod';
import { recordSchema } from '../controller/record.js';
import type { LoadedRecords, SandboxRecord } from '../controller/types.js';
import { messageOf } from '../base/errors.js';
import { syncPath } from './sync.js';
import type { StateLayout } from './layout.js';

/** The name of a sandbox's record in its directory. */
export const RECORD_FILE = 'record.json';

/**
 * The per-sandbox record files as they are on disk: read back through the zod schema, an
 * unreadable one moved to quarantine/ with a log line. The record store writes them
 * (state/record-store.ts) and reads them through this at start-up.
 */
export class RecordFiles {
  readonly #layout: StateLayout;
  readonly #log: Logger;

  constructor(layout: StateLayout, logger: Logger) {
    this.#layout = layout;
    this.#log = logger;
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
    return { ok: true, record: parsed.data };
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
