/**
 * Pods coming and going for a while, as on a busy node: on each of tsbox's routes (the runc
 * shim route and the Task API route), pods with one container each are run, started, stopped
 * and removed through CRI, four at once. After a warm-up, 100 more (TSBOX_CHURN_PODS): tsbox's
 * heap (a census of its objects by kind, from heap snapshots) and its descriptors are where they
 * were, and nothing of any pod is left on the host (its process, which relays its task calls on
 * the Task API route, included).
 */
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, readdirSync, readlinkSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { before, describe, test } from 'node:test';
import { type HeapCensus, heapGrowth, heapSnapshotFlags, takeHeapCensus } from '../support/heap.js';
import { type PodEnv, TSBOX_HANDLER, TSBOX_TASK_HANDLER, podLeftovers, runcShimsOf, usePodEnv } from '../support/pod-env.js';
import { waitFor } from '../support/tsbox-daemon.js';

/**
 * 100 pods after a warm-up of 50; fewer where each pod takes seconds (the user-mode Linux node
 * runs TSBOX_CHURN_PODS=10: the same checks, with bounds scaled to the count).
 */
const PODS = Number(process.env['TSBOX_CHURN_PODS'] ?? '100');
if (!Number.isInteger(PODS) || PODS < 10) throw new Error(`TSBOX_CHURN_PODS must be a whole number of at least 10, not ${process.env['TSBOX_CHURN_PODS']}`);
const WARM_UP = Math.ceil(PODS / 2);
const AT_ONCE = 4;
/** A kind of object that grows by this many over PODS pods grows with the pods (one per pod is caught at 10 pods). */
const KIND_BOUND = Math.max(PODS / 2, 10);
/** Heap growth allowed over PODS pods: a kilobyte per pod would be kept memory. */
const BYTES_BOUND = PODS * 1024;

/** Open descriptors of `pid`, by what they point at. */
function descriptors(pid: number): string[] {
  const out: string[] = [];
  for (const fd of readdirSync(`/proc/${pid}/fd`)) {
    try {
      out.push(readlinkSync(`/proc/${pid}/fd/${fd}`));
    } catch {
      continue; // closed meanwhile
    }
  }
  return out.sort();
}

describe(`${PODS} pods with a container come and go on each route: tsbox keeps nothing of them`, { timeout: 1_800_000 }, () => {
  const diagnostics = mkdtempSync(path.join(tmpdir(), 'tsbox-heap-'));
  const harness = usePodEnv({
    tsboxNodeFlags: heapSnapshotFlags(diagnostics),
    cleanup: () => rmSync(diagnostics, { recursive: true, force: true }),
  });
  const { withLogs, runPod, startContainer, removePod } = harness;
  let env: PodEnv;
  before(() => {
    env = harness.env;
  });

  const tsboxPid = (): number => {
    assert.ok(env.tsbox.pid !== undefined, 'tsbox runs');
    return env.tsbox.pid;
  };
  const fds = (): string[] => descriptors(tsboxPid()).map((d) => `tsbox ${d}`);

  /** `count` pods on `handler`, AT_ONCE at a time, each run, its container started, then all removed as kubelet does. */
  async function churn(handler: string, count: number): Promise<{ id: string; container: string }[]> {
    const done: { id: string; container: string }[] = [];
    let next = 0;
    let failed = false;
    const worker = async (): Promise<void> => {
      while (!failed && next < count) {
        next += 1;
        try {
          const config = env.podConfig('churn');
          const id = await runPod(config, handler);
          const container = await startContainer(id, config, 'c', 'exec sleep 100000');
          await removePod(id, [container]);
          done.push({ id, container });
        } catch (err) {
          failed = true;
          throw err;
        }
      }
    };
    await Promise.all(Array.from({ length: AT_ONCE }, worker));
    return done;
  }

  for (const [handler, route] of [
    [TSBOX_HANDLER, 'the runc shim route'],
    [TSBOX_TASK_HANDLER, 'the Task API route'],
  ] as const) {
    test(`${route}: after ${PODS} pods came and went, no kind of object in tsbox's heap grew with them, its descriptors are back, nothing of a pod is left`, () =>
      withLogs(async () => {
        await churn(handler, WARM_UP);
        const fdsBefore = fds();
        const heapBefore: HeapCensus = await takeHeapCensus(tsboxPid(), diagnostics);

        const pods = await churn(handler, PODS);
        assert.equal(pods.length, PODS);

        // Nothing of any pod on the host: processes, mounts, cgroups, files, shims, holders' records.
        let left: string[] = [];
        await waitFor(
          () => {
            left = pods.flatMap(({ id, container }) => {
              const l = podLeftovers(env, id, [container]);
              return [...l.processes, ...l.mounts, ...l.cgroups, ...l.files];
            });
            left.push(...runcShimsOf(env).map((s) => `runc shim ${s.pid}`));
            const records = path.join(env.containerd.paths.state, 'tsbox', 'tasks');
            if (existsSync(records)) left.push(...readdirSync(records).map((t) => `task record ${t}`));
            const runcStates = path.join(env.containerd.paths.state, 'tsbox', 'runc', 'k8s.io');
            if (existsSync(runcStates)) left.push(...readdirSync(runcStates).map((c) => `runc state ${c}`));
            return left.length === 0;
          },
          { what: `nothing of the ${PODS} pods left`, timeoutMs: 60_000, describe: () => left.join('\n') },
        );

        // Descriptors: back to where they were (an fd closes as its peer's goes: awaited).
        let fdsAfter: string[] = [];
        await waitFor(
          () => {
            fdsAfter = fds();
            return fdsAfter.length <= fdsBefore.length;
          },
          {
            what: `tsbox's descriptors back to ${fdsBefore.length}`,
            timeoutMs: 30_000,
            describe: () => `now ${fdsAfter.length}; new: ${fdsAfter.filter((d) => !fdsBefore.includes(d)).join(', ')}`,
          },
        );

        // The heap: nothing kept per pod.
        const heapAfter = await takeHeapCensus(tsboxPid(), diagnostics);
        const grown = heapGrowth(heapBefore, heapAfter);
        const report = `heap ${heapBefore.bytes} -> ${heapAfter.bytes} bytes; most grown: ${JSON.stringify(grown.slice(0, 12))}`;
        process.stdout.write(`# ${route}: ${report}; descriptors ${fdsBefore.length} -> ${fdsAfter.length}\n`);
        const perPod = grown.filter((g) => g.count >= KIND_BOUND);
        // What a few of the new objects of each such kind are, and what holds them.
        const samples = perPod.flatMap(({ kind }) => {
          const old = new Set(heapBefore.ids.get(kind) ?? []);
          return (heapAfter.ids.get(kind) ?? []).filter((id) => !old.has(id)).slice(-4).map((id) => heapAfter.explain(id));
        });
        assert.deepEqual(perPod, [], `kinds of objects that grew by ${KIND_BOUND} or more over ${PODS} pods: ${report}\nnew objects:\n${samples.join('\n')}`);
        assert.ok(heapAfter.bytes - heapBefore.bytes < BYTES_BOUND, `the heap grew by ${BYTES_BOUND} bytes or more over ${PODS} pods: ${report}`);
      }));
  }
});
