// The daemon's sockets as a client meets them: the path appears with its final mode (a client
// or a readiness probe that finds the path never finds another mode), a live server's socket is
// never replaced, and nothing but the socket is left beside it. Real unix sockets in a temp dir.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtempSync, readdirSync, rmSync, statSync } from 'node:fs';
import { createServer, type Server } from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { after, describe, test } from 'node:test';
import { TsboxError } from '../../src/base/errors.js';
import { isSocketLive, listenUnixSocket } from '../../src/transport/socket.js';

/**
 * Starts a process that stats `file` as fast as it can until it exists and reports the mode it
 * found first; resolves once it is watching.
 */
async function watchFirstMode(file: string): Promise<{ firstMode: Promise<string> }> {
  const script = `const fs = require('node:fs'); process.stdout.write('watching\\n');
    for (;;) { try { process.stdout.write((fs.statSync(${JSON.stringify(file)}).mode & 0o777).toString(8)); break; } catch {} }`;
  const child = spawn(process.execPath, ['-e', script], { stdio: ['ignore', 'pipe', 'inherit'] });
  let out = '';
  child.stdout.setEncoding('utf8');
  await new Promise<void>((resolve, reject) => {
    child.stdout.on('data', (chunk: string) => {
      out += chunk;
      if (out.startsWith('watching\n')) resolve();
    });
    child.once('exit', (code) => reject(new Error(`the watcher exited early (${String(code)}): ${out}`)));
  });
  return { firstMode: new Promise((resolve) => child.once('close', () => resolve(out.slice('watching\n'.length)))) };
}

const closed = (server: Server): Promise<unknown> => new Promise((resolve) => server.close(resolve));

describe('listening on a unix socket', () => {
  const dir = mkdtempSync(path.join(tmpdir(), 'socket-listen-'));
  after(() => rmSync(dir, { recursive: true, force: true }));

  test('the socket appears at its path with its mode from the first moment', async () => {
    // With the usual umask 022 a socket is bound 0755: only a later chmod would make it 0660.
    const previous = process.umask(0o022);
    try {
      for (let round = 0; round < 5; round++) {
        const file = path.join(dir, `mode-${round}.sock`);
        const { firstMode } = await watchFirstMode(file);
        const server = createServer((c) => c.destroy());
        const socket = await listenUnixSocket(server, file, 0o660, 16);
        assert.equal(await firstMode, '660', `round ${round}: the path was seen with another mode first`);
        assert.equal((statSync(file).mode & 0o777).toString(8), '660');
        assert.ok(await isSocketLive(file), 'the server does not accept on its path');
        await closed(server);
        await socket.remove();
      }
    } finally {
      process.umask(previous);
    }
  });

  test('nothing but the socket is left beside it; remove deletes it only while it is ours', async () => {
    const sub = mkdtempSync(path.join(dir, 'own-'));
    const file = path.join(sub, 'tsbox.sock');
    const server = createServer((c) => c.destroy());
    const socket = await listenUnixSocket(server, file, 0o600, 16);
    assert.deepEqual(readdirSync(sub), ['tsbox.sock']);
    await closed(server);
    assert.deepEqual(readdirSync(sub), ['tsbox.sock'], 'closing the server removed or added a name');

    // Another server took the path (its stale socket replaced): ours is gone, theirs stays.
    rmSync(file);
    const other = createServer((c) => c.destroy());
    await new Promise<void>((resolve) => other.listen(file, resolve));
    await socket.remove();
    assert.ok(await isSocketLive(file), "remove deleted another server's socket");
    await closed(other);
  });

  test('a live server at the path is refused, keeps its socket, and no hidden name is left', async () => {
    const sub = mkdtempSync(path.join(dir, 'live-'));
    const file = path.join(sub, 'tsbox.sock');
    const first = createServer((c) => c.destroy());
    const socket = await listenUnixSocket(first, file, 0o660, 16);
    const inode = statSync(file).ino;

    const second = createServer((c) => c.destroy());
    await assert.rejects(listenUnixSocket(second, file, 0o660, 16), (err: unknown) => {
      assert.ok(err instanceof TsboxError);
      assert.equal(err.kind, 'FailedPrecondition');
      assert.match(err.message, /already listening on .*tsbox\.sock/);
      return true;
    });
    assert.equal(second.listening, false);
    assert.equal(statSync(file).ino, inode, 'the live socket was replaced');
    assert.ok(await isSocketLive(file));
    assert.deepEqual(readdirSync(sub), ['tsbox.sock']);
    await closed(first);
    await socket.remove();
    assert.deepEqual(readdirSync(sub), []);
  });

  test('a stale socket left by a crash is replaced', async () => {
    const sub = mkdtempSync(path.join(dir, 'stale-'));
    const file = path.join(sub, 'tsbox.sock');
    const script = `require('node:net').createServer().listen(${JSON.stringify(file)}, () => process.stdout.write('up'))`;
    const child = spawn(process.execPath, ['-e', script], { stdio: ['ignore', 'pipe', 'inherit'] });
    await new Promise<void>((resolve) => child.stdout.once('data', () => resolve()));
    const exited = new Promise((resolve) => child.once('exit', resolve));
    child.kill('SIGKILL');
    await exited;
    assert.equal(await isSocketLive(file), false, 'the killed listener left a live socket');

    const server = createServer((c) => c.destroy());
    const socket = await listenUnixSocket(server, file, 0o660, 16);
    assert.ok(await isSocketLive(file));
    assert.deepEqual(readdirSync(sub), ['tsbox.sock']);
    await closed(server);
    await socket.remove();
  });
});
