/**
 * tsbox's links to the pods' processes (src/tasks/pod-links.ts) against stand-ins for a pod's
 * process: a unix socket that accepts tsbox's link and speaks the pod protocol (a Hello with its
 * version, then the calls it relays). The real pod process (native/tsbox-shim.c in relay mode)
 * meets tsbox in the hostile, integration and end-to-end tiers; here the versions it could speak
 * and the link's life are set at will.
 */
import assert from 'node:assert/strict';
import net from 'node:net';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { pino } from 'pino';
import { GRPC_CODES } from '../../src/base/errors.js';
import { Response } from '../../src/gen/ttrpc/request.js';
import { PodLinks } from '../../src/tasks/pod-links.js';
import { FrameDecoder, FrameType } from '../../src/ttrpc/frame.js';
import { POD_HELLO, POD_PROTOCOL_VERSION, POD_SERVICE } from '../../src/ttrpc/pod-link.js';
import { TtrpcServer } from '../../src/ttrpc/server.js';
import { makeTempDir, removeTree, waitFor } from '../support/processes.js';
import { TEST_SERVICE, addTestMethods, requestFrame } from '../support/ttrpc-peer.js';

/** A stand-in for a pod's process: listens on its link socket; each link tsbox opens is kept with what tsbox answered on it. */
class FakePod {
  readonly links: { socket: net.Socket; answers: { streamId: number; code: number; message: string; payload: string }[]; closed: boolean }[] = [];
  readonly #server: net.Server;

  private constructor(server: net.Server) {
    this.#server = server;
  }

  static async listen(file: string, hello: string | undefined): Promise<FakePod> {
    const pod = new FakePod(net.createServer());
    pod.#server.on('connection', (socket) => {
      const link = { socket, answers: [] as FakePod['links'][number]['answers'], closed: false };
      pod.links.push(link);
      const decoder = new FrameDecoder();
      socket.on('data', (chunk: Buffer) => {
        for (const item of decoder.push(chunk)) {
          if (item.kind !== 'frame' || item.frame.type !== FrameType.Response) continue;
          const response = Response.decode(item.frame.payload);
          link.answers.push({ streamId: item.frame.streamId, code: response.status?.code ?? 0, message: response.status?.message ?? '', payload: Buffer.from(response.payload).toString() });
        }
      });
      socket.on('error', () => undefined);
      socket.once('close', () => {
        link.closed = true;
      });
      if (hello !== undefined) socket.write(requestFrame(1, POD_SERVICE, POD_HELLO, Buffer.from(hello)));
    });
    await new Promise<void>((resolve) => pod.#server.listen(file, resolve));
    return pod;
  }

  close(): Promise<void> {
    for (const link of this.links) link.socket.destroy();
    return new Promise((resolve) => this.#server.close(() => resolve()));
  }
}

describe('links to the pods\' processes', () => {
  let dir: string;
  let server: TtrpcServer;
  let links: PodLinks;
  const logged: string[] = [];
  before(async () => {
    dir = await makeTempDir('pod-links-');
    const logger = pino({ level: 'warn' }, { write: (line: string) => void logged.push(line) });
    server = new TtrpcServer({ logger });
    addTestMethods(server);
    links = new PodLinks({ logger, server });
  });
  after(async () => {
    links.close();
    await server.close(0);
    await removeTree(dir);
  });

  test("a pod's process of this protocol version is served; one of another version is refused, naming both, and its pod reported", async () => {
    const current = await FakePod.listen(path.join(dir, 'current.link'), String(POD_PROTOCOL_VERSION));
    const other = await FakePod.listen(path.join(dir, 'other.link'), '2');
    try {
      const alive = (): Promise<boolean> => Promise.resolve(true);
      links.attach({ key: 'ns/current', path: path.join(dir, 'current.link'), alive, lost: () => assert.fail('not lost') });
      links.attach({ key: 'ns/other', path: path.join(dir, 'other.link'), alive, lost: () => assert.fail('not lost') });

      await waitFor(() => current.links[0]?.answers.length === 1, { what: 'the Hello answered' });
      assert.deepEqual(current.links[0]?.answers[0], { streamId: 1, code: 0, message: '', payload: '' });
      current.links[0]?.socket.write(requestFrame(3, TEST_SERVICE, 'Echo', Buffer.from('relayed')));
      await waitFor(() => current.links[0]?.answers.length === 2, { what: 'the relayed call answered' });
      assert.equal(current.links[0]?.answers[1]?.payload, 'relayed');

      await waitFor(() => other.links[0]?.closed === true, { what: 'the link of another version closed by tsbox' });
      const refusal = other.links[0]?.answers[0];
      assert.equal(refusal?.code, GRPC_CODES.FailedPrecondition);
      assert.match(refusal?.message ?? '', /the process of pod ns\/other speaks protocol version 2; this tsbox speaks version 1: its containers are not served/);
      assert.ok(logged.some((line) => line.includes('"level":50') && line.includes('ns/other') && line.includes('protocol version 2')), logged.join(''));
    } finally {
      links.detach('ns/current');
      links.detach('ns/other');
      await current.close();
      await other.close();
    }
  });

  test("a link that closes while the pod's process lives is opened again; once the process is gone, the pod is told lost, once", async () => {
    const file = path.join(dir, 'flaky.link');
    const pod = await FakePod.listen(file, String(POD_PROTOCOL_VERSION));
    let processLives = true;
    let lost = 0;
    links.attach({ key: 'ns/flaky', path: file, alive: () => Promise.resolve(processLives), lost: () => void lost++ });
    try {
      await waitFor(() => pod.links.length === 1 && pod.links[0]?.answers.length === 1, { what: 'the first link' });
      pod.links[0]?.socket.destroy();
      await waitFor(() => pod.links.length === 2 && pod.links[1]?.answers.length === 1, { what: 'the link opened again, its Hello answered' });
      processLives = false;
      await pod.close();
      await waitFor(() => lost === 1, { what: 'the pod told lost' });
      assert.equal(links.size, 0, 'its link is forgotten');
    } finally {
      links.detach('ns/flaky');
    }
  });
});
