// Records on disk (STYLE.md convention 6), through the store the daemon runs: every record
// saved comes back as it was, the last of concurrent saves wins with no temp file left over,
// removal takes the directories with it, and an unreadable record file is moved aside and
// logged, never a crash, while its valid siblings load (state/record-files.ts).
import assert from 'node:assert/strict';
import { mkdir, mkdtemp, readFile, readdir, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, test, type TestContext } from 'node:test';
import { pino, type Logger } from 'pino';
import type { SandboxRecord } from '../../src/controller/types.js';
import { stateLayout, type StateLayout } from '../../src/state/layout.js';
import { FileRecordStore } from '../../src/state/record-store.js';
import { makeRecord } from '../support/fakes.js';

async function tempRoot(t: TestContext): Promise<string> {
  const root = await mkdtemp(join(tmpdir(), 'tsbox-fs-store-'));
  t.after(() => rm(root, { recursive: true, force: true }));
  return root;
}

interface LogLine {
  readonly level: number;
  readonly msg: string;
  readonly file?: string;
  readonly reason?: string;
  readonly movedTo?: string;
  readonly path?: string;
}

/** A logger whose JSON lines land in an array. */
function capturingLogger(): { logger: Logger; lines: LogLine[] } {
  const lines: LogLine[] = [];
  const logger = pino({ level: 'info' }, { write: (line: string) => lines.push(JSON.parse(line) as LogLine) });
  return { logger, lines };
}

async function storeIn(t: TestContext): Promise<{ store: FileRecordStore; layout: StateLayout; lines: LogLine[] }> {
  const layout = stateLayout(await tempRoot(t));
  const { logger, lines } = capturingLogger();
  const store = new FileRecordStore(layout, logger);
  t.after(() => store.close());
  return { store, layout, lines };
}

const FULL: SandboxRecord = makeRecord({
  namespace: 'k8s.io',
  id: 'abc123',
  state: 'exited',
  registeredAt: { seconds: 1_700_000_000, nanos: 1 },
  startedAt: { seconds: 1_700_000_010, nanos: 999_999_999 },
  pid: 0,
  launch: {
    hostname: 'web-0',
    netnsPath: '/var/run/netns/cni-1',
    command: { args: ['/bin/sleep', 'infinity'], env: ['PATH=/bin'], cwd: '/' },
  },
  labels: { app: 'web' },
  annotations: { 'io.kubernetes.cri.sandbox-name': 'web-0' },
  extensions: { metadata: { typeUrl: 'github.com/containerd/cri/pkg/store/sandbox/Metadata', value: 'e30=' } },
  backend: { supervisorPid: 1234, cgroup: '/sys/fs/cgroup/tsbox/k8s.io-abc123' },
  exit: { status: 137, exitedAt: { seconds: 1_700_000_020, nanos: 5 }, reason: 'killed' },
});

