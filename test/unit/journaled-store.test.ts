// Records behind a group-commit journal, on real files in temp dirs: every acknowledged
// change survives the loss of the record files the journal stands in front of, changes of a
// sandbox keep their order across flushes and rotations, one fdatasync covers many changes,
// a torn journal end is ignored and a damaged line in the middle is skipped and logged, and
// unreadable records without journal entries are quarantined as RecordFiles does.
import assert from 'node:assert/strict';
import { appendFile, mkdir, mkdtemp, readFile, readdir, rm, stat, writeFile, type FileHandle } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, test, type TestContext } from 'node:test';
import { pino, type Logger } from 'pino';
import type { SandboxRecord } from '../../src/controller/types.js';
import { RecordFiles } from '../../src/state/record-files.js';
import { decodeJournal, decodeLine, encodeEntry } from '../../src/state/journal.js';
import { JournaledRecordStore, type JournaledStoreOptions } from '../../src/state/journaled-store.js';
import { stateLayout, type StateLayout } from '../../src/state/layout.js';
import { Gate, makeRecord } from '../support/fakes.js';

interface LogLine {
  readonly level: number;
  readonly msg: string;
  readonly file?: string;
  readonly line?: number;
  readonly reason?: string;
  readonly movedTo?: string;
}

function capturingLogger(level = 'info'): { logger: Logger; lines: LogLine[] } {
  const lines: LogLine[] = [];
  const logger = pino({ level }, { write: (line: string) => lines.push(JSON.parse(line) as LogLine) });
  return { logger, lines };
}

async function tempLayout(t: TestContext): Promise<StateLayout> {
  const root = await mkdtemp(join(tmpdir(), 'tsbox-journal-'));
  t.after(() => rm(root, { recursive: true, force: true }));
  return stateLayout(root);
}

/**
 * Stores a test dropped without close() to stand for a crash stay referenced here, so that
 * garbage collection does not close their files behind them during the run.
 */
const crashed: JournaledRecordStore[] = [];
/** Files whose fsync a test made hang forever; referenced for the same reason. */
const stuck: FileHandle[] = [];

interface Opened {
  readonly store: JournaledRecordStore;
  readonly lines: LogLine[];
  /** fdatasyncs of the journal so far. */
  readonly flushes: () => number;
}

/**
 * A store on `layout`. Dropping it without close() once settled() has resolved is a crash
 * as far as the files are concerned: it writes nothing more (no timer runs: the interval
 * checkpoint is off).
 */
function openStore(layout: StateLayout, options: JournaledStoreOptions = {}, level = 'info'): Opened {
  const { logger, lines } = capturingLogger(level);
  let flushes = 0;
  const store = new JournaledRecordStore(layout, logger, {
    checkpointIntervalMs: 0,
    preallocateBytes: 64 * 1024,
    datasync: async (handle) => {
      flushes++;
      await handle.datasync();
    },
    ...options,
  });
  crashed.push(store);
  return { store, lines, flushes: () => flushes };
}

const record = (namespace: string, id: string, n: number, extra: Partial<SandboxRecord> = {}): SandboxRecord =>
  makeRecord({ namespace, id, state: 'created', labels: { n: String(n) }, ...extra });

const byKey = (records: readonly SandboxRecord[]): Map<string, SandboxRecord> =>
  new Map(records.map((r) => [`${r.namespace}/${r.id}`, r]));

const journalPath = (layout: StateLayout): string => join(layout.root, 'journal');

async function journalFiles(layout: StateLayout): Promise<string[]> {
  // journal.new is the next journal file, prepared empty in advance.
  return (await readdir(layout.root)).filter((name) => name.startsWith('journal') && name !== 'journal.new').sort();
}

/** Lines in the active journal (the file itself is preallocated with zeros). */
async function journalLines(layout: StateLayout): Promise<number> {
  return (await journalEntries(layout)).length;
}

async function journalEntries(layout: StateLayout): Promise<ReturnType<typeof decodeJournal>['entries']> {
  return decodeJournal(await readFile(journalPath(layout))).entries;
}

