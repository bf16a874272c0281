/**
 * Many full lifecycles through the real daemon with real processes must leak nothing: no file
 * descriptor, no supervisor, no record, no cgroup, no exit notice, and no memory beyond a loose
 * bound. Waits that end by their deadline or by a client cancel are part of the load: an
 * abandoned Wait must leave nothing behind (SPEC.md section 3, Wait).
 *
 * File descriptors are compared exactly (a small slack for the runtime's own); memory only
 * loosely: RSS depends on the allocator and the garbage collector, not only on leaks.
 */
import { after, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync, readdirSync, readlinkSync } from 'node:fs';
import path from 'node:path';
import {
  cgroupDirsOfNamespace,
  processesInNamespaceCgroups,
  supervisorsOfStateDir,
  uniqueNamespace,
} from '../support/host.js';
import { KILLED, pauseSandbox } from '../support/crash-invariants.js';
import { GrpcStatus, expectCode } from '../support/grpc-client.js';
import { type TsboxClient, type TsboxDaemon, createTsbox, waitFor } from '../support/tsbox-daemon.js';

const WARM_UP = 20;
const LIFECYCLES = 200;
const CONCURRENCY = 4;
/** Slack for descriptors the runtime opens on its own (e.g. a lazily created worker). */
const FD_SLACK = 2;
/**
 * Generous: after 20 lifecycles the daemon's heap is still growing towards the size its
 * garbage collector settles at (measured: +25–40 MiB within the next few hundred lifecycles,
 * then flat or shrinking over a thousand). A leak of a sandbox's worth of state per lifecycle
 * shows up as more than this over 200.
 */
const RSS_SLACK_BYTES = 64 * 1024 * 1024;

function fdCount(pid: number): number {
  return readdirSync(`/proc/${pid}/fd`).length;
}

/** What each descriptor of `pid` refers to, for failure messages. */
function fdTargets(pid: number): string[] {
  return readdirSync(`/proc/${pid}/fd`).map((fd) => {
    try {
      return `${fd} -> ${readlinkSync(`/proc/${pid}/fd/${fd}`)}`;
    } catch {
      // closed between the listing and the readlink
      return `${fd} (closed)`;
    }
  });
}

function rssBytes(pid: number): number {
  const match = /^VmRSS:\s+(\d+) kB$/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  assert.ok(match !== null, `VmRSS of ${pid}`);
  return Number(match[1]) * 1024;
}

/** Runs `count` jobs, at most `concurrency` at once; the first failure fails the whole run. */
async function pool(count: number, concurrency: number, job: (i: number) => Promise<void>): Promise<void> {
  let next = 0;
  const worker = async (): Promise<void> => {
    while (next < count) await job(next++);
  };
  await Promise.all(Array.from({ length: concurrency }, worker));
}

describe('soak: full lifecycles leak nothing', () => {
  let d: TsboxDaemon | undefined;
  const ns = uniqueNamespace('soak');

  after(async () => {
    await d?.teardown();
  });

  /** Create → Start → Status → [abandoned Waits] → Stop(0) → Wait → Shutdown. */
  async function lifecycle(client: TsboxClient, i: number): Promise<void> {
    const id = `sb-${i}`;
    await client.create(pauseSandbox(id), { timeoutMs: 30_000 });
    const started = await client.start({ sandboxId: id }, { timeoutMs: 30_000 });
    d?.track(ns, undefined, started.pid);
    const status = await client.status({ sandboxId: id }, { timeoutMs: 30_000 });
    assert.equal(status.state, 'SANDBOX_READY');
    assert.equal(status.pid, started.pid);
    if (i % 4 === 0) {
      await expectCode(client.wait({ sandboxId: id }, { timeoutMs: 100 }), GrpcStatus.DEADLINE_EXCEEDED);
    }
    if (i % 6 === 0) {
      const cancel = new AbortController();
      const waiting = client.wait({ sandboxId: id }, { signal: cancel.signal });
      // A round trip after the Wait was sent: the server holds it when the cancel arrives.
      await client.status({ sandboxId: id }, { timeoutMs: 30_000 });
      cancel.abort();
      await expectCode(waiting, GrpcStatus.CANCELLED);
    }
    await client.stop({ sandboxId: id, timeoutSecs: 0 }, { timeoutMs: 30_000 });
    const exit = await client.wait({ sandboxId: id }, { timeoutMs: 30_000 });
    assert.equal(exit.exitStatus, KILLED);
    await client.shutdown({ sandboxId: id }, { timeoutMs: 30_000 });
  }

  test(`${LIFECYCLES} lifecycles at concurrency ${CONCURRENCY}: descriptors, memory, processes, files, cgroups`, async () => {
    d = await createTsbox('tsbox-soak', { closeClientsOnExit: true });
    const daemon = d;
    daemon.track(ns);
    try {
      await daemon.start();
      const pid = daemon.pid;
      assert.ok(pid !== undefined);
      const client = daemon.client(ns);

      await pool(WARM_UP, CONCURRENCY, (i) => lifecycle(client, i));
      const baseFds = fdCount(pid);
      const baseRss = rssBytes(pid);

      await pool(LIFECYCLES, CONCURRENCY, (i) => lifecycle(client, WARM_UP + i));

      // Descriptors of the last exits (supervisor pipes, cgroup files) close asynchronously.
      await waitFor(() => fdCount(pid) <= baseFds + FD_SLACK, {
        what: `tsbox's descriptors back to ${baseFds} (+${FD_SLACK})`,
        timeoutMs: 10_000,
        describe: () => `now ${fdCount(pid)}:\n${fdTargets(pid).join('\n')}`,
      });
      const rss = rssBytes(pid);
      const mib = (bytes: number): string => `${(bytes / 2 ** 20).toFixed(1)} MiB`;
      process.stderr.write(`# soak: fds ${baseFds} -> ${fdCount(pid)}; RSS ${mib(baseRss)} -> ${mib(rss)}\n`);
      assert.ok(rss < baseRss + RSS_SLACK_BYTES, `RSS grew from ${baseRss} to ${rss} bytes`);

      assert.deepEqual(supervisorsOfStateDir(daemon.stateDir), [], 'no supervisor left');
      assert.deepEqual(processesInNamespaceCgroups(ns), [], 'no process left in a sandbox cgroup');
      assert.deepEqual(readdirSync(path.join(daemon.stateDir, 'sandboxes')), [], 'no record left');
      // A notice touched just after its exit was read goes as tsbox's watch sees it.
      let notices: string[] = [];
      await waitFor(() => (notices = readdirSync(path.join(daemon.stateDir, 'exits'))).length === 0, { what: 'no exit notice left', timeoutMs: 5000, describe: () => notices.join(', ') });
      assert.deepEqual(cgroupDirsOfNamespace(ns), [], 'no cgroup left');
      assert.equal(daemon.pid, pid, 'the same daemon served every call');
    } catch (err) {
      if (err instanceof Error) err.message = `${err.message}\n${daemon.logTail(30)}`;
      throw err;
    }
  });
});
