// What a Stop waits for on CRI (src/containerd/cri-containers.ts), against a fake Kubernetes
// RuntimeService on a unix socket: the question asked, waiting while a container of the pod is
// still counted as running, and every way the wait ends without holding a Stop forever.
import assert from 'node:assert/strict';
import { EventEmitter, once } from 'node:events';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Writable } from 'node:stream';
import { after, before, describe, test } from 'node:test';
import * as grpc from '@grpc/grpc-js';
import { pino } from 'pino';
import { criPodContainers } from '../../src/containerd/cri-containers.js';
import { track } from '../support/fakes.js';
import {
  ContainerState,
  RuntimeServiceService,
  type ListContainersRequest,
  type ListContainersResponse,
} from '../../src/gen/runtime/v1/containers.js';

const POD = '5f2a9c0d7e1b';

/** A CRI that lists `running[pod]` as the pod's running containers, and reports every question. */
class FakeCri extends EventEmitter {
  readonly running = new Map<string, string[]>();
  readonly requests: ListContainersRequest[] = [];
  readonly server = new grpc.Server();

  constructor(serveCri: boolean) {
    super();
    if (!serveCri) return;
    this.server.addService(RuntimeServiceService, {
      listContainers: (
        call: grpc.ServerUnaryCall<ListContainersRequest, ListContainersResponse>,
        done: grpc.sendUnaryData<ListContainersResponse>,
      ) => {
        this.requests.push(call.request);
        const pod = call.request.filter?.podSandboxId ?? '';
        const ids = this.running.get(pod) ?? [];
        done(null, { containers: ids.map((id) => ({ id, podSandboxId: pod, state: ContainerState.CONTAINER_RUNNING })) });
        this.emit('asked', this.requests.length);
      },
    });
  }

  async listen(path: string): Promise<void> {
    await new Promise<void>((resolve, reject) => {
      this.server.bindAsync(`unix:${path}`, grpc.ServerCredentials.createInsecure(), (err) => (err === null ? resolve() : reject(err)));
    });
  }

  /** Resolves once CRI has been asked `n` times in all. */
  async asked(n: number): Promise<void> {
    while (this.requests.length < n) await once(this, 'asked');
  }
}

/** A logger whose lines the test reads. */
function capturedLogger(): { logger: pino.Logger; lines: Record<string, unknown>[] } {
  const lines: Record<string, unknown>[] = [];
  const sink = new Writable({
    write(chunk: Buffer, _enc, cb) {
      for (const line of chunk.toString().split('\n')) if (line !== '') lines.push(JSON.parse(line) as Record<string, unknown>);
      cb();
    },
  });
  return { logger: pino({ level: 'debug' }, sink), lines };
}

let dir: string;
before(() => {
  dir = mkdtempSync(join(tmpdir(), 'tsbox-cri-'));
});
after(() => rmSync(dir, { recursive: true, force: true }));

describe('a Stop waiting for CRI', () => {
  test('asks for the pod\'s running containers, waits while one is listed, and ends once CRI records its exit', async () => {
    const cri = new FakeCri(true);
    const socket = join(dir, 'cri-1.sock');
    await cri.listen(socket);
    cri.running.set(POD, ['c0ffee']);
    cri.running.set('another-pod', ['beef']);
    const { logger, lines } = capturedLogger();
    const containers = criPodContainers(socket, { logger, intervalMs: 20 });
    try {
      const waiting = containers.settled('k8s.io', POD, new AbortController().signal);
      const state = track(waiting);
      await cri.asked(3);
      assert.equal(state.settled, false, 'the wait ended while CRI still listed a running container');
      assert.deepEqual(cri.requests[0]?.filter, {
        id: '',
        podSandboxId: POD,
        state: { state: ContainerState.CONTAINER_RUNNING },
        labelSelector: {},
      });

      cri.running.set(POD, []);
      await waiting;
      assert.ok(lines.some((l) => l['msg'] === 'CRI recorded the pod\'s containers as exited' && l['podId'] === POD));
    } finally {
      containers.close();
      cri.server.forceShutdown();
    }
  });

  test('asks nothing for a sandbox outside CRI\'s namespace', async () => {
    const cri = new FakeCri(true);
    const socket = join(dir, 'cri-2.sock');
    await cri.listen(socket);
    cri.running.set(POD, ['c0ffee']);
    const containers = criPodContainers(socket, { logger: pino({ level: 'silent' }) });
    try {
      await containers.settled('default', POD, new AbortController().signal);
      assert.equal(cri.requests.length, 0);
    } finally {
      containers.close();
      cri.server.forceShutdown();
    }
  });

  test('a containerd without CRI (UNIMPLEMENTED) or no containerd at all (UNAVAILABLE) does not hold it', async () => {
    const noCri = new FakeCri(false);
    const socket = join(dir, 'cri-3.sock');
    await noCri.listen(socket);
    for (const [address, code] of [
      [socket, 'UNIMPLEMENTED'],
      [join(dir, 'nobody-listens.sock'), 'UNAVAILABLE'],
    ] as const) {
      const { logger, lines } = capturedLogger();
      const containers = criPodContainers(address, { logger });
      try {
        await containers.settled('k8s.io', POD, new AbortController().signal);
        const line = lines.find((l) => l['msg'] === 'no CRI on containerd\'s socket: Stop does not wait for it');
        assert.ok(line !== undefined, `${code}: ${JSON.stringify(lines)}`);
        assert.match(String(line['err']), new RegExp(String(grpc.status[code])));
      } finally {
        containers.close();
      }
    }
    noCri.server.forceShutdown();
  });

  test('a container CRI keeps counting as running holds it no longer than the bound, and is named in a warning', async () => {
    const cri = new FakeCri(true);
    const socket = join(dir, 'cri-4.sock');
    await cri.listen(socket);
    cri.running.set(POD, ['c0ffee']);
    const { logger, lines } = capturedLogger();
    const containers = criPodContainers(socket, { logger, intervalMs: 20, boundMs: 200 });
    try {
      await containers.settled('k8s.io', POD, new AbortController().signal);
      const warning = lines.find((l) => l['msg'] === 'CRI still counts these containers of the pod as running: Stop answers anyway');
      assert.ok(warning !== undefined);
      assert.deepEqual(warning['containers'], ['c0ffee']);
      assert.ok(Number(warning['waitedMs']) >= 200);
    } finally {
      containers.close();
      cri.server.forceShutdown();
    }
  });

  test('ends when the Stop\'s own signal fires', async () => {
    const cri = new FakeCri(true);
    const socket = join(dir, 'cri-5.sock');
    await cri.listen(socket);
    cri.running.set(POD, ['c0ffee']);
    const containers = criPodContainers(socket, { logger: pino({ level: 'silent' }), intervalMs: 60_000 });
    try {
      const call = new AbortController();
      const waiting = containers.settled('k8s.io', POD, call.signal);
      await cri.asked(1);
      call.abort();
      await waiting;
      assert.equal(cri.requests.length, 1);
    } finally {
      containers.close();
      cri.server.forceShutdown();
    }
  });
});
