#!/usr/bin/env -S node --max-semi-space-size=1
/**
 * The entry point: parses the command line, runs the command, wires SIGTERM/SIGINT to an
 * ordered shutdown, and is the only place that exits the process.
 */
import { ConfigError, UsageError, containerdSnippet, parseCommand, type Command } from './cli/cli.js';
import { startDaemon } from './daemon.js';
import { messageOf } from './base/errors.js';
import { createLogger } from './base/log.js';
import { runDoctor } from './ops/doctor.js';
import { EXIT, OperatorError } from './ops/exit-codes.js';
import { install, uninstall } from './ops/install.js';
import { waitUntilServing } from './ops/ready.js';
import {
  type SandboxContext,
  inspectSandbox,
  listSandboxes,
  removeSandboxes,
  runSandbox,
  sandboxLogs,
  stopSandbox,
  waitSandbox,
} from './ops/sandbox-commands.js';

const output = {
  out: (text: string) => void process.stdout.write(text),
  err: (text: string) => void process.stderr.write(text),
};

/** Runs an operator command; Ctrl-C ends a `wait` or `logs -f`. */
async function runSandboxCommand(command: Extract<Command, { kind: 'sandbox' }>): Promise<number> {
  const abort = new AbortController();
  const onSignal = (): void => abort.abort();
  process.once('SIGINT', onSignal);
  process.once('SIGTERM', onSignal);
  const ctx: SandboxContext = { ...command.target, stateDir: command.config.stateDir, output, signal: abort.signal };
  try {
    const { action } = command;
    switch (action.op) {
      case 'run':
        return await runSandbox(ctx, action.options);
      case 'ls':
        return await listSandboxes(ctx, { json: action.json });
      case 'inspect':
        return await inspectSandbox(ctx, action.id);
      case 'wait':
        return await waitSandbox(ctx, action.id);
      case 'stop':
        return await stopSandbox(ctx, action.id, action.timeoutSeconds);
      case 'rm':
        return await removeSandboxes(ctx, action.ids, action.force);
      case 'logs':
        return await sandboxLogs(ctx, action.id, action.follow);
    }
  } finally {
    process.off('SIGINT', onSignal);
    process.off('SIGTERM', onSignal);
  }
}

async function main(argv: readonly string[]): Promise<number> {
  let command;
  try {
    command = parseCommand(argv);
  } catch (err) {
    if (err instanceof ConfigError || err instanceof UsageError) {
      process.stderr.write(`tsbox: ${err.message}\n`);
      return EXIT.usage;
    }
    throw err;
  }
  try {
    switch (command.kind) {
      case 'help':
      case 'completion':
        process.stdout.write(command.text);
        return EXIT.ok;
      case 'containerd-snippet':
        process.stdout.write(containerdSnippet(command.config));
        return EXIT.ok;
      case 'show-config':
        process.stdout.write(`${JSON.stringify({ ...command.config, socketMode: command.config.socketMode.toString(8).padStart(4, '0') }, null, 2)}\n`);
        return EXIT.ok;
      case 'sandbox':
        return await runSandboxCommand(command);
      case 'doctor':
        return await runDoctor({ config: command.config, address: command.address, containerdConfig: command.containerdConfig, output });
      case 'install':
        return install({ config: command.config, root: command.root, containerdConfig: command.containerdConfig, execPath: command.execPath, output });
      case 'uninstall':
        return uninstall({ config: command.config, root: command.root, containerdConfig: command.containerdConfig, output });
      case 'ready':
        return await waitUntilServing(command.config.socket, command.timeoutSeconds);
      case 'serve':
        return await serve(command.config);
    }
  } catch (err) {
    if (err instanceof OperatorError) {
      process.stderr.write(err.describe());
      return err.exitCode;
    }
    throw err;
  }
}

async function serve(config: Extract<Command, { kind: 'serve' }>['config']): Promise<number> {
  const logger = createLogger(config.logLevel, config.logFormat);
  let daemon;
  try {
    daemon = await startDaemon(config, logger);
  } catch (err) {
    if (err instanceof OperatorError) {
      logger.fatal({ err }, `tsbox cannot start: ${err.message}`);
      process.stderr.write(err.describe());
      return err.exitCode;
    }
    logger.fatal({ err }, `tsbox cannot start: ${messageOf(err)}`);
    process.stderr.write(`tsbox: cannot start: ${messageOf(err)}\n`);
    return EXIT.failure;
  }
  const running = daemon;
  return new Promise<number>((resolve) => {
    let stopping = false;
    const onSignal = (signal: NodeJS.Signals): void => {
      if (stopping) {
        logger.warn({ signal }, 'second signal: exiting now');
        resolve(EXIT.failure);
        return;
      }
      stopping = true;
      logger.info({ signal }, 'signal received: stopping');
      running.stop().then(
        () => resolve(EXIT.ok),
        (err: unknown) => {
          logger.error({ err }, 'shutdown failed');
          resolve(EXIT.failure);
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
    process.exit(EXIT.failure);
  },
);
