/**
 * The task front's log stays small (native/tsbox-front.c): a flood of connections that break
 * the protocol, one warning each, makes the log pass its bound; the front keeps a copy of what
 * it held in `<log>.1`, starts the log again from nothing, and goes on serving.
 */
import assert from 'node:assert/strict';
import { readFileSync, statSync } from 'node:fs';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { type ManagedProcess, makeTempDir, removeTree, spawnLogged, stopProcess, tailFile, waitFor, waitForSocket } from '../support/processes.js';
import { openMany } from '../support/raw-socket.js';
import { tsboxFront } from '../support/task-front.js';
import { RawTtrpc } from '../support/ttrpc-peer.js';

const MAX_BYTES = 4096;

describe('the task front\'s log', () => {
  let dir = '';
  let front: ManagedProcess | undefined;

  before(async () => {
    dir = await makeTempDir('tsbox-front-log-');
  });

  after(async () => {
    if (front !== undefined) await stopProcess(front, { graceMs: 5000 });
    await removeTree(dir);
  });

  test(`past ${MAX_BYTES} bytes it is kept in <log>.1 and started again; the front goes on serving`, async () => {
    const socketPath = path.join(dir, 'task.sock');
    const logPath = path.join(dir, 'task-front.log');
    front = await spawnLogged(tsboxFront, ['--listen', socketPath, '--backend', path.join(dir, 'backend.sock'), '--log-file', logPath, '--log-max-bytes', String(MAX_BYTES), '--log-check-ms', '50'], { logPath });
    await waitForSocket(front, socketPath, { name: 'task front', logTail: () => tailFile(logPath) });
    // Each connection sends a frame of an unknown type: one warning line each, about 200 bytes.
    const garbage = Buffer.from([0, 0, 0, 1, 0, 0, 0, 1, 9, 0, 0]);
    const conns = await openMany(() => RawTtrpc.connect(socketPath, { keepResponses: false }), 100, () => garbage, 50);
    try {
      const closed = await Promise.all(conns.map((c) => c.closedWithin(10_000)));
      assert.ok(closed.every(Boolean), 'the front closes every connection that breaks the protocol');
    } finally {
      for (const c of conns) c.destroy();
    }
    // The flood is over; the front cut its log at least once meanwhile (it may have cut it
    // more than once: each cut keeps the latest copy), and at its next check it is back
    // under the bound.
    await waitFor(() => statSync(logPath).size <= MAX_BYTES && readFileSync(logPath, 'utf8').includes('log file cut'), {
      what: `the front's log cut and back under ${MAX_BYTES} bytes`,
      timeoutMs: 10_000,
      describe: () => `${statSync(logPath).size} bytes: ${tailFile(logPath)}`,
    });
    const kept = readFileSync(`${logPath}.1`, 'utf8');
    assert.ok(kept.length > MAX_BYTES, `the kept copy holds what passed the bound (${kept.length} bytes)`);
    assert.match(kept, /broke the protocol/);
    assert.equal(front.exitInfo(), undefined, 'the front still runs');
    const fresh = await RawTtrpc.connect(socketPath, { keepResponses: false });
    try {
      assert.equal(fresh.closed, false, 'a new connection is taken');
    } finally {
      fresh.destroy();
    }
  });
});
