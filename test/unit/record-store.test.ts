// The record store's durability, on real files in temp dirs with an fsync the tests watch or
// hold: a save resolves only once its file and every directory entry leading to it are
// synced; writes of one sandbox land in the order issued while other sandboxes go on; a
// removed record is not brought back by a save issued before the remove; a failed write
// leaves the previous record and no temp file; and what is on disk is always the record an
// operator can read.
import assert from 'node:assert/strict';
import { mkdir, mkdtemp, readFile, readdir, rm, writeFile, type FileHandle } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, test, type TestContext } from 'node:test';
import { pino } from 'pino';
import type { SandboxRecord } from '../../src/controller/types.js';
import { stateLayout, type StateLayout } from '../../src/state/layout.js';
import { FileRecordStore } from '../../src/state/record-store.js';
import type { SyncFile } from '../../src/state/sync.js';
import { Gate, makeRecord, settle as settleTurns, until } from '../support/fakes.js';

async function tempLayout(t: TestContext): Promise<StateLayout> {
  const root = await mkdtemp(join(tmpdir(), 'tsbox-store-'));
  t.after(() => rm(root, { recursive: true, force: true }));
  return stateLayout(root);
}

const silent = pino({ level: 'silent' });

const record = (namespace: string, id: string, n: number, extra: Partial<SandboxRecord> = {}): SandboxRecord =>
  makeRecord({ namespace, id, state: 'created', labels: { n: String(n) }, ...extra });

/** An fsync that logs the paths it syncs, in order, and holds those `hold` picks until `gate` opens. */
function watchedSync(hold: (path: string) => boolean = () => false, gate = new Gate()): { fsync: SyncFile; synced: string[]; gate: Gate } {
  const synced: string[] = [];
  const fsync = async (handle: FileHandle, path: string): Promise<void> => {
    if (hold(path)) await gate.wait();
    await handle.sync();
    synced.push(path);
  };
  return { fsync, synced, gate };
}

async function onDisk(layout: StateLayout, namespace: string, id: string): Promise<SandboxRecord | undefined> {
  try {
    return JSON.parse(await readFile(join(layout.sandboxDir(namespace, id), 'record.json'), 'utf8')) as SandboxRecord;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw err;
  }
}

/** Lets pending I/O callbacks and promise jobs run. */
const settle = (): Promise<void> => settleTurns(20);

