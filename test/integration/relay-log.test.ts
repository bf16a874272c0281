/**
 * A pod's relay log stays small (native/relay.c, --relay-log of native/tsbox-shim.c): a flood of
 * connections that break the protocol, one warning each, makes the log pass its bound; the relay
 * moves what it held to `<log>.1`, starts the log again from nothing, and goes on serving.
 */
import assert from 'node:assert/strict';
import { readFileSync, statSync } from 'node:fs';
import { after, before, describe, test } from 'node:test';
import { makeTempDir, removeTree, tailFile } from '../support/processes.js';
import { openMany } from '../support/raw-socket.js';
import { type PodProcess, startPod } from '../support/pod-relay.js';
import { RawTtrpc } from '../support/ttrpc-peer.js';

const MAX_BYTES = 4096;

describe('a pod\'s relay log', () => {
  let dir = '';
  let pod: PodProcess | undefined;

  before(async () => {
    dir = await makeTempDir('tsbox-relay-log-');
  });

  after(async () => {
    if (pod !== undefined) await pod.stop();
    await removeTree(dir);
  });

  test(`past ${MAX_BYTES} bytes it is kept in <log>.1 and started again; the relay goes on serving`, async () => {
    pod = await startPod(dir, { relayLogMaxBytes: MAX_BYTES });
    const logPath = pod.relayLog;
    // Each connection sends a frame of an unknown type: one warning line each, about 250 bytes.
    const garbage = Buffer.from([0, 0, 0, 1, 0, 0, 0, 1, 9, 0, 0]);
    const conns = await openMany(() => RawTtrpc.connect(pod!.taskSocket, { keepResponses: false }), 100, () => garbage, 50);
    try {
      const closed = await Promise.all(conns.map((c) => c.closedWithin(10_000)));
      assert.ok(closed.every(Boolean), 'the relay closes every connection that breaks the protocol');
    } finally {
      for (const c of conns) c.destroy();
    }
    // The relay cut its log at least once meanwhile (each cut keeps the latest copy); it cuts as
    // it writes, so the log is under the bound and begins with the cut's own line.
    const log = readFileSync(logPath, 'utf8');
    assert.ok(statSync(logPath).size <= MAX_BYTES, `${statSync(logPath).size} bytes: ${tailFile(logPath)}`);
    assert.match(log, /log file cut/);
    const kept = readFileSync(`${logPath}.1`, 'utf8');
    assert.ok(kept.length > MAX_BYTES, `the kept copy holds what passed the bound (${kept.length} bytes)`);
    assert.match(kept, /broke the protocol/);
    for (const line of [...kept.split('\n'), ...log.split('\n')].filter((l) => l !== '')) JSON.parse(line);
    assert.equal(pod.supervisor.exitInfo(), undefined, 'the relay still runs');
    const fresh = await RawTtrpc.connect(pod.taskSocket, { keepResponses: false });
    try {
      assert.equal(fresh.closed, false, 'a new connection is taken');
    } finally {
      fresh.destroy();
    }
  });
});
