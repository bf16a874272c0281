/**
 * The native programs as built with AddressSanitizer, LeakSanitizer and UndefinedBehaviorSanitizer
 * (dist/bin-sanitize/, scripts/build-shim.mjs; any finding is fatal), run through real work: the
 * supervisor with the built-in pause and with a command in a pid namespace of its own, and its
 * failed starts; the pod's process in relay mode, with clients sending good ttrpc frames and
 * garbage and links that say Hello, until the pod ends; the helper modes (mount, umount-all of
 * a tree of tmpfs, bind and overlay mounts, lock, serve); the container holder through real runc
 * create, start, exec, a terminal, and its failures. Each must behave as the plain build does
 * (answers, records, exit statuses), and no sanitizer may report anything.
 *
 * How a finding shows: AddressSanitizer and LeakSanitizer write a report file into the test's
 * directory (log_path) and exit 86; UndefinedBehaviorSanitizer exits 86 too, but gcc builds its
 * runtime apart from AddressSanitizer's, and that one writes to stderr whatever log_path says,
 * so its report is looked for in what each program wrote on stderr while it was the test's, and
 * otherwise shows as the exit status 86 (of the program, or of the process whose end a record
 * holds). LeakSanitizer checks every program that returns from main; those that end with _exit
 * or exec (a failed start, the pause, a request's child) are not checked for leaks.
 */
import assert from 'node:assert/strict';
import { type ChildProcess, execFileSync, spawn } from 'node:child_process';
import { closeSync, constants, copyFileSync, existsSync, mkdirSync, openSync, readFileSync, readdirSync, renameSync, symlinkSync, writeFileSync, writeSync } from 'node:fs';
import { type Socket, connect } from 'node:net';
import path from 'node:path';
import { after, afterEach, before, describe, test } from 'node:test';
import { pino } from 'pino';
import { TsboxError, abortError } from '../../src/base/errors.js';
import { podRequests } from '../../src/tasks/pod-links.js';
import { parseHolderRecord } from '../../src/runtime/container-holder.js';
import { isMountedAt } from '../../src/runtime/mountinfo.js';
import { parseExitFile } from '../../src/runtime/supervised.js';
import { FrameType, encodeFrame } from '../../src/ttrpc/frame.js';
import { POD_CANCEL, POD_PROTOCOL_VERSION, POD_SERVICE } from '../../src/ttrpc/pod-link.js';
import { TtrpcServer } from '../../src/ttrpc/server.js';
import { repoRoot } from '../support/containerd-clients.js';
import { cmdlineOf, listPids } from '../support/host.js';
import { makeBundle, makeFifo, readFifo } from '../support/oci-bundle.js';
import { startPod } from '../support/pod-relay.js';
import { makeTempDir, removeTree, signalPid, tailFile, waitFor, within } from '../support/processes.js';
import { RawTtrpc, TEST_SERVICE, addTestMethods, requestFrame } from '../support/ttrpc-peer.js';

const sanitized = path.join(repoRoot, 'dist', 'bin-sanitize');
const shim = path.join(sanitized, 'tsbox-shim');
const ctr = path.join(sanitized, 'tsbox-ctr');
const busybox = path.join(repoRoot, '.cache', 'busybox', 'bin', 'busybox');
/** The exit status of a program a sanitizer stopped (ASAN_OPTIONS, UBSAN_OPTIONS). */
const SANITIZER_EXIT = 86;

let scratch = '';
/** Where the sanitizers write their reports. */
let reports = '';

/**
 * Whatever the sanitizers reported since the last look; the test fails on any (the reports are
 * moved aside once read, so that a finding fails the test that made it, not those after it).
 */
function assertNoReports(stderr = ''): void {
  const files = readdirSync(reports);
  const text = files.map((f) => `--- ${f}\n${readFileSync(path.join(reports, f), 'utf8')}`).join('\n');
  for (const f of files) renameSync(path.join(reports, f), path.join(scratch, `seen-${f}`));
  assert.deepEqual(files, [], `sanitizer reports:\n${text}`);
  assert.doesNotMatch(stderr, /runtime error:|Sanitizer/, 'a sanitizer reported on stderr');
}

interface Ended {
  code: number | null;
  signal: NodeJS.Signals | null;
}

/** A program started by the test, in a session of its own, as tsbox starts them. */
interface Launched {
  readonly child: ChildProcess;
  /** Everything on its stdout, once it has closed it (the answer, for the supervising programs). */
  readonly answer: Promise<string>;
  readonly exited: Promise<Ended>;
  stdout(): string;
  stderr(): string;
}

