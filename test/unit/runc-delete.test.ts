// Deleting a stopped container without runc: which of runc's states tsbox deletes itself, what
// it removes, when it ends what is left in the cgroup, and when it leaves the work to runc
// delete. runc's state is written here as runc 1.1 writes it; cgroup directories are plain
// directories (rmdir is the same call). test/e2e/pods-task-api.test.ts deletes real ones.
import assert from 'node:assert/strict';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, describe, test } from 'node:test';
import { boundOf } from '../../src/runtime/bound.js';
import { type ChangeCalls, changesFor } from '../../src/base/fs-now.js';
import { deleteStoppedContainer } from '../../src/tasks/runc-delete.js';

const work = mkdtempSync(path.join(os.tmpdir(), 'tsbox-runc-delete-'));
after(() => rmSync(work, { recursive: true, force: true }));
let n = 0;
const changes = changesFor(work, (err) => assert.fail(String(err)));

/** Field 22 of /proc/self/stat: this process's start time, as runc records its init's. */
function ownStart(): number {
  const stat = readFileSync('/proc/self/stat', 'utf8');
  return Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[19]);
}

/** A runc root with one container's state, its "cgroups" (with a child) made; overrides merged in. */
function container(overrides: { state?: Record<string, unknown>; config?: Record<string, unknown>; cgroups?: Record<string, unknown>; empty?: boolean } = {}) {
  const root = path.join(work, `root${++n}`);
  const id = `c${n}`;
  const cgroupPaths = { memory: path.join(work, `memory${n}`, id), pids: path.join(work, `pids${n}`, id), '': path.join(work, `unified${n}`, id) };
  for (const dir of Object.values(cgroupPaths)) mkdirSync(overrides.empty === true ? dir : path.join(dir, 'child'), { recursive: true });
  mkdirSync(path.join(root, id), { recursive: true });
  const state = {
    id,
    init_process_pid: 2 ** 22 + 1, // above any pid_max: gone
    init_process_start: 12345,
    rootless: false,
    intel_rdt_path: '',
    cgroup_paths: cgroupPaths,
    config: {
      namespaces: [
        { type: 'NEWPID', path: '/proc/42/ns/pid' },
        { type: 'NEWNS', path: '' },
      ],
      cgroups: { path: `/k8s.io/${id}`, Systemd: false, ...overrides.cgroups },
      Hooks: null,
      ...overrides.config,
    },
    ...overrides.state,
  };
  writeFileSync(path.join(root, id, 'state.json'), JSON.stringify(state));
  writeFileSync(path.join(root, id, 'exec.fifo.gone'), '');
  const killed: string[] = [];
  const kill = (cgroup: string): Promise<void> => {
    killed.push(cgroup);
    return Promise.resolve();
  };
  const del = (calls: ChangeCalls = changes) => deleteStoppedContainer({ root, id, changes: calls, kill, bound: boundOf(1000, new AbortController().signal) });
  return { root, id, dir: path.join(root, id), cgroupPaths, killed, del };
}

