import { execFile } from 'node:child_process';
import { readdir } from 'node:fs/promises';
import { basename, dirname, join } from 'node:path';
import { promisify } from 'node:util';
import { readIfPresentNow } from '../base/errors.js';
import { processStat } from './proc.js';

const run = promisify(execFile);

/** Who serves a unix socket: its pid and command line, and for a tsbox, the state dir it holds. */
export interface SocketOwner {
  readonly pid: number;
  readonly command: string;
  /** The state dir whose lock the owner holds (a tsbox), when it holds one. */
  readonly stateDir?: string;
}

/**
 * The process serving the unix socket at `path` (the supervisor binary's `peer` mode reads it with
 * SO_PEERCRED), or undefined when nobody does or it cannot be told. A tsbox holds its state dir's
 * lock through a helper of its own (`tsbox-shim lock <state dir>/tsbox.lock`): that names the
 * state dir.
 */
export async function socketOwner(path: string, shimPath: string): Promise<SocketOwner | undefined> {
  let pid: number;
  try {
    pid = Number((await run(shimPath, ['peer', path], { timeout: 5000 })).stdout.trim());
  } catch {
    return undefined; // nobody serves it any more, or it cannot be told: the caller says what it knows
  }
  if (!Number.isInteger(pid) || pid <= 0) return undefined;
  const command = ((await readIfPresentNow(`/proc/${pid}/cmdline`)) ?? '').split('\0').filter(Boolean).join(' ');
  for (const entry of await readdir('/proc')) {
    if (!/^\d+$/.test(entry) || (await processStat(Number(entry)))?.parent !== pid) continue;
    const args = ((await readIfPresentNow(`/proc/${entry}/cmdline`)) ?? '').split('\0');
    const lock = args[args.indexOf('lock') + 1];
    if (args.indexOf('lock') > 0 && lock !== undefined && basename(lock) === 'tsbox.lock' && (await isStateDir(dirname(lock)))) {
      return { pid, command, stateDir: dirname(lock) };
    }
  }
  return { pid, command };
}

/** A tsbox state dir has its sandboxes' directory (the tasks' lock, below containerd's state dir, has none). */
async function isStateDir(dir: string): Promise<boolean> {
  try {
    await readdir(join(dir, 'sandboxes'));
    return true;
  } catch {
    // No such directory (or none readable): not a state dir this check can name.
    return false;
  }
}
