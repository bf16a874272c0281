import { pino, type Logger } from 'pino';
import type { Config } from './config.js';

/** The one root logger: JSON lines on stdout; components and sandboxes get children. */
export function createLogger(level: Config['logLevel']): Logger {
  return pino({ level, base: { name: 'tsbox' }, timestamp: pino.stdTimeFunctions.isoTime });
}
