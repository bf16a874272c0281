/**
 * The per-container holder (native/tsbox-ctr.c) with the real runc and real containers made
 * from Debian's static busybox: output reaches CRI-style FIFOs, exit codes are recorded, the
 * holder outlives the Node process that started it and is found again by another, a tty can be
 * resized, an exec'd process has its own exit, a container in a shared pid namespace takes its
 * other processes with it, and runc's own error reaches the caller when create fails. All of it
 * twice: with the holder started by tsbox itself, and by tsbox-shim serve's spawn (the daemon's way).
 */
import assert from 'node:assert/strict';
import { execFileSync, spawn } from 'node:child_process';
import { closeSync, constants, copyFileSync, existsSync, mkdirSync, openSync, readFileSync, readdirSync, rmdirSync, symlinkSync, writeFileSync, writeSync } from 'node:fs';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { pino } from 'pino';
import { isTsboxError } from '../../src/base/errors.js';
import {
  type ContainerHolder,
  type CreateOptions,
  createContainer,
  execProcess,
  findContainerHolder,
  sharesPidNamespace,
} from '../../src/runtime/container-holder.js';
import { detectCgroups } from '../../src/runtime/cgroups.js';
import { HelperService } from '../../src/runtime/helper-service.js';
import { processStat } from '../../src/runtime/proc.js';
import { repoRoot } from '../support/containerd-clients.js';
import { makeBundle, makeFifo, readFifo } from '../support/oci-bundle.js';
import { makeTempDir, processAlive, removeTree, waitFor } from '../support/processes.js';

const holderPath = path.join(repoRoot, 'dist', 'bin', 'tsbox-ctr');
const holderChild = path.join(repoRoot, 'dist', 'test', 'support', 'holder-child.js');
const busybox = path.join(repoRoot, '.cache', 'busybox', 'bin', 'busybox');
/** The parent of the cgroups of the shared-pid test's containers (cgroup v1 or v2). */
const CGROUP_PARENT = 'tsbox-holder-test';

let scratch = '';
let rootfs = '';
let runcRoot = '';
const ids: string[] = [];
/** Starts the holders in the second run of the suite. */
let starter: HelperService | undefined;

/** An OCI bundle running `args` in the busybox root file system. */
function bundle(id: string, args: string[], edit: (config: Record<string, unknown>) => void = () => undefined): string {
  return makeBundle(path.join(scratch, `${id}.bundle`), rootfs, args, edit);
}

function fifo(name: string): string {
  return makeFifo(path.join(scratch, name));
}

/** Writes to a FIFO that has a reader (the container's), then closes this writer. */
function writeFifo(p: string, text: string): void {
  const fd = openSync(p, constants.O_WRONLY | constants.O_NONBLOCK);
  try {
    writeSync(fd, text);
  } finally {
    closeSync(fd);
  }
}

function options(id: string, bundleDir: string, io: Partial<CreateOptions> = {}): CreateOptions {
  ids.push(id);
  const dir = path.join(scratch, id);
  mkdirSync(dir, { recursive: true });
  return { dir, id, root: runcRoot, bundle: bundleDir, terminal: false, killAll: false, holderPath, timeoutMs: 30_000, ...(starter === undefined ? {} : { starter }), ...io };
}

function runcList(): string[] {
  return (JSON.parse(execFileSync('runc', ['--root', runcRoot, 'list', '--format', 'json'], { encoding: 'utf8' }) || '[]') as { id: string }[] | null ?? []).map((c) => c.id);
}

/** Resident and proportional memory of a process, in KiB. */
function memoryOf(pid: number): { rss: number; pss: number } {
  const text = readFileSync(`/proc/${pid}/smaps_rollup`, 'utf8');
  const field = (name: string): number => Number(new RegExp(`^${name}:\\s+(\\d+) kB`, 'm').exec(text)?.[1] ?? NaN);
  return { rss: field('Rss'), pss: field('Pss') };
}