function launch(program: string, args: readonly string[], input?: string | Buffer): Launched {
  const child = spawn(program, args, { stdio: ['pipe', 'pipe', 'pipe'], detached: true, cwd: '/' });
  const out: Buffer[] = [];
  const err: Buffer[] = [];
  child.stdout.on('data', (chunk: Buffer) => out.push(chunk));
  child.stderr.on('data', (chunk: Buffer) => err.push(chunk));
  child.on('error', () => /* a failed spawn shows as its exit */ undefined);
  child.stdin.on('error', () => /* a program that has ended reads no more */ undefined);
  const answer = new Promise<string>((resolve) => child.stdout.once('close', () => resolve(Buffer.concat(out).toString())));
  const exited = new Promise<Ended>((resolve) => child.once('exit', (code, signal) => resolve({ code, signal })));
  if (input !== undefined) child.stdin.end(input);
  return { child, answer, exited, stdout: () => Buffer.concat(out).toString(), stderr: () => Buffer.concat(err).toString() };
}

/** Runs a program to its end: how it ended and what it wrote. */
async function run(program: string, args: readonly string[], input: string | Buffer = ''): Promise<Ended & { stdout: string; stderr: string }> {
  const p = launch(program, args, input);
  const ended = await within(p.exited, 30_000, `${path.basename(program)} ${args.join(' ')}`);
  await p.answer;
  return { ...ended, stdout: p.stdout(), stderr: p.stderr() };
}


/** The exit record in `dir`, parsed as tsbox parses it. */
function exitRecord(dir: string): { status: number; seconds: number } {
  const text = readFileSync(path.join(dir, 'exit'), 'utf8');
  const exit = parseExitFile(text);
  assert.ok(exit !== undefined, `${dir}/exit is malformed: ${JSON.stringify(text)}`);
  return { status: exit.status, seconds: exit.exitedAt.seconds };
}

/** A time in seconds that must lie between `from` and now (ms since the epoch). */
function assertTimeSince(seconds: number, from: number): void {
  assert.ok(seconds >= Math.floor(from / 1000) && seconds <= Math.ceil(Date.now() / 1000), `exit time ${seconds} is not between ${from / 1000} and now`);
}

before(async () => {
  for (const program of [shim, ctr]) assert.ok(existsSync(program), `${program} not found: run npm run build`);
  scratch = await makeTempDir('tsbox-san-');
  reports = path.join(scratch, 'reports');
  mkdirSync(reports);
  // Every program the test starts inherits them (Node itself has no sanitizer to read them).
  // LeakSanitizer stops the process's threads with ptrace, which root has here.
  process.env['ASAN_OPTIONS'] = `detect_leaks=1:log_path=${reports}/asan:abort_on_error=0:exitcode=${SANITIZER_EXIT}`;
  process.env['UBSAN_OPTIONS'] = `print_stacktrace=1:halt_on_error=1:exitcode=${SANITIZER_EXIT}:log_path=${reports}/ubsan`;
});

after(async () => {
  delete process.env['ASAN_OPTIONS'];
  delete process.env['UBSAN_OPTIONS'];
  // A program a sanitizer stopped leaves what it ran behind (a pause whose supervisor died
  // names the test's directory on its command line, as its supervisor's copy): it goes.
  for (const pid of listPids()) if (pid !== process.pid && cmdlineOf(pid).some((arg) => arg.includes(scratch))) signalPid(pid, 'SIGKILL');
  await removeTree(scratch);
});

