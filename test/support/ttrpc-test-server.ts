/**
 * A ttrpc server process for the hostile tier (test/hostile/ttrpc.test.ts, pod-relay.test.ts), so
 * that its memory and descriptors can be watched apart from the test's:
 * `node ttrpc-test-server.js <socket>` serves the test service (ttrpc-peer.ts) with the default
 * limits on its own socket; `node ttrpc-test-server.js --link <link socket>` serves it through a
 * pod's relay instead, over the one connection it opens to the relay's link socket, as tsbox
 * does, answering the relay's Hello as tsbox does (src/ttrpc/pod-link.ts).
 * It prints "ready" once it serves, and closes on SIGTERM.
 */
import { connect } from 'node:net';
import { pino } from 'pino';
import { TsboxError } from '../../src/base/errors.js';
import { podRequests } from '../../src/tasks/pod-links.js';
import { POD_PROTOCOL_VERSION } from '../../src/ttrpc/pod-link.js';
import { TtrpcServer } from '../../src/ttrpc/server.js';
import { addTestMethods } from './ttrpc-peer.js';

const [first, second] = process.argv.slice(2);
if (first === undefined || (first === '--link' && second === undefined)) throw new Error('usage: ttrpc-test-server <socket> | --link <link socket>');
const server = new TtrpcServer({ logger: pino({ level: process.env['TSBOX_LOG_LEVEL'] ?? 'warn' }) });
addTestMethods(server);
if (first === '--link') {
  const socket = connect(second as string);
  await new Promise<void>((resolve, reject) => {
    socket.once('connect', resolve);
    socket.once('error', reject);
  });
  const hello = (version: number | undefined): TsboxError | undefined =>
    version === POD_PROTOCOL_VERSION ? undefined : new TsboxError('FailedPrecondition', `pod protocol version ${String(version)} is not ${POD_PROTOCOL_VERSION}`);
  void server.serveConnection(socket, podRequests(hello));
} else {
  await server.listen(first, 0o600);
}
process.stdout.write('ready\n');
process.once('SIGTERM', () => {
  // Once closed, nothing holds the event loop: the process ends.
  void server.close(1000);
});