for (const startedBy of ['tsbox', 'tsbox-shim serve'] as const) describe(`container holder (tsbox-ctr) with runc, started by ${startedBy}`, () => {
  before(async () => {
    ids.length = 0;
    if (startedBy === 'tsbox-shim serve') starter = new HelperService(path.join(repoRoot, 'dist', 'bin', 'tsbox-shim'), pino({ level: 'silent' }));
    assert.ok(existsSync(busybox), `${busybox} not found: run scripts/install-containerd.sh (as root)`);
    scratch = await makeTempDir('tsbox-holder-');
    runcRoot = path.join(scratch, 'runc');
    rootfs = path.join(scratch, 'rootfs');
    for (const d of ['bin', 'proc', 'sys', 'dev', 'tmp']) mkdirSync(path.join(rootfs, d), { recursive: true });
    copyFileSync(busybox, path.join(rootfs, 'bin', 'busybox'));
    for (const applet of ['sh', 'echo', 'sleep', 'stty', 'cat', 'dd']) symlinkSync('busybox', path.join(rootfs, 'bin', applet));
  });

  after(async () => {
    await starter?.close();
    starter = undefined;
    for (const id of ids) {
      try {
        execFileSync('runc', ['--root', runcRoot, 'delete', '--force', id], { stdio: 'ignore' });
      } catch {
        // Not there any more (deleted by its test, or never created): nothing to remove.
      }
    }
    for (const hierarchy of readdirSync('/sys/fs/cgroup')) {
      const dir = path.join('/sys/fs/cgroup', hierarchy, CGROUP_PARENT);
      if (existsSync(dir)) rmdirSync(dir);
    }
    if (existsSync(path.join('/sys/fs/cgroup', CGROUP_PARENT))) rmdirSync(path.join('/sys/fs/cgroup', CGROUP_PARENT));
    await removeTree(scratch);
  });

  test('output reaches the stdout and stderr FIFOs, and exit code 42 is recorded', async (t) => {
    const out = fifo('c1-stdout');
    const err = fifo('c1-stderr');
    const output = readFifo(out);
    const errors = readFifo(err);
    const began = process.hrtime.bigint();
    const holder = await createContainer(options('c1', bundle('c1', ['sh', '-c', 'echo hello out; echo hello err >&2; exit 42']), { stdout: out, stderr: err }));
    const createMs = Number(process.hrtime.bigint() - began) / 1e6;
    const { rss, pss } = memoryOf(holder.record.holderPid);
    t.diagnostic(`create took ${createMs.toFixed(1)} ms; holder RSS ${rss} KiB, PSS ${pss} KiB`);
    assert.equal(await holder.exit(), undefined, 'a created container has not exited');
    assert.deepEqual(runcList(), ['c1']);
    await holder.start();
    const exit = await holder.waitExit();
    assert.equal(exit.status, 42);
    assert.ok(exit.exitedAt.seconds > 1_600_000_000, 'the exit time is a real time');
    assert.equal(await output, 'hello out\n');
    assert.equal(await errors, 'hello err\n');
    assert.deepEqual(await holder.exit(), exit, 'the exit file says the same');
    // The holder is done once it has drained and closed everything.
    await waitFor(() => !processAlive(holder.record.holderPid), { what: 'the holder to exit' });
  });

  test('a direct start (no runc start): the process runs, runc then says running, a second start is harmless; a dead init fails it', async () => {
    const out = fifo('c11-stdout');
    const output = readFifo(out);
    const stdin = fifo('c11-stdin');
    const holder = await createContainer(options('c11', bundle('c11', ['sh', '-c', 'echo started; read line; exit 5']), { stdout: out, stdin, directStart: true }));
    const state = (): string => (JSON.parse(execFileSync('runc', ['--root', runcRoot, 'state', 'c11'], { encoding: 'utf8' })) as { status: string }).status;
    assert.equal(state(), 'created');
    await holder.start();
    assert.equal(state(), 'running', 'runc sees the container started');
    await holder.start();
    const writer = openSync(stdin, 'w');
    writeSync(writer, 'go\n');
    closeSync(writer);
    assert.equal((await holder.waitExit()).status, 5);
    assert.equal(await output, 'started\n');

    // An init killed before its start: the start fails, naming it, instead of hanging.
    const doomed = await createContainer(options('c12', bundle('c12', ['sh', '-c', 'exit 0']), { directStart: true }));
    process.kill(doomed.pid, 'SIGKILL');
    await assert.rejects(doomed.start(), /already dead|has exited/);
    await doomed.waitExit();
  });

  test('the holder outlives the Node process that started it; another one finds it and gets the exit', async () => {
    const stdin = fifo('c2-stdin');
    const out = fifo('c2-stdout');
    const output = readFifo(out);
    const opts = options('c2', bundle('c2', ['sh', '-c', 'read line; echo "got $line"; exit 7']), { stdin, stdout: out });
    // The other Node process starts the holder itself (a serving process would be its child).
    const child = spawn(process.execPath, [holderChild, JSON.stringify({ ...opts, starter: undefined })], { stdio: ['pipe', 'pipe', 'inherit'] });
    const line = await new Promise<string>((resolve, reject) => {
      let text = '';
      child.stdout.setEncoding('utf8').on('data', (chunk: string) => {
        text += chunk;
        if (text.includes('\n')) resolve(text.trim());
      });
      child.once('error', reject);
      child.once('exit', (code) => reject(new Error(`the starting process exited (${code}) before it answered: ${text}`)));
    });
    const [, holderPid, initPid] = line.split(' ').map(Number);
    const died = new Promise((resolve) => child.once('exit', resolve));
    child.kill('SIGKILL');
    await died;

    assert.ok(processAlive(holderPid ?? 0), 'the holder lives on');
    const found = await findContainerHolder(opts.dir);
    assert.equal(found.kind, 'running');
    const holder = (found as { holder: ContainerHolder }).holder;
    assert.equal(holder.record.holderPid, holderPid);
    assert.equal(holder.pid, initPid);
    const exit = holder.waitExit();
    writeFifo(stdin, 'hello\n');
    assert.equal((await exit).status, 7);
    assert.equal(await output, 'got hello\n');
    const again = await findContainerHolder(opts.dir);
    assert.equal(again.kind, 'exited');
    assert.equal((again as { exit: { status: number } }).exit.status, 7);
  });

  test('a tty container: its output comes through the relay and resize reaches its terminal', async () => {
    const stdin = fifo('c3-stdin');
    const out = fifo('c3-stdout');
    const output = readFifo(out);
    const holder = await createContainer(
      options(
        'c3',
        bundle('c3', ['sh', '-c', 'read line; echo "size $(stty size)"; exit 3'], (c) => ((c['process'] as { terminal: boolean }).terminal = true)),
        { stdin, stdout: out, terminal: true },
      ),
    );
    await holder.start();
    await holder.resize(100, 40);
    const exit = holder.waitExit();
    writeFifo(stdin, 'go\n');
    assert.equal((await exit).status, 3);
    const text = await output;
    assert.match(text, /size 40 100\r?\n/, `terminal output: ${JSON.stringify(text)}`);
  });

  test('an exec has its own holder and exit code; the container keeps running until killed', async () => {
    const holder = await createContainer(options('c4', bundle('c4', ['sleep', '1000'])));
    const parent = (await processStat(holder.record.holderPid))?.parent;
    if (starter === undefined) assert.equal(parent, process.pid, 'started by this process');
    else assert.ok(parent !== undefined && parent !== process.pid && !starter.pids.includes(parent), `started through serve: its parent ${parent} is neither this process nor a serving one`);
    await holder.start();
    const out = fifo('c4-exec-stdout');
    const output = readFifo(out);
    const execDir = path.join(scratch, 'c4-exec');
    mkdirSync(execDir);
    const exec = await execProcess({
      dir: execDir,
      id: 'c4',
      root: runcRoot,
      stdout: out,
      terminal: false,
      holderPath,
      ...(starter === undefined ? {} : { starter }),
      timeoutMs: 30_000,
      process: { args: ['sh', '-c', 'echo in exec; exit 5'], cwd: '/', env: ['PATH=/bin'], user: { uid: 0, gid: 0 } },
    });
    assert.notEqual(exec.pid, holder.pid);
    assert.equal((await exec.waitExit()).status, 5);
    assert.equal(await output, 'in exec\n');
    assert.equal(await holder.exit(), undefined, 'the container still runs');
    await assert.rejects(exec.start(), (e: unknown) => isTsboxError(e, 'NotFound'), 'the exec has exited: its holder is gone');
    execFileSync('runc', ['--root', runcRoot, 'kill', 'c4', 'KILL']);
    assert.equal((await holder.waitExit()).status, 137);
  });

  /** runc with `kill` refused: a holder that ends the container's processes must do it without runc. */
  function runcWithoutKill(): string {
    const wrapper = path.join(scratch, 'runc-without-kill');
    writeFileSync(wrapper, '#!/bin/sh\nfor a; do [ "$a" = kill ] && { echo "runc kill refused by the test" >&2; exit 1; }; done\nexec runc "$@"\n', { mode: 0o755 });
    return wrapper;
  }

  const killHierarchy = detectCgroups().manager?.killHierarchy;
  for (const [how, id, extra] of [
    ['runc kill --all', 'c5', (): Partial<CreateOptions> => ({})],
    [
      `through its cgroup, without runc (${killHierarchy?.version === 2 ? 'cgroup.kill' : 'the v1 freezer'})`,
      'c5n',
      (): Partial<CreateOptions> => {
        assert.ok(killHierarchy !== undefined, 'this node has a cgroup hierarchy to kill through');
        return { killThrough: killHierarchy, runcPath: runcWithoutKill() };
      },
    ],
  ] as const) {
    test(`a container in another's pid namespace takes its other processes with it when its init ends: ${how}`, async () => {
      const pod = await createContainer(options(`${id}-pod`, bundle(`${id}-pod`, ['sleep', '1000'])));
      await pod.start();
      const stdin = fifo(`${id}-stdin`);
      const cgroupsPath = `/${CGROUP_PARENT}/${id}`;
      const bundleDir = bundle(id, ['sh', '-c', 'sleep 1000 & read line; exit 0'], (c) => {
        const linux = c['linux'] as { namespaces: { type: string; path?: string }[]; cgroupsPath?: string };
        linux.namespaces = linux.namespaces.map((ns) => (ns.type === 'pid' ? { type: 'pid', path: `/proc/${pod.pid}/ns/pid` } : ns));
        linux.cgroupsPath = cgroupsPath;
      });
      const config = JSON.parse(readFileSync(path.join(bundleDir, 'config.json'), 'utf8')) as unknown;
      assert.equal(sharesPidNamespace(config), true);
      const holder = await createContainer(options(id, bundleDir, { stdin, killAll: sharesPidNamespace(config), ...extra() }));
      await holder.start();
      const procs = ['pids', 'unified', ''].map((h) => path.join('/sys/fs/cgroup', h, cgroupsPath, 'cgroup.procs')).find((p) => existsSync(p));
      assert.ok(procs !== undefined, 'the container has a cgroup');
      // The background sleep is forked by the init's shell: no event says when.
      const background = await waitFor(
        () => readFileSync(procs, 'utf8').split('\n').map(Number).find((pid) => pid > 0 && pid !== holder.pid),
        { what: 'the background process' },
      );
      const exit = holder.waitExit();
      writeFifo(stdin, '\n');
      assert.equal((await exit).status, 0);
      // Its SIGKILL was sent before the exit was written; it is gone (or a zombie) once it is delivered.
      await waitFor(async () => (await processStat(background)) === undefined, { what: `background process ${background} to be killed` });
      assert.equal(await pod.exit(), undefined, "the pod's own process is untouched");
    });
  }

  test('a rootfs mounted for the container is unmounted by its holder as the init ends, before the exit is told', async () => {
    const bundleDir = path.join(scratch, 'c14.bundle');
    mkdirSync(path.join(bundleDir, 'rootfs'), { recursive: true });
    // What tsbox does at Create: the rootfs mounted at <bundle>/rootfs (here a bind of the test's).
    execFileSync('mount', ['--bind', rootfs, path.join(bundleDir, 'rootfs')]);
    const mounted = (): boolean => readFileSync('/proc/self/mountinfo', 'utf8').split('\n').some((l) => l.split(' ')[4] === path.join(bundleDir, 'rootfs'));
    try {
      makeBundle(bundleDir, 'rootfs', ['sh', '-c', 'exit 4']);
      const holder = await createContainer(options('c14', bundleDir, { unmountRootfs: true }));
      assert.equal(mounted(), true, 'mounted while the container is created');
      await holder.start();
      assert.equal((await holder.waitExit()).status, 4);
      assert.equal(mounted(), false, 'nothing mounted at the rootfs once the exit is told');
    } finally {
      if (mounted()) execFileSync('umount', ['-l', path.join(bundleDir, 'rootfs')]);
    }
  });

  test('the OOM watch: a process of a running container killed by the OOM killer is told while the container runs', async () => {
    const stdin = fifo('c13-stdin');
    const out = fifo('c13-out');
    const cgroupsPath = `/${CGROUP_PARENT}/c13`;
    // dd, the shell's child, is past the 16 MiB limit as it starts; the shell goes on.
    const bundleDir = bundle('c13', ['sh', '-c', 'dd if=/dev/zero of=/dev/null bs=32M count=1; echo "dd ended: $?"; read line; exit 0'], (c) => {
      const linux = c['linux'] as { cgroupsPath?: string; resources?: Record<string, unknown> };
      linux.cgroupsPath = cgroupsPath;
      linux.resources = { ...linux.resources, memory: { limit: 16 * 1024 * 1024 } };
    });
    const holder = await createContainer(options('c13', bundleDir, { stdin, stdout: out }));
    const file = [path.join('/sys/fs/cgroup/memory', cgroupsPath, 'memory.oom_control'), path.join('/sys/fs/cgroup', cgroupsPath, 'memory.events')].find((f) => existsSync(f));
    assert.ok(file !== undefined, 'the container has a memory cgroup');
    await assert.rejects(holder.watchOom('/etc/hostname'), /neither memory\.events nor memory\.oom_control/);
    assert.equal(await holder.watchOom(file), 0, 'no OOM kill yet');
    assert.equal(await holder.watchOom(file), 0, 'asked again: the same watch');
    const kills: number[] = [];
    let told: (() => void) | undefined;
    const oomTold = new Promise<void>((resolve) => (told = resolve));
    const exit = holder.waitExit(undefined, {
      onOom: (count) => {
        kills.push(count);
        told?.();
      },
    });
    const output = readFifo(out);
    await holder.start();
    await oomTold;
    assert.deepEqual(kills, [1]);
    assert.equal(await holder.exit(), undefined, 'the container still runs');
    // A waiter that comes later (a restarted tsbox) hears of it at once.
    const late: number[] = [];
    let lateTold: (() => void) | undefined;
    const lateDone = new Promise<void>((resolve) => (lateTold = resolve));
    const lateExit = holder.waitExit(undefined, {
      onOom: (count) => {
        late.push(count);
        lateTold?.();
      },
    });
    await lateDone;
    assert.deepEqual(late, [1]);
    writeFifo(stdin, '\n');
    assert.equal((await exit).status, 0);
    assert.equal((await lateExit).status, 0);
    assert.match(await output, /dd ended: 137/);
  });

  test('stdin stays open until closeio: the holder keeps a writer while CRI comes and goes', async () => {
    const stdin = fifo('c8-stdin');
    const out = fifo('c8-stdout');
    const output = readFifo(out);
    const holder = await createContainer(options('c8', bundle('c8', ['sh', '-c', 'cat; exit 9']), { stdin, stdout: out }));
    await holder.start();
    // A writer that comes and goes (CRI restarting) does not end the input.
    writeFifo(stdin, 'first\n');
    writeFifo(stdin, 'second\n');
    const exit = holder.waitExit();
    await holder.closeIO();
    assert.equal((await exit).status, 9);
    assert.equal(await output, 'first\nsecond\n');
  });

  test('a holder killed before the exit: waitExit reports status 255 at once, found again as lost', async () => {
    const opts = options('c9', bundle('c9', ['sleep', '1000']));
    const holder = await createContainer(opts);
    await holder.start();
    const exit = holder.waitExit();
    process.kill(holder.record.holderPid, 'SIGKILL');
    const lost = await exit;
    assert.equal(lost.status, 255);
    assert.match(lost.reason, /holder was killed/);
    const found = await findContainerHolder(opts.dir);
    assert.equal(found.kind, 'exited');
    assert.equal((found as { exit: { status: number } }).exit.status, 255);
  });

  test("a bad bundle: create fails with runc's own message and leaves nothing", async () => {
    const empty = path.join(scratch, 'c6.bundle');
    mkdirSync(empty);
    const opts = options('c6', empty);
    await assert.rejects(createContainer(opts), (e: unknown) => {
      assert.ok(isTsboxError(e, 'FailedPrecondition'), String(e));
      assert.equal(e.message, 'cannot create container c6: runc create failed: JSON specification file config.json not found');
      return true;
    });
    const opts7 = options('c7', bundle('c7', ['no-such-program']));
    await assert.rejects(createContainer(opts7), (e: unknown) => {
      assert.ok(isTsboxError(e, 'FailedPrecondition'), String(e));
      assert.match(e.message, /^cannot create container c7: runc create failed: unable to start container process: exec: "no-such-program": executable file not found in \$PATH$/);
      return true;
    });
    assert.ok(!runcList().includes('c6') && !runcList().includes('c7'), 'no container is left');
    // The holder answers its failure and then exits; the record it wrote first names it until
    // then ('working'), and no longer once it is gone.
    const found = await waitFor(async () => {
      const f = await findContainerHolder(opts7.dir);
      return f.kind !== 'working' && f;
    }, { what: 'the failed holder to end' });
    assert.equal(found.kind, 'absent', 'no holder record is left');
  });
});