/** Rejects when `promise` takes longer than `ms`. */
async function within<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out: ${what}`)), ms);
  });
  try {
    return await Promise.race([promise, timeout]);
  } finally {
    clearTimeout(timer);
  }
}

/**
 * A journal fdatasync that counts its calls; the first one waits for `gate` (a flush stuck on
 * disk), then fails with EIO when `fail` is set.
 */
function firstFlushHeld(gate: Gate, fail = false): { datasync: (handle: FileHandle) => Promise<void>; calls: () => number } {
  let calls = 0;
  return {
    calls: () => calls,
    datasync: async (handle) => {
      calls++;
      if (calls === 1) {
        await gate.wait();
        if (fail) throw Object.assign(new Error('EIO: i/o error, fdatasync'), { code: 'EIO' });
      }
      await handle.datasync();
    },
  };
}

/** fsyncs of record files and their directories wait for `gate`: a checkpoint stuck on disk. */
const recordFsyncsWaitFor =
  (layout: StateLayout, gate: Gate) =>
  async (handle: FileHandle, path: string): Promise<void> => {
    if (path.startsWith(layout.sandboxes)) await gate.wait();
    await handle.sync();
  };

describe('journal lines', () => {
  test('a line is JSON with its seq, op and a checksum; any changed bit is detected', () => {
    const entry = { seq: 7, op: 'save' as const, record: record('k8s.io', 'line', 1, { annotations: { note: 'héllo ✓' } }) };
    const line = encodeEntry(entry);
    assert.ok(line.endsWith('\n'));
    const json = JSON.parse(line) as { seq: number; op: string; crc: string };
    assert.equal(json.seq, 7);
    assert.equal(json.op, 'save');
    assert.match(json.crc, /^[0-9a-f]{8}$/);
    const bytes = Buffer.from(line.slice(0, -1));
    assert.deepEqual(decodeLine(bytes), { ok: true, entry });
    for (let i = 0; i < bytes.length; i++) {
      for (const bit of [0x01, 0x20, 0x80]) {
        const damaged = Buffer.from(bytes);
        damaged[i] = (damaged[i] as number) ^ bit;
        assert.equal(decodeLine(damaged).ok, false, `byte ${i} bit ${bit} changed`);
      }
    }
    const remove = encodeEntry({ seq: 8, op: 'remove', namespace: 'k8s.io', id: 'line' });
    assert.deepEqual(decodeLine(Buffer.from(remove.slice(0, -1))), { ok: true, entry: { seq: 8, op: 'remove', namespace: 'k8s.io', id: 'line' } });
  });
});

describe('JournaledRecordStore', () => {
  test('saved records load back exactly, also in a new store after close()', async (t) => {
    const layout = await tempLayout(t);
    const { store } = openStore(layout);
    assert.deepEqual(await store.loadAll(), { records: [], quarantined: [] });
    const full = makeRecord({
      namespace: 'k8s.io',
      id: 'abc123',
      state: 'exited',
      registeredAt: { seconds: 1_700_000_000, nanos: 1 },
      startedAt: { seconds: 1_700_000_010, nanos: 999_999_999 },
      pid: 0,
      launch: { hostname: 'web-0', netnsPath: '/var/run/netns/cni-1', command: { args: ['/bin/sleep', 'infinity'], env: ['PATH=/bin'], cwd: '/' } },
      labels: { app: 'web' },
      annotations: { 'io.kubernetes.cri.sandbox-name': 'web-0' },
      extensions: { metadata: { typeUrl: 'github.com/containerd/cri/pkg/store/sandbox/Metadata', value: 'e30=' } },
      backend: { supervisorPid: 1234, cgroup: '/sys/fs/cgroup/tsbox/k8s.io-abc123' },
      exit: { status: 137, exitedAt: { seconds: 1_700_000_020, nanos: 5 }, reason: 'killed' },
    });
    const plain = record('default', 'plain', 0);
    await store.save(full);
    await store.save(plain);
    await store.close();
    await assert.rejects(store.save(plain), /closed/);

    const again = openStore(layout).store;
    const loaded = await again.loadAll();
    assert.deepEqual(loaded.quarantined, []);
    assert.equal(loaded.records.length, 2);
    assert.deepEqual(byKey(loaded.records).get('k8s.io/abc123'), full);
    assert.deepEqual(byKey(loaded.records).get('default/plain'), plain);
    // The operator's view is unchanged: one record.json per sandbox directory.
    assert.deepEqual(JSON.parse(await readFile(join(layout.sandboxDir('k8s.io', 'abc123'), 'record.json'), 'utf8')), full);
    assert.deepEqual(await journalFiles(layout), ['journal'], 'one journal, no leftovers');
    assert.equal(await journalLines(layout), 0, 'replayed into the files and emptied');
    await again.close();
  });

  test('saves made before loadAll() wait for the previous run to be replayed and come after it', async (t) => {
    const layout = await tempLayout(t);
    const first = openStore(layout).store;
    await first.save(record('k8s.io', 'old', 1));
    await first.save(record('k8s.io', 'both', 1));
    await first.settled(); // then it crashes: no close, and it writes nothing more
    const second = openStore(layout).store;
    await second.save(record('k8s.io', 'both', 2));
    await second.save(record('k8s.io', 'new', 1));
    const loaded = byKey((await second.loadAll()).records);
    assert.deepEqual([...loaded.keys()].sort(), ['k8s.io/both', 'k8s.io/new', 'k8s.io/old']);
    assert.deepEqual(loaded.get('k8s.io/both')?.labels, { n: '2' });
    await second.close();
  });

  test('concurrent saves of one sandbox: the last one wins, in the file and after a crash', async (t) => {
    const layout = await tempLayout(t);
    const { store } = openStore(layout);
    await store.loadAll();
    await Promise.all(Array.from({ length: 25 }, (_, i) => store.save(record('k8s.io', 'busy', i))));
    await store.settled();
    // The journal has all 25 in issue order; until a checkpoint, no file.
    assert.deepEqual(
      (await journalEntries(layout)).map((e) => (e.op === 'save' ? e.record.labels.n : 'remove')),
      Array.from({ length: 25 }, (_, i) => String(i)),
    );
    await assert.rejects(readdir(layout.sandboxDir('k8s.io', 'busy')), { code: 'ENOENT' });
    // Crash now: the next start writes the last one.
    const { records } = await openStore(layout).store.loadAll();
    assert.equal(records.length, 1);
    assert.deepEqual(records[0]?.labels, { n: '24' });
    const file = JSON.parse(await readFile(join(layout.sandboxDir('k8s.io', 'busy'), 'record.json'), 'utf8')) as SandboxRecord;
    assert.deepEqual(file.labels, { n: '24' });
    assert.deepEqual(await readdir(layout.sandboxDir('k8s.io', 'busy')), ['record.json'], 'no temp file left');
  });

  test('remove takes the sandbox directory, and its namespace directory once empty, before it resolves', async (t) => {
    const layout = await tempLayout(t);
    const { store } = openStore(layout);
    await store.loadAll();
    await store.save(record('k8s.io', 'one', 0));
    await store.save(record('k8s.io', 'two', 0));
    await store.checkpoint();
    await writeFile(join(layout.sandboxDir('k8s.io', 'one'), 'console.log'), 'left by the sandbox');

    await store.remove('k8s.io', 'one');
    assert.deepEqual(await readdir(join(layout.sandboxes, 'k8s.io')), ['two'], 'gone at once, the sibling keeps the namespace');
    await store.remove('k8s.io', 'two');
    assert.deepEqual(await readdir(layout.sandboxes), [], 'the empty namespace directory is gone');
    await store.remove('k8s.io', 'never');
    await store.settled();

    // A crash that lost the deletion (not yet durable) brings the directory back: the journal removes it again.
    await mkdir(layout.sandboxDir('k8s.io', 'one'), { recursive: true });
    await writeFile(join(layout.sandboxDir('k8s.io', 'one'), 'record.json'), JSON.stringify(record('k8s.io', 'one', 0)));
    const { records, quarantined } = await openStore(layout).store.loadAll();
    assert.deepEqual(records, []);
    assert.deepEqual(quarantined, []);
    assert.deepEqual(await readdir(layout.sandboxes), []);
  });

  test('group commit: changes that arrive while two flushes are on disk share the next one', async (t) => {
    const layout = await tempLayout(t);
    const { store, flushes } = openStore(layout);
    await store.loadAll();

    await Promise.all(Array.from({ length: 100 }, (_, i) => store.save(record(`ns${i % 4}`, `sb${i}`, i))));
    assert.ok(flushes() <= 2, `100 concurrent saves took ${flushes()} fdatasyncs`);
    assert.equal((await journalEntries(layout)).length, 100);

    // The first flush hangs on disk. The next change starts a second flush at once (it does
    // not wait for one it is not part of); the 49 after it, from different turns, share a third.
    const gate = new Gate();
    const held = firstFlushHeld(gate);
    const layout2 = await tempLayout(t);
    const gated = openStore(layout2, { datasync: held.datasync }).store;
    await gated.loadAll();
    const answered: string[] = [];
    const first = gated.save(record('k8s.io', 'first', 0)).then(() => void answered.push('first'));
    const more: Promise<void>[] = [];
    for (let i = 0; i < 50; i++) {
      await new Promise<void>((resolve) => setImmediate(resolve));
      more.push(gated.save(record('k8s.io', `later${i}`, i)).then(() => void answered.push(`later${i}`)));
    }
    assert.equal(held.calls(), 2, 'two flushes on disk at once, no more');
    assert.deepEqual(answered, [], 'nothing is answered before the flushes before it land');
    gate.open();
    await Promise.all([first, ...more]);
    assert.equal(held.calls(), 3);
    assert.deepEqual(answered, ['first', ...Array.from({ length: 50 }, (_, i) => `later${i}`)], 'answered in order');
    assert.equal((await journalEntries(layout2)).length, 51);
    await store.close();
    await gated.close();
  });

  test('changes of a sandbox keep their order across a flush boundary', async (t) => {
    const layout = await tempLayout(t);
    const gate = new Gate();
    const held = firstFlushHeld(gate);
    const { store } = openStore(layout, { datasync: held.datasync });
    await store.loadAll();
    const done: string[] = [];
    const track = (name: string, p: Promise<void>): Promise<void> => p.then(() => void done.push(name));
    const ops = [track('a0', store.save(record('k8s.io', 'a', 0)))];
    await new Promise<void>((resolve) => setImmediate(resolve)); // the first flush is now waiting on disk
    ops.push(
      track('a1', store.save(record('k8s.io', 'a', 1))),
      track('b0', store.save(record('k8s.io', 'b', 0))),
      track('a-rm', store.remove('k8s.io', 'a')),
      track('a2', store.save(record('k8s.io', 'a', 2))),
      track('b-rm', store.remove('k8s.io', 'b')),
    );
    gate.open();
    await Promise.all(ops);
    assert.equal(held.calls(), 2, 'two flushes');
    assert.deepEqual(done.slice(0, 3), ['a0', 'a1', 'b0'], 'saves resolve in order');
    assert.deepEqual(
      (await journalEntries(layout)).map((e) => `${e.seq}:${e.op === 'save' ? `${e.record.id}${e.record.labels.n}` : `rm-${e.id}`}`),
      ['1:a0', '2:a1', '3:b0', '4:rm-a', '5:a2', '6:rm-b'],
    );
    await store.settled();
    // Crash now: the replay gives each sandbox its last change.
    const { records } = await openStore(layout).store.loadAll();
    assert.deepEqual(records.map((r) => `${r.id}${r.labels.n}`), ['a2']);
    const file = JSON.parse(await readFile(join(layout.sandboxDir('k8s.io', 'a'), 'record.json'), 'utf8')) as SandboxRecord;
    assert.deepEqual(file.labels, { n: '2' });
    await assert.rejects(readdir(layout.sandboxDir('k8s.io', 'b')), { code: 'ENOENT' });
  });

  test('crash before the record files reached the disk: a new store rebuilds them all from the journal', async (t) => {
    const layout = await tempLayout(t);
    const { store } = openStore(layout);
    await store.loadAll();
    const expected = new Map<string, SandboxRecord>();
    const nsOf = (i: number): string => (i % 3 === 0 ? 'default' : 'k8s.io');
    // Every sandbox has a record file from an earlier checkpoint ...
    await Promise.all(Array.from({ length: 24 }, (_, i) => store.save(record(nsOf(i), `sb${i}`, 0))));
    await store.checkpoint();
    // ... and then changes that only the journal holds.
    await Promise.all(
      Array.from({ length: 24 }, async (_, i) => {
        const ns = nsOf(i);
        const id = `sb${i}`;
        await store.save(record(ns, id, 1, { state: 'running', pid: 100 + i, startedAt: { seconds: 1_700_000_100 + i, nanos: 0 } }));
        if (i % 4 === 0) await store.remove(ns, id);
        else expected.set(`${ns}/${id}`, record(ns, id, 1, { state: 'running', pid: 100 + i, startedAt: { seconds: 1_700_000_100 + i, nanos: 0 } }));
      }),
    );
    await store.settled();
    // No checkpoint ran: the files are as a crash may leave them. Some are gone, some torn,
    // some empty, some directories never made it, the 'default' namespace vanished whole.
    let n = 0;
    for (const key of expected.keys()) {
      const [ns, id] = key.split('/') as [string, string];
      const file = join(layout.sandboxDir(ns, id), 'record.json');
      if (ns === 'default') continue;
      switch (n++ % 4) {
        case 0: await rm(file, { force: true }); break;
        case 1: await writeFile(file, (await readFile(file, 'utf8')).slice(0, 30)); break;
        case 2: await writeFile(file, ''); break;
        case 3: await rm(layout.sandboxDir(ns, id), { recursive: true }); break;
      }
    }
    await rm(join(layout.sandboxes, 'default'), { recursive: true });

    const reopened = openStore(layout);
    const loaded = await reopened.store.loadAll();
    assert.deepEqual(loaded.quarantined, [], 'the journal heals what it holds; nothing is quarantined');
    assert.deepEqual(byKey(loaded.records), expected);
    await assert.rejects(readdir(layout.quarantine), { code: 'ENOENT' });
    for (const [key, value] of expected) {
      const [ns, id] = key.split('/') as [string, string];
      assert.deepEqual(JSON.parse(await readFile(join(layout.sandboxDir(ns, id), 'record.json'), 'utf8')), value, `${key} rewritten`);
    }
    assert.ok(reopened.lines.some((l) => l.msg === 'journal replayed into the record files'));
    assert.equal(await journalLines(layout), 0);
    // And now the files alone carry the state.
    assert.deepEqual(byKey((await new RecordFiles(layout, capturingLogger().logger).loadAll()).records), expected);
  });

  test('a torn final journal line is ignored: it was never acknowledged', async (t) => {
    const layout = await tempLayout(t);
    const { store } = openStore(layout);
    await store.loadAll();
    await store.save(record('k8s.io', 'a', 1));
    await store.save(record('k8s.io', 'b', 1));
    await store.settled();
    const ghost = encodeEntry({ seq: 3, op: 'save', record: record('k8s.io', 'ghost', 1) });
    await appendFile(journalPath(layout), ghost.slice(0, ghost.length - 20));
    await rm(layout.sandboxDir('k8s.io', 'a'), { recursive: true, force: true });

    const reopened = openStore(layout);
    const { records, quarantined } = await reopened.store.loadAll();
    assert.deepEqual(quarantined, []);
    assert.deepEqual([...byKey(records).keys()].sort(), ['k8s.io/a', 'k8s.io/b']);
    const warning = reopened.lines.find((l) => l.file === journalPath(layout));
    assert.ok(warning !== undefined, 'the torn end is logged');
    assert.equal(warning.level, 40);
    assert.equal(warning.line, 3);
    assert.ok(!reopened.lines.some((l) => l.level >= 50), 'not an error');
  });

  test('a corrupt line in the middle is logged with its line number and skipped; the lines after it count', async (t) => {
    const layout = await tempLayout(t);
    const { store } = openStore(layout);
    await store.loadAll();
    await store.save(record('k8s.io', 'a', 1));
    await store.save(record('k8s.io', 'b', 1));
    await store.save(record('k8s.io', 'c', 1));
    await store.save(record('k8s.io', 'b', 2));
    await store.settled();
    const lines = (await readFile(journalPath(layout), 'utf8')).split('\n');
    lines[1] = (lines[1] as string).replace('"n":"1"', '"n":"9"'); // valid JSON, wrong checksum
    await writeFile(journalPath(layout), lines.join('\n'));
    await rm(layout.sandboxDir('k8s.io', 'a'), { recursive: true, force: true });
    await rm(layout.sandboxDir('k8s.io', 'c'), { recursive: true, force: true });

    const reopened = openStore(layout);
    const { records } = await reopened.store.loadAll();
    const loaded = byKey(records);
    assert.deepEqual([...loaded.keys()].sort(), ['k8s.io/a', 'k8s.io/b', 'k8s.io/c']);
    assert.deepEqual(loaded.get('k8s.io/b')?.labels, { n: '2' }, 'the later line of b still applies');
    const error = reopened.lines.find((l) => l.file === journalPath(layout));
    assert.ok(error !== undefined, 'the corrupt line is logged');
    assert.equal(error.level, 50);
    assert.equal(error.line, 2);
    assert.match(error.reason ?? '', /checksum/);
  });

  test('rotation and checkpoints under concurrent changes lose nothing', async (t) => {
    const layout = await tempLayout(t);
    let frozen = false;
    let checkpointSyncs = 0;
    const { store, lines } = openStore(
      layout,
      {
        checkpointEntries: 5,
        fsync: async (handle: FileHandle, path: string) => {
          if (path.startsWith(layout.sandboxes)) {
            checkpointSyncs++;
            // A checkpoint stuck on a slow disk: its fsyncs never finish.
            if (frozen) {
              stuck.push(handle);
              await new Promise<never>(() => undefined);
            }
          }
          await handle.sync();
        },
      },
      'debug',
    );
    await store.loadAll();
    const expected = new Map<string, SandboxRecord>();
    /** One sandbox's life as the controller drives it: its changes one after another. */
    const lifecycle = async (ns: string, id: string, n: number, removed: boolean): Promise<void> => {
      await store.save(record(ns, id, n));
      await store.save(record(ns, id, n, { state: 'running', pid: n }));
      await store.save(record(ns, id, n, { state: 'exited', exit: { status: 0, exitedAt: { seconds: n, nanos: 0 }, reason: 'done' } }));
      if (removed) {
        await store.remove(ns, id);
        expected.delete(`${ns}/${id}`);
      } else {
        expected.set(`${ns}/${id}`, record(ns, id, n, { state: 'exited', exit: { status: 0, exitedAt: { seconds: n, nanos: 0 }, reason: 'done' } }));
      }
    };

    // Phase 1: many rotations, checkpoints running while saves go on.
    await Promise.all(Array.from({ length: 40 }, (_, i) => lifecycle(`ns${i % 3}`, `sb${i}`, i, i % 3 === 0)));
    await store.checkpoint();
    assert.ok(lines.filter((l) => l.msg === 'checkpoint done').length >= 2, 'checkpoints ran');
    assert.ok(checkpointSyncs > 0);
    assert.deepEqual(await journalFiles(layout), ['journal'], 'every retired journal was deleted');
    assert.equal(await journalLines(layout), 0);

    // Phase 2: checkpoints hang; rotations go on and neither saves nor removes wait for them.
    frozen = true;
    const touched = new Set<string>();
    await within(
      Promise.all(
        Array.from({ length: 40 }, (_, i) => {
          const ns = `ns${i % 3}`;
          const id = `sb${i + 20}`; // half of them lived in phase 1
          touched.add(`${ns}/${id}`);
          return lifecycle(ns, id, 1000 + i, i % 4 === 0);
        }),
      ),
      10_000,
      'changes while a checkpoint hangs',
    );
    await store.settled();
    const retired = (await journalFiles(layout)).filter((name) => name !== 'journal');
    assert.ok(retired.length >= 2, `several retired journals wait for their checkpoint: ${retired.join(' ')}`);

    // Crash now. Whatever phase 2 wrote to the record files was never made durable: lose it all.
    for (const key of touched) {
      const [ns, id] = key.split('/') as [string, string];
      await rm(layout.sandboxDir(ns, id), { recursive: true, force: true });
    }
    const { records, quarantined } = await openStore(layout).store.loadAll();
    assert.deepEqual(quarantined, []);
    assert.deepEqual(byKey(records), expected);
    assert.deepEqual(await journalFiles(layout), ['journal']);
  });

  test('a checkpoint waiting on the disk holds up neither saves nor removes of the sandboxes it covers', async (t) => {
    const layout = await tempLayout(t);
    const gate = new Gate();
    const { store } = openStore(layout, {
      checkpointEntries: 10,
      fsync: recordFsyncsWaitFor(layout, gate),
    });
    await store.loadAll();
    await Promise.all(Array.from({ length: 10 }, (_, i) => store.save(record('k8s.io', `sb${i}`, 0))));
    // The journal is full: it is retired and its checkpoint waits at the gate.
    const checkpoint = store.checkpoint();
    await within(
      Promise.all(Array.from({ length: 10 }, (_, i) => (i % 2 === 0 ? store.remove('k8s.io', `sb${i}`) : store.save(record('k8s.io', `sb${i}`, 1))))),
      5000,
      'changes during a checkpoint',
    );
    gate.open();
    await checkpoint;
    const { records } = await store.loadAll();
    assert.deepEqual(
      records.map((r) => `${r.id}:${r.labels.n}`).sort(),
      ['sb1:1', 'sb3:1', 'sb5:1', 'sb7:1', 'sb9:1'],
    );
    await store.close();
  });

  test('a failed journal write refuses its changes; later ones go to a new journal file', async (t) => {
    const layout = await tempLayout(t);
    let calls = 0;
    const { store, lines } = openStore(layout, {
      datasync: async (handle) => {
        calls++;
        if (calls === 2) throw Object.assign(new Error('EIO: i/o error, fdatasync'), { code: 'EIO' });
        await handle.datasync();
      },
    });
    await store.loadAll();
    await store.save(record('k8s.io', 'a', 1));
    await assert.rejects(store.save(record('k8s.io', 'refused', 1)), /EIO/);
    await store.settled();
    for (const name of await journalFiles(layout)) {
      const text = await readFile(join(layout.root, name), 'utf8').catch(() => '');
      assert.doesNotMatch(text, /refused/, `the refused line is taken out of ${name} again`);
    }
    await store.save(record('k8s.io', 'c', 1));
    assert.ok(lines.some((l) => l.level === 50 && l.msg.includes('journal write failed')));
    const { records } = await store.loadAll();
    assert.deepEqual(records.map((r) => r.id).sort(), ['a', 'c']);
    assert.deepEqual(await journalFiles(layout), ['journal']);
    await store.close();
    // Nothing of the refused change is replayed either.
    const { records: again } = await openStore(layout).store.loadAll();
    assert.deepEqual(again.map((r) => r.id).sort(), ['a', 'c']);
  });

  test('a failed flush also refuses the flush in flight after it; neither is replayed', async (t) => {
    const layout = await tempLayout(t);
    const gate = new Gate();
    const held = firstFlushHeld(gate, true);
    const { store } = openStore(layout, { datasync: held.datasync });
    await store.loadAll();
    const a = store.save(record('k8s.io', 'a', 1));
    await new Promise<void>((resolve) => setImmediate(resolve));
    const b = store.save(record('k8s.io', 'b', 1));
    await new Promise<void>((resolve) => setImmediate(resolve));
    assert.equal(held.calls(), 2, 'both flushes are on disk');
    gate.open();
    await assert.rejects(a, /EIO/);
    await assert.rejects(b, /an earlier journal write failed/);
    await store.save(record('k8s.io', 'c', 1));
    assert.deepEqual((await store.loadAll()).records.map((r) => r.id), ['c']);
    await store.close();
    assert.deepEqual((await openStore(layout).store.loadAll()).records.map((r) => r.id), ['c']);
  });

  test('after close() the record files alone hold the state: edits made while tsbox is stopped count', async (t) => {
    const layout = await tempLayout(t);
    const gate = new Gate();
    const { store } = openStore(layout, {
      checkpointEntries: 20,
      fsync: recordFsyncsWaitFor(layout, gate),
    });
    await store.loadAll();
    await Promise.all(Array.from({ length: 20 }, (_, i) => store.save(record('k8s.io', `old${i}`, i))));
    // A background checkpoint now waits on the disk; more changes follow it.
    for (const id of ['forgotten', 'corrupted', 'edited', 'kept']) await store.save(record('k8s.io', id, 1));
    const closed = store.close();
    await new Promise<void>((resolve) => setTimeout(resolve, 20));
    assert.deepEqual(await journalFiles(layout), ['journal', 'journal.1', 'journal.2'], 'close() retired the rest and waits');
    gate.open();
    await closed;
    assert.deepEqual(await journalFiles(layout), ['journal']);
    assert.equal(await journalLines(layout), 0, 'nothing left to replay');

    // The operator, while tsbox is stopped:
    await rm(layout.sandboxDir('k8s.io', 'forgotten'), { recursive: true });
    await writeFile(join(layout.sandboxDir('k8s.io', 'corrupted'), 'record.json'), '{"torn');
    await writeFile(join(layout.sandboxDir('k8s.io', 'edited'), 'record.json'), JSON.stringify(record('k8s.io', 'edited', 2)));

    const { records, quarantined } = await openStore(layout).store.loadAll();
    const loaded = byKey(records);
    assert.equal(loaded.size, 22);
    assert.ok(!loaded.has('k8s.io/forgotten'));
    assert.deepEqual(loaded.get('k8s.io/edited')?.labels, { n: '2' });
    assert.deepEqual(loaded.get('k8s.io/kept')?.labels, { n: '1' });
    assert.deepEqual(quarantined, [{ namespace: 'k8s.io', id: 'corrupted', leftover: true }]);
  });

  test('close() writes what is queued, finishes the files and refuses later changes', async (t) => {
    const layout = await tempLayout(t);
    const { store } = openStore(layout);
    await store.loadAll();
    const saves = Array.from({ length: 20 }, (_, i) => store.save(record('k8s.io', `sb${i}`, i)));
    await store.close();
    await Promise.all(saves);
    assert.equal((await readdir(join(layout.sandboxes, 'k8s.io'))).length, 20, 'the record files are written');
    await assert.rejects(store.remove('k8s.io', 'sb0'), /closed/);
    await store.close();
    assert.equal((await openStore(layout).store.loadAll()).records.length, 20);
  });
});

describe('JournaledRecordStore between checkpoints (as the daemon runs it)', () => {
  test('a journal file is preallocated: appends do not grow it, and a crash loses none of its lines', async (t) => {
    const layout = await tempLayout(t);
    const first = openStore(layout, { preallocateBytes: 256 * 1024 });
    await first.store.loadAll();
    const size = (await stat(journalPath(layout))).size;
    assert.equal(size, 256 * 1024, 'written with zeros before it takes a line');
    await Promise.all(Array.from({ length: 50 }, (_, n) => first.store.save(record('k8s.io', `sb${n}`, n))));
    await first.store.settled();
    assert.equal((await stat(journalPath(layout))).size, size, 'the appends went into the zeros');
    assert.equal(await journalLines(layout), 50);
    assert.ok((await readdir(layout.root)).includes('journal.new'), 'the next journal file is prepared');
    // Crash: the lines before the zeros are replayed; the zeros are no torn line.
    const second = openStore(layout, { preallocateBytes: 256 * 1024 });
    assert.equal((await second.store.loadAll()).records.length, 50);
    assert.ok(!second.lines.some((l) => l.level >= 40), 'nothing to warn about');
    await second.store.close();
    assert.ok(!(await readdir(layout.root)).includes('journal.new'), 'a clean stop leaves no spare behind');
  });

  test('a sandbox that comes and goes within one journal generation never costs a file or an fsync', async (t) => {
    const layout = await tempLayout(t);
    const synced: string[] = [];
    const { store, flushes } = openStore(layout, {
      fsync: async (handle: FileHandle, path: string) => {
        synced.push(path);
        await handle.sync();
      },
    });
    await store.loadAll();
    synced.length = 0;
    const before = flushes();
    await Promise.all(
      Array.from({ length: 20 }, async (_, n) => {
        await store.save(record('k8s.io', `sb${n}`, 0));
        await store.save(record('k8s.io', `sb${n}`, 1, { state: 'running', pid: 100 + n }));
        await store.remove('k8s.io', `sb${n}`);
      }),
    );
    assert.ok(flushes() - before < 60, `changes were group-committed (${flushes() - before} flushes for 60)`);
    assert.deepEqual(await readdir(layout.sandboxes), [], 'no directory was made');
    await store.checkpoint();
    assert.deepEqual(
      synced.filter((path) => path.startsWith(layout.sandboxes)),
      [],
      'the checkpoint had nothing of theirs to write or fsync',
    );
    assert.deepEqual((await store.loadAll()).records, []);
    await store.close();
  });

  test('a save reaches its record file at the next checkpoint, and a crash before it loses nothing', async (t) => {
    const layout = await tempLayout(t);
    const first = openStore(layout);
    await first.store.loadAll();
    const file = join(layout.sandboxDir('k8s.io', 'pod'), 'record.json');
    const read = async (): Promise<string | undefined> => (JSON.parse(await readFile(file, 'utf8')) as SandboxRecord).labels['n'];
    await first.store.save(record('k8s.io', 'pod', 1));
    await first.store.checkpoint();
    assert.equal(await read(), '1');
    await first.store.save(record('k8s.io', 'pod', 2, { state: 'exited' }));
    await first.store.settled();
    assert.equal(await read(), '1', 'the file waits for the next checkpoint');
    // Dropped without close(): the second save is only in the journal.
    const second = openStore(layout);
    const loaded = await second.store.loadAll();
    assert.equal(loaded.records.length, 1);
    assert.equal(loaded.records[0]?.labels['n'], '2');
    assert.equal(loaded.records[0]?.state, 'exited');
    assert.equal(await read(), '2', 'the replay wrote it');
    await second.store.close();
  });
});
