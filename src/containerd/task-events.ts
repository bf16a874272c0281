/**
 * Task events for containerd's event bus, published on containerd's own socket
 * (`containerd.services.events.v1.Events/Publish`, namespace in the call's metadata), for the
 * containers tsbox runs on the Task API route: where containerd's runc shim would publish them.
 * CRI reads one topic of these, `/tasks/oom`, to give an OOM-killed container the reason
 * OOMKilled; `ctr events` and other clients read the rest.
 *
 * Publishing never fails or holds a Task call: events queue (bounded) and go out in order,
 * each retried while containerd is unreachable, then dropped with a warning. The OOM event
 * alone is awaited, with a bound, by the exit it explains: CRI must have the reason before it
 * hears of the exit.
 */
import { setTimeout as delay } from 'node:timers/promises';
import * as grpc from '@grpc/grpc-js';
import type { Logger } from 'pino';
import type { ExitInfo } from '../controller/types.js';
import { messageOf } from '../base/errors.js';
import { TaskDelete, TaskExecAdded, TaskExecStarted, TaskExit, TaskOOM, TaskStart } from '../gen/containerd/events/task.js';
import { EventsClient } from '../gen/containerd/services/events/v1/events.js';
import type { TaskEvents } from '../tasks/tasks.js';

/** One event: its topic and its message as an Any whose type URL is the message's full name. */
export interface TaskEvent {
  readonly namespace: string;
  readonly topic: string;
  readonly typeUrl: string;
  readonly value: Uint8Array;
  /** Called once the event has reached containerd (not when it is dropped); awaited before the next. */
  readonly sent?: () => Promise<void>;
}

/** Sends one event; rejects with a gRPC error. */
export type SendEvent = (event: TaskEvent, deadlineMs: number) => Promise<void>;

export interface EventQueueOptions {
  readonly logger: Logger;
  /** Events waiting at most; past it the newest is dropped (the runc shim keeps 2 048). */
  readonly capacity?: number;
  /** Tries per event while containerd is unreachable. */
  readonly tries?: number;
  /** Pause before the first retry; doubled each time. */
  readonly backoffMs?: number;
  /** Deadline of one Publish. */
  readonly callMs?: number;
  /** Called by close(): lets go of the sender's connection. */
  readonly onClose?: () => void;
}

/** Codes worth another try: containerd restarting or busy. */
const RETRY = new Set([grpc.status.UNAVAILABLE, grpc.status.DEADLINE_EXCEEDED, grpc.status.RESOURCE_EXHAUSTED]);

/** The queue: TaskEvents over a sender. */
export class EventQueue implements TaskEvents {
  readonly #send: SendEvent;
  readonly #log: Logger;
  readonly #capacity: number;
  readonly #tries: number;
  readonly #backoffMs: number;
  readonly #callMs: number;
  readonly #onClose: (() => void) | undefined;
  readonly #queue: TaskEvent[] = [];
  #running = false;
  #closed = false;
  /** Resolves when the queue has drained (tests, shutdown). */
  #idle: (() => void)[] = [];

  constructor(send: SendEvent, options: EventQueueOptions) {
    this.#send = send;
    this.#log = options.logger;
    this.#capacity = options.capacity ?? 2048;
    this.#tries = options.tries ?? 6;
    this.#backoffMs = options.backoffMs ?? 100;
    this.#callMs = options.callMs ?? 5000;
    this.#onClose = options.onClose;
  }

  created(): void {
    // TaskCreate carries the rootfs and IO, which nothing reads from the bus: not published.
  }

  started(ns: string, id: string, pid: number): void {
    this.#enqueue(ns, '/tasks/start', 'containerd.events.TaskStart', TaskStart.encode({ containerId: id, pid }).finish());
  }

  exited(ns: string, id: string, execId: string, pid: number, exit: ExitInfo, sent?: () => Promise<void>): void {
    const event = TaskExit.encode({ containerId: id, id: execId || id, pid, exitStatus: exit.status, exitedAt: { ...exit.exitedAt } });
    this.#enqueue(ns, '/tasks/exit', 'containerd.events.TaskExit', event.finish(), sent);
  }

