/**
 * Task events on a real containerd (the one installed, 2.1.9 here): what tsbox publishes for
 * the containers of the Task API route (src/containerd/task-events.ts) reaches containerd's event
 * bus with its topic, in its namespace, in order, and decodes there: `ctr events` subscribes, and
 * prints an event only when containerd's typeurl resolves its Any, so the type URLs are checked
 * too.
 * The TaskOOM, which CRI reads for the OOMKilled reason, is sent at once and awaited, as before a
 * Wait answer (the end-to-end tests check CRI's reason itself).
 */
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { pino } from 'pino';
import { type Containerd, containerdUnavailableReason, startContainerd } from '../support/containerd.js';
import { uniqueNamespace } from '../support/host.js';
import { killAndReap, makeTempDir, removeTree, waitFor } from '../support/processes.js';
import { containerdTaskEvents } from '../../src/containerd/task-events.js';

/** One line of `ctr events`: "<timestamp> <namespace> <topic> <event as JSON>". */
interface Printed {
  readonly namespace: string;
  readonly topic: string;
  readonly event: Record<string, unknown>;
}

describe('task events on containerd\'s bus', { timeout: 180_000 }, () => {
  let containerd: Containerd | undefined;
  let scratch: string | undefined;

  before(async () => {
    const missing = containerdUnavailableReason();
    if (missing !== undefined) throw new Error(missing);
    scratch = await makeTempDir('task-events-');
    // No sandboxer is called here; containerd only needs an address for the proxy plugin.
    containerd = await startContainerd({ sandboxerSocket: path.join(scratch, 'no-sandboxer.sock'), logLevel: 'info' });
  });

  after(async () => {
    await containerd?.teardown();
    if (scratch !== undefined) await removeTree(scratch);
  });

  test('`ctr events` sees each event, queued or sent at once, in the order sent, with its topic, namespace and fields', async () => {
    assert.ok(containerd !== undefined);
    const d = containerd;
    const ns = uniqueNamespace('events');
    const printed: Printed[] = [];
    let output = '';
    const ctr = spawn('ctr', ['--address', d.address, 'events'], { stdio: ['ignore', 'pipe', 'pipe'] });
    ctr.on('error', () => undefined);
    let stderr = '';
    ctr.stderr.setEncoding('utf8').on('data', (s: string) => (stderr += s));
    ctr.stdout.setEncoding('utf8').on('data', (s: string) => {
      output += s;
      const lines = output.split('\n');
      output = lines.pop() ?? '';
      for (const line of lines) {
        // The timestamp is Go's time.Time text, four words ("2026-01-02 03:04:05.6 +0000 UTC").
        const m = /^\S+ \S+ \S+ \S+ (\S+) (\S+) (.*)$/.exec(line);
        if (m !== null) printed.push({ namespace: m[1] ?? '', topic: m[2] ?? '', event: JSON.parse(m[3] ?? '{}') as Record<string, unknown> });
      }
    });
    const publisher = containerdTaskEvents(d.address, pino({ level: 'warn' }));
    const context = (): string => `ctr events printed:\n${printed.map((p) => JSON.stringify(p)).join('\n')}\nctr stderr: ${stderr}\n${d.logTail()}`;
    try {
      // ctr prints nothing when it has subscribed: publish a probe until it shows one.
      await waitFor(
        async () => {
          publisher.started(ns, 'probe', 1);
          await publisher.drained();
          return printed.some((p) => p.namespace === ns && p.event['container_id'] === 'probe');
        },
        { what: '`ctr events` to print a probe event', timeoutMs: 30_000, intervalMs: 200, describe: context },
      );
      const exit = { status: 137, exitedAt: { seconds: 1_700_000_000, nanos: 0 }, reason: 'killed by signal 9' };
      publisher.started(ns, 'c0ffee', 4242);
      publisher.execAdded(ns, 'c0ffee', 'probe-1');
      publisher.execStarted(ns, 'c0ffee', 'probe-1', 4243);
      await publisher.drained();
      await publisher.oom(ns, 'c0ffee');
      publisher.exited(ns, 'c0ffee', '', 4242, exit);
      publisher.deleted(ns, 'c0ffee', 4242, exit);
      await publisher.drained();
      // Probes sent while ctr was subscribing may still come; they are left out.
      const events = (): Printed[] => printed.filter((p) => p.event['container_id'] !== 'probe');
      await waitFor(() => events().length >= 6, { what: 'the six events printed by `ctr events`', timeoutMs: 30_000, describe: context });
      const seen = events().map((p) => [p.namespace, p.topic, p.event]);
      assert.deepEqual(
        seen,
        [
          [ns, '/tasks/start', { container_id: 'c0ffee', pid: 4242 }],
          [ns, '/tasks/exec-added', { container_id: 'c0ffee', exec_id: 'probe-1' }],
          [ns, '/tasks/exec-started', { container_id: 'c0ffee', exec_id: 'probe-1', pid: 4243 }],
          [ns, '/tasks/oom', { container_id: 'c0ffee' }],
          [ns, '/tasks/exit', { container_id: 'c0ffee', id: 'c0ffee', pid: 4242, exit_status: 137, exited_at: { seconds: 1_700_000_000 } }],
          [ns, '/tasks/delete', { container_id: 'c0ffee', id: 'c0ffee', pid: 4242, exit_status: 137, exited_at: { seconds: 1_700_000_000 } }],
        ],
        context(),
      );
    } finally {
      publisher.close();
      if (ctr.pid !== undefined) await killAndReap([ctr.pid]);
    }
  });
});