describe('the sanitized supervisor (tsbox-shim)', () => {
  // A report a failed assertion left unread fails the test that made it, not the next one.
  afterEach(() => assertNoReports());

  test('the built-in pause: ok, its pid record; SIGTERM to the sandbox process: exit 0 recorded, the notice touched, the supervisor exits 0', async () => {
    const dir = path.join(scratch, 'pause');
    mkdirSync(dir);
    const notify = path.join(scratch, 'pause.notify');
    const began = Date.now();
    const sv = launch(shim, ['--dir', dir, '--notify', notify]);
    const answer = await within(sv.answer, 10_000, 'the answer');
    const ok = /^ok (\d+) (\d+)\n$/.exec(answer);
    assert.ok(ok !== null, `answer ${JSON.stringify(answer)}, stderr ${JSON.stringify(sv.stderr())}`);
    assert.equal(Number(ok[1]), sv.child.pid);
    assert.equal(readFileSync(path.join(dir, 'pid'), 'utf8'), `${ok[1]} ${ok[2]}\n`);
    signalPid(Number(ok[2]), 'SIGTERM');
    assert.deepEqual(await within(sv.exited, 10_000, 'the supervisor\'s end'), { code: 0, signal: null });
    const exit = exitRecord(dir);
    assert.equal(exit.status, 0);
    assertTimeSince(exit.seconds, began);
    assert.ok(existsSync(notify), 'the notice is touched');
    assert.deepEqual(readdirSync(dir).sort(), ['exit', 'pid'], 'no temp file left');
    assertNoReports(sv.stderr());
  });

  test('a command in pid, mount, ipc and uts namespaces of its own: its exit code 7 is recorded', async () => {
    const dir = path.join(scratch, 'pidns');
    mkdirSync(dir);
    const sv = launch(shim, ['--dir', dir, '--unshare', 'pid,mnt,ipc,uts', '--hostname', 'sanitized', '--', '/bin/sh', '-c', '[ "$(cat /proc/sys/kernel/hostname)" = sanitized ] && [ $$ = 1 ] && exit 7; exit 1']);
    const answer = await within(sv.answer, 10_000, 'the answer');
    assert.match(answer, /^ok \d+ \d+\n$/, `stderr ${JSON.stringify(sv.stderr())}`);
    assert.deepEqual(await within(sv.exited, 10_000, 'the supervisor\'s end'), { code: 0, signal: null });
    assert.equal(exitRecord(dir).status, 7);
    assertNoReports(sv.stderr());
  });

  test('failed starts answer "error <what>", exit 1 and leave nothing', async () => {
    const dir = path.join(scratch, 'failed');
    mkdirSync(dir);
    const netns = path.join(scratch, 'no-such-netns');
    assert.deepEqual(await run(shim, ['--dir', dir, '--netns', netns]), {
      code: 1,
      signal: null,
      stdout: `error open network namespace ${netns}: No such file or directory\n`,
      stderr: '',
    });
    assert.deepEqual(await run(shim, ['--dir', dir, '--bogus', 'x']), { code: 1, signal: null, stdout: 'error unknown option --bogus\n', stderr: '' });
    // Relay mode: the task socket's path is taken by a file; the link socket bound before it goes.
    const taken = path.join(dir, 'task.sock');
    writeFileSync(taken, '');
    const link = path.join(dir, 'link.sock');
    const refused = await run(shim, ['--dir', dir, '--task-socket', taken, '--link', link]);
    assert.deepEqual(refused, { code: 1, signal: null, stdout: `error ${taken} exists and is not a socket; refusing to replace it\n`, stderr: '' });
    assert.deepEqual(readdirSync(dir), ['task.sock'], 'nothing left but the file that was there');
    assertNoReports();
  });
});

