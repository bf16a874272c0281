import { createHash } from 'node:crypto';
import { z } from 'zod';

/**
 * The records tsbox keeps of its tasks, version 1, as zod schemas: the one source of their
 * shape. `task.json` in a task's directory (`<tasks>/<taskDirName>/`), `exec.json` in each
 * exec's (`<task dir>/<execDirName>/`). The task table writes them as JSON and reads them
 * back through these schemas at its start: a record that is not JSON, fails its schema or is
 * of a newer version is never guessed at (tasks.ts leaves it where it is, with an error line
 * naming the file and the reason).
 *
 * Version 1 is the format every build has written since the Task API route began; the builds
 * before this field wrote it without `version`, which reads as 1. Their earlier records may
 * also lack `runcRoot` (a tsbox that kept one runc root: recovery fills it in) and
 * `sandboxId` (none named). A change of meaning or an incompatible change of shape takes a
 * new version; a record of a version this build does not know is left for the build that does.
 */
export const TASK_RECORD_VERSION = 1;

/** The name of a task's record in its directory. */
export const TASK_RECORD_FILE = 'task.json';
/** The name of an exec's record in its directory. */
export const EXEC_RECORD_FILE = 'exec.json';

/** Short, fixed-length directory names: a holder's control socket path must fit 108 bytes. */
function shortName(...parts: string[]): string {
  return createHash('sha256').update(parts.join('\0')).digest('hex').slice(0, 16);
}

/** The directory name of task (ns, id) below the tasks' directory. */
export function taskDirName(ns: string, id: string): string {
  return shortName(ns, id);
}

/** The directory name of exec `execId` below its task's directory. */
export function execDirName(execId: string): string {
  return `e-${shortName(execId)}`;
}

/** Absent in the records of builds before the field: the same format, version 1. */
const versionSchema = z.literal(TASK_RECORD_VERSION).default(TASK_RECORD_VERSION);

/** What Create and Exec carry of a process's IO: CRI's FIFOs (State echoes them) and the tty. */
const ioShape = {
  stdin: z.string(),
  stdout: z.string(),
  stderr: z.string(),
  terminal: z.boolean(),
};

/**
 * A task, written by Create before it does anything else, so that a tsbox that dies part-way
 * leaves a record of what to undo. Ids are checked as non-empty only: the Task API checks
 * them on the way in, and a record's directory name must be the hash of its namespace and id.
 */
export const taskRecordSchema = z.object({
  version: versionSchema,
  namespace: z.string().min(1),
  id: z.string().min(1),
  /** containerd's bundle: config.json, rootfs (mounted by Create), `sandbox`. */
  bundle: z.string().min(1),
  ...ioShape,
  /** runc's --systemd-cgroup, from the CRI handler's runc options. */
  systemdCgroup: z.boolean(),
  /** The runc binary (a name on PATH, or a path). */
  runcPath: z.string().min(1),
  /** runc's root for the container (its namespace's directory); absent in records of a tsbox that kept one root. */
  runcRoot: z.string().min(1).optional(),
  /** The sandbox the task belongs to (containerd's `<bundle>/sandbox`); '' or absent when it names none. */
  sandboxId: z.string().optional(),
});

/** An exec, written by Exec; its process runs at Start. */
export const execRecordSchema = z.object({
  version: versionSchema,
  execId: z.string().min(1),
  /** The OCI process to run, as containerd sent it. */
  spec: z.record(z.string(), z.unknown()),
  ...ioShape,
});

export type TaskRecordFile = z.output<typeof taskRecordSchema>;
export type ExecRecordFile = z.output<typeof execRecordSchema>;

/** A record read back, or why it cannot be. */
export type ReadRecord<T> = { readonly ok: true; readonly record: T } | { readonly ok: false; readonly reason: string };

/** The first look at a record: JSON, an object, a version this build reads. */
function readVersioned(text: string): { ok: true; json: object } | { ok: false; reason: string } {
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch (err) {
    return { ok: false, reason: `not JSON (torn or truncated?): ${err instanceof Error ? err.message : String(err)}` };
  }
  if (json === null || typeof json !== 'object' || Array.isArray(json)) return { ok: false, reason: 'not a JSON object' };
  const version: unknown = (json as { version?: unknown }).version;
  if (typeof version === 'number' && Number.isInteger(version) && version > TASK_RECORD_VERSION) {
    return { ok: false, reason: `version ${version} is newer than this build reads (${TASK_RECORD_VERSION}): written by a later tsbox` };
  }
  return { ok: true, json };
}

function parse<T>(schema: z.ZodType<T>, text: string): ReadRecord<T> {
  const first = readVersioned(text);
  if (!first.ok) return first;
  const parsed = schema.safeParse(first.json);
  if (!parsed.success) return { ok: false, reason: `not a version ${TASK_RECORD_VERSION} record: ${z.prettifyError(parsed.error)}` };
  return { ok: true, record: parsed.data };
}

/** A task's record from its text, found in directory `dirName`, which must be its own. */
export function readTaskRecord(text: string, dirName: string): ReadRecord<TaskRecordFile> {
  const read = parse(taskRecordSchema, text);
  if (read.ok && taskDirName(read.record.namespace, read.record.id) !== dirName) {
    return { ok: false, reason: `the record names task ${read.record.namespace}/${read.record.id}, whose directory is not ${dirName}` };
  }
  return read;
}

/** An exec's record from its text, found in directory `dirName`, which must be its own. */
export function readExecRecord(text: string, dirName: string): ReadRecord<ExecRecordFile> {
  const read = parse(execRecordSchema, text);
  if (read.ok && execDirName(read.record.execId) !== dirName) {
    return { ok: false, reason: `the record names exec ${read.record.execId}, whose directory is not ${dirName}` };
  }
  return read;
}