  deleted(ns: string, id: string, pid: number, exit: ExitInfo): void {
    const event = TaskDelete.encode({ containerId: id, id, pid, exitStatus: exit.status, exitedAt: { ...exit.exitedAt } });
    this.#enqueue(ns, '/tasks/delete', 'containerd.events.TaskDelete', event.finish());
  }

  execAdded(ns: string, id: string, execId: string): void {
    this.#enqueue(ns, '/tasks/exec-added', 'containerd.events.TaskExecAdded', TaskExecAdded.encode({ containerId: id, execId }).finish());
  }

  execStarted(ns: string, id: string, execId: string, pid: number): void {
    this.#enqueue(ns, '/tasks/exec-started', 'containerd.events.TaskExecStarted', TaskExecStarted.encode({ containerId: id, execId, pid }).finish());
  }

  /**
   * Published at once, not queued, and awaited: it holds the answer to a Wait, so it is
   * bounded more tightly (3 tries of at most 2 s: under 7 s with containerd away); never rejects.
   */
  async oom(ns: string, id: string): Promise<void> {
    const event: TaskEvent = { namespace: ns, topic: '/tasks/oom', typeUrl: 'containerd.events.TaskOOM', value: TaskOOM.encode({ containerId: id }).finish() };
    await this.#deliver(event, Math.min(3, this.#tries), Math.min(2000, this.#callMs));
  }

  /** Resolves once every queued event has been sent or dropped. */
  drained(): Promise<void> {
    if (!this.#running && this.#queue.length === 0) return Promise.resolve();
    return new Promise((resolve) => this.#idle.push(resolve));
  }

  /** Stops sending; what is queued is dropped. */
  close(): void {
    this.#closed = true;
    if (this.#queue.length > 0) this.#log.warn({ dropped: this.#queue.length }, 'task events not published: tsbox is stopping');
    this.#queue.length = 0;
    this.#onClose?.();
  }

  #enqueue(namespace: string, topic: string, typeUrl: string, value: Uint8Array, sent?: () => Promise<void>): void {
    if (this.#closed) return;
    if (this.#queue.length >= this.#capacity) {
      this.#log.warn({ topic, capacity: this.#capacity }, 'task event dropped: too many waiting for containerd');
      return;
    }
    this.#queue.push({ namespace, topic, typeUrl, value, ...(sent === undefined ? {} : { sent }) });
    if (!this.#running) void this.#run();
  }

  async #run(): Promise<void> {
    this.#running = true;
    for (let event = this.#queue.shift(); event !== undefined && !this.#closed; event = this.#queue.shift()) await this.#deliver(event, this.#tries, this.#callMs);
    this.#running = false;
    for (const resolve of this.#idle.splice(0)) resolve();
  }

  async #deliver(event: TaskEvent, tries: number, callMs: number): Promise<void> {
    let wait = this.#backoffMs;
    for (let attempt = 1; ; attempt++) {
      try {
        await this.#send(event, callMs);
        await event.sent?.();
        return;
      } catch (err) {
        const code = (err as Partial<grpc.ServiceError>).code;
        if (code === undefined || !RETRY.has(code) || attempt >= tries || this.#closed) {
          this.#log.warn({ topic: event.topic, namespace: event.namespace, err: messageOf(err), attempt }, 'task event not published');
          return;
        }
      }
      await delay(wait);
      wait *= 2;
    }
  }
}

/** Task events published on containerd's socket at `address` (a path). Nothing is dialled before the first. */
export function containerdTaskEvents(address: string, logger: Logger): EventQueue {
  const client = new EventsClient(`unix:${address}`, grpc.credentials.createInsecure());
  const send: SendEvent = (event, deadlineMs) =>
    new Promise((resolve, reject) => {
      const metadata = new grpc.Metadata();
      metadata.set('containerd-namespace', event.namespace);
      client.publish(
        { topic: event.topic, event: { typeUrl: event.typeUrl, value: Buffer.from(event.value) } },
        metadata,
        { deadline: Date.now() + deadlineMs },
        (err: grpc.ServiceError | null) => (err === null ? resolve() : reject(err)),
      );
    });
  return new EventQueue(send, { logger, onClose: () => client.close() });
}
