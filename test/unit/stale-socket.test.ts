// A pod's runc shim leaves its socket file when it exits (containerd 2.1's pkg/shim removes
// another path): tsbox removes such a file at Shutdown once connecting to it is refused, and
// never one that a process still serves. Real unix sockets in a temp dir.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { after, describe, test } from 'node:test';
import { pino } from 'pino';
import { removeStaleSocket, shimSocketPath } from '../../src/runtime/task-shim.js';

const log = pino({ level: 'silent' });

/** A socket file whose listener was killed: what an exited shim leaves. */
async function deadSocket(file: string): Promise<void> {
  const script = `require('node:net').createServer().listen(${JSON.stringify(file)}, () => process.stdout.write('up'))`;
  const child = spawn(process.execPath, ['-e', script], { stdio: ['ignore', 'pipe', 'inherit'] });
  await new Promise<void>((resolve, reject) => {
    child.stdout.once('data', () => resolve());
    child.once('exit', (code) => reject(new Error(`listener exited early (${String(code)})`)));
  });
  const exited = new Promise((resolve) => child.once('exit', resolve));
  child.kill('SIGKILL');
  await exited;
}

describe('stale shim sockets', () => {
  const dir = mkdtempSync(path.join(tmpdir(), 'stale-socket-'));
  after(() => rmSync(dir, { recursive: true, force: true }));

  test('the pod socket and its debug socket are named as containerd 2.1 pkg/shim names them', () => {
    // `echo -n /run/containerd/containerd.sock/k8s.io/pod1 | sha256sum`, and with "/debug"
    assert.equal(shimSocketPath('/run/containerd/containerd.sock', 'k8s.io', 'pod1'), '/run/containerd/s/8e264b1ad347c80aee5f3dea6e4bb53d72026989222058782273d5db043c7723');
    assert.equal(shimSocketPath('/run/containerd/containerd.sock', 'k8s.io', 'pod1', true), '/run/containerd/s/ddbdfb7af5ceff24b0d2ddc30aff7f5124fd781c8851437485f62039b920b4e2');
    assert.equal(shimSocketPath('/run/containerd//containerd.sock/', 'k8s.io', 'pod1'), shimSocketPath('/run/containerd/containerd.sock', 'k8s.io', 'pod1'), 'the key is a cleaned path (Go filepath.Join)');
  });

  test('a socket nobody listens on is removed', async () => {
    const file = path.join(dir, 'dead.sock');
    await deadSocket(file);
    assert.ok(existsSync(file), 'the killed listener left its socket file');
    assert.equal(await removeStaleSocket(file, log), 'removed');
    assert.equal(existsSync(file), false);
  });

  test('a socket a process serves is left, and so is a file that is not a socket', async () => {
    const file = path.join(dir, 'live.sock');
    const server = createServer((c) => c.destroy());
    await new Promise<void>((resolve) => server.listen(file, resolve));
    try {
      assert.equal(await removeStaleSocket(file, log), 'served');
      assert.ok(existsSync(file));
    } finally {
      await new Promise((resolve) => server.close(resolve));
    }
    const plain = path.join(dir, 'plain');
    writeFileSync(plain, 'not a socket');
    assert.equal(await removeStaleSocket(plain, log), 'kept');
    assert.ok(existsSync(plain));
  });

  test('a listener that ends within the grace is waited for, then its socket removed', async () => {
    const file = path.join(dir, 'ending.sock');
    // Serves, then exits 300 ms later without closing the socket (as a killed process would).
    const script = `require('node:net').createServer().listen(${JSON.stringify(file)}, () => { process.stdout.write('up'); setTimeout(() => process.exit(0), 300); })`;
    const child = spawn(process.execPath, ['-e', script], { stdio: ['ignore', 'pipe', 'inherit'] });
    const exited = new Promise((resolve) => child.once('exit', resolve));
    await new Promise<void>((resolve) => child.stdout.once('data', () => resolve()));
    assert.equal(await removeStaleSocket(file, log, 5_000, 5_000), 'removed');
    await exited;
    assert.equal(existsSync(file), false);
  });

  test('no file: nothing to do', async () => {
    assert.equal(await removeStaleSocket(path.join(dir, 'never.sock'), log), 'absent');
  });
});
