import { connect } from 'node:net';
import { chmod, lstat, mkdir, stat, unlink } from 'node:fs/promises';
import { dirname } from 'node:path';
import { TsboxError } from '../errors.js';

/**
 * What a connection attempt to the unix socket at `path` finds within `timeoutMs`: a server
 * that accepts, nothing (refused, absent, not a socket), or no answer yet.
 */
export function probeSocket(path: string, timeoutMs = 1000): Promise<'accepts' | 'refused' | 'silent'> {
  return new Promise((resolve) => {
    const socket = connect(path);
    const finish = (found: 'accepts' | 'refused' | 'silent'): void => {
      clearTimeout(timer);
      socket.destroy();
      resolve(found);
    };
    const timer = setTimeout(() => finish('silent'), timeoutMs);
    socket.once('connect', () => finish('accepts'));
    socket.once('error', () => finish('refused'));
  });
}

/** Resolves true when a server listens on the unix socket at `path`. */
export async function isSocketLive(path: string, timeoutMs = 1000): Promise<boolean> {
  // A server too busy to accept within the bound is still a live server.
  return (await probeSocket(path, timeoutMs)) !== 'refused';
}

/**
 * Makes `path` ready to bind: creates its directory, refuses when a live server answers
 * there or when something other than a socket is in the way, removes a stale socket left
 * by a crash.
 */
export async function prepareSocketPath(path: string): Promise<void> {
  await mkdir(dirname(path), { recursive: true, mode: 0o755 });
  let info;
  try {
    info = await lstat(path);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return;
    throw err;
  }
  if (!info.isSocket()) {
    throw new TsboxError('FailedPrecondition', `${path} exists and is not a socket; refusing to replace it`);
  }
  if (await isSocketLive(path)) {
    throw new TsboxError('FailedPrecondition', `another server is already listening on ${path}`);
  }
  await unlink(path);
}

/** The bound socket: its mode is set now; `remove` deletes it if it is still ours. */
export async function claimSocket(path: string, mode: number): Promise<{ remove(): Promise<void> }> {
  await chmod(path, mode);
  const ino = (await stat(path)).ino;
  return {
    async remove() {
      try {
        if ((await lstat(path)).ino === ino) await unlink(path);
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
      }
    },
  };
}