describe('FileRecordStore', () => {
  test('the first save of a sandbox syncs the file, then its directory, then every new directory entry above it', async (t) => {
    const layout = await tempLayout(t);
    const { fsync, synced } = watchedSync();
    const store = new FileRecordStore(layout, silent, { fsync });
    const dir = layout.sandboxDir('k8s.io', 'first');
    const temp = join(dir, 'record.json.tmp');

    await store.save(record('k8s.io', 'first', 0));
    // sandboxes/ did not exist either: its entry in the state dir is synced too.
    assert.deepEqual(synced, [temp, dir, join(layout.sandboxes, 'k8s.io'), layout.sandboxes, layout.root]);
    assert.deepEqual(await onDisk(layout, 'k8s.io', 'first'), record('k8s.io', 'first', 0));

    synced.length = 0;
    await store.save(record('k8s.io', 'first', 1));
    assert.deepEqual(synced, [temp, dir], 'a later save syncs the file and the directory the rename changed');

    synced.length = 0;
    await store.save(record('k8s.io', 'second', 0));
    assert.deepEqual(
      synced,
      [join(layout.sandboxDir('k8s.io', 'second'), 'record.json.tmp'), layout.sandboxDir('k8s.io', 'second'), join(layout.sandboxes, 'k8s.io')],
      "a new sandbox in a namespace whose entry is durable syncs up to the namespace's directory",
    );
    assert.deepEqual(await readdir(dir), ['record.json'], 'no temp file is left');
    await store.close();
  });

  test('once a namespace directory went with its last sandbox, its next sandbox syncs sandboxes/ again', async (t) => {
    const layout = await tempLayout(t);
    const { fsync, synced } = watchedSync();
    const store = new FileRecordStore(layout, silent, { fsync });
    const nsDir = join(layout.sandboxes, 'ns1');
    await store.save(record('ns1', 'a', 0));
    await store.remove('ns1', 'a');
    assert.deepEqual(await readdir(layout.sandboxes), [], 'the empty namespace directory is gone');
    synced.length = 0;
    await store.save(record('ns1', 'b', 0));
    assert.deepEqual(synced, [join(layout.sandboxDir('ns1', 'b'), 'record.json.tmp'), layout.sandboxDir('ns1', 'b'), nsDir, layout.sandboxes]);

    // A namespace directory left by an earlier run is not known durable: synced once, then not.
    await mkdir(join(layout.sandboxes, 'old'), { mode: 0o700 });
    const fresh = new FileRecordStore(layout, silent, { fsync });
    synced.length = 0;
    await fresh.save(record('old', 'c', 0));
    assert.ok(synced.includes(layout.sandboxes), 'sandboxes/ synced for a namespace directory this run did not make durable');
    synced.length = 0;
    await fresh.save(record('old', 'd', 0));
    assert.ok(!synced.includes(layout.sandboxes), 'and not again');
    await store.close();
    await fresh.close();
  });

  test("concurrent first saves in one namespace share its directory's fsync, and none resolves before a sync that began after its entry was made", async (t) => {
    const layout = await tempLayout(t);
    const nsDir = join(layout.sandboxes, 'k8s.io');
    const holding = { on: false };
    const { fsync, synced, gate } = watchedSync((path) => holding.on && path === nsDir);
    const store = new FileRecordStore(layout, silent, { fsync });
    await store.save(record('k8s.io', 'seed', 0));
    holding.on = true;
    // The first save's sync of the namespace directory is held while five more come.
    let resolved = 0;
    const first = store.save(record('k8s.io', 'n0', 0)).then(() => resolved++);
    await settle();
    const rest = [1, 2, 3, 4, 5].map((n) => store.save(record('k8s.io', `n${n}`, 0)).then(() => resolved++));
    // Each asks for the namespace directory's sync right after its own directory's.
    await until(() => [1, 2, 3, 4, 5].every((n) => synced.includes(layout.sandboxDir('k8s.io', `n${n}`))), 'the five saves synced their own directories', 5000);
    await settle();
    assert.equal(resolved, 0, 'no save resolves while the sync of its namespace directory waits');
    holding.on = false;
    gate.open();
    await Promise.all([first, ...rest]);
    // One for the seed, the held one for n0, one shared by the five that came while it was held.
    assert.equal(synced.filter((p) => p === nsDir).length, 3);
    const { records } = await new FileRecordStore(layout, silent).loadAll();
    assert.equal(records.length, 7);
    await store.close();
  });

  test('a save resolves only once it is on disk; later writes of the sandbox wait, other sandboxes do not', async (t) => {
    const layout = await tempLayout(t);
    const dirA = layout.sandboxDir('k8s.io', 'a');
    const holding = { on: true };
    const { fsync, gate } = watchedSync((path) => holding.on && path === join(dirA, 'record.json.tmp'));
    const store = new FileRecordStore(layout, silent, { fsync });
    const done: string[] = [];
    const a0 = store.save(record('k8s.io', 'a', 0)).then(() => void done.push('a0'));
    await settle();
    const a1 = store.save(record('k8s.io', 'a', 1)).then(() => void done.push('a1'));
    await store.save(record('k8s.io', 'b', 0));
    done.push('b0');
    await settle();
    assert.deepEqual(done, ['b0'], 'b landed while a waits on the disk; nothing of a is answered');
    assert.equal(await onDisk(layout, 'k8s.io', 'a'), undefined, 'a0 is not in place before its fsync');
    holding.on = false;
    gate.open();
    await Promise.all([a0, a1]);
    assert.deepEqual(done, ['b0', 'a0', 'a1']);
    assert.deepEqual((await onDisk(layout, 'k8s.io', 'a'))?.labels, { n: '1' }, 'the last write issued is the one on disk');
    await store.close();
  });

  test('25 concurrent saves of one sandbox land in the order issued', async (t) => {
    const layout = await tempLayout(t);
    const seen: string[] = [];
    const fsync: SyncFile = async (handle, path) => {
      await handle.sync();
      if (path.endsWith('record.json.tmp')) {
        const text = await readFile(path, 'utf8');
        seen.push((JSON.parse(text) as SandboxRecord).labels['n'] ?? '?');
      }
    };
    const store = new FileRecordStore(layout, silent, { fsync });
    await Promise.all(Array.from({ length: 25 }, (_, i) => store.save(record('k8s.io', 'busy', i))));
    assert.deepEqual(seen, Array.from({ length: 25 }, (_, i) => String(i)));
    assert.deepEqual((await onDisk(layout, 'k8s.io', 'busy'))?.labels, { n: '24' });
    await store.close();
  });

  test('a remove issued while a save waits on the disk wins: the record is not brought back', async (t) => {
    const layout = await tempLayout(t);
    const dir = layout.sandboxDir('k8s.io', 'gone');
    const { fsync, gate, synced } = watchedSync((path) => path === join(dir, 'record.json.tmp'));
    const store = new FileRecordStore(layout, silent, { fsync });
    const saved = store.save(record('k8s.io', 'gone', 0, { state: 'running', pid: 42 }));
    await settle();
    let removed = false;
    const removal = store.remove('k8s.io', 'gone').then(() => {
      removed = true;
    });
    await settle();
    assert.equal(removed, false, 'the remove waits for the save before it');
    gate.open();
    await Promise.all([saved, removal]);
    await assert.rejects(readdir(dir), { code: 'ENOENT' });
    assert.deepEqual(await readdir(layout.sandboxes), [], 'the namespace directory went with its last sandbox');
    assert.equal(synced.at(-1), layout.sandboxes, 'the removal was synced before remove resolved');
    const again = new FileRecordStore(layout, silent);
    assert.deepEqual(await again.loadAll(), { records: [], quarantined: [] });
    await store.close();
  });

  test('remove takes the runtime files and the directory, keeps the namespace of other sandboxes, and allows the id again', async (t) => {
    const layout = await tempLayout(t);
    const { fsync, synced } = watchedSync();
    const store = new FileRecordStore(layout, silent, { fsync });
    await store.save(record('k8s.io', 'one', 0));
    await store.save(record('k8s.io', 'two', 0));
    const dir = layout.sandboxDir('k8s.io', 'one');
    await writeFile(join(dir, 'console.log'), 'output of the sandbox');
    await writeFile(join(dir, 'exit'), '0 1 2');
    await mkdir(join(dir, 'rootfs', 'etc'), { recursive: true });
    await writeFile(join(dir, 'rootfs', 'etc', 'hosts'), '127.0.0.1 localhost');

    synced.length = 0;
    await store.remove('k8s.io', 'one');
    assert.deepEqual(await readdir(join(layout.sandboxes, 'k8s.io')), ['two']);
    assert.deepEqual(synced, [join(layout.sandboxes, 'k8s.io')], 'the namespace directory, which held the entry, is synced');
    await store.remove('k8s.io', 'never');

    await store.save(record('k8s.io', 'one', 7, { state: 'running', pid: 9 }));
    const { records } = await new FileRecordStore(layout, silent).loadAll();
    assert.deepEqual(records.map((r) => `${r.id}:${r.state}:${r.labels['n']}`).sort(), ['one:running:7', 'two:created:0']);
    await store.close();
  });

  test('a failed fsync rejects the save and leaves the previous record in place, with no temp file', async (t) => {
    const layout = await tempLayout(t);
    let fail = false;
    const fsync: SyncFile = async (handle, path) => {
      if (fail && path.endsWith('.tmp')) throw Object.assign(new Error('EIO: i/o error, fsync'), { code: 'EIO' });
      await handle.sync();
    };
    const store = new FileRecordStore(layout, silent, { fsync });
    await store.save(record('k8s.io', 'disk', 0));
    fail = true;
    await assert.rejects(store.save(record('k8s.io', 'disk', 1)), { code: 'EIO' });
    assert.deepEqual((await onDisk(layout, 'k8s.io', 'disk'))?.labels, { n: '0' });
    assert.deepEqual(await readdir(layout.sandboxDir('k8s.io', 'disk')), ['record.json']);
    fail = false;
    await store.save(record('k8s.io', 'disk', 2));
    assert.deepEqual((await onDisk(layout, 'k8s.io', 'disk'))?.labels, { n: '2' }, 'the next save after a failure still lands');
    await store.close();
  });

  test('close() waits for queued writes and refuses later ones', async (t) => {
    const layout = await tempLayout(t);
    const { fsync, gate } = watchedSync((path) => path.endsWith('.tmp'));
    const store = new FileRecordStore(layout, silent, { fsync });
    const saved = store.save(record('k8s.io', 'late', 3));
    await settle();
    let closed = false;
    const closing = store.close().then(() => {
      closed = true;
    });
    await settle();
    assert.equal(closed, false);
    gate.open();
    await Promise.all([saved, closing]);
    assert.deepEqual((await onDisk(layout, 'k8s.io', 'late'))?.labels, { n: '3' });
    await assert.rejects(store.save(record('k8s.io', 'late', 4)), /closed/);
  });

  test('saves of 200 sandboxes in 8 namespaces run together and all load back', async (t) => {
    const layout = await tempLayout(t);
    const store = new FileRecordStore(layout, silent);
    const records = Array.from({ length: 200 }, (_, i) => record(`ns${i % 8}`, `sb${i}`, i));
    await Promise.all(records.map((r) => store.save(r)));
    // Half go again while the others are saved a second time.
    await Promise.all(records.map((r, i) => (i % 2 === 0 ? store.remove(r.namespace, r.id) : store.save({ ...r, state: 'exited' }))));
    const { records: loaded, quarantined } = await new FileRecordStore(layout, silent).loadAll();
    assert.deepEqual(quarantined, []);
    assert.equal(loaded.length, 100);
    assert.ok(loaded.every((r) => r.state === 'exited' && Number(r.labels['n']) % 2 === 1));
    await store.close();
  });
});
