/**
 * tsbox with the no-process backend (`--backend noop`), as a sandboxer the daemon harness
 * runs: for tests of the transport, where no sandbox process should get in the way.
 */
import { DAEMON_NODE_FLAGS } from '../../src/base/node-flags.js';
import { type SandboxerSpec, tsboxMain } from './tsbox-daemon.js';

export const noopTsbox: SandboxerSpec = {
  name: 'tsbox-noop',
  runsProcesses: false,
  stopExitStatus: 137,
  command: ({ socketPath, stateDir }) => ({
    file: process.execPath,
    args: [...DAEMON_NODE_FLAGS, tsboxMain, 'serve', '--socket', socketPath, '--state-dir', stateDir, '--backend', 'noop', '--log-level', 'warn'],
  }),
};
