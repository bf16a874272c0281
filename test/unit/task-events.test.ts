/**
 * The task event queue (src/containerd/task-events.ts) over a fake sender: events go out in
 * order, one at a time; containerd away (UNAVAILABLE) is retried, other errors are not; a full
 * queue drops the newest with a warning; the awaited OOM event is bounded; close drops what waits.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import * as grpc from '@grpc/grpc-js';
import { pino } from 'pino';
import { TaskExit, TaskOOM } from '../../src/gen/containerd/events/task.js';
import { EventQueue, type SendEvent, type TaskEvent } from '../../src/containerd/task-events.js';

const exit = { status: 3, exitedAt: { seconds: 1_700_000_000, nanos: 5 }, reason: 'exited with code 3' };

function failure(code: grpc.status): Error {
  return Object.assign(new Error(`code ${code}`), { code });
}

/** A sender that records each attempt and fails the first `failures` ones with `code`. */
function sender(failures = 0, code: grpc.status = grpc.status.UNAVAILABLE): { send: SendEvent; attempts: TaskEvent[]; sent: TaskEvent[] } {
  const attempts: TaskEvent[] = [];
  const sent: TaskEvent[] = [];
  const send: SendEvent = (event) => {
    attempts.push(event);
    if (attempts.length <= failures) return Promise.reject(failure(code));
    sent.push(event);
    return Promise.resolve();
  };
  return { send, attempts, sent };
}

const quiet = pino({ level: 'silent' });

test('events go out in the order they came, with topic, namespace, type URL and fields', async () => {
  const s = sender();
  const q = new EventQueue(s.send, { logger: quiet });
  q.started('k8s.io', 'c1', 10);
  q.execAdded('k8s.io', 'c1', 'e1');
  q.execStarted('k8s.io', 'c1', 'e1', 11);
  q.exited('k8s.io', 'c1', 'e1', 11, exit);
  q.deleted('k8s.io', 'c1', 10, exit);
  await q.drained();
  assert.deepEqual(
    s.sent.map((e) => [e.namespace, e.topic, e.typeUrl]),
    [
      ['k8s.io', '/tasks/start', 'containerd.events.TaskStart'],
      ['k8s.io', '/tasks/exec-added', 'containerd.events.TaskExecAdded'],
      ['k8s.io', '/tasks/exec-started', 'containerd.events.TaskExecStarted'],
      ['k8s.io', '/tasks/exit', 'containerd.events.TaskExit'],
      ['k8s.io', '/tasks/delete', 'containerd.events.TaskDelete'],
    ],
  );
  assert.deepEqual(TaskExit.decode(s.sent[3]?.value ?? new Uint8Array()), { containerId: 'c1', id: 'e1', pid: 11, exitStatus: 3, exitedAt: { seconds: 1_700_000_000, nanos: 5 } });
});

test('containerd away (UNAVAILABLE) is retried until it answers; an event it refuses is not', async () => {
  const away = sender(2);
  const q = new EventQueue(away.send, { logger: quiet, backoffMs: 1 });
  q.started('ns', 'c1', 1);
  await q.drained();
  assert.equal(away.attempts.length, 3);
  assert.equal(away.sent.length, 1);
  const refused = sender(1, grpc.status.INVALID_ARGUMENT);
  const r = new EventQueue(refused.send, { logger: quiet, backoffMs: 1 });
  r.started('ns', 'c1', 1);
  r.started('ns', 'c2', 2);
  await r.drained();
  assert.equal(refused.attempts.length, 2, 'no retry of a refused event; the next one goes');
  assert.deepEqual(refused.sent.map((e) => e.topic), ['/tasks/start']);
});

test('a queue at capacity drops the newest events, and the others still go', async () => {
  let release: () => void = () => undefined;
  const gate = new Promise<void>((resolve) => (release = resolve));
  const sent: TaskEvent[] = [];
  const q = new EventQueue(
    async (e) => {
      await gate;
      sent.push(e);
    },
    { logger: quiet, capacity: 2 },
  );
  for (let i = 0; i < 5; i++) q.started('ns', `c${i}`, i);
  release();
  await q.drained();
  // The first is in flight when the others come; two wait; two are dropped.
  assert.equal(sent.length, 3);
});

test('the OOM event is sent at once and awaited, and gives up within its bound when containerd stays away', async () => {
  const ok = sender();
  const q = new EventQueue(ok.send, { logger: quiet });
  await q.oom('k8s.io', 'c9');
  assert.equal(ok.sent[0]?.topic, '/tasks/oom');
  assert.deepEqual(TaskOOM.decode(ok.sent[0]?.value ?? new Uint8Array()), { containerId: 'c9' });
  const away = sender(100);
  const bounded = new EventQueue(away.send, { logger: quiet, backoffMs: 1 });
  await bounded.oom('k8s.io', 'c9');
  assert.equal(away.attempts.length, 3, 'three tries, then the Wait is answered without it');
});

test('close drops what waits and sends nothing more', async () => {
  const s = sender();
  let closed = false;
  const q = new EventQueue(s.send, { logger: quiet, onClose: () => (closed = true) });
  q.close();
  q.started('ns', 'c1', 1);
  await q.drained();
  assert.equal(s.attempts.length, 0);
  assert.equal(closed, true);
});
