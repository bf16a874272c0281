import { readIfPresentNow } from '../base/errors.js';

/** What tsbox reads of /proc/PID/stat. */
export interface ProcessStat {
  readonly parent: number;
  /** Field 22, in clock ticks since boot. */
  readonly startTime: string;
}

/** The parent and start time of a live process, or undefined (no such process, or a zombie); throws when /proc cannot be read. */
export async function processStat(pid: number): Promise<ProcessStat | undefined> {
  if (!Number.isInteger(pid) || pid <= 0) return undefined;
  // No such process (or it is gone while read): nothing to trust, which is what undefined
  // means. Any other failure is thrown with the path: a check that cannot be made is not "gone".
  const stat = await readIfPresentNow(`/proc/${pid}/stat`);
  if (stat === undefined) return undefined;
  // The command name (field 2) is in parentheses and may contain spaces or ')'.
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  // fields[0] is field 3 (state), fields[1] field 4 (ppid), fields[19] field 22 (start time).
  const startTime = fields[19];
  if (fields[0] === 'Z' || startTime === undefined) return undefined;
  return { parent: Number(fields[1]), startTime };
}

/**
 * The start time of a process, or undefined when no such process exists. A pid is trusted
 * only together with this value: after a restart the same pid may belong to another process
 * (supervised.ts names processes so).
 */
export async function processStartTime(pid: number): Promise<string | undefined> {
  return (await processStat(pid))?.startTime;
}

/** Sends `signal` to a process (or, with a negative pid, a group), ignoring one that is gone. */
export function signalProcess(pid: number, signal: NodeJS.Signals): void {
  try {
    process.kill(pid, signal);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'ESRCH') throw err;
  }
}

/** Sends `signal` to a process group and its leader, ignoring processes that are gone. */
export function signalGroup(pid: number, signal: NodeJS.Signals): void {
  for (const target of [-pid, pid]) signalProcess(target, signal);
}
