/**
 * The standard gRPC health service on tsbox's socket (grpc.health.v1.Health), as a probe or
 * an operator sees it: SERVING once the daemon accepts calls, NOT_SERVING from the first
 * moment of a shutdown, told to a Watch before its stream ends.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { credentials, makeGenericClientConstructor, type Client, type ClientReadableStream, type ServiceError } from '@grpc/grpc-js';
import { service as healthService } from 'grpc-health-check';
import { noopTsbox } from '../support/noop-daemon.js';
import { type SandboxerDaemon, startSandboxerDaemon } from '../support/tsbox-daemon.js';

const CONTROLLER = 'containerd.services.sandbox.v1.Controller';
type HealthClient = Client & {
  check(request: { service: string }, options: { deadline: number }, callback: (err: ServiceError | null, res?: { status: string }) => void): void;
  watch(request: { service: string }): ClientReadableStream<{ status: string }>;
};
const HealthClientCtor = makeGenericClientConstructor(healthService, 'Health') as unknown as new (
  address: string,
  creds: ReturnType<typeof credentials.createInsecure>,
) => HealthClient;

function check(client: HealthClient, service: string): Promise<string> {
  return new Promise((resolve, reject) =>
    client.check({ service }, { deadline: Date.now() + 5000 }, (err, res) => (err === null ? resolve(res?.status ?? '') : reject(err))),
  );
}

describe('the gRPC health service', () => {
  let daemon: SandboxerDaemon | undefined;
  let client: HealthClient | undefined;

  before(async () => {
    daemon = await startSandboxerDaemon(noopTsbox);
    client = new HealthClientCtor(`unix:${daemon.socketPath}`, credentials.createInsecure());
  });

  after(async () => {
    client?.close();
    await daemon?.teardown();
  });

  test('SERVING for the server and for the Controller once the daemon accepts calls', async () => {
    assert.ok(client !== undefined);
    assert.equal(await check(client, ''), 'SERVING');
    assert.equal(await check(client, CONTROLLER), 'SERVING');
  });

  test('a Watch hears NOT_SERVING when the daemon begins to shut down', async () => {
    assert.ok(client !== undefined && daemon !== undefined);
    const seen: string[] = [];
    const stream = client.watch({ service: CONTROLLER });
    stream.on('error', () => undefined);
    const first = new Promise<void>((resolve) => stream.once('data', () => resolve()));
    stream.on('data', (message: { status: string }) => seen.push(message.status));
    const ended = new Promise<void>((resolve) => stream.once('close', resolve));
    await first;
    assert.deepEqual(seen, ['SERVING']);
    const stopped = await daemon.stop({ graceMs: 15_000 });
    assert.equal(stopped.code, 0);
    await ended;
    assert.deepEqual(seen, ['SERVING', 'NOT_SERVING']);
  });
});
