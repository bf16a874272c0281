/**
 * The metrics endpoint of a real tsbox daemon (`serve --metrics-address`): /healthz,
 * /readyz and /metrics with the sandbox counters moving as a sandbox starts and is stopped;
 * a metrics address in use stops tsbox from starting, saying so. And the log formats: JSON
 * lines by default, readable lines with --log-format pretty. On a unix socket path, a socket
 * file left by a crash is replaced and a live one is refused.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { lstatSync, readFileSync } from 'node:fs';
import { get } from 'node:http';
import { createServer, type AddressInfo, type Server } from 'node:net';
import path from 'node:path';
import pino from 'pino';
import { createMetrics } from '../../src/metrics/metrics.js';
import { MetricsAddressError, startMetricsServer } from '../../src/metrics/server.js';
import { createSandboxClients } from '../support/containerd-clients.js';
import { runCommand } from '../support/containerd.js';
import { type SandboxerDaemon, makeTempDir, removeTree, startSandboxerDaemon, tsboxMain, waitFor } from '../support/tsbox-daemon.js';

function httpGet(socketPath: string, urlPath: string): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = get({ socketPath, path: urlPath, timeout: 10_000 }, (res) => {
      let body = '';
      res.setEncoding('utf8').on('data', (d: string) => (body += d));
      res.once('end', () => resolve({ status: res.statusCode ?? 0, body }));
    });
    req.once('error', reject);
  });
}

/** The value of one sample in Prometheus text, e.g. `tsbox_sandbox_starts_total{result="ok"}`. */
function sample(text: string, series: string): number | undefined {
  const line = text.split('\n').find((l) => l.startsWith(`${series} `));
  return line === undefined ? undefined : Number(line.slice(series.length + 1));
}

function daemonWith(extra: readonly string[]): Promise<SandboxerDaemon> {
  return startSandboxerDaemon({
    name: 'tsbox-metrics',
    runsProcesses: true,
    stopExitStatus: 137,
    command: ({ socketPath, stateDir }) => ({
      file: process.execPath,
      args: [tsboxMain, 'serve', '--socket', socketPath, '--state-dir', stateDir, ...extra.map((a) => a.replace('{DIR}', path.dirname(stateDir)))],
    }),
  });
}

describe('metrics endpoint', () => {
  let daemon: SandboxerDaemon | undefined;
  let metricsSocket = '';

  before(async () => {
    daemon = await daemonWith(['--metrics-address', '{DIR}/metrics.sock']);
    metricsSocket = path.join(daemon.dir, 'metrics.sock');
  });
  after(async () => {
    await daemon?.teardown();
  });

  test('healthz and readyz answer 200 once tsbox serves; metrics has process and tsbox series', async () => {
    assert.deepEqual(await httpGet(metricsSocket, '/healthz'), { status: 200, body: 'ok\n' });
    assert.deepEqual(await httpGet(metricsSocket, '/readyz'), { status: 200, body: 'ready\n' });
    const { status, body } = await httpGet(metricsSocket, '/metrics');
    assert.equal(status, 200);
    assert.equal(sample(body, 'tsbox_ready'), 1);
    assert.ok((sample(body, 'tsbox_recovery_duration_seconds') ?? -1) >= 0);
    assert.ok(sample(body, 'process_cpu_seconds_total') !== undefined, 'process metrics');
    assert.ok(sample(body, 'nodejs_heap_size_used_bytes') !== undefined, 'Node metrics');
    assert.equal((await httpGet(metricsSocket, '/nope')).status, 404);
  });

  test('a start, a Stop and the exit move the counters; sandboxes by namespace and state', async () => {
    const d = daemon;
    assert.ok(d !== undefined);
    const c = createSandboxClients(d.socketPath, 'metrics-ns');
    try {
      const ref = { sandbox_id: 'm1', sandboxer: 'tsbox' };
      await c.controller.call('Create', { ...ref, rootfs: [], annotations: {}, netns_path: '' });
      await c.controller.call('Start', ref);
      let body = (await httpGet(metricsSocket, '/metrics')).body;
      assert.equal(sample(body, 'tsbox_sandbox_starts_total{result="ok"}'), 1);
      assert.equal(sample(body, 'tsbox_sandboxes{namespace="metrics-ns",state="running"}'), 1);
      assert.ok((sample(body, 'tsbox_state_write_duration_seconds_count{op="save"}') ?? 0) >= 2, 'each change was written');

      await c.controller.call('Stop', { ...ref, timeout_secs: 0 });
      await waitFor(async () => sample((await httpGet(metricsSocket, '/metrics')).body, 'tsbox_sandbox_exits_total{class="signal"}') === 1, { what: 'the exit to be counted', timeoutMs: 10_000 });
      body = (await httpGet(metricsSocket, '/metrics')).body;
      assert.equal(sample(body, 'tsbox_stop_duration_seconds_count'), 1);
      assert.equal(sample(body, 'tsbox_sandboxes{namespace="metrics-ns",state="exited"}'), 1);
      assert.equal(sample(body, 'tsbox_sandboxes{namespace="metrics-ns",state="running"}'), undefined);

      await c.controller.call('Shutdown', ref);
      const missing = await c.controller.call('Status', { sandbox_id: 'no-such', sandboxer: 'tsbox' }).then(
        () => 'answered',
        (err: unknown) => String((err as { code?: unknown }).code),
      );
      assert.equal(missing, '5', 'NOT_FOUND');
      body = (await httpGet(metricsSocket, '/metrics')).body;
      for (const method of ['Create', 'Start', 'Stop', 'Shutdown']) {
        assert.equal(sample(body, `tsbox_rpc_requests_total{method="${method}",code="OK"}`), 1, `${method} counted by the transport`);
        assert.equal(sample(body, `tsbox_rpc_duration_seconds_count{method="${method}",code="OK"}`), 1, `${method} timed`);
      }
      assert.equal(sample(body, 'tsbox_rpc_requests_total{method="Status",code="NOT_FOUND"}'), 1, 'failed calls by their code');
      assert.equal(sample(body, 'tsbox_sandboxes{namespace="metrics-ns",state="exited"}'), undefined, 'a removed sandbox is no longer counted');
    } finally {
      c.close();
    }
  });

  test('logs are JSON lines when stdout is not a terminal', () => {
    const first = readFileSync(daemon?.logPath ?? '', 'utf8').split('\n')[0] ?? '';
    const entry = JSON.parse(first) as { msg: string; level: number };
    assert.equal(entry.msg, 'tsbox starting');
  });
});

