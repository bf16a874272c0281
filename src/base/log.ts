import { pino, type LevelWithSilent, type Logger } from 'pino';
import { PinoPretty } from 'pino-pretty';

/** How log entries are written: JSON lines, readable lines, or readable on a terminal only. */
export type LogFormat = 'auto' | 'json' | 'pretty';

/**
 * The one root logger; components and sandboxes get children. JSON lines on stdout (for
 * journald and log collectors) unless a person reads them: `pretty`, or `auto` on a
 * terminal, prints one readable line per entry (pino-pretty, in-process and synchronous, so
 * no worker thread and nothing lost at exit).
 */
export function createLogger(level: LevelWithSilent, format: LogFormat = 'json', isTty = process.stdout.isTTY === true): Logger {
  const options = { level, base: { name: 'tsbox' }, timestamp: pino.stdTimeFunctions.isoTime };
  if (format === 'json' || (format === 'auto' && !isTty)) return pino(options);
  const stream = PinoPretty({
    sync: true,
    colorize: isTty,
    translateTime: 'SYS:yyyy-mm-dd HH:MM:ss.l',
    ignore: 'pid,hostname,name',
    singleLine: true,
    destination: 1,
  });
  return pino(options, stream);
}
