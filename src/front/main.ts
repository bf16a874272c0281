#!/usr/bin/env node
/**
 * The task front's process (front.ts): `main.js --listen TASK_SOCKET --backend BACKEND_SOCKET
 * [--pid-file FILE] [--log-level LEVEL] [--log-file FILE [--log-max-bytes N]]`. tsbox starts it,
 * detached in a session of its own, when none answers on the backend socket; it then outlives
 * every restart of tsbox. It logs JSON lines on stdout (tsbox points it at
 * `<state>/task-front.log` and names that file with --log-file, which keeps it under
 * --log-max-bytes, 8 MiB by default: log-file.ts), ignores SIGHUP and SIGINT, and ends on SIGTERM.
 */
import { writeFile } from 'node:fs/promises';
import { parseArgs } from 'node:util';
import { messageOf } from '../errors.js';
import { createLogger } from '../log.js';
import { TaskFront } from './front.js';
import { keepLogSmall } from './log-file.js';

const { values } = parseArgs({
  options: {
    listen: { type: 'string' },
    backend: { type: 'string' },
    'pid-file': { type: 'string' },
    'log-level': { type: 'string', default: 'info' },
    'log-file': { type: 'string' },
    'log-max-bytes': { type: 'string', default: String(8 * 1024 * 1024) },
    'log-check-ms': { type: 'string', default: '60000' },
  },
  strict: true,
});
const level = values['log-level'] as 'info';
const logger = createLogger(level, 'json', false).child({ component: 'task-front' });
if (values.listen === undefined || values.backend === undefined) {
  process.stderr.write('usage: main.js --listen TASK_SOCKET --backend BACKEND_SOCKET [--log-level LEVEL]\n');
  process.exit(2);
}
const logFile = values['log-file'];
if (logFile !== undefined) {
  const maxBytes = Number(values['log-max-bytes']);
  const everyMs = Number(values['log-check-ms']);
  if (!Number.isInteger(maxBytes) || maxBytes < 1024 || !Number.isInteger(everyMs) || everyMs < 10) {
    process.stderr.write('main.js: --log-max-bytes must be a whole number of bytes, at least 1024; --log-check-ms at least 10\n');
    process.exit(2);
  }
  // stdout is the log file (the caller opened it for appending).
  keepLogSmall({ path: logFile, fd: 1, maxBytes, everyMs, logger });
}
for (const signal of ['SIGHUP', 'SIGINT'] as const) process.on(signal, () => logger.info({ signal }, 'ignored'));
process.on('SIGTERM', () => {
  logger.info('SIGTERM: the task front ends; containerd\'s task connections close with it');
  process.exit(0);
});
const pidFile = values['pid-file'];
new TaskFront({ logger, listen: values.listen, backend: values.backend })
  .start()
  .then(() => (pidFile === undefined ? undefined : writeFile(pidFile, `${process.pid}\n`)))
  .catch((err: unknown) => {
    logger.fatal({ err }, `task front cannot start: ${messageOf(err)}`);
    process.exit(1);
  });
