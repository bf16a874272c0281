import { readFile } from 'node:fs/promises';

/**
 * The start time of a process (field 22 of /proc/PID/stat, in clock ticks since boot), or
 * undefined when no such process exists. A pid is trusted only together with this value:
 * after a restart the same pid may belong to another process.
 */
export async function processStartTime(pid: number): Promise<string | undefined> {
  if (!Number.isInteger(pid) || pid <= 0) return undefined;
  let stat: string;
  try {
    stat = await readFile(`/proc/${pid}/stat`, 'utf8');
  } catch {
    return undefined;
  }
  // The command name (field 2) is in parentheses and may contain spaces or ')'.
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  // fields[0] is field 3 (state); field 22 is fields[19]. A zombie has exited.
  if (fields[0] === 'Z') return undefined;
  return fields[19];
}

/** True when `pid` is alive and is the process that started at `startTime`. */
export async function isSameProcess(pid: number, startTime: string): Promise<boolean> {
  return (await processStartTime(pid)) === startTime;
}

/** Sends `signal` to a process group and its leader, ignoring processes that are gone. */
export function signalGroup(pid: number, signal: NodeJS.Signals): void {
  for (const target of [-pid, pid]) {
    try {
      process.kill(target, signal);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'ESRCH') throw err;
    }
  }
}
