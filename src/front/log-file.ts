import { ftruncate } from 'node:fs';
import { copyFile, stat } from 'node:fs/promises';
import type { Logger } from 'pino';
import { isGone } from '../errors.js';

/**
 * Keeps the task front's log (its stdout and stderr, a file opened for appending) under a
 * size: past `maxBytes` the file is copied to `<path>.1` (the previous copy replaced) and cut
 * to nothing; appends go on at its new end. Checked every `everyMs`; a check that fails is
 * logged and tried again at the next one.
 */
export function keepLogSmall(options: { path: string; fd: number; maxBytes: number; everyMs: number; logger: Logger }): NodeJS.Timeout {
  const { path, fd, maxBytes, logger } = options;
  let busy = false;
  const check = async (): Promise<void> => {
    if (busy) return;
    busy = true;
    try {
      const { size } = await stat(path);
      if (size <= maxBytes) return;
      await copyFile(path, `${path}.1`);
      await ftruncateFd(fd);
      logger.info({ path, bytes: size, kept: `${path}.1` }, 'log file cut: what it held is in the kept copy');
    } catch (err) {
      // Gone: someone removed the log; nothing to cut (writes go to the unlinked file).
      if (!isGone(err)) logger.warn({ err, path }, 'cannot cut the log file');
    } finally {
      busy = false;
    }
  };
  const timer = setInterval(() => void check(), options.everyMs);
  timer.unref();
  void check();
  return timer;
}

async function ftruncateFd(fd: number): Promise<void> {
  // fs/promises' ftruncate takes a FileHandle; the descriptor is stdout's, so the callback API.
  await new Promise<void>((resolve, reject) => ftruncate(fd, 0, (err) => (err === null ? resolve() : reject(err))));
}
