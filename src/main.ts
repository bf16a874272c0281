#!/usr/bin/env node
/**
 * The entry point: parses the command line, runs the command, wires SIGTERM/SIGINT to an
 * ordered shutdown, and is the only place that exits the process.
 */
import { ConfigError, USAGE, UsageError, containerdSnippet, parseCommand } from './cli.js';
import { startDaemon } from './daemon.js';
import { messageOf } from './errors.js';
import { createLogger } from './log.js';

async function main(argv: readonly string[]): Promise<number> {
  let command;
  try {
    command = parseCommand(argv);
  } catch (err) {
    if (err instanceof ConfigError || err instanceof UsageError) {
      process.stderr.write(`tsbox: ${err.message}\n`);
      return 2;
    }
    throw err;
  }
  switch (command.kind) {
    case 'help':
      process.stdout.write(USAGE);
      return 0;
    case 'containerd-snippet':
      process.stdout.write(containerdSnippet(command.config));
      return 0;
    case 'show-config':
      process.stdout.write(`${JSON.stringify({ ...command.config, socketMode: command.config.socketMode.toString(8).padStart(4, '0') }, null, 2)}\n`);
      return 0;
    case 'serve':
      break;
  }
  const logger = createLogger(command.config.logLevel);
  let daemon;
  try {
    daemon = await startDaemon(command.config, logger);
  } catch (err) {
    logger.fatal({ err }, `tsbox cannot start: ${messageOf(err)}`);
    process.stderr.write(`tsbox: cannot start: ${messageOf(err)}\n`);
    return 1;
  }
  const running = daemon;
  return new Promise<number>((resolve) => {
    let stopping = false;
    const onSignal = (signal: NodeJS.Signals): void => {
      if (stopping) {
        logger.warn({ signal }, 'second signal: exiting now');
        resolve(1);
        return;
      }
      stopping = true;
      logger.info({ signal }, 'signal received: stopping');
      running.stop().then(
        () => resolve(0),
        (err: unknown) => {
          logger.error({ err }, 'shutdown failed');
          resolve(1);
        },
      );
    };
    process.on('SIGTERM', onSignal);
    process.on('SIGINT', onSignal);
  });
}

main(process.argv.slice(2)).then(
  (code) => process.exit(code),
  (err: unknown) => {
    process.stderr.write(`tsbox: unexpected failure: ${err instanceof Error ? err.stack ?? err.message : String(err)}\n`);
    process.exit(1);
  },
);