describe('the sanitized pod\'s process in relay mode', () => {
  afterEach(() => assertNoReports());

  test('clients with good frames and garbage, links that say Hello (one refused), then the pod ends: exit 137 recorded, SIGTERM ends it with 0 and its sockets go', async () => {
    const dir = path.join(scratch, 'relay');
    mkdirSync(dir);
    const pod = await startPod(dir, { program: shim });
    const server = new TtrpcServer({ logger: pino({ level: 'silent' }) });
    addTestMethods(server);
    // Calls held until cancelled: how many came, and how many the relay's Cancel ended.
    let held = 0;
    let cancelled = 0;
    server.register(TEST_SERVICE, 'Held', (_payload, ctx) =>
      new Promise((_resolve, reject) => {
        held++;
        ctx.signal.addEventListener('abort', () => {
          cancelled++;
          reject(abortError(ctx.signal));
        }, { once: true });
      }),
    );
    const opened: { destroy(): void }[] = [];
    const linkTo = async (version: number): Promise<Socket> => {
      const socket = connect(pod.link);
      await new Promise<void>((resolve, reject) => {
        socket.once('connect', resolve);
        socket.once('error', reject);
      });
      opened.push(socket);
      void server.serveConnection(
        socket,
        podRequests((v) => (v === version ? undefined : new TsboxError('FailedPrecondition', `pod protocol version ${String(v)} is not ${version}`))),
      );
      return socket;
    };
    const client = async (): Promise<RawTtrpc> => {
      const c = await RawTtrpc.connect(pod.taskSocket);
      opened.push(c);
      return c;
    };
    const answers = (c: RawTtrpc): [number, number, string][] => c.responses.map((r) => [r.streamId, r.code, r.payload.toString()]);
    try {
      // A link whose Hello is refused is closed by its tsbox; the next one is served.
      const refused = await linkTo(POD_PROTOCOL_VERSION + 1);
      await waitFor(() => refused.destroyed || refused.readableEnded, { what: 'the refused link closed', timeoutMs: 5000 });
      await linkTo(POD_PROTOCOL_VERSION);

      // Good frames: two at once, then one split across writes.
      const good = await client();
      await good.write(Buffer.concat([requestFrame(1, TEST_SERVICE, 'Echo', Buffer.from('one')), requestFrame(3, TEST_SERVICE, 'Echo', Buffer.from('two'))]));
      const split = requestFrame(5, TEST_SERVICE, 'Echo', Buffer.from('three'));
      await good.write(split.subarray(0, 7));
      await new Promise((resolve) => setTimeout(resolve, 50));
      await good.write(split.subarray(7));
      await waitFor(() => good.responses.length === 3, { what: 'three answers', timeoutMs: 10_000, describe: () => tailFile(pod.relayLog) });
      assert.deepEqual(answers(good).sort(), [[1, 0, 'one'], [3, 0, 'two'], [5, 0, 'three']]);

      // Garbage: a request that is no protobuf is relayed (tsbox answers INVALID_ARGUMENT); a
      // frame of no known type, one over the bound, an even stream id, and a call of the
      // relay's own service each close their connection.
      const notProtobuf = await client();
      await notProtobuf.write(encodeFrame(1, FrameType.Request, Buffer.from([0xff, 0xff, 0xff, 0x0f, 0x80])));
      await waitFor(() => notProtobuf.responses.length === 1, { what: 'the answer to bytes that are no request', timeoutMs: 10_000 });
      assert.notEqual(notProtobuf.responses[0]?.code, 0);
      const header = (length: number, streamId: number, type: number): Buffer => {
        const h = Buffer.alloc(10);
        h.writeUInt32BE(length, 0);
        h.writeUInt32BE(streamId, 4);
        h.writeUInt8(type, 8);
        return h;
      };
      const closers = [
        Buffer.concat([header(3, 1, 0x7f), Buffer.from('abc')]),
        header(0xffffffff, 1, FrameType.Request),
        requestFrame(2, TEST_SERVICE, 'Echo'),
        requestFrame(1, POD_SERVICE, POD_CANCEL, Buffer.alloc(8, 0xff)),
      ];
      for (const bytes of closers) {
        const c = await client();
        await c.write(bytes);
        assert.ok(await c.closedWithin(5000), `a connection that sent ${bytes.subarray(0, 12).toString('hex')}… stayed open`);
      }
      // Half a frame, then gone; a held call, then gone (the relay cancels it at tsbox).
      const half = await client();
      await half.write(requestFrame(1, TEST_SERVICE, 'Echo', Buffer.alloc(100, 1)).subarray(0, 40));
      half.destroy();
      const holding = await client();
      await holding.write(Buffer.concat([requestFrame(1, TEST_SERVICE, 'Held'), requestFrame(3, TEST_SERVICE, 'Held')]));
      await waitFor(() => held === 2, { what: 'two calls held', timeoutMs: 10_000, describe: () => tailFile(pod.relayLog) });
      holding.destroy();
      await waitFor(() => cancelled === 2, { what: 'the held calls cancelled', timeoutMs: 10_000, describe: () => tailFile(pod.relayLog) });

      // The pod ends: its exit is recorded, the relay goes on until SIGTERM.
      assert.equal(await pod.endSandbox(), 137);
      await good.write(requestFrame(7, TEST_SERVICE, 'Echo', Buffer.from('after the end')));
      await waitFor(() => good.responses.length === 4, { what: 'an answer after the sandbox ended', timeoutMs: 10_000 });
      const stopped = await pod.stop();
      assertNoReports(pod.stderr);
      assert.deepEqual([stopped.code, stopped.signal, stopped.graceful], [0, null, true], `the pod's process ended ${JSON.stringify(stopped)} (${SANITIZER_EXIT}: a sanitizer's finding)`);
      assert.equal(existsSync(pod.taskSocket), false, 'the task socket is removed');
      assert.equal(existsSync(pod.link), false, 'the link socket is removed');
      assert.equal(exitRecord(dir).status, 137);
      assert.match(tailFile(pod.relayLog), /SIGTERM: the pod's process ends/);
      assertNoReports(pod.stderr);
    } finally {
      for (const o of opened) o.destroy();
      await server.close(0);
      await pod.stop();
    }
  });
});

describe('the sanitized helper modes (tsbox-shim)', () => {
  afterEach(() => assertNoReports());

  test('mount: tmpfs, a read-only bind and an overlay of many layers (lowerdirs made relative); umount-all takes the tree down, detaching what is busy', async () => {
    const tree = path.join(scratch, 'tree');
    mkdirSync(tree);
    const mount = async (args: string[]): Promise<void> => {
      const r = await run(shim, ['mount', ...args]);
      assert.deepEqual(r, { code: 0, signal: null, stdout: '', stderr: '' }, `mount ${args.join(' ').slice(0, 200)}`);
    };
    await mount([tree, 'tmpfs', 'tmpfs', 'size=16m', 'nodev', 'nosuid', 'mode=0755']);
    // Layers whose paths pass a page less 512 bytes, as containerd compacts them.
    const layers = path.join(tree, 'L'.repeat(200));
    const lower = Array.from({ length: 24 }, (_, i) => path.join(layers, `l${i}`));
    for (const [i, dir] of lower.entries()) {
      mkdirSync(dir, { recursive: true });
      writeFileSync(path.join(dir, `f${i}`), `layer ${i}\n`);
    }
    const a = path.join(tree, 'a');
    mkdirSync(a);
    await mount([a, 'tmpfs', 'tmpfs', 'size=1m']);
    for (const d of ['upper', 'work', 'merged']) mkdirSync(path.join(a, d));
    const options = [`lowerdir=${lower.join(':')}`, `upperdir=${path.join(a, 'upper')}`, `workdir=${path.join(a, 'work')}`];
    assert.ok(options.join(',').length >= 4096 - 512, 'the options are long enough to be compacted');
    await mount([path.join(a, 'merged'), 'overlay', 'overlay', ...options]);
    assert.equal(readFileSync(path.join(a, 'merged', 'f0'), 'utf8'), 'layer 0\n');
    assert.equal(readFileSync(path.join(a, 'merged', 'f23'), 'utf8'), 'layer 23\n');
    const b = path.join(tree, 'b');
    mkdirSync(b);
    await mount([b, 'none', layers, 'bind', 'ro']);
    assert.throws(() => writeFileSync(path.join(b, 'x'), ''), /EROFS/);
    const c = path.join(tree, 'c');
    mkdirSync(c);
    await mount([c, 'tmpfs', 'tmpfs', 'size=1m']);
    assert.deepEqual(await run(shim, ['mount', 'relative', 'tmpfs', 'tmpfs']), {
      code: 1,
      signal: null,
      stdout: '',
      stderr: 'mount tmpfs on relative: the target is not an absolute path\n',
    });

    // A file open on c keeps it busy: it is detached, and said so.
    const busy = openSync(path.join(c, 'busy'), 'w');
    try {
      const down = await run(shim, ['umount-all', tree]);
      assert.deepEqual(down, { code: 0, signal: null, stdout: `detached ${c}\n`, stderr: '' });
    } finally {
      closeSync(busy);
    }
    assert.equal(await isMountedAt(tree, { below: true }), false, 'nothing mounted at or below the tree');
    assert.deepEqual(await run(shim, ['umount-all', path.join(scratch, 'not-there')]), { code: 0, signal: null, stdout: '', stderr: '' });
    assert.deepEqual(await run(shim, ['umount', tree]), { code: 0, signal: null, stdout: '', stderr: '' });
    const usage = await run(shim, ['frob']);
    assert.equal(usage.code, 2);
    assert.match(usage.stderr, /^usage: tsbox-shim umount PATH/);
    assertNoReports();
  });

  test('lock: ok and the daemon\'s pid; a second is busy naming it; the end of stdin lets go', async () => {
    const file = path.join(scratch, 'lock');
    const first = launch(shim, ['lock', file]);
    assert.equal(await within(first.answer, 10_000, 'the lock\'s answer'), 'ok\n');
    assert.equal(readFileSync(file, 'utf8'), `${process.pid}\n`);
    assert.deepEqual(await run(shim, ['lock', file]), { code: 1, signal: null, stdout: `busy ${process.pid}\n`, stderr: '' });
    first.child.stdin?.end();
    assert.deepEqual(await within(first.exited, 10_000, 'the lock\'s end'), { code: 0, signal: null });
    const again = launch(shim, ['lock', file], '');
    assert.equal(await within(again.answer, 10_000, 'the lock\'s answer'), 'ok\n');
    assert.deepEqual(await within(again.exited, 10_000, 'the lock\'s end'), { code: 0, signal: null });
    assertNoReports(first.stderr() + again.stderr());
  });

  test('serve: mount, umount-all, a mode it does not run, spawns that run and that cannot; requests that are not one end it with 2', async () => {
    const target = path.join(scratch, 'served');
    mkdirSync(target);
    const request = (...args: string[]): string => `${args.length}\n${args.map((a) => `${a}\0`).join('')}`;
    const input = [
      request('mount', target, 'tmpfs', 'tmpfs', 'size=1m'),
      request('umount-all', target),
      request('frob'),
      request('spawn', '/bin/sh', '1', 'GREETING=hello', '-c', 'echo "$GREETING out"; echo err >&2'),
      request('spawn', path.join(scratch, 'no-such-program'), '0'),
      request('mount', 'relative', 'tmpfs', 'tmpfs'),
    ].join('');
    const served = await run(shim, ['serve'], input);
    assert.equal(served.code, 0, `serve ended ${JSON.stringify(served)}`);
    // Each answer: "<status> <out-bytes> <err-bytes>\n", then those bytes.
    const got: [number, string, string][] = [];
    let rest = Buffer.from(served.stdout);
    while (rest.length > 0) {
      const nl = rest.indexOf('\n');
      const [status, outBytes, errBytes] = rest.subarray(0, nl).toString().split(' ').map(Number) as [number, number, number];
      const out = rest.subarray(nl + 1, nl + 1 + outBytes).toString();
      const err = rest.subarray(nl + 1 + outBytes, nl + 1 + outBytes + errBytes).toString();
      got.push([status, out, err]);
      rest = rest.subarray(nl + 1 + outBytes + errBytes);
    }
    assert.deepEqual(got, [
      [0, '', ''],
      [0, '', ''],
      [2, '', 'serve: frob is not a mode it runs (mount, umount, umount-all, spawn)\n'],
      [0, 'hello out\n', 'err\n'],
      [127, '', `cannot run ${path.join(scratch, 'no-such-program')}: No such file or directory\n`],
      [1, '', 'mount tmpfs on relative: the target is not an absolute path\n'],
    ]);
    assert.equal(await isMountedAt(target, { below: true }), false);
    const notCounted = await run(shim, ['serve'], 'x\n');
    assert.deepEqual([notCounted.code, notCounted.stdout], [2, '']);
    assert.match(notCounted.stderr, /^serve: a request must begin with its argument count/);
    const cutShort = await run(shim, ['serve'], `${request('umount', target)}2\nmount\0`);
    assert.deepEqual(cutShort, { code: 2, signal: null, stdout: '0 0 0\n', stderr: 'serve: argument 2 of 2: missing (end of file)\n' });
    assertNoReports(served.stderr + notCounted.stderr + cutShort.stderr);
  });
});

/**
 * One connection to a holder's control socket: a line each way, in order ("wait" is answered
 * only at the exit, so it is sent first and its answer is the last line).
 */
class Control {
  readonly #lines: string[] = [];
  #text = '';

  private constructor(readonly socket: Socket) {
    socket.setEncoding('utf8').on('data', (chunk: string) => {
      this.#text += chunk;
      for (let nl = this.#text.indexOf('\n'); nl >= 0; nl = this.#text.indexOf('\n')) {
        this.#lines.push(this.#text.slice(0, nl));
        this.#text = this.#text.slice(nl + 1);
      }
    });
    socket.on('error', () => /* the holder's end: the test sees no answer */ undefined);
  }

  static open(dir: string): Promise<Control> {
    return new Promise((resolve, reject) => {
      const socket = connect(path.join(dir, 'ctl'));
      socket.once('connect', () => resolve(new Control(socket)));
      socket.once('error', reject);
    });
  }

  send(line: string): void {
    this.socket.write(`${line}\n`);
  }

  /** The next line answered. */
  next(what: string): Promise<string> {
    return waitFor(() => this.#lines.shift(), { what: `the holder's answer to ${what}`, timeoutMs: 30_000, intervalMs: 10 });
  }

  ask(line: string): Promise<string> {
    this.send(line);
    return this.next(line);
  }

  close(): void {
    this.socket.destroy();
  }
}

describe('the sanitized container holder (tsbox-ctr) with runc', () => {
  afterEach(() => assertNoReports());

  let rootfs = '';
  let runcRoot = '';
  const ids: string[] = [];
  const mounts: string[] = [];
  const fifos: string[] = [];
  /** A FIFO read as CRI reads a container's output. */
  const fifo = (name: string): string => {
    const p = makeFifo(path.join(scratch, name));
    fifos.push(p);
    return p;
  };

  before(() => {
    assert.ok(existsSync(busybox), `${busybox} not found: run scripts/install-containerd.sh (as root)`);
    rootfs = path.join(scratch, 'rootfs');
    runcRoot = path.join(scratch, 'runc');
    for (const d of ['bin', 'proc', 'sys', 'dev', 'tmp']) mkdirSync(path.join(rootfs, d), { recursive: true });
    copyFileSync(busybox, path.join(rootfs, 'bin', 'busybox'));
    for (const applet of ['sh', 'echo', 'sleep', 'cat']) symlinkSync('busybox', path.join(rootfs, 'bin', applet));
  });

  after(() => {
    for (const id of ids) {
      try {
        execFileSync('runc', ['--root', runcRoot, 'delete', '--force', id], { stdio: 'ignore' });
      } catch {
        // Gone already (its test deleted it, or it was never made).
      }
    }
    for (const m of mounts) {
      try {
        execFileSync('umount', ['-l', m], { stdio: 'ignore' });
      } catch {
        // Unmounted by its holder, as it should be.
      }
    }
    // A reader whose container never opened its FIFO (a holder that died first) would wait for
    // a writer for good: one comes and goes.
    for (const p of fifos) {
      try {
        closeSync(openSync(p, constants.O_WRONLY | constants.O_NONBLOCK));
      } catch {
        // No reader left (ENXIO): nothing waits.
      }
    }
  });

  /** Starts a holder; its answer must be ok. Returns it with the pids it answered. */
  async function holder(mode: 'create' | 'exec', id: string, args: string[]): Promise<{ dir: string; p: Launched; holderPid: number; pid: number }> {
    const dir = path.join(scratch, `${id}-${mode}`);
    mkdirSync(dir);
    const p = launch(ctr, [mode, '--dir', dir, '--id', id, '--root', runcRoot, ...args]);
    const answer = await within(p.answer, 30_000, `the ${mode} holder's answer`);
    const ok = /^ok (\d+) (\d+)\n$/.exec(answer);
    assert.ok(ok !== null, `answer ${JSON.stringify(answer)}, stderr ${JSON.stringify(p.stderr())}`);
    const [holderPid, pid] = [Number(ok[1]), Number(ok[2])];
    assert.equal(holderPid, p.child.pid);
    // The records tsbox finds the holder by, as it parses them.
    const record = parseHolderRecord(readFileSync(path.join(dir, 'pid'), 'utf8'));
    assert.deepEqual([record?.holderPid, record?.pid], [holderPid, pid]);
    assert.equal(readFileSync(path.join(dir, 'holder'), 'utf8'), `${holderPid} ${record?.holderStart}\n`);
    return { dir, p, holderPid, pid };
  }

  test('create, control requests, start, wait: output reaches the FIFOs, exit 3 is recorded and answered, the rootfs is unmounted, the holder exits 0', async () => {
    const id = 'san-c1';
    ids.push(id);
    const bundleDir = path.join(scratch, `${id}.bundle`);
    mkdirSync(path.join(bundleDir, 'rootfs'), { recursive: true });
    execFileSync('mount', ['--bind', rootfs, path.join(bundleDir, 'rootfs')]);
    mounts.push(path.join(bundleDir, 'rootfs'));
    makeBundle(bundleDir, 'rootfs', ['sh', '-c', 'echo out; echo err >&2; exit 3']);
    const out = fifo(`${id}-stdout`);
    const err = fifo(`${id}-stderr`);
    const output = readFifo(out);
    const errors = readFifo(err);
    const notify = path.join(scratch, `${id}.notify`);
    const began = Date.now();
    const h = await holder('create', id, ['--bundle', bundleDir, '--stdout', out, '--stderr', err, '--notify', notify, '--unmount-rootfs']);
    const ctl = await Control.open(h.dir);
    try {
      ctl.send('wait');
      assert.equal(await ctl.ask('resize 80 24'), 'ok');
      assert.equal(await ctl.ask('kill 0'), 'error 0 is not a signal number');
      assert.equal(await ctl.ask('frob'), 'error unknown request: frob');
      assert.equal(await ctl.ask('closeio'), 'ok');
      assert.equal(await ctl.ask('start'), `ok ${h.pid}`);
      const exited = await ctl.next('wait');
      const recorded = readFileSync(path.join(h.dir, 'exit'), 'utf8');
      assert.equal(exited, `exited ${recorded.trimEnd()}`);
      const exit = exitRecord(h.dir);
      assert.equal(exit.status, 3);
      assertTimeSince(exit.seconds, began);
    } finally {
      ctl.close();
    }
    assert.deepEqual(await within(h.p.exited, 30_000, 'the holder\'s end'), { code: 0, signal: null });
    assert.equal(await output, 'out\n');
    assert.equal(await errors, 'err\n');
    assert.ok(existsSync(notify), 'the notice is touched');
    assert.equal(existsSync(path.join(h.dir, 'ctl')), false, 'the control socket is removed');
    assert.equal(await isMountedAt(path.join(bundleDir, 'rootfs'), { below: true }), false, 'the rootfs is unmounted');
    assertNoReports(h.p.stderr());
  });

  test('a terminal, and an exec with its own holder: exit 5 through the pty, exit 9 of the exec, a kill of the container recorded as 137', async () => {
    const tty = 'san-c2';
    ids.push(tty);
    const ttyBundle = makeBundle(path.join(scratch, `${tty}.bundle`), rootfs, ['sh', '-c', 'echo on a tty; exit 5'], (c) => ((c['process'] as { terminal: boolean }).terminal = true));
    const ttyOut = fifo(`${tty}-stdout`);
    const ttyOutput = readFifo(ttyOut);
    const t = await holder('create', tty, ['--bundle', ttyBundle, '--stdout', ttyOut, '--terminal']);
    const tctl = await Control.open(t.dir);
    try {
      tctl.send('wait');
      assert.equal(await tctl.ask('resize 100 40'), 'ok');
      assert.equal(await tctl.ask('start'), `ok ${t.pid}`);
      assert.match(await tctl.next('wait'), /^exited 5 \d+ \d+$/);
    } finally {
      tctl.close();
    }
    assert.deepEqual(await within(t.p.exited, 30_000, 'the tty holder\'s end'), { code: 0, signal: null });
    assert.match(await ttyOutput, /on a tty\r?\n/);
    assert.equal(existsSync(path.join(t.dir, 'console.sock')), false, 'the console socket is removed');

    const id = 'san-c3';
    ids.push(id);
    const bundleDir = makeBundle(path.join(scratch, `${id}.bundle`), rootfs, ['sleep', '1000']);
    const c = await holder('create', id, ['--bundle', bundleDir]);
    const cctl = await Control.open(c.dir);
    try {
      cctl.send('wait');
      assert.equal(await cctl.ask('start'), `ok ${c.pid}`);
      const config = JSON.parse(readFileSync(path.join(bundleDir, 'config.json'), 'utf8')) as { process: Record<string, unknown> };
      const processJson = path.join(scratch, `${id}-exec.json`);
      writeFileSync(processJson, JSON.stringify({ ...config.process, args: ['sh', '-c', 'read line; exit 9'] }));
      // The exec'd process waits for a line on its stdin, so that its holder is asked before it ends.
      const stdin = fifo(`${id}-exec-stdin`);
      const e = await holder('exec', id, ['--process', processJson, '--stdin', stdin]);
      const ectl = await Control.open(e.dir);
      try {
        ectl.send('wait');
        assert.equal(await ectl.ask('start'), 'error an exec\'d process is started by its holder');
        const writer = openSync(stdin, constants.O_WRONLY | constants.O_NONBLOCK);
        writeSync(writer, 'go\n');
        closeSync(writer);
        assert.match(await ectl.next('wait'), /^exited 9 \d+ \d+$/);
      } finally {
        ectl.close();
      }
      assert.deepEqual(await within(e.p.exited, 30_000, 'the exec holder\'s end'), { code: 0, signal: null });
      assert.equal(exitRecord(e.dir).status, 9);
      assert.equal(await cctl.ask('kill 9'), 'ok');
      assert.match(await cctl.next('wait'), /^exited 137 \d+ \d+$/);
      assertNoReports(e.p.stderr());
    } finally {
      cctl.close();
    }
    assert.deepEqual(await within(c.p.exited, 30_000, 'the container holder\'s end'), { code: 0, signal: null });
    assert.equal(exitRecord(c.dir).status, 137);
    assertNoReports(t.p.stderr() + c.p.stderr());
  });

  test('failures: runc\'s own error for a bad bundle (nothing left), a relative --dir, no mode at all', async () => {
    const id = 'san-c4';
    ids.push(id);
    const bundleDir = makeBundle(path.join(scratch, `${id}.bundle`), rootfs, ['/no/such/program']);
    const dir = path.join(scratch, `${id}-create`);
    mkdirSync(dir);
    const bad = await run(ctr, ['create', '--dir', dir, '--id', id, '--root', runcRoot, '--bundle', bundleDir]);
    assert.equal(bad.code, 1, `ended ${JSON.stringify(bad)}`);
    assert.match(bad.stdout, /^error .*no such file or directory.*\n$/i);
    assert.equal(execFileSync('runc', ['--root', runcRoot, 'list', '-q'], { encoding: 'utf8' }).includes(id), false, 'runc deleted what it made');
    assert.deepEqual(await run(ctr, ['create', '--dir', 'relative', '--id', id, '--root', runcRoot, '--bundle', bundleDir]), {
      code: 1,
      signal: null,
      stdout: 'error --dir must be an absolute path\n',
      stderr: '',
    });
    const usage = await run(ctr, []);
    assert.equal(usage.code, 2);
    assert.match(usage.stderr, /^usage: tsbox-ctr create\|exec/);
    assertNoReports(bad.stderr);
  });
});
