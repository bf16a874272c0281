/**
 * A sandbox whose processes cannot die in time (held in a frozen cgroup v1 freezer cgroup below
 * its own): Stop fails within kill_timeout_ms naming the cgroup and the pid, and works once the
 * process can die. A cgroup v1 node's test (on cgroup v2 a SIGKILL passes a frozen cgroup, so
 * nothing holds a process there this way): it fails elsewhere, saying so.
 */
import assert from 'node:assert/strict';
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { describe, test } from 'node:test';
import { sandboxCgroupDirs, sandboxCgroupName, uniqueNamespace } from '../support/host.js';
import { startSandboxerDaemon, tsboxSandboxer, waitFor } from '../support/tsbox-daemon.js';
import { GrpcStatus, expectCode } from '../support/grpc-client.js';
import { alive, createAndStart, ociSpec, withLog } from './fixtures.js';

const IGNORES_TERM = 'trap "" TERM; while :; do sleep 0.1; done';

function shSandbox(id: string, script: string) {
  return { sandbox: { sandboxId: id, runtime: { name: 'io.containerd.tsbox.v1' }, spec: ociSpec(['sh', '-c', script]) } };
}

/** Where the cgroup v1 freezer hierarchy is mounted. */
function freezerMount(): string {
  for (const line of readFileSync('/proc/self/mountinfo', 'utf8').split('\n')) {
    const [left, right] = line.split(' - ');
    const [type, , options] = (right ?? '').split(' ');
    const mountPoint = left?.split(' ')[4];
    if (type === 'cgroup' && mountPoint !== undefined && (options ?? '').split(',').includes('freezer')) return mountPoint;
  }
  throw new Error('this test freezes a process with the cgroup v1 freezer, which is not mounted here (a cgroup v2 node lets SIGKILL through a frozen cgroup)');
}

describe('processes that outlive SIGKILL', () => {
  test('Stop fails within kill_timeout_ms naming the cgroup and the pid left; once it can die, Stop and Shutdown work', async () => {
    const killTimeoutMs = 600;
    const daemon = await startSandboxerDaemon(tsboxSandboxer({ args: ['--kill-timeout-ms', String(killTimeoutMs)] }), { label: 'tsbox-stuck-' });
    const ns = uniqueNamespace('stuck');
    try {
      await withLog(daemon, async () => {
        const client = daemon.client(ns);
        const id = 'frozen';
        const { pid } = await createAndStart(daemon, client, id, shSandbox(id, IGNORES_TERM));
        // A cgroup of its own below the sandbox's, frozen: a SIGKILL stays pending until it is
        // thawed, and thawing the sandbox's cgroup does not thaw it.
        const held = path.join(freezerMount(), 'tsbox', sandboxCgroupName(ns, id), 'held');
        mkdirSync(held);
        writeFileSync(path.join(held, 'cgroup.procs'), String(pid));
        writeFileSync(path.join(held, 'freezer.state'), 'FROZEN');
        await waitFor(() => readFileSync(path.join(held, 'freezer.state'), 'utf8').trim() === 'FROZEN', { what: 'the sandbox frozen', timeoutMs: 5000 });

        const began = Date.now();
        const err = await expectCode(client.stop({ sandboxId: id, timeoutSecs: 0 }, { timeoutMs: 20_000 }), GrpcStatus.DEADLINE_EXCEEDED);
        const tookMs = Date.now() - began;
        const cgroup = `/tsbox/${sandboxCgroupName(ns, id)}`;
        assert.match(err.details, new RegExp(`cgroup v1 ${cgroup} still holds 1 process\\(es\\) ${killTimeoutMs} ms after they were killed \\(kill_timeout_ms\\): pids ${pid}$`));
        assert.ok(tookMs < killTimeoutMs + 2000, `Stop took ${tookMs} ms, beyond the ${killTimeoutMs} ms bound`);
        assert.match(daemon.logText(), new RegExp(`cannot end the processes of the sandbox: cgroup v1 ${cgroup} .*pids ${pid}`));
        assert.ok(alive(pid), 'frozen, the sandbox cannot have died');

        writeFileSync(path.join(held, 'freezer.state'), 'THAWED');
        // Its SIGKILL was pending: it dies now, and the next Stop and Shutdown succeed.
        await client.stop({ sandboxId: id, timeoutSecs: 0 }, { timeoutMs: 20_000 });
        assert.equal(alive(pid), false);
        // The supervisor, outside the sandbox's cgroup, saw it die of the SIGKILL.
        assert.equal((await client.wait({ sandboxId: id })).exitStatus, 137);
        await client.shutdown({ sandboxId: id }, { timeoutMs: 20_000 });
        for (const dir of sandboxCgroupDirs(ns, id)) assert.equal(existsSync(dir), false, `${dir} left behind`);
        await expectCode(client.status({ sandboxId: id }), GrpcStatus.NOT_FOUND);
      });
    } finally {
      await daemon.teardown();
    }
  });
});
