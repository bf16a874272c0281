/**
 * A ttrpc server process for the hostile tier (test/hostile/ttrpc.test.ts), so that its memory
 * and descriptors can be watched apart from the test's: `node ttrpc-test-server.js <socket>`
 * serves the test service (ttrpc-peer.ts) with the default limits, prints "ready" once it
 * listens, and closes on SIGTERM.
 */
import { pino } from 'pino';
import { TtrpcServer } from '../../src/ttrpc/server.js';
import { addTestMethods } from './ttrpc-peer.js';

const socketPath = process.argv[2];
if (socketPath === undefined) throw new Error('usage: ttrpc-test-server <socket>');
const server = new TtrpcServer({ logger: pino({ level: process.env['TSBOX_LOG_LEVEL'] ?? 'warn' }) });
addTestMethods(server);
await server.listen(socketPath, 0o600);
process.stdout.write('ready\n');
process.once('SIGTERM', () => {
  // Once closed, nothing holds the event loop: the process ends.
  void server.close(1000);
});
