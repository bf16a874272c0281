/**
 * The Task API v3 as tsbox serves it, over a real ttrpc socket, with the real runc, the
 * container holder and a real rootfs mount, driven call by call as containerd's CRI drives
 * it (research notes on the Task API, §1.4): Create, Connect, Wait before Start, Start, State,
 * Kill, Delete; Exec; the codes containerd acts on; a restart of the task table that finds
 * its containers again.
 */
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { copyFileSync, existsSync, mkdirSync, readFileSync, readdirSync, symlinkSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import pino, { type Logger } from 'pino';
import { GRPC_CODES } from '../../src/base/errors.js';
import { TaskService } from '../../src/gen/containerd/task/v3/shim.js';
import { Status } from '../../src/gen/containerd/v1/types/task.js';
import { Options as RuncOptions } from '../../src/gen/containerd/runc/v1/options.js';
import { mountRootfs, unmountRootfs } from '../../src/tasks/rootfs.js';
import { registerTaskService } from '../../src/tasks/task-service.js';
import { TaskTable, type TaskEvents } from '../../src/tasks/tasks.js';
import { execDirName, taskDirName } from '../../src/tasks/task-record.js';
import { TtrpcClient, TtrpcError } from '../../src/ttrpc/client.js';
import { TtrpcServer } from '../../src/ttrpc/server.js';
import { repoRoot } from '../support/containerd-clients.js';
import { makeBundle, makeFifo, readFifo } from '../support/oci-bundle.js';
import { formerExecJson, formerTaskJson } from '../support/task-records.js';
import { makeTempDir, processAlive, removeTree, unmountBelow, waitFor } from '../support/processes.js';

const holderPath = path.join(repoRoot, 'dist', 'bin', 'tsbox-ctr');
const shimPath = path.join(repoRoot, 'dist', 'bin', 'tsbox-shim');
const busybox = path.join(repoRoot, '.cache', 'busybox', 'bin', 'busybox');
const NS = 'k8s.io';
const META = { 'containerd-namespace-ttrpc': NS };

let scratch = '';
let image = '';

/** Events as a list, to check what reached "containerd". */
function recordingEvents(): TaskEvents & { seen: string[]; sent: Promise<void>[] } {
  const seen: string[] = [];
  const sent: Promise<void>[] = [];
  return {
    seen,
    sent,
    created: (_ns, t) => void seen.push(`create ${t.id}`),
    started: (_ns, id) => void seen.push(`start ${id}`),
    exited: (_ns, id, execId, _pid, exit, done) => {
      seen.push(`exit ${execId || id} ${exit.status}`);
      if (done !== undefined) sent.push(done());
    },
    deleted: (_ns, id) => void seen.push(`delete ${id}`),
    execAdded: (_ns, _id, execId) => void seen.push(`exec-added ${execId}`),
    execStarted: (_ns, _id, execId) => void seen.push(`exec-started ${execId}`),
    oom: (_ns, id) => Promise.resolve(void seen.push(`oom ${id}`)),
  };
}

interface Served {
  readonly client: TtrpcClient;
  readonly server: TtrpcServer;
  readonly events: ReturnType<typeof recordingEvents>;
  readonly table: TaskTable;
}

/** Where a table keeps its tasks (below scratch), and where an earlier tsbox kept them. */
interface Places {
  readonly tasks: string;
  readonly runc: string;
  readonly former?: { readonly tasks: string; readonly runc: string };
}

async function serve(name: string, runcPath = 'runc', places: Places = { tasks: 'tasks', runc: 'runc' }, logger: Logger = pino({ level: 'silent' })): Promise<Served> {
  const events = recordingEvents();
  const { former } = places;
  const table = new TaskTable({
    logger,
    dir: path.join(scratch, places.tasks),
    runcRoot: path.join(scratch, places.runc),
    ...(former === undefined ? {} : { formerDirs: { dir: path.join(scratch, former.tasks), runcRoot: path.join(scratch, former.runc) } }),
    runcPath,
    holderPath,
    rootfs: { mount: (m, t, s) => mountRootfs(shimPath, m, t, s), unmount: (t, s) => unmountRootfs(shimPath, t, s) },
    events,
    cgroups: undefined,
  });
  await table.recover();
  const server = new TtrpcServer({ logger: pino({ level: 'silent' }) });
  registerTaskService(server, table);
  const socket = path.join(scratch, `${name}.sock`);
  await server.listen(socket, 0o600);
  return { client: await TtrpcClient.connect(socket), server, events, table };
}

/** The directory of a task's records, found by its id in task.json. */
function taskDirOf(id: string, tasks = 'tasks'): string {
  const dir = path.join(scratch, tasks);
  for (const name of readdirSync(dir)) {
    const text = readFileSync(path.join(dir, name, 'task.json'), 'utf8');
    if ((JSON.parse(text) as { id?: unknown }).id === id) return path.join(dir, name);
  }
  throw new Error(`no record of task ${id} in ${dir}`);
}

/** A bundle as containerd makes one: config.json and an empty rootfs to mount into. */
function bundle(id: string, args: string[]): string {
  const dir = makeBundle(path.join(scratch, 'bundles', id), 'rootfs', args);
  mkdirSync(path.join(dir, 'rootfs'), { recursive: true });
  return dir;
}

function fifo(name: string): string {
  return makeFifo(path.join(scratch, name));
}

function createRequest(id: string, args: string[], io: { stdout?: string } = {}) {
  return {
    id,
    bundle: bundle(id, args),
    rootfs: [{ type: 'bind', source: image, target: '', options: ['rbind', 'ro'] }],
    terminal: false,
    stdin: '',
    stdout: io.stdout ?? '',
    stderr: '',
    checkpoint: '',
    parentCheckpoint: '',
    options: { typeUrl: 'containerd.runc.v1.Options', value: Buffer.from(RuncOptions.encode(RuncOptions.fromPartial({})).finish()) },
  };
}

async function codeOf(call: Promise<unknown>): Promise<number> {
  try {
    await call;
  } catch (err) {
    assert.ok(err instanceof TtrpcError, `a ttrpc error, got ${String(err)}`);
    return err.code;
  }
  assert.fail('the call succeeded');
}

function runcList(root = 'runc'): string[] {
  const out = execFileSync('runc', ['--root', path.join(scratch, root, NS), 'list', '--format', 'json'], { encoding: 'utf8' });
  return ((JSON.parse(out || '[]') as { id: string }[] | null) ?? []).map((c) => c.id);
}

function mountedBelow(dir: string): boolean {
  return readFileSync('/proc/self/mountinfo', 'utf8').split('\n').some((line) => (line.split(' ')[4] ?? '').startsWith(dir));
}

describe('Task API v3 served by tsbox (ttrpc, runc, holders)', () => {
  const open: Served[] = [];
  before(async () => {
    assert.ok(existsSync(busybox), `${busybox} not found: run scripts/install-containerd.sh (as root)`);
    scratch = await makeTempDir('tsbox-tasks-');
    image = path.join(scratch, 'image');
    for (const d of ['bin', 'proc', 'sys', 'dev', 'tmp']) mkdirSync(path.join(image, d), { recursive: true });
    copyFileSync(busybox, path.join(image, 'bin', 'busybox'));
    for (const applet of ['sh', 'echo', 'sleep', 'cat']) symlinkSync('busybox', path.join(image, 'bin', applet));
  });

  after(async () => {
    for (const s of open) {
      s.client.close();
      await s.server.close(0);
    }
    // Every runc root a test used (the tables on another layout too), also after a failure.
    for (const root of ['runc', 'old-state/runc', 'run/runc']) {
      for (const id of existsSync(path.join(scratch, root, NS)) ? runcList(root) : []) {
        execFileSync('runc', ['--root', path.join(scratch, root, NS), 'delete', '--force', id], { stdio: 'ignore' });
      }
    }
    unmountBelow(scratch);
    await removeTree(scratch);
  });

  test('a container as CRI runs one: Create, Wait before Start, Start, its output and exit code, Kill NotFound after, Delete; nothing left', async () => {
    const s = await serve('a');
    open.push(s);
    const out = fifo('a-stdout');
    const output = readFifo(out);
    const req = createRequest('c1', ['sh', '-c', 'echo hello from $(cat /proc/1/comm); exit 3'], { stdout: out });
    const { pid } = await s.client.request(TaskService.create, req, { metadata: META });
    assert.ok(pid > 0 && processAlive(pid), 'Create answers the container init, which exists');
    assert.ok(mountedBelow(path.join(req.bundle, 'rootfs')), 'the rootfs is mounted into the bundle');
    const connect = await s.client.request(TaskService.connect, { id: 'c1' }, { metadata: META });
    assert.equal(connect.taskPid, pid);
    let state = await s.client.request(TaskService.state, { id: 'c1', execId: '' }, { metadata: META });
    assert.equal(state.status, Status.CREATED);
    assert.equal(state.stdout, out, 'State echoes the stdio paths (CRI reopens them after its restart)');
    assert.equal(state.bundle, req.bundle);
    let waited = false;
    const wait = s.client.request(TaskService.wait, { id: 'c1', execId: '' }, { metadata: META }).then((w) => ((waited = true), w));
    await new Promise((r) => setImmediate(r));
    assert.equal(waited, false, 'a Wait sent before Start blocks');
    const started = await s.client.request(TaskService.start, { id: 'c1', execId: '' }, { metadata: META });
    assert.equal(started.pid, pid);
    const exit = await wait;
    assert.equal(exit.exitStatus, 3);
    assert.ok((exit.exitedAt?.seconds ?? 0) > 1_600_000_000);
    assert.equal(await output, 'hello from sh\n');
    assert.equal((await s.client.request(TaskService.start, { id: 'c1', execId: '' }, { metadata: META })).pid, pid, 'Start again (a replay after a restart of tsbox) answers as the first, though the process has exited');
    assert.equal(await codeOf(s.client.request(TaskService.kill, { id: 'c1', execId: '', signal: 9, all: true }, { metadata: META })), GRPC_CODES.NotFound, 'Kill of an exited task is NotFound');
    state = await s.client.request(TaskService.state, { id: 'c1', execId: '' }, { metadata: META });
    assert.equal(state.status, Status.STOPPED);
    assert.equal(state.exitStatus, 3);
    const deleted = await s.client.request(TaskService.delete, { id: 'c1', execId: '' }, { metadata: META });
    assert.equal(deleted.exitStatus, 3);
    assert.equal(deleted.pid, pid);
    assert.equal(await codeOf(s.client.request(TaskService.state, { id: 'c1', execId: '' }, { metadata: META })), GRPC_CODES.NotFound, 'a deleted task is NotFound');
    assert.equal(await codeOf(s.client.request(TaskService.delete, { id: 'c1', execId: '' }, { metadata: META })), GRPC_CODES.NotFound);
    assert.equal(mountedBelow(path.join(req.bundle, 'rootfs')), false, 'the rootfs is unmounted');
    assert.deepEqual(runcList(), [], 'runc knows the container no more');
    assert.deepEqual(s.events.seen, ['create c1', 'start c1', 'exit c1 3', 'delete c1']);
    assert.equal((await s.client.request(TaskService.connect, { id: 'c1' }, { metadata: META })).taskPid, 0, 'Connect never fails; an unknown task has pid 0');
  });

  test('Exec: a process in the running container with its own exit; another process under its id AlreadyExists; unstarted Kill FailedPrecondition; init killed: 137', async () => {
    const s = await serve('b');
    open.push(s);
    const req = createRequest('c2', ['sleep', '1000']);
    const { pid } = await s.client.request(TaskService.create, req, { metadata: META });
    const initWait = s.client.request(TaskService.wait, { id: 'c2', execId: '' }, { metadata: META });
    await s.client.request(TaskService.start, { id: 'c2', execId: '' }, { metadata: META });
    const out = fifo('b-exec-stdout');
    const output = readFifo(out);
    const spec = { args: ['sh', '-c', 'echo in $(cat /proc/1/comm); exit 5'], env: ['PATH=/bin'], cwd: '/', user: { uid: 0, gid: 0 } };
    const exec = { id: 'c2', execId: 'e1', terminal: false, stdin: '', stdout: out, stderr: '', spec: { typeUrl: 'types.containerd.io/opencontainers/runtime-spec/1/Process', value: Buffer.from(JSON.stringify(spec)) } };
    await s.client.request(TaskService.exec, exec, { metadata: META });
    await s.client.request(TaskService.exec, exec, { metadata: META }); // the same request again (a replay): accepted
    const other = { ...exec, spec: { typeUrl: exec.spec.typeUrl, value: Buffer.from(JSON.stringify({ ...spec, args: ['true'] })) } };
    assert.equal(await codeOf(s.client.request(TaskService.exec, other, { metadata: META })), GRPC_CODES.AlreadyExists, 'another process under a known exec id');
    assert.equal(await codeOf(s.client.request(TaskService.kill, { id: 'c2', execId: 'e1', signal: 9, all: false }, { metadata: META })), GRPC_CODES.FailedPrecondition, 'Kill of an exec never started');
    const execState = await s.client.request(TaskService.state, { id: 'c2', execId: 'e1' }, { metadata: META });
    assert.equal(execState.status, Status.CREATED);
    assert.equal(execState.pid, 0);
    const execWait = s.client.request(TaskService.wait, { id: 'c2', execId: 'e1' }, { metadata: META });
    const execPid = (await s.client.request(TaskService.start, { id: 'c2', execId: 'e1' }, { metadata: META })).pid;
    assert.ok(execPid > 0 && execPid !== pid);
    assert.equal((await execWait).exitStatus, 5);
    assert.equal(await output, 'in sleep\n', 'the exec ran inside the container, beside its init');
    assert.equal((await s.client.request(TaskService.delete, { id: 'c2', execId: 'e1' }, { metadata: META })).exitStatus, 5);
    assert.equal(await codeOf(s.client.request(TaskService.state, { id: 'c2', execId: 'e1' }, { metadata: META })), GRPC_CODES.NotFound);
    // An exec deleted before it ran: a Wait on it ends with the delete.
    await s.client.request(TaskService.exec, { ...exec, execId: 'e3' }, { metadata: META });
    const unstartedWait = s.client.request(TaskService.wait, { id: 'c2', execId: 'e3' }, { metadata: META });
    await s.client.request(TaskService.delete, { id: 'c2', execId: 'e3' }, { metadata: META });
    assert.equal((await unstartedWait).exitStatus, 0, 'the Wait on an exec deleted unstarted ends');
    const bad = { ...exec, execId: 'e2', spec: { typeUrl: exec.spec.typeUrl, value: Buffer.from('{not json') } };
    assert.equal(await codeOf(s.client.request(TaskService.exec, bad, { metadata: META })), GRPC_CODES.InvalidArgument, 'an exec spec that is not JSON');
    assert.equal(await codeOf(s.client.request(TaskService.delete, { id: 'c2', execId: '' }, { metadata: META })), GRPC_CODES.FailedPrecondition, 'a running task cannot be deleted');
    const pids = await s.client.request(TaskService.pids, { id: 'c2' }, { metadata: META });
    assert.deepEqual(pids.processes.map((p) => p.pid), [pid]);
    await s.client.request(TaskService.kill, { id: 'c2', execId: '', signal: 9, all: true }, { metadata: META });
    assert.equal((await initWait).exitStatus, 137);
    assert.equal((await s.client.request(TaskService.delete, { id: 'c2', execId: '' }, { metadata: META })).exitStatus, 137);
    assert.deepEqual(runcList(), []);
  });

  test('bad calls get containerd\'s codes and the server goes on serving', async () => {
    const s = await serve('c');
    open.push(s);
    const meta = { metadata: META };
    assert.equal(await codeOf(s.client.request(TaskService.state, { id: 'nope', execId: '' }, meta)), GRPC_CODES.NotFound);
    assert.equal(await codeOf(s.client.request(TaskService.wait, { id: 'nope', execId: '' }, meta)), GRPC_CODES.NotFound);
    assert.equal(await codeOf(s.client.request(TaskService.kill, { id: 'nope', execId: '', signal: 15, all: false }, meta)), GRPC_CODES.NotFound);
    assert.equal(await codeOf(s.client.request(TaskService.delete, { id: 'nope', execId: '' }, meta)), GRPC_CODES.NotFound);
    assert.equal(await codeOf(s.client.request(TaskService.checkpoint, { id: 'nope', path: '/x', options: undefined }, meta)), GRPC_CODES.Unimplemented);
    assert.equal(await codeOf(s.client.request(TaskService.create, { ...createRequest('c3', ['true']), checkpoint: '/some/image' }, meta)), GRPC_CODES.FailedPrecondition, 'restore from a checkpoint');
    assert.equal(await codeOf(s.client.request(TaskService.create, { ...createRequest('c4', ['true']), rootfs: [{ type: 'nfs', source: 'x:/y', target: '', options: [] }] }, meta)), GRPC_CODES.InvalidArgument, 'a mount type tsbox does not mount');
    assert.equal(await codeOf(s.client.request(TaskService.create, createRequest('../c5', ['true']), meta)), GRPC_CODES.InvalidArgument, 'a bad id');
    // containerd's identifier rule, as on the Sandbox API: containerd itself refuses these.
    assert.equal(await codeOf(s.client.request(TaskService.create, createRequest('c..5', ['true']), meta)), GRPC_CODES.InvalidArgument, 'two separators in a row');
    assert.equal(await codeOf(s.client.request(TaskService.create, createRequest(`c${'5'.repeat(76)}`, ['true']), meta)), GRPC_CODES.InvalidArgument, 'an id of 77 characters');
    assert.equal(await codeOf(s.client.request(TaskService.exec, { id: 'nope', execId: 'e..1', terminal: false, stdin: '', stdout: '', stderr: '', spec: undefined }, meta)), GRPC_CODES.InvalidArgument, 'an exec id two separators in a row');
    // No namespace: what containerd answers (and tsbox's Sandbox API) is FailedPrecondition.
    assert.equal(await codeOf(s.client.request(TaskService.state, { id: 'nope', execId: '' })), GRPC_CODES.FailedPrecondition, 'no namespace');
    assert.equal(await codeOf(s.client.request(TaskService.state, { id: 'nope', execId: '' }, { metadata: { 'containerd-namespace-ttrpc': 'a..b' } })), GRPC_CODES.InvalidArgument, 'a namespace that is not an identifier');
    const missing = await codeOf(s.client.request(TaskService.create, createRequest('c6', ['/bin/no-such-binary']), meta));
    assert.notEqual(missing, GRPC_CODES.Unimplemented, 'Create never answers UNIMPLEMENTED');
    await s.client.request(TaskService.shutdown, { id: 'nope', now: true }, meta);
    assert.equal((await s.client.request(TaskService.connect, { id: 'nope' }, meta)).taskPid, 0, 'still serving after Shutdown');
    assert.deepEqual(runcList(), [], 'no failed Create left a container');
    for (const id of ['c3', 'c4', 'c6']) assert.equal(mountedBelow(path.join(scratch, 'bundles', id, 'rootfs')), false, `${id}: nothing left mounted`);
  });

  test('a new task table (tsbox restarted) finds a running container, a paused one, and an exit it missed, which it publishes once', async () => {
    const meta = { metadata: META };
    const first = await serve('d1');
    const req = createRequest('c7', ['sleep', '1000']);
    const { pid } = await first.client.request(TaskService.create, req, meta);
    await first.client.request(TaskService.start, { id: 'c7', execId: '' }, meta);
    const paused = createRequest('c10', ['sleep', '1000']);
    await first.client.request(TaskService.create, paused, meta);
    await first.client.request(TaskService.start, { id: 'c10', execId: '' }, meta);
    await first.client.request(TaskService.pause, { id: 'c10' }, meta);
    assert.equal((await first.client.request(TaskService.state, { id: 'c10', execId: '' }, meta)).status, Status.PAUSED);
    const missed = createRequest('c11', ['sleep', '1000']);
    const missedPid = (await first.client.request(TaskService.create, missed, meta)).pid;
    await first.client.request(TaskService.start, { id: 'c11', execId: '' }, meta);
    first.client.close();
    first.table.close();
    await first.server.close(0);
    // c11 ends while no table runs (tsbox is away).
    process.kill(missedPid, 'SIGKILL');
    const exitFile = path.join(taskDirOf('c11'), 'init', 'exit');
    await waitFor(() => existsSync(exitFile), { what: 'the holder records c11\'s exit', timeoutMs: 10_000 });
    const second = await serve('d2');
    open.push(second);
    const state = await second.client.request(TaskService.state, { id: 'c7', execId: '' }, meta);
    assert.equal(state.status, Status.RUNNING);
    assert.equal(state.pid, pid, 'the same process');
    assert.equal((await second.client.request(TaskService.state, { id: 'c10', execId: '' }, meta)).status, Status.PAUSED, 'a paused container is still PAUSED');
    await second.client.request(TaskService.resume, { id: 'c10' }, meta);
    assert.equal((await second.client.request(TaskService.state, { id: 'c10', execId: '' }, meta)).status, Status.RUNNING);
    assert.equal((await second.client.request(TaskService.wait, { id: 'c11', execId: '' }, meta)).exitStatus, 137, 'the exit missed is answered');
    assert.deepEqual(second.events.seen, ['exit c11 137'], 'the exit missed is published at recovery, and nothing else');
    await Promise.all(second.events.sent);
    const wait = second.client.request(TaskService.wait, { id: 'c7', execId: '' }, meta);
    await second.client.request(TaskService.kill, { id: 'c7', execId: '', signal: 9, all: false }, meta);
    assert.equal((await wait).exitStatus, 137, 'the exit reaches the new table with its own code');
    await Promise.all(second.events.sent);
    second.client.close();
    second.table.close();
    await second.server.close(0);
    open.pop();
    const third = await serve('d3');
    open.push(third);
    assert.deepEqual(third.events.seen, [], 'a restarted table publishes no exit containerd already has');
    for (const id of ['c7', 'c11']) await third.client.request(TaskService.delete, { id, execId: '' }, meta);
    await third.client.request(TaskService.kill, { id: 'c10', execId: '', signal: 9, all: true }, meta);
    await third.client.request(TaskService.wait, { id: 'c10', execId: '' }, meta);
    await third.client.request(TaskService.delete, { id: 'c10', execId: '' }, meta);
    assert.equal(mountedBelow(path.join(req.bundle, 'rootfs')), false);
    assert.deepEqual(runcList(), []);
  });
  test('a task an earlier tsbox kept in its own state dir (one runc root, records that name none) is recovered and served from there; new tasks go to the new place', async () => {
    const meta = { metadata: META };
    const old: Places = { tasks: 'old-state/tasks', runc: 'old-state/runc' };
    const first = await serve('g1', 'runc', old);
    const { pid } = await first.client.request(TaskService.create, createRequest('c20', ['sleep', '1000']), meta);
    await first.client.request(TaskService.start, { id: 'c20', execId: '' }, meta);
    first.client.close();
    first.table.close();
    await first.server.close(0);
    // As that tsbox wrote it: no runc root in the record.
    const record = path.join(taskDirOf('c20', old.tasks), 'task.json');
    const { runcRoot, ...written } = JSON.parse(readFileSync(record, 'utf8')) as { runcRoot?: string };
    assert.equal(runcRoot, path.join(scratch, old.runc, NS), 'a record names its runc root');
    writeFileSync(record, JSON.stringify(written));

    const second = await serve('g2', 'runc', { tasks: 'run/tasks', runc: 'run/runc', former: old });
    open.push(second);
    const state = await second.client.request(TaskService.state, { id: 'c20', execId: '' }, meta);
    assert.equal(state.status, Status.RUNNING);
    assert.equal(state.pid, pid, 'the same process, found where the earlier tsbox kept it');
    const made = createRequest('c21', ['sleep', '1000']);
    await second.client.request(TaskService.create, made, meta);
    await second.client.request(TaskService.start, { id: 'c21', execId: '' }, meta);
    assert.ok(existsSync(path.join(taskDirOf('c21', 'run/tasks'), 'task.json')), 'a new task is recorded in the new place');
    assert.deepEqual(runcList('run/runc'), ['c21'], 'runc keeps the new container below the new root');
    assert.deepEqual(runcList(old.runc), ['c20'], 'and the recovered one where it was');
    // Each is ended and deleted through its own runc root: nothing of either is left.
    for (const id of ['c20', 'c21']) {
      const wait = second.client.request(TaskService.wait, { id, execId: '' }, meta);
      await second.client.request(TaskService.kill, { id, execId: '', signal: 9, all: true }, meta);
      assert.equal((await wait).exitStatus, 137);
      await second.client.request(TaskService.delete, { id, execId: '' }, meta);
    }
    assert.deepEqual(runcList(old.runc), []);
    assert.deepEqual(runcList('run/runc'), []);
    assert.deepEqual(readdirSync(path.join(scratch, old.tasks)), [], 'no record left in the old place');
    assert.deepEqual(readdirSync(path.join(scratch, 'run/tasks')), [], 'nor in the new');
    assert.equal(mountedBelow(made.bundle), false);
  });

  test('records of the build before the version (no version field) are served after an upgrade; a record that cannot be read (not JSON, a newer version, not its schema) is left as it is, with an error line naming the file and why, and the other tasks are served', async () => {
    const meta = { metadata: META };
    const first = await serve('v1');
    const processSpec = (args: string[]) => ({ typeUrl: 'types.containerd.io/opencontainers/runtime-spec/1/Process', value: Buffer.from(JSON.stringify({ args, env: ['PATH=/bin'], cwd: '/', user: { uid: 0, gid: 0 } })) });
    const execReq = (execId: string) => ({ id: 'c30', execId, terminal: false, stdin: '', stdout: '', stderr: '', spec: processSpec(['sleep', '1000']) });
    const pids = new Map<string, number>();
    const requests = new Map(['c30', 'c31', 'c32', 'c33'].map((id) => [id, createRequest(id, ['sleep', '1000'])]));
    for (const [id, req] of requests) {
      pids.set(id, (await first.client.request(TaskService.create, req, meta)).pid);
      await first.client.request(TaskService.start, { id, execId: '' }, meta);
    }
    await first.client.request(TaskService.exec, execReq('e1'), meta);
    const execPid = (await first.client.request(TaskService.start, { id: 'c30', execId: 'e1' }, meta)).pid;
    await first.client.request(TaskService.exec, execReq('e2'), meta);
    first.client.close();
    first.table.close();
    await first.server.close(0);

    const taskFile = (id: string): string => path.join(scratch, 'tasks', taskDirName(NS, id), 'task.json');
    const execFile = (execId: string): string => path.join(scratch, 'tasks', taskDirName(NS, 'c30'), execDirName(execId), 'exec.json');
    // c30 and its exec e1 as the build before the version wrote them.
    const { version, ...taskFields } = JSON.parse(readFileSync(taskFile('c30'), 'utf8')) as { version?: number } & Parameters<typeof formerTaskJson>[0];
    assert.equal(version, 1, 'this build writes the version of its records');
    writeFileSync(taskFile('c30'), formerTaskJson(taskFields));
    assert.equal(readFileSync(taskFile('c30'), 'utf8'), JSON.stringify(taskFields), "the earlier build's format: its record as JSON.stringify wrote it");
    const { version: execVersion, ...execFields } = JSON.parse(readFileSync(execFile('e1'), 'utf8')) as { version?: number } & Parameters<typeof formerExecJson>[0];
    assert.equal(execVersion, 1);
    writeFileSync(execFile('e1'), formerExecJson(execFields));
    // Records that cannot be read.
    const kept = new Map(['c31', 'c32', 'c33'].map((id) => [id, readFileSync(taskFile(id), 'utf8')]));
    const unreadable = new Map<string, { text: string; reason: RegExp }>([
      [taskFile('c31'), { text: 'not json{', reason: /not JSON/ }],
      [taskFile('c32'), { text: JSON.stringify({ ...(JSON.parse(kept.get('c32') ?? '') as object), version: 2 }), reason: /version 2 is newer than this build reads/ }],
      [taskFile('c33'), { text: JSON.stringify({ ...(JSON.parse(kept.get('c33') ?? '') as object), bundle: undefined }), reason: /bundle/ }],
      [execFile('e2'), { text: '{"execId":"e2","spec":', reason: /not JSON/ }],
    ]);
    for (const [file, { text }] of unreadable) writeFileSync(file, text);

    const lines: { level: number; msg: string; file?: string; reason?: string }[] = [];
    const second = await serve('v2', 'runc', undefined, pino({ level: 'info' }, { write: (line: string) => void lines.push(JSON.parse(line) as (typeof lines)[number]) }));
    open.push(second);
    for (const [file, { text, reason }] of unreadable) {
      const line = lines.find((l) => l.file === file);
      assert.ok(line !== undefined, `an error line names ${file}: ${JSON.stringify(lines.filter((l) => l.level >= 50))}`);
      assert.equal(line.level, 50, 'at error level');
      assert.match(line.reason ?? '', reason, `and says why: ${line.reason ?? ''}`);
      assert.match(line.msg, /cannot be read.*not served.*left as/);
      assert.equal(readFileSync(file, 'utf8'), text, 'the record is left as it was');
    }
    // The record of the earlier build is served: the same processes, its exec too.
    const state = await second.client.request(TaskService.state, { id: 'c30', execId: '' }, meta);
    assert.equal(state.status, Status.RUNNING);
    assert.equal(state.pid, pids.get('c30'));
    assert.equal((await second.client.request(TaskService.state, { id: 'c30', execId: 'e1' }, meta)).pid, execPid);
    assert.equal(await codeOf(second.client.request(TaskService.state, { id: 'c30', execId: 'e2' }, meta)), GRPC_CODES.NotFound, 'an exec whose record cannot be read is not served');
    assert.equal(await codeOf(second.client.request(TaskService.exec, execReq('e2'), meta)), GRPC_CODES.FailedPrecondition, 'nor made anew over its record');
    for (const id of ['c31', 'c32', 'c33']) {
      assert.equal(await codeOf(second.client.request(TaskService.state, { id, execId: '' }, meta)), GRPC_CODES.NotFound, `${id}: not served`);
      assert.ok(processAlive(pids.get(id) ?? 0), `${id}: its container runs on, left as it is`);
    }
    assert.equal(await codeOf(second.client.request(TaskService.create, requests.get('c31') ?? assert.fail(), meta)), GRPC_CODES.FailedPrecondition, 'a Create of its id does not make it anew over its record');
    assert.equal(readFileSync(taskFile('c31'), 'utf8'), 'not json{');
    // c30 goes on as any task: its exec and its init end with their own status, and it is deleted.
    const execWait = second.client.request(TaskService.wait, { id: 'c30', execId: 'e1' }, meta);
    await second.client.request(TaskService.kill, { id: 'c30', execId: 'e1', signal: 9, all: false }, meta);
    assert.equal((await execWait).exitStatus, 137);
    await second.client.request(TaskService.delete, { id: 'c30', execId: 'e1' }, meta);
    const initWait = second.client.request(TaskService.wait, { id: 'c30', execId: '' }, meta);
    await second.client.request(TaskService.kill, { id: 'c30', execId: '', signal: 9, all: true }, meta);
    assert.equal((await initWait).exitStatus, 137);
    assert.equal((await second.client.request(TaskService.delete, { id: 'c30', execId: '' }, meta)).exitStatus, 137);
    assert.equal(existsSync(path.dirname(taskFile('c30'))), false, 'its directory is gone, the unreadable exec record with it');
    second.client.close();
    second.table.close();
    await second.server.close(0);
    open.pop();

    // The records readable again (the build that reads them): served, and deleted.
    for (const [id, text] of kept) writeFileSync(taskFile(id), text);
    const third = await serve('v3');
    open.push(third);
    for (const id of kept.keys()) {
      assert.equal((await third.client.request(TaskService.state, { id, execId: '' }, meta)).pid, pids.get(id), `${id} served again`);
      const wait = third.client.request(TaskService.wait, { id, execId: '' }, meta);
      await third.client.request(TaskService.kill, { id, execId: '', signal: 9, all: true }, meta);
      assert.equal((await wait).exitStatus, 137);
      await third.client.request(TaskService.delete, { id, execId: '' }, meta);
    }
    assert.deepEqual(runcList(), []);
    assert.deepEqual(readdirSync(path.join(scratch, 'tasks')), [], 'no record left');
  });

  test('tsbox stopped while a holder still makes a container: the next table ends that holder and undoes the create; the create made again works', async () => {
    // A runc that takes its time over create, as under load.
    const slowRunc = path.join(scratch, 'slow-runc');
    writeFileSync(slowRunc, '#!/bin/sh\ncase " $* " in *" create "*) sleep 1000 ;; esac\nexec runc "$@"\n', { mode: 0o755 });
    const first = await serve('f1', slowRunc);
    const req = createRequest('c12', ['sleep', '1000']);
    // Never answered: the first table stands for a tsbox that is gone.
    const abandoned = first.table.create(NS, req, new AbortController().signal).then(
      () => 'answered',
      (err: unknown) => (err instanceof Error ? 'failed' : 'thrown a non-error'),
    );
    await waitFor(() => existsSync(path.join(scratch, 'tasks')) && readdirSync(path.join(scratch, 'tasks')).some((n) => existsSync(path.join(scratch, 'tasks', n, 'init', 'holder'))), { what: 'the holder at work', timeoutMs: 10_000 });
    const holderPid = Number(readFileSync(path.join(taskDirOf('c12'), 'init', 'holder'), 'utf8').split(' ')[0]);
    assert.ok(processAlive(holderPid));
    first.client.close();
    first.table.close();
    await first.server.close(0);
    const second = await serve('f2');
    open.push(second);
    assert.equal(processAlive(holderPid), false, 'the holder at work is ended by the recovery');
    assert.equal(await codeOf(second.client.request(TaskService.state, { id: 'c12', execId: '' }, { metadata: META })), GRPC_CODES.NotFound, 'the unanswered create is undone');
    assert.equal(mountedBelow(path.join(req.bundle, 'rootfs')), false, 'its rootfs is unmounted');
    assert.equal(await abandoned, 'failed');
    // containerd asks again (the front replays the call): it is made anew.
    const { pid } = await second.client.request(TaskService.create, req, { metadata: META });
    assert.ok(processAlive(pid));
    await second.client.request(TaskService.delete, { id: 'c12', execId: '' }, { metadata: META });
    assert.deepEqual(runcList(), []);
  });

  test('a runc slow to create (systemd slow to start its scope on a busy node) is waited for as the runc shim waits; the call\'s own deadline still ends it, leaving nothing', async () => {
    // 12 s: longer than a sandbox's start bound (start_timeout_ms, 10 s by default); runc itself
    // waits up to 30 s for systemd.
    const slowRunc = path.join(scratch, 'slow-runc-12');
    writeFileSync(slowRunc, '#!/bin/sh\ncase " $* " in *" create "*) sleep 12 ;; esac\nexec runc "$@"\n', { mode: 0o755 });
    const s = await serve('h', slowRunc);
    open.push(s);
    const req = createRequest('c13', ['sleep', '1000']);
    const { pid } = await s.client.request(TaskService.create, req, { metadata: META });
    assert.ok(pid > 0 && processAlive(pid), 'the slow create answers with the container init');
    assert.equal((await s.client.request(TaskService.state, { id: 'c13', execId: '' }, { metadata: META })).status, Status.CREATED);
    await s.client.request(TaskService.delete, { id: 'c13', execId: '' }, { metadata: META });
    assert.equal(processAlive(pid), false);

    // containerd's deadline (kubelet's 2 min, here 2 s) is the call's bound.
    const late = createRequest('c14', ['sleep', '1000']);
    const code = await codeOf(s.client.request(TaskService.create, late, { metadata: META, timeoutMs: 2000 }));
    assert.equal(code, GRPC_CODES.DeadlineExceeded, 'a Create past its deadline is DeadlineExceeded');
    await waitFor(() => !mountedBelow(path.join(late.bundle, 'rootfs')), { what: 'the late create undone (its rootfs unmounted)', timeoutMs: 30_000 });
    assert.equal(await codeOf(s.client.request(TaskService.state, { id: 'c14', execId: '' }, { metadata: META })), GRPC_CODES.NotFound, 'the late create is undone');
    assert.deepEqual(runcList(), [], 'runc knows no container of either');
  });

  test("a sandbox's Shutdown deletes the tasks it left, processes, rootfs and records, and no other sandbox's", async () => {
    const s = await serve('e');
    open.push(s);
    const mine = createRequest('c8', ['sleep', '1000']);
    const other = createRequest('c9', ['sleep', '1000']);
    writeFileSync(path.join(mine.bundle, 'sandbox'), 'sb1');
    writeFileSync(path.join(other.bundle, 'sandbox'), 'sb2');
    const pids: number[] = [];
    for (const req of [mine, other]) {
      pids.push((await s.client.request(TaskService.create, req, { metadata: META })).pid);
      await s.client.request(TaskService.start, { id: req.id, execId: '' }, { metadata: META });
    }
    const spec = { args: ['sleep', '1000'], env: ['PATH=/bin'], cwd: '/', user: { uid: 0, gid: 0 } };
    await s.client.request(TaskService.exec, { id: 'c8', execId: 'x', terminal: false, stdin: '', stdout: '', stderr: '', spec: { typeUrl: 'types.containerd.io/opencontainers/runtime-spec/1/Process', value: Buffer.from(JSON.stringify(spec)) } }, { metadata: META });
    const execPid = (await s.client.request(TaskService.start, { id: 'c8', execId: 'x' }, { metadata: META })).pid;
    await s.table.removeSandboxTasks(NS, 'sb1', AbortSignal.timeout(30_000));
    assert.equal(await codeOf(s.client.request(TaskService.state, { id: 'c8', execId: '' }, { metadata: META })), GRPC_CODES.NotFound, 'the left task is gone');
    assert.equal(processAlive(pids[0] as number), false, 'its init is gone');
    assert.equal(processAlive(execPid), false, 'its exec is gone');
    assert.equal(mountedBelow(path.join(mine.bundle, 'rootfs')), false, 'its rootfs is unmounted');
    assert.deepEqual(runcList(), ['c9'], 'only the other sandbox\'s container is left');
    assert.equal((await s.client.request(TaskService.state, { id: 'c9', execId: '' }, { metadata: META })).status, Status.RUNNING);
    await s.client.request(TaskService.kill, { id: 'c9', execId: '', signal: 9, all: true }, { metadata: META });
    await s.client.request(TaskService.wait, { id: 'c9', execId: '' }, { metadata: META });
    await s.client.request(TaskService.delete, { id: 'c9', execId: '' }, { metadata: META });
  });
});
