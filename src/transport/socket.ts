import { randomBytes } from 'node:crypto';
import { chmod, link, lstat, mkdir, unlink } from 'node:fs/promises';
import { type Server as NetServer, connect } from 'node:net';
import { basename, dirname, join } from 'node:path';
import { TsboxError, messageOf } from '../base/errors.js';

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

/** A socket path's limit on Linux: sun_path holds 108 bytes with the terminating NUL. */
const MAX_SOCKET_PATH = 107;

/**
 * Makes `listener` listen on the unix socket at `path` (replacing a stale socket, refusing a
 * live one or anything else in the way), the socket appearing at `path` with `mode` from its
 * first moment: a client that finds the path finds its final mode. It is bound under a private
 * name beside `path`, given its mode, and then linked to `path` (link fails rather than replace
 * what another server put there in the meantime). `remove` deletes it if it is still ours.
 */
export async function listenUnixSocket(
  listener: NetServer,
  path: string,
  mode: number,
  backlog: number,
): Promise<{ remove(): Promise<void> }> {
  await prepareSocketPath(path);
  const hidden = await bindHidden(listener, path, backlog);
  try {
    await chmod(hidden, mode);
    await link(hidden, path);
  } catch (err) {
    await new Promise((resolve) => listener.close(resolve));
    await unlinkIfPresent(hidden);
    if ((err as NodeJS.ErrnoException).code === 'EEXIST') {
      throw new TsboxError('FailedPrecondition', `another server took ${path} while tsbox was binding it`, { cause: err });
    }
    throw new TsboxError('Unavailable', `cannot listen on ${path}: ${messageOf(err)}`, { cause: err });
  }
  // The private name goes; the server keeps listening on the inode `path` now names. That
  // inode is known by its number and its change time: a socket made later may get the number.
  await unlinkIfPresent(hidden);
  const ours = await lstat(path, { bigint: true });
  return {
    async remove() {
      try {
        const found = await lstat(path, { bigint: true });
        if (found.ino === ours.ino && found.ctimeNs === ours.ctimeNs) await unlink(path);
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
      }
    },
  };
}

/**
 * Binds `listener` to a fresh hidden name in `path`'s directory, as long as `path`'s own name
 * where it can be (so a path that fits the kernel's limit still fits), and returns that name.
 */
async function bindHidden(listener: NetServer, path: string, backlog: number): Promise<string> {
  const length = Math.max(basename(path).length, 4);
  for (let attempt = 0; ; attempt++) {
    const hidden = join(dirname(path), `.${randomBytes(length).toString('hex').slice(0, length - 1)}`);
    if (Buffer.byteLength(hidden) > MAX_SOCKET_PATH) {
      throw new TsboxError('InvalidArgument', `cannot listen on ${path}: a socket path is at most ${MAX_SOCKET_PATH} bytes`);
    }
    try {
      await new Promise<void>((resolve, reject) => {
        listener.once('error', reject);
        listener.listen({ path: hidden, backlog }, () => {
          listener.off('error', reject);
          resolve();
        });
      });
      return hidden;
    } catch (err) {
      // A name that is taken (a leftover of a crash between bind and link) is passed over.
      if ((err as NodeJS.ErrnoException).code === 'EADDRINUSE' && attempt < 8) continue;
      throw new TsboxError('Unavailable', `cannot listen on ${path}: ${messageOf(err)}`, { cause: err });
    }
  }
}

async function unlinkIfPresent(file: string): Promise<void> {
  try {
    await unlink(file);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
  }
}
