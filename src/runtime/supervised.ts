import { join } from 'node:path';
import type { ExitInfo } from '../controller/types.js';
import { TsboxError, readIfPresentNow } from '../base/errors.js';
import { type Bound, pollUntil } from './bound.js';
import { processStartTime, signalGroup, signalProcess } from './proc.js';

/**
 * The processes tsbox supervises without being (or staying) their parent: a sandbox's
 * supervisor and its sandbox process, a container's holder and its container's process, a pod's
 * runc shim. Each is known by its pid together with its start time (field 22 of /proc/PID/stat),
 * never by its pid alone: after a restart of tsbox or of the node's busy hours the pid may be
 * another process's. This module is the one place that finds them, signals them, waits for their
 * end and ends them, and reads back what their supervisor recorded (the exit file, the same
 * format for sandboxes and containers: native/supervise.c writes both).
 */

/** A process as tsbox names it: its pid and the start time it had when tsbox recorded it. */
export interface ProcessId {
  readonly pid: number;
  readonly start: string;
}

/** The process now running as `pid`, with its start time; undefined when there is none (or a zombie). */
export async function processIdOf(pid: number): Promise<ProcessId | undefined> {
  const start = await processStartTime(pid);
  return start === undefined ? undefined : { pid, start };
}

/** True while the process recorded as `id` runs (the same pid with the same start time). */
export async function isRunning(id: ProcessId): Promise<boolean> {
  return id.start !== '' && (await processStartTime(id.pid)) === id.start;
}

/**
 * Sends `signal` to the recorded process (with `group`, to its process group too) only while it
 * is that process; false when it is gone. The check and the signal are not one step: a pid
 * reused in between would need the kernel to go round its whole pid space meanwhile.
 */
export async function signalIfRunning(id: ProcessId, signal: NodeJS.Signals, options: { readonly group?: boolean } = {}): Promise<boolean> {
  if (!(await isRunning(id))) return false;
  if (options.group === true) signalGroup(id.pid, signal);
  else signalProcess(id.pid, signal);
  return true;
}

/**
 * Waits, within `bound`, for the recorded process to be gone; false when it outlived it. Not
 * tsbox's child: no event tells its end for sure, so /proc is looked at (pollUntil's intervals);
 * `wake`, an event that comes with its end (a connection of it closing), looks at once.
 */
export function untilGone(id: ProcessId, bound: Bound, wake?: Promise<unknown>): Promise<boolean> {
  return pollUntil(async () => !(await isRunning(id)), bound, wake);
}

/** How endProcess ends a process. */
export interface EndOptions {
  /** Its process group too (a holder with runc under it, a sandbox with what it forked). */
  readonly group?: boolean;
  /** SIGTERM first, SIGKILL only once half the bound has passed (a process that cleans up on its way out). */
  readonly gentle?: boolean;
  /** Told when a gentle end had to come to SIGKILL. */
  readonly onStubborn?: () => void;
  /** An event that comes with its end: see untilGone. */
  readonly wake?: Promise<unknown>;
}

/**
 * Ends the recorded process and waits, within `bound`, for it to be gone; false when it outlived
 * the bound. A process already gone is done at once (true).
 */
export async function endProcess(id: ProcessId, bound: Bound, options: EndOptions = {}): Promise<boolean> {
  const group = options.group === true;
  if (options.gentle === true) {
    if (!(await signalIfRunning(id, 'SIGTERM', { group }))) return true;
    if (await untilGone(id, { ...bound, deadline: Math.min(bound.deadline, Date.now() + bound.ms / 2) }, options.wake)) return true;
    options.onStubborn?.();
  }
  if (!(await signalIfRunning(id, 'SIGKILL', { group }))) return true;
  return untilGone(id, bound, options.wake);
}

/** Parses an exit record: "<status> <seconds> <nanoseconds>" (native/supervise.c writes it). */
export function parseExitFile(text: string): ExitInfo | undefined {
  const match = /^(\d{1,3}) (-?\d+) (\d{1,9})\n?$/.exec(text);
  if (match === null) return undefined;
  const status = Number(match[1]);
  if (status > 255) return undefined;
  const reason = status > 128 ? `killed by signal ${status - 128}` : `exited with code ${status}`;
  return { status, exitedAt: { seconds: Number(match[2]), nanos: Number(match[3]) }, reason };
}

/** `<dir>/exit`; undefined while there is none. A malformed or unreadable one is an error naming the file. */
export async function readExitRecord(dir: string): Promise<ExitInfo | undefined> {
  const file = join(dir, 'exit');
  const text = await readIfPresentNow(file);
  if (text === undefined) return undefined;
  const exit = parseExitFile(text);
  if (exit === undefined) throw new TsboxError('Internal', `unreadable exit file ${file}: ${JSON.stringify(text.slice(0, 80))}`);
  return exit;
}

/**
 * What a supervised process's directory and its supervisor say, for tsbox coming back (a restart)
 * or looking again (a notice, a lost connection): the exit it recorded; else its supervisor still
 * running; else lost, the supervisor gone without a record (killed). `readExit` reads `<dir>/exit`
 * (readExitRecord, or one that logs what it cannot read).
 */
export type Supervision = { readonly kind: 'exited'; readonly exit: ExitInfo } | { readonly kind: 'running' } | { readonly kind: 'lost' };

export async function superviseAgain(supervisor: ProcessId, readExit: () => Promise<ExitInfo | undefined>): Promise<Supervision> {
  const exit = await readExit();
  if (exit !== undefined) return { kind: 'exited', exit };
  if (await isRunning(supervisor)) return { kind: 'running' };
  // It writes the exit before it ends: one written since the first read is there now.
  const late = await readExit();
  return late === undefined ? { kind: 'lost' } : { kind: 'exited', exit: late };
}
