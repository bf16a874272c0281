/**
 * The daemon as an operator meets it: its socket (mode, a second instance, a stale socket
 * after a crash, something else in the way), its state dir (one daemon at a time), SIGTERM (pending Waits end UNAVAILABLE, which
 * containerd retries; sandboxes keep running; a restart finds them) and a bad configuration
 * (SPEC.md sections 1 and 3-5).
 */
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { lstatSync, mkdirSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync, existsSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { cmdlineOf, listPids, uniqueNamespace } from '../support/host.js';
import { GrpcStatus, expectCode, timestampMs } from '../support/grpc-client.js';
import { type TsboxDaemon, socketAccepts, startTsbox, tsboxMain, tsboxShim } from '../support/tsbox-daemon.js';
import { alive, createAndStart, procExists, waitFor, withLog } from './fixtures.js';

describe('the tsbox daemon and its socket', () => {
  let daemon: TsboxDaemon | undefined;
  const ns = uniqueNamespace('daemon');

  before(async () => {
    daemon = await startTsbox('tsbox-daemon');
  });

  after(async () => {
    await daemon?.teardown();
  });

  function d(): TsboxDaemon {
    assert.ok(daemon !== undefined, 'daemon not started');
    return daemon;
  }

  test('the socket is a unix socket with mode 0660', () => {
    const info = statSync(d().socketPath);
    assert.ok(info.isSocket(), `${d().socketPath} is not a socket`);
    assert.equal((info.mode & 0o777).toString(8), '660');
  });

  test('a second serve on the same socket exits 2 at once naming the first tsbox, its pid and its state dir; the first keeps serving', () =>
    withLog(daemon, async () => {
      const client = d().client(ns);
      const id = 'survives-second-serve';
      const { pid } = await createAndStart(d(), client, id);
      const inode = statSync(d().socketPath).ino;

      // Its own state dir: the socket, not the state dir lock, is what refuses it.
      const args = d().serveArgs();
      args[args.indexOf('--state-dir') + 1] = path.join(d().dir, 'second-state');
      const second = await d().run(args, 15_000);
      assert.equal(second.signal, null, `the second serve did not exit by itself within 15 s:\n${second.stderr}`);
      // A configuration mistake (exit 2), naming who serves the socket: the first tsbox, its pid and its state dir.
      assert.equal(second.code, 2, second.stderr);
      assert.ok(second.stderr.includes(`${d().socketPath} is served by another tsbox, pid ${d().pid}, state dir ${d().stateDir}`), `stderr: ${second.stderr}`);

      assert.equal(statSync(d().socketPath).ino, inode, 'the socket of the first daemon was replaced');
      const status = await client.status({ sandboxId: id });
      assert.equal(status.state, 'SANDBOX_READY');
      assert.equal(status.pid, pid);
      assert.ok(alive(pid));
      await client.shutdown({ sandboxId: id });
    }));

  test('a regular file at the socket path is refused ("not a socket") and left alone', () =>
    withLog(daemon, async () => {
      const dir = path.join(d().dir, 'not-a-socket');
      mkdirSync(dir, { recursive: true });
      const file = path.join(dir, 'tsbox.sock');
      writeFileSync(file, 'precious\n');
      const result = await d().run([tsboxMain, 'serve', '--socket', file, '--state-dir', path.join(dir, 'state')], 15_000);
      assert.equal(result.signal, null, 'serve did not exit by itself');
      assert.notEqual(result.code, 0);
      assert.match(result.stderr, /not a socket/, `stderr: ${result.stderr}`);
      assert.ok(lstatSync(file).isFile());
      assert.equal(readFileSync(file, 'utf8'), 'precious\n');
    }));

  test('a bad configuration exits 2 and lists every problem', () =>
    withLog(daemon, async () => {
      const dir = path.join(d().dir, 'bad-config');
      mkdirSync(dir, { recursive: true });
      const socket = path.join(dir, 'tsbox.sock');
      const stateDir = path.join(dir, 'state');
      const result = await d().run(
        [tsboxMain, 'serve', '--socket', socket, '--state-dir', stateDir, '--log-level', 'loud', '--socket-mode', '999'],
        15_000,
      );
      assert.equal(result.code, 2, `exit ${result.code}, stderr: ${result.stderr}`);
      assert.match(result.stderr, /log[-_ ]?level/i, `stderr should name the log level: ${result.stderr}`);
      assert.match(result.stderr, /socket[-_ ]?mode/i, `stderr should name the socket mode: ${result.stderr}`);
      assert.equal(existsSync(socket), false, 'no socket for a daemon that did not start');
      assert.equal(existsSync(stateDir), false, 'no state dir for a daemon that did not start');
    }));

  test("containerd's config that cannot be read, or a setting that disagrees with it, exits 2 naming the file or both values", () =>
    withLog(daemon, async () => {
      const dir = path.join(d().dir, 'containerd-config');
      mkdirSync(path.join(dir, 'conf.d'), { recursive: true });
      const socket = path.join(dir, 'tsbox.sock');
      const stateDir = path.join(dir, 'state');
      const base = ['serve', '--socket', socket, '--state-dir', stateDir];
      const main = path.join(dir, 'config.toml');
      writeFileSync(main, 'version = 3\nimports = ["conf.d/*.toml", "extra.toml"]\n');
      writeFileSync(path.join(dir, 'conf.d', 'paths.toml'), 'version = 3\nroot = "/srv/k3s/containerd"\n');

      const missingImport = await d().run([tsboxMain, ...base, '--containerd-config', main], 15_000);
      assert.equal(missingImport.code, 2, `exit ${missingImport.code}, stderr: ${missingImport.stderr}`);
      assert.ok(missingImport.stderr.includes(`cannot read containerd config ${path.join(dir, 'extra.toml')} (imported by ${main}): no such file`), missingImport.stderr);

      writeFileSync(path.join(dir, 'extra.toml'), '[grpc]\n  address = "/run/k3s/containerd/containerd.sock"\n');
      const disagrees = await d().run([tsboxMain, ...base, '--containerd-config', main, '--containerd-root', '/var/lib/containerd'], 15_000);
      assert.equal(disagrees.code, 2, `exit ${disagrees.code}, stderr: ${disagrees.stderr}`);
      assert.match(disagrees.stderr, /containerd_root: \/var\/lib\/containerd .* disagrees with containerd's root in .*conf\.d\/paths\.toml, \/srv\/k3s\/containerd/);
      assert.equal(existsSync(socket), false, 'no socket for a daemon that did not start');
      assert.equal(existsSync(stateDir), false, 'no state dir for a daemon that did not start');

      // What tsbox would run with: containerd's values, from the files that set them.
      const shown = await d().run([tsboxMain, 'config', 'show', '--containerd-config', main], 15_000);
      assert.equal(shown.code, 0, shown.stderr);
      const effective = JSON.parse(shown.stdout) as Record<string, unknown>;
      assert.deepEqual([effective['containerdRoot'], effective['containerdState'], effective['containerdAddress']], ['/srv/k3s/containerd', '/run/containerd', '/run/k3s/containerd/containerd.sock']);

      writeFileSync(path.join(dir, 'extra.toml'), '[grpc]\n  address = "/run/k3s/containerd/containerd.sock\n');
      const broken = await d().run([tsboxMain, ...base, '--containerd-config', main], 15_000);
      assert.equal(broken.code, 2, `exit ${broken.code}, stderr: ${broken.stderr}`);
      assert.match(broken.stderr, new RegExp(`containerd config ${path.join(dir, 'extra.toml')} \\(imported by ${main}\\) is not valid TOML at line 2, column \\d+`));
    }));

  test('an invalid or unreadable TOML config file exits 2', () =>
    withLog(daemon, async () => {
      const dir = path.join(d().dir, 'toml');
      mkdirSync(dir, { recursive: true });
      const base = ['serve', '--socket', path.join(dir, 'tsbox.sock'), '--state-dir', path.join(dir, 'state')];

      const invalid = path.join(dir, 'invalid.toml');
      writeFileSync(invalid, 'socket = [\nlog_level = \n');
      const bad = await d().run([tsboxMain, ...base, '--config', invalid], 15_000);
      assert.equal(bad.code, 2, `invalid TOML: exit ${bad.code}, stderr: ${bad.stderr}`);
      assert.ok(bad.stderr.includes(invalid), `stderr should name ${invalid}: ${bad.stderr}`);

      const missing = path.join(dir, 'missing.toml');
      const gone = await d().run([tsboxMain, ...base, '--config', missing], 15_000);
      assert.equal(gone.code, 2, `missing config: exit ${gone.code}, stderr: ${gone.stderr}`);
      assert.ok(gone.stderr.includes(missing), `stderr should name ${missing}: ${gone.stderr}`);

      // A directory cannot be read as a file, even by root.
      const unreadable = await d().run([tsboxMain, ...base, '--config', dir], 15_000);
      assert.equal(unreadable.code, 2, `unreadable config: exit ${unreadable.code}, stderr: ${unreadable.stderr}`);

      const unknownKey = path.join(dir, 'unknown.toml');
      writeFileSync(unknownKey, 'log_level = "info"\nno_such_setting = 1\n');
      const unknown = await d().run([tsboxMain, ...base, '--config', unknownKey], 15_000);
      assert.equal(unknown.code, 2, `unknown setting: exit ${unknown.code}, stderr: ${unknown.stderr}`);
      assert.match(unknown.stderr, /no_such_setting|noSuchSetting/);
    }));

  test('after a crash (kill -9) the stale socket is replaced on restart and the sandboxes are still there', () =>
    withLog(daemon, async () => {
      const client = d().client(ns);
      const id = 'survives-crash';
      const { pid, createdAtMs } = await createAndStart(d(), client, id);

      await d().kill9();
      assert.ok(lstatSync(d().socketPath).isSocket(), 'a killed daemon leaves its socket file behind');
      assert.equal(await socketAccepts(d().socketPath), false);
      assert.ok(alive(pid), 'the sandbox must outlive the daemon');

      await d().start();
      const fresh = d().client(ns);
      const status = await fresh.status({ sandboxId: id });
      assert.equal(status.state, 'SANDBOX_READY');
      assert.equal(status.pid, pid);
      assert.equal(timestampMs(status.createdAt), createdAtMs);
      assert.equal((statSync(d().socketPath).mode & 0o777).toString(8), '660');

      await fresh.stop({ sandboxId: id, timeoutSecs: 0 });
      assert.equal(procExists(pid), false);
      assert.equal((await fresh.wait({ sandboxId: id })).exitStatus, 137);
      await fresh.shutdown({ sandboxId: id });
    }));

  test('SIGTERM: exit 0, socket removed, a pending Wait ends UNAVAILABLE, sandboxes keep running', () =>
    withLog(daemon, async () => {
      const client = d().client(ns);
      const id = 'survives-sigterm';
      const { pid, createdAtMs } = await createAndStart(d(), client, id);
      const waiter = d().newClient(ns);
      const waiting = expectCode(waiter.wait({ sandboxId: id }), GrpcStatus.UNAVAILABLE);
      // On the same connection, after the Wait: once this answers, the Wait is with the server.
      await waiter.status({ sandboxId: id });

      const exit = await d().stop();
      assert.equal(exit.graceful, true, 'tsbox did not exit on SIGTERM within the grace period');
      assert.equal(exit.code, 0, `tsbox exited with ${exit.code} (signal ${exit.signal})`);
      const ended = await waiting;
      assert.equal(ended.code, GrpcStatus.UNAVAILABLE);
      assert.equal(existsSync(d().socketPath), false, 'the socket should be removed on SIGTERM');
      assert.ok(procExists(pid) && alive(pid), 'the sandbox process must keep running without tsbox');

      await d().start();
      const fresh = d().client(ns);
      const status = await fresh.status({ sandboxId: id });
      assert.equal(status.state, 'SANDBOX_READY');
      assert.equal(status.pid, pid);
      assert.equal(timestampMs(status.createdAt), createdAtMs);

      const waitingAgain = fresh.wait({ sandboxId: id });
      await fresh.stop({ sandboxId: id, timeoutSecs: 0 });
      assert.equal(procExists(pid), false);
      const answer = await waitingAgain;
      assert.equal(answer.exitStatus, 137);
      assert.deepEqual(await fresh.wait({ sandboxId: id }), answer);
      assert.equal((await fresh.status({ sandboxId: id })).state, 'SANDBOX_NOTREADY');
      await fresh.shutdown({ sandboxId: id });
    }));
});

/** Live processes running `tsbox-shim lock <state>/tsbox.lock`. */
function lockHelpers(stateDir: string): number[] {
  const lockFile = path.join(stateDir, 'tsbox.lock');
  return listPids().filter((pid) => {
    const words = cmdlineOf(pid);
    return words[1] === 'lock' && words[2] === lockFile;
  });
}

describe('one daemon per state dir', () => {
  let daemon: TsboxDaemon | undefined;
  const ns = uniqueNamespace('lock');

  before(async () => {
    daemon = await startTsbox('tsbox-lock');
  });

  after(async () => {
    await daemon?.teardown();
  });

  function d(): TsboxDaemon {
    assert.ok(daemon !== undefined, 'daemon not started');
    return daemon;
  }

  test('a second serve on the same state dir with another socket exits 2 naming the dir and the first pid; the first keeps serving', () =>
    withLog(daemon, async () => {
      const client = d().client(ns);
      const id = 'held';
      const { pid } = await createAndStart(d(), client, id);
      const record = path.join(d().sandboxDir(ns, id), 'record.json');
      const recordBefore = readFileSync(record, 'utf8');
      const firstPid = d().pid;
      assert.ok(firstPid !== undefined);
      const helpers = lockHelpers(d().stateDir);
      assert.equal(helpers.length, 1, `one lock helper expected, found ${helpers.join(', ')}`);

      const otherSocket = path.join(d().dir, 'other.sock');
      const second = await d().run([tsboxMain, 'serve', '--socket', otherSocket, '--state-dir', d().stateDir], 15_000);
      assert.equal(second.signal, null, `the second serve did not exit by itself within 15 s:\n${second.stderr}`);
      assert.equal(second.code, 2, `exit ${second.code}, stderr: ${second.stderr}`);
      assert.ok(second.stderr.includes(d().stateDir), `stderr should name ${d().stateDir}: ${second.stderr}`);
      assert.match(second.stderr, new RegExp(`pid ${firstPid}\\b`), `stderr should name pid ${firstPid}: ${second.stderr}`);
      assert.equal(existsSync(otherSocket), false, 'the refused daemon must not bind its socket');

      assert.deepEqual(lockHelpers(d().stateDir), helpers, 'the refused daemon left a lock helper or took the first one away');
      assert.equal(readFileSync(record, 'utf8'), recordBefore, "the first daemon's record was touched");
      const status = await client.status({ sandboxId: id });
      assert.equal(status.state, 'SANDBOX_READY');
      assert.equal(status.pid, pid);
      assert.ok(alive(pid));
    }));

  test('after kill -9 the lock helper is gone and a new daemon starts on the dir without any cleanup', () =>
    withLog(daemon, async () => {
      const client = d().client(ns);
      const id = 'after-crash';
      const { pid } = await createAndStart(d(), client, id);
      const [helper] = lockHelpers(d().stateDir);
      assert.ok(helper !== undefined, 'no lock helper runs');

      await d().kill9();
      assert.ok(alive(pid), 'the sandbox must outlive the daemon');
      // The sandbox's supervisor, started by the daemon, must not hold the helper's pipe open.
      await waitFor(() => !procExists(helper), { what: `lock helper ${helper} gone after its daemon was killed`, timeoutMs: 5000 });

      await d().start();
      const helpers = lockHelpers(d().stateDir);
      assert.equal(helpers.length, 1, `one lock helper expected, found ${helpers.join(', ')}`);
      assert.equal(readFileSync(path.join(d().stateDir, 'tsbox.lock'), 'utf8'), `${d().pid}\n`, 'the lock file names the new daemon');
      const fresh = d().client(ns);
      const status = await fresh.status({ sandboxId: id });
      assert.equal(status.state, 'SANDBOX_READY');
      assert.equal(status.pid, pid);
      await fresh.shutdown({ sandboxId: id });
    }));

  test('a lock helper killed while the daemon runs is replaced: the dir stays locked, and the log says so', () =>
    withLog(daemon, async () => {
      const [helper] = lockHelpers(d().stateDir);
      assert.ok(helper !== undefined, 'no lock helper runs');
      process.kill(helper, 'SIGKILL');
      let helpers: number[] = [];
      await waitFor(
        () => {
          helpers = lockHelpers(d().stateDir);
          return helpers.length === 1 && helpers[0] !== helper;
        },
        { what: 'a new lock helper in place of the killed one', timeoutMs: 10_000, describe: () => `helpers: ${helpers.join(', ')}` },
      );
      await waitFor(() => d().logTail().includes('state dir locked again'), { what: 'the log says the dir is locked again', timeoutMs: 5000 });
      assert.match(d().logTail(), /lock helper exited while tsbox runs/);
      assert.equal(readFileSync(path.join(d().stateDir, 'tsbox.lock'), 'utf8'), `${d().pid}\n`, 'the lock file names the daemon');
      // Still the only daemon on the dir.
      const second = await d().run([tsboxMain, 'serve', '--socket', path.join(d().dir, 'other2.sock'), '--state-dir', d().stateDir], 15_000);
      assert.equal(second.code, 2, `exit ${second.code}, stderr: ${second.stderr}`);
      assert.equal((await d().client(ns).status({ sandboxId: 'absent' }).catch((err: { code?: number }) => err.code)), 5, 'the daemon still serves (NotFound)');
    }));

  test('SIGTERM: the lock helper has exited (and was reaped) when the daemon has; the next daemon takes the dir', () =>
    withLog(daemon, async () => {
      const [helper] = lockHelpers(d().stateDir);
      assert.ok(helper !== undefined, 'no lock helper runs');
      const exit = await d().stop();
      assert.equal(exit.code, 0, `tsbox exited with ${exit.code} (signal ${exit.signal})`);
      assert.equal(procExists(helper), false, `lock helper ${helper} outlived its daemon (or is a zombie)`);
      await d().start();
      assert.equal(lockHelpers(d().stateDir).length, 1);
    }));

  test('the lock helper keeps the lock from its "ok" until its daemon lets go, every time (200 in a row), and refuses a second taker meanwhile', async () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'tsbox-lockhelper-'));
    const lockFile = path.join(dir, 'tsbox.lock');
    // One helper: its first line, then (once stdin closes) its exit.
    const take = () => {
      const child = spawn(tsboxShim, ['lock', lockFile], { stdio: ['pipe', 'pipe', 'pipe'] });
      const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
      const answer = new Promise<string>((resolve) => {
        let out = '';
        child.stdout.setEncoding('utf8').on('data', (chunk: string) => (out += chunk));
        child.stdout.once('end', () => resolve(out));
      });
      return { child, exited, answer };
    };
    try {
      const held = take();
      assert.equal(await held.answer, 'ok\n');
      const other = take();
      assert.match(await other.answer, /^busy \d+\n$/, 'a second helper is refused while the first holds the lock');
      assert.equal(await other.exited, 1);
      held.child.stdin.end();
      assert.equal(await held.exited, 0);
      const early: string[] = [];
      for (let i = 0; i < 200; i++) {
        const h = take();
        // stdout ends after "ok" (the helper closes it) while it goes on holding the lock.
        const said = await h.answer;
        h.child.stdin.end();
        const code = await h.exited;
        // Exit 0 is the helper seeing its stdin close; anything else let go of the lock before.
        if (said !== 'ok\n' || code !== 0) early.push(`#${i}: said ${JSON.stringify(said)}, exit ${code}`);
      }
      assert.deepEqual(early, [], 'helpers that answered ok and then did not hold the lock until released');
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
