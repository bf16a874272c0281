/**
 * tsbox's Prometheus metrics (prom-client) and the one interface the daemon reports to.
 * The backend and the record store are wrapped here (instrumentBackend, instrumentStore), so
 * starts, exits, Stop durations, state writes and the sandboxes by state are measured
 * without the controller knowing; the transport reports each answered call through
 * `rpcDone` once per RPC, and the daemon reports recovery and readiness.
 */
import { status as GrpcStatus } from '@grpc/grpc-js';
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';
import type { RecoverySummary } from '../controller/controller.js';
import type { ExitInfo, LaunchSpec, RecordStore, RunningSandbox, RuntimeBackend, SandboxRecord } from '../controller/types.js';

/** gRPC status code names, for the `code` label (the numbers are the protocol's). */

/** The class of an exit status: 0, an error code, 128+signal, or 255 (unknown, SPEC.md section 6). */
function exitClass(status: number): 'success' | 'error' | 'signal' | 'unknown' {
  if (status === 0) return 'success';
  if (status === 255) return 'unknown';
  if (status > 128) return 'signal';
  return 'error';
}

/** What the daemon reports; every method is cheap and never throws. */
export interface DaemonMetrics {
  readonly registry: Registry;
  /**
   * One answered RPC: `method` as containerd names it ("Create", "Wait", …), the gRPC status
   * code sent (0 for OK), and the seconds from the call's arrival to its answer. The
   * transport calls this once per call, where it sends the answer.
   */
  rpcDone(method: string, code: number, seconds: number): void;
  /** Recovery finished at start-up. */
  recoveryDone(summary: RecoverySummary): void;
  /** Whether tsbox serves (after recovery, until shutdown begins): /readyz. */
  setReady(ready: boolean): void;
  readonly ready: boolean;
}

/** The daemon's metrics, with the wrappers' hooks. */
export interface TsboxMetrics extends DaemonMetrics {
  sandboxStarted(ok: boolean): void;
  sandboxExited(status: number): void;
  stopDone(seconds: number): void;
  stateWrite(op: 'save' | 'remove', seconds: number): void;
  /** The latest record of a sandbox, for the sandboxes-by-state gauge. */
  recordSaved(record: SandboxRecord): void;
  recordRemoved(namespace: string, id: string): void;
}

const LATENCY_BUCKETS = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 3600];

/** Creates the registry with every metric tsbox exports, process metrics included. */
export function createMetrics(): TsboxMetrics {
  const registry = new Registry();
  collectDefaultMetrics({ register: registry });
  const rpcs = new Counter({ name: 'tsbox_rpc_requests_total', help: 'Sandbox Controller RPCs answered, by method and gRPC code.', labelNames: ['method', 'code'], registers: [registry] });
  const rpcSeconds = new Histogram({
    name: 'tsbox_rpc_duration_seconds',
    help: 'Time from an RPC\'s arrival to its answer, by method and gRPC code (Wait lasts as long as the sandbox).',
    labelNames: ['method', 'code'],
    buckets: LATENCY_BUCKETS,
    registers: [registry],
  });
  const starts = new Counter({ name: 'tsbox_sandbox_starts_total', help: 'Sandbox starts, by result.', labelNames: ['result'], registers: [registry] });
  const exits = new Counter({ name: 'tsbox_sandbox_exits_total', help: 'Sandbox exits observed, by exit status class (success, error, signal, unknown).', labelNames: ['class'], registers: [registry] });
  const stops = new Histogram({ name: 'tsbox_stop_duration_seconds', help: 'Time from the first signal of a Stop to the sandbox\'s exit.', buckets: LATENCY_BUCKETS, registers: [registry] });
  const writes = new Histogram({ name: 'tsbox_state_write_duration_seconds', help: 'Time for a sandbox record change to be durable, by operation.', labelNames: ['op'], buckets: LATENCY_BUCKETS, registers: [registry] });
  const recoverySeconds = new Gauge({ name: 'tsbox_recovery_duration_seconds', help: 'Duration of the last start-up recovery.', registers: [registry] });
  const recovered = new Counter({ name: 'tsbox_recovered_sandboxes_total', help: 'Sandboxes found at start-up recovery, by what they were found in.', labelNames: ['outcome'], registers: [registry] });
  const readyGauge = new Gauge({ name: 'tsbox_ready', help: '1 while tsbox serves (recovery done, not shutting down).', registers: [registry] });
  const states = new Map<string, { namespace: string; state: string }>();
  new Gauge({
    name: 'tsbox_sandboxes',
    help: 'Sandboxes tsbox holds, by namespace and state (created, starting, running, exited).',
    labelNames: ['namespace', 'state'],
    registers: [registry],
    collect() {
      this.reset();
      for (const { namespace, state } of states.values()) this.inc({ namespace, state });
    },
  });
  let ready = false;
  readyGauge.set(0);
  const key = (namespace: string, id: string): string => `${namespace}\u0000${id}`;
  return {
    registry,
    get ready() {
      return ready;
    },
    rpcDone(method, code, seconds) {
      // gRPC's own names for its codes (grpc-js's enum, read backwards).
      const labels = { method, code: GrpcStatus[code] ?? String(code) };
      rpcs.inc(labels);
      rpcSeconds.observe(labels, seconds);
    },
    recoveryDone(summary) {
      recoverySeconds.set(summary.seconds);
      for (const outcome of ['running', 'exited', 'created', 'quarantined'] as const) recovered.inc({ outcome }, summary[outcome]);
    },
    setReady(value) {
      ready = value;
      readyGauge.set(value ? 1 : 0);
    },
    sandboxStarted(ok) {
      starts.inc({ result: ok ? 'ok' : 'error' });
    },
    sandboxExited(status) {
      exits.inc({ class: exitClass(status) });
    },
    stopDone(seconds) {
      stops.observe(seconds);
    },
    stateWrite(op, seconds) {
      writes.observe({ op }, seconds);
    },
    recordSaved(record) {
      states.set(key(record.namespace, record.id), { namespace: record.namespace, state: record.state });
    },
    recordRemoved(namespace, id) {
      states.delete(key(namespace, id));
    },
  };
}