describe('metrics address in use, and pretty logs', () => {
  let dir = '';
  let blocker: Server | undefined;
  before(async () => {
    dir = await makeTempDir('metrics-');
  });
  after(async () => {
    blocker?.close();
    await removeTree(dir);
  });

  test('tsbox refuses to start when its metrics address is taken, naming it', async () => {
    const s = createServer();
    blocker = s;
    await new Promise<void>((resolve) => s.listen(0, '127.0.0.1', resolve));
    const address = `127.0.0.1:${(s.address() as AddressInfo).port}`;
    const r = await runCommand(process.execPath, [tsboxMain, 'serve', '--socket', path.join(dir, 't.sock'), '--state-dir', path.join(dir, 'state'), '--backend', 'noop', '--metrics-address', address], 30_000);
    assert.equal(r.code, 1, r.stderr);
    assert.match(r.stderr, new RegExp(`metrics address ${address.replace(/\./g, '\\.')} is in use by another process`));
  });

  test('--log-format pretty prints readable lines', async () => {
    const d = await daemonWith(['--log-format', 'pretty', '--backend', 'noop']);
    try {
      const first = readFileSync(d.logPath, 'utf8').split('\n')[0] ?? '';
      assert.throws(() => JSON.parse(first) as unknown, 'not JSON');
      assert.match(first, /^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}\] INFO: tsbox starting/);
    } finally {
      await d.teardown();
    }
  });
});

describe('metrics endpoint on a unix socket path', () => {
  let dir = '';
  const logger = pino({ level: 'silent' });
  before(async () => {
    dir = await makeTempDir('metrics-unix-');
  });
  after(async () => {
    await removeTree(dir);
  });

  test('a socket file nobody answers on is replaced', async () => {
    const socketPath = path.join(dir, 'stale.sock');
    // A server killed without removing its socket file.
    const killed = spawnSync(process.execPath, ['-e', `require('node:net').createServer().listen(${JSON.stringify(socketPath)}, () => process.kill(process.pid, 'SIGKILL'))`]);
    assert.equal(killed.signal, 'SIGKILL');
    assert.ok(lstatSync(socketPath).isSocket());
    const server = await startMetricsServer(socketPath, createMetrics(), logger);
    try {
      const r = await httpGet(socketPath, '/healthz');
      assert.equal(r.status, 200);
    } finally {
      await server.close();
    }
  });

  test('a socket another server answers on is refused, naming the address', async () => {
    const socketPath = path.join(dir, 'live.sock');
    const live = createServer((c) => c.destroy());
    await new Promise<void>((resolve) => live.listen(socketPath, resolve));
    try {
      await assert.rejects(startMetricsServer(socketPath, createMetrics(), logger), (err: unknown) => {
        assert.ok(err instanceof MetricsAddressError);
        assert.equal(err.message, `metrics address ${socketPath} is in use: another server answers on it; stop it or pick another metrics_address`);
        return true;
      });
    } finally {
      await new Promise<void>((resolve) => live.close(() => resolve()));
    }
  });
});