describe('a stopped container deleted without runc', () => {
  test('in the pod\'s pid namespace: what is left in its cgroup is ended, every cgroup directory and runc\'s state go', async () => {
    const c = container();
    assert.equal(await c.del(), 'deleted');
    assert.deepEqual(c.killed, [`/k8s.io/${c.id}`]);
    for (const dir of Object.values(c.cgroupPaths)) assert.equal(existsSync(dir), false, `${dir} removed`);
    assert.equal(existsSync(c.dir), false, 'runc\'s state directory removed');
  });

  test('runc\'s state directory is removed through the change calls it is given (made at once where runc\'s root is a tmpfs)', async () => {
    const c = container({ empty: true });
    const made: string[] = [];
    const spy: ChangeCalls = {
      ...changes,
      unlink: (p) => (made.push(`unlink ${path.relative(c.root, p)}`), changes.unlink(p)),
      rmdir: (p) => (made.push(`rmdir ${path.relative(c.root, p)}`), changes.rmdir(p)),
      rm: (p, o) => (made.push(`rm ${path.relative(c.root, p)}`), changes.rm(p, o)),
    };
    const files = readdirSync(c.dir).map((f) => `unlink ${c.id}/${f}`);
    assert.ok(files.includes(`unlink ${c.id}/state.json`));
    assert.equal(await c.del(spy), 'deleted');
    assert.deepEqual(made, [...files, `rmdir ${c.id}`]);
    assert.equal(existsSync(c.dir), false, 'runc\'s state directory removed');
  });

  test('in the pod\'s pid namespace, its cgroup emptied already (as its holder leaves it): nothing is killed, every cgroup directory and runc\'s state go', async () => {
    const c = container({ empty: true });
    assert.equal(await c.del(), 'deleted');
    assert.deepEqual(c.killed, []);
    for (const dir of Object.values(c.cgroupPaths)) assert.equal(existsSync(dir), false, `${dir} removed`);
    assert.equal(existsSync(c.dir), false, 'runc\'s state directory removed');
  });

  test('a cgroup emptied in one hierarchy but not another: what is left is ended and every directory goes', async () => {
    const c = container({ empty: true });
    mkdirSync(path.join(c.cgroupPaths.pids, 'child'));
    assert.equal(await c.del(), 'deleted');
    assert.deepEqual(c.killed, [`/k8s.io/${c.id}`]);
    for (const dir of Object.values(c.cgroupPaths)) assert.equal(existsSync(dir), false, `${dir} removed`);
    assert.equal(existsSync(c.dir), false);
  });

  test('runc\'s state directory with more in it than its state (a directory too) goes whole', async () => {
    const c = container({ empty: true });
    mkdirSync(path.join(c.dir, 'sub'));
    writeFileSync(path.join(c.dir, 'sub', 'file'), '');
    assert.equal(await c.del(), 'deleted');
    assert.equal(existsSync(c.dir), false);
  });

  test('with a pid namespace of its own: the kernel ended the rest with its init, nothing is killed', async () => {
    const c = container({ config: { namespaces: [{ type: 'NEWPID', path: '' }] } });
    assert.equal(await c.del(), 'deleted');
    assert.deepEqual(c.killed, []);
    assert.equal(existsSync(c.dir), false);
  });

  test('deleted already (a Delete answered twice): nothing to do', async () => {
    const c = container();
    rmSync(c.dir, { recursive: true });
    assert.equal(await c.del(), 'deleted');
    assert.deepEqual(c.killed, []);
  });

  test('a cgroup directory that cannot be removed fails the delete, naming it, and runc\'s state is kept for the next try', async () => {
    const c = container();
    writeFileSync(path.join(c.cgroupPaths.memory, 'child', 'a-file'), ''); // rmdir fails: ENOTEMPTY
    await assert.rejects(c.del(), (err: Error) => err.message.includes(path.join(c.cgroupPaths.memory, 'child')));
    assert.equal(existsSync(path.join(c.dir, 'state.json')), true);
  });
});

describe('what is left to runc delete --force', () => {
  const cases: [string, Parameters<typeof container>[0]][] = [
    ['poststop hooks (runc runs them)', { config: { Hooks: { poststop: [{ path: '/bin/true' }] } } }],
    ['systemd cgroups (runc stops the unit)', { cgroups: { Systemd: true } }],
    ['an Intel RDT group', { state: { intel_rdt_path: '/sys/fs/resctrl/x' } }],
    ['a rootless container', { state: { rootless: true } }],
    ['a state this code does not know (no cgroup paths)', { state: { cgroup_paths: undefined } }],
    ['an init still running (runc kills it)', { state: { init_process_pid: process.pid, init_process_start: ownStart() } }],
  ];
  for (const [what, overrides] of cases) {
    test(what, async () => {
      const c = container(overrides);
      assert.equal(await c.del(), 'runc');
      assert.deepEqual(c.killed, []);
      assert.equal(existsSync(path.join(c.dir, 'state.json')), true, 'nothing removed');
      for (const dir of Object.values(c.cgroupPaths)) assert.equal(existsSync(dir), true, `${dir} kept`);
    });
  }

  test('a state file that is not JSON, or a state directory without one', async () => {
    const broken = container();
    writeFileSync(path.join(broken.dir, 'state.json'), '{"id": ');
    assert.equal(await broken.del(), 'runc');
    const empty = container();
    rmSync(path.join(empty.dir, 'state.json'));
    assert.equal(await empty.del(), 'runc');
    assert.equal(existsSync(empty.dir), true);
  });

  test('without a cgroup manager (no cgroups on the host)', async () => {
    const c = container();
    assert.equal(await deleteStoppedContainer({ root: c.root, id: c.id, changes, kill: undefined, bound: boundOf(1000, new AbortController().signal) }), 'runc');
  });
});