const seconds = (since: bigint): number => Number(process.hrtime.bigint() - since) / 1e9;

/** The backend, counting starts and exits and timing each Stop from its signal to the exit. */
export function instrumentBackend(backend: RuntimeBackend, metrics: TsboxMetrics): RuntimeBackend {
  const killedAt = new WeakMap<RunningSandbox, bigint>();
  const watch = (sandbox: RunningSandbox): RunningSandbox => {
    sandbox.onExit((exit: ExitInfo) => {
      metrics.sandboxExited(exit.status);
      const since = killedAt.get(sandbox);
      if (since !== undefined) metrics.stopDone(seconds(since));
    });
    return sandbox;
  };
  return {
    get name() {
      return backend.name;
    },
    async start(spec: LaunchSpec, signal) {
      try {
        const sandbox = await backend.start(spec, signal);
        metrics.sandboxStarted(true);
        return watch(sandbox);
      } catch (err) {
        metrics.sandboxStarted(false);
        throw err;
      }
    },
    async recover(spec, handle) {
      const found = await backend.recover(spec, handle);
      if (found.kind === 'running') watch(found.sandbox);
      return found;
    },
    abandon: (spec, signal) => backend.abandon(spec, signal),
    terminate(sandbox) {
      if (!killedAt.has(sandbox)) killedAt.set(sandbox, process.hrtime.bigint());
      return backend.terminate(sandbox);
    },
    kill(sandbox, signal) {
      if (!killedAt.has(sandbox)) killedAt.set(sandbox, process.hrtime.bigint());
      return backend.kill(sandbox, signal);
    },
    release: (spec, signal) => backend.release(spec, signal),
    endpoint: (spec) => backend.endpoint(spec),
    teardown: (spec, stage) => backend.teardown(spec, stage),
    updateResources: (spec, sandbox, limits) => backend.updateResources(spec, sandbox, limits),
    metrics: (spec, sandbox) => backend.metrics(spec, sandbox),
    describe: (sandbox) => backend.describe(sandbox),
    placement: (spec, sandbox) => backend.placement(spec, sandbox),
    close: () => backend.close(),
  };
}

/** The store, timing each durable change and keeping the sandboxes-by-state gauge current. */
export function instrumentStore(store: RecordStore, metrics: TsboxMetrics): RecordStore {
  return {
    async save(record) {
      const since = process.hrtime.bigint();
      await store.save(record);
      metrics.stateWrite('save', seconds(since));
      metrics.recordSaved(record);
    },
    async remove(namespace, id) {
      const since = process.hrtime.bigint();
      await store.remove(namespace, id);
      metrics.stateWrite('remove', seconds(since));
      metrics.recordRemoved(namespace, id);
    },
    async loadAll() {
      const loaded = await store.loadAll();
      for (const record of loaded.records) metrics.recordSaved(record);
      return loaded;
    },
  };
}
