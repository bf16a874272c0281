/**
 * The cgroup manager of this host (v1 here, v2 on the node tier's kernel) with real cgroups:
 * removeIfEmpty, the way an exited sandbox's cgroup goes, removes an empty cgroup in one step,
 * and leaves one that still holds a process or a cgroup below exactly as it was, for the long
 * way (kill, then remove) to end.
 */
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync, mkdirSync, writeFileSync } from 'node:fs';
import { after, describe, test } from 'node:test';
import { boundOf } from '../../src/runtime/bound.js';
import { type CgroupManager, detectCgroups } from '../../src/runtime/cgroups.js';
import { procInfo } from '../support/host.js';

const PARENT = `tsbox-cgroups-test-${process.pid}`;

function manager(): CgroupManager {
  const { manager: found, reason } = detectCgroups();
  assert.ok(found !== undefined, `no cgroups here: ${reason ?? 'unknown'}`);
  return found;
}

describe('cgroups: removeIfEmpty', () => {
  const cgroups = manager();
  const made: string[] = [];
  const fresh = async (name: string): Promise<{ path: string; dirs: string[] }> => {
    const path = `/${PARENT}/${name}`;
    made.push(path);
    return { path, dirs: await cgroups.create(path, undefined) };
  };
  after(async () => {
    const bound = boundOf(10_000, new AbortController().signal);
    for (const path of made) {
      await cgroups.kill(path, bound);
      await cgroups.remove(path, bound);
    }
    await cgroups.remove(`/${PARENT}`, bound);
  });

  test('an empty cgroup is removed from every hierarchy; an absent one counts as removed', async () => {
    const { path, dirs } = await fresh('empty');
    assert.ok(dirs.length > 0 && dirs.every((d) => existsSync(d)));
    assert.equal(await cgroups.removeIfEmpty(path), true);
    for (const d of dirs) assert.equal(existsSync(d), false, `${d} is gone`);
    assert.equal(await cgroups.removeIfEmpty(path), true, 'absent: nothing left to remove');
  });

  test('a cgroup that holds a process is left as it was (false); kill and remove then end it', async () => {
    const { path, dirs } = await fresh('busy');
    const child = spawn('sleep', ['1000'], { stdio: 'ignore' });
    const exited = new Promise((resolve) => child.once('exit', resolve));
    const pid = child.pid ?? 0;
    for (const d of dirs) writeFileSync(`${d}/cgroup.procs`, String(pid));
    assert.equal(await cgroups.removeIfEmpty(path), false);
    for (const d of dirs) assert.equal(existsSync(d), true, `${d} is still there`);
    assert.notEqual(procInfo(pid), undefined, 'the process runs on');
    assert.deepEqual(await cgroups.pids(path), [pid]);
    const bound = boundOf(10_000, new AbortController().signal);
    await cgroups.kill(path, bound);
    await exited;
    await cgroups.remove(path, bound);
    for (const d of dirs) assert.equal(existsSync(d), false, `${d} is gone`);
  });

  test('a cgroup busy in one hierarchy only: the empty ones go, the busy one stays (false), and remove then ends it', async () => {
    const { path, dirs } = await fresh('partly');
    const [busy, ...empty] = dirs as [string, ...string[]];
    mkdirSync(`${busy}/below`);
    assert.equal(await cgroups.removeIfEmpty(path), false);
    assert.equal(existsSync(`${busy}/below`), true, `${busy}/below is still there`);
    for (const d of empty) assert.equal(existsSync(d), false, `${d} (empty) is gone`);
    const bound = boundOf(10_000, new AbortController().signal);
    await cgroups.kill(path, bound);
    await cgroups.remove(path, bound);
    assert.equal(existsSync(busy), false, `${busy} is gone`);
  });

  test('a cgroup with a cgroup below it is left as it was (false)', async () => {
    const { path, dirs } = await fresh('parent');
    for (const d of dirs) mkdirSync(`${d}/below`);
    assert.equal(await cgroups.removeIfEmpty(path), false);
    for (const d of dirs) assert.equal(existsSync(`${d}/below`), true, `${d}/below is still there`);
    await cgroups.remove(path, boundOf(10_000, new AbortController().signal));
    for (const d of dirs) assert.equal(existsSync(d), false, `${d} is gone`);
  });
});