describe('record files', () => {
  test('a saved record loads back exactly', async (t) => {
    const { store } = await storeIn(t);
    const created = makeRecord({ namespace: 'default', id: 'plain', state: 'created' });
    await store.save(FULL);
    await store.save(created);
    const loaded = await store.loadAll();
    assert.deepEqual(loaded.quarantined, []);
    const byId = new Map(loaded.records.map((r) => [r.id, r]));
    assert.deepEqual(byId.get('abc123'), FULL);
    assert.deepEqual(byId.get('plain'), created);
    assert.equal(loaded.records.length, 2);
  });

  test('an empty state directory loads nothing and is created', async (t) => {
    const { store, layout } = await storeIn(t);
    assert.deepEqual(await store.loadAll(), { records: [], quarantined: [] });
    assert.deepEqual(await readdir(layout.sandboxes), []);
  });

  test('concurrent saves of one sandbox leave the last one and no temp file', async (t) => {
    const { store, layout } = await storeIn(t);
    const saves = Array.from({ length: 25 }, (_, i) =>
      store.save(makeRecord({ namespace: 'k8s.io', id: 'busy', state: 'created', labels: { n: String(i) } })),
    );
    await Promise.all(saves);
    const { records } = await store.loadAll();
    assert.equal(records.length, 1);
    assert.deepEqual(records[0]?.labels, { n: '24' });
    assert.deepEqual(await readdir(layout.sandboxDir('k8s.io', 'busy')), ['record.json']);
  });

  test('concurrent saves of many sandboxes in many namespaces all load', async (t) => {
    const { store } = await storeIn(t);
    const records = Array.from({ length: 30 }, (_, i) => makeRecord({ namespace: `ns${i % 3}`, id: `sb${i}`, state: 'created' }));
    await Promise.all(records.map((r) => store.save(r)));
    const loaded = await store.loadAll();
    assert.equal(loaded.records.length, 30);
    assert.deepEqual(new Set(loaded.records.map((r) => `${r.namespace}/${r.id}`)), new Set(records.map((r) => `${r.namespace}/${r.id}`)));
  });

  test('a save racing a remove of its namespace\'s last other sandbox still lands', async (t) => {
    const { store } = await storeIn(t);
    await store.save(makeRecord({ namespace: 'k8s.io', id: 'old', state: 'created' }));
    await Promise.all([
      store.remove('k8s.io', 'old'),
      store.save(makeRecord({ namespace: 'k8s.io', id: 'new', state: 'created' })),
    ]);
    const { records } = await store.loadAll();
    assert.deepEqual(records.map((r) => r.id), ['new']);
  });

  test('remove deletes the sandbox directory and its namespace directory once empty', async (t) => {
    const { store, layout } = await storeIn(t);
    await store.save(makeRecord({ namespace: 'k8s.io', id: 'one', state: 'created' }));
    await store.save(makeRecord({ namespace: 'k8s.io', id: 'two', state: 'created' }));

    await store.remove('k8s.io', 'one');
    assert.deepEqual(await readdir(join(layout.sandboxes, 'k8s.io')), ['two'], 'the sibling keeps the namespace directory');

    await store.remove('k8s.io', 'two');
    assert.deepEqual(await readdir(layout.sandboxes), [], 'the empty namespace directory is gone');
    assert.deepEqual((await store.loadAll()).records, []);
  });

  test('remove of a sandbox that has no record is fine, and it can be saved again after', async (t) => {
    const { store } = await storeIn(t);
    await store.remove('k8s.io', 'never');
    await store.save(makeRecord({ namespace: 'k8s.io', id: 'again', state: 'created' }));
    await store.remove('k8s.io', 'again');
    await store.save(makeRecord({ namespace: 'k8s.io', id: 'again', state: 'running', pid: 5 }));
    const { records } = await store.loadAll();
    assert.equal(records[0]?.state, 'running');
  });

  test('corrupt records are moved to quarantine/, reported and logged, while valid siblings load', async (t) => {
    const { store, layout, lines } = await storeIn(t);
    await store.save(makeRecord({ namespace: 'k8s.io', id: 'good1', state: 'created' }));
    await store.save(makeRecord({ namespace: 'default', id: 'good2', state: 'running', pid: 7 }));
    const valid = JSON.stringify(makeRecord({ namespace: 'k8s.io', id: 'v2', state: 'created' }));

    const corrupt: { id: string; bytes: Uint8Array; reason: RegExp }[] = [
      { id: 'truncated', bytes: Buffer.from(valid.slice(0, valid.length / 2)), reason: /not JSON/ },
      { id: 'garbage', bytes: new Uint8Array([0x00, 0xff, 0x13, 0x37, 0xc3, 0x28]), reason: /not JSON/ },
      { id: 'v2', bytes: Buffer.from(valid.replace('"version":1', '"version":2')), reason: /version/ },
      { id: 'elsewhere', bytes: Buffer.from(valid.replace('"id":"v2"', '"id":"other"')), reason: /not its directory/ },
      { id: 'empty', bytes: new Uint8Array(), reason: /not JSON/ },
    ];
    for (const { id, bytes } of corrupt) {
      const dir = layout.sandboxDir('k8s.io', id);
      await mkdir(dir, { recursive: true });
      await writeFile(join(dir, 'record.json'), bytes);
    }

    const loaded = await store.loadAll();

    assert.deepEqual(loaded.records.map((r) => r.id).sort(), ['good1', 'good2']);
    assert.deepEqual(
      loaded.quarantined.map((q) => `${q.namespace}/${q.id}`).sort(),
      corrupt.map((c) => `k8s.io/${c.id}`).sort(),
    );
    const moved = await readdir(layout.quarantine);
    assert.equal(moved.length, corrupt.length);
    for (const { id, bytes, reason } of corrupt) {
      const file = join(layout.sandboxDir('k8s.io', id), 'record.json');
      const line = lines.find((l) => l.file === file);
      assert.ok(line !== undefined, `a log line names ${file}`);
      assert.equal(line.level, 50, 'logged as an error');
      assert.equal(line.msg, 'sandbox record quarantined: it cannot be read; the sandbox is not served');
      assert.match(line.reason ?? '', reason, `reason for ${id}`);
      assert.ok(line.movedTo !== undefined && line.movedTo.startsWith(layout.quarantine), 'the line says where it went');
      assert.deepEqual(new Uint8Array(await readFile(line.movedTo)), new Uint8Array(bytes), 'the bytes are kept for inspection');
      await assert.rejects(readFile(file), { code: 'ENOENT' }, 'the unreadable record is no longer in place');
    }
  });

  test('a sandbox directory without a record is reported for clean-up', async (t) => {
    const { store, layout, lines } = await storeIn(t);
    await mkdir(layout.sandboxDir('k8s.io', 'half'), { recursive: true });
    await writeFile(join(layout.sandboxDir('k8s.io', 'half'), 'record.json.tmp'), '{"version":1');
    const loaded = await store.loadAll();
    assert.deepEqual(loaded.records, []);
    assert.deepEqual(loaded.quarantined, [{ namespace: 'k8s.io', id: 'half', leftover: true }]);
    assert.ok(lines.some((l) => l.file === join(layout.sandboxDir('k8s.io', 'half'), 'record.json')));
    assert.ok(lines.some((l) => l.msg === 'sandbox directory has no record; its leftovers are removed'));
  });

  test('a directory that cannot be a sandbox is moved aside whole and not served', async (t) => {
    const { store, layout } = await storeIn(t);
    await store.save(makeRecord({ namespace: 'k8s.io', id: 'good', state: 'created' }));
    const odd = join(layout.sandboxes, 'k8s.io', 'not a sandbox');
    await mkdir(odd, { recursive: true });
    await writeFile(join(odd, 'record.json'), 'junk');
    const loaded = await store.loadAll();
    assert.deepEqual(loaded.records.map((r) => r.id), ['good']);
    // Counted, but nothing is left for the controller to clean up.
    assert.deepEqual(loaded.quarantined, [{ namespace: 'k8s.io', id: 'not a sandbox', leftover: false }]);
    await assert.rejects(readdir(odd), { code: 'ENOENT' });
    assert.equal((await readdir(layout.quarantine)).length, 1);
  });

  test('a stray file among the namespace directories is ignored with a warning', async (t) => {
    const { store, layout, lines } = await storeIn(t);
    await store.save(makeRecord({ namespace: 'k8s.io', id: 'good', state: 'created' }));
    await writeFile(join(layout.sandboxes, 'README'), 'not a namespace');
    const loaded = await store.loadAll();
    assert.deepEqual(loaded.records.map((r) => r.id), ['good']);
    assert.deepEqual(loaded.quarantined, []);
    assert.ok(lines.some((l) => l.level === 40 && l.path === join(layout.sandboxes, 'README')));
  });

  test('a leftover temp file beside a valid record does not hide the record', async (t) => {
    const { store, layout } = await storeIn(t);
    const record = makeRecord({ namespace: 'k8s.io', id: 'torn-write', state: 'running', pid: 3 });
    await store.save(record);
    await writeFile(join(layout.sandboxDir('k8s.io', 'torn-write'), 'record.json.tmp'), '{"vers');
    const loaded = await store.loadAll();
    assert.deepEqual(loaded.records, [record]);
    assert.deepEqual(loaded.quarantined, []);
  });
});
