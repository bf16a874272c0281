/**
 * The operator CLI (`tsbox sandbox …`) against a real containerd 2.x with tsbox registered:
 * every command run as a user runs it (a child process), its output, its exit code, and what
 * containerd itself (`ctr sandboxes ls`) sees; and each failure an operator can meet, with
 * the exit code a script branches on.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import path from 'node:path';
import { createSandboxClients, type Sandbox } from '../support/containerd-clients.js';
import { type CommandResult, type Containerd, containerdUnavailableReason, runCommand, startContainerd } from '../support/containerd.js';
import { type SandboxerDaemon, processAlive, startSandboxerDaemon, tsboxMain, tsboxSandboxer } from '../support/tsbox-daemon.js';
import { EXIT } from '../../src/ops/exit-codes.js';

/** Runs `tsbox ARGS` to its exit (bounded). */
export function tsbox(args: readonly string[], timeoutMs = 60_000): Promise<CommandResult> {
  return runCommand(process.execPath, [tsboxMain, ...args], timeoutMs);
}

function describeRun(r: CommandResult): string {
  return `exit ${r.code}\nstdout: ${r.stdout}\nstderr: ${r.stderr}`;
}

describe('tsbox sandbox … through a real containerd', () => {
  let sandboxer: SandboxerDaemon | undefined;
  let containerd: Containerd | undefined;
  const ns = `cli-${process.pid}`;

  /** `tsbox sandbox <cmd> --address … -n ns <rest>` */
  function cli(cmd: string, rest: readonly string[] = [], namespace = ns): Promise<CommandResult> {
    const d = containerd;
    const s = sandboxer;
    if (d === undefined || s === undefined) throw new Error('not started');
    return tsbox(['sandbox', cmd, '--address', d.address, '-n', namespace, '--state-dir', s.stateDir, ...rest]);
  }

  async function ok(cmd: string, rest: readonly string[] = []): Promise<string> {
    const r = await cli(cmd, rest);
    assert.equal(r.code, 0, `tsbox sandbox ${cmd} ${rest.join(' ')}\n${describeRun(r)}`);
    return r.stdout;
  }

  async function fails(cmd: string, rest: readonly string[], code: number, message: RegExp): Promise<CommandResult> {
    const r = await cli(cmd, rest);
    assert.equal(r.code, code, `tsbox sandbox ${cmd} ${rest.join(' ')} should exit ${code}\n${describeRun(r)}`);
    assert.match(r.stderr, message);
    assert.match(r.stderr, /fix: /, 'the error says how to fix it');
    return r;
  }

  before(async () => {
    const missing = containerdUnavailableReason();
    if (missing !== undefined) throw new Error(missing);
    sandboxer = await startSandboxerDaemon(tsboxSandboxer());
    containerd = await startContainerd({ sandboxerSocket: sandboxer.socketPath, sandboxerName: 'tsbox' });
  });

  after(async () => {
    await containerd?.teardown();
    await sandboxer?.teardown();
  });

  test('run, ls, inspect, logs, stop, wait, rm: the whole life of a sandbox, seen by containerd too', async () => {
    const d = containerd;
    assert.ok(d !== undefined);
    const id = (await ok('run', ['--id', 'life', '--hostname', 'box1', '--label', 'team=ops', '--', 'sh', '-c', 'echo hello from $(hostname); exec sleep 1000'])).trim();
    assert.equal(id, 'life');

    const ctrLs = await d.ctr(['sandboxes', 'ls'], { namespace: ns });
    assert.match(ctrLs.stdout, /^life\s/m, `ctr sandboxes ls lists it\n${ctrLs.stdout}`);

    const table = await ok('ls');
    assert.match(table.split('\n')[0] ?? '', /^ID\s+NAMESPACE\s+STATE\s+PID\s+CREATED\s+EXIT$/);
    const row = table.split('\n').find((l) => l.startsWith('life '));
    assert.ok(row !== undefined, table);
    assert.match(row, new RegExp(`^life\\s+${ns}\\s+SANDBOX_READY\\s+\\d+\\s+\\S+\\s+-$`));

    const rows = JSON.parse(await ok('ls', ['--json'])) as { id: string; state: string; pid: number; labels: Record<string, string> }[];
    const listed = rows.find((r) => r.id === 'life');
    assert.equal(listed?.state, 'SANDBOX_READY');
    assert.ok(listed !== undefined && listed.pid > 0 && processAlive(listed.pid), 'ls --json gives the live pid');
    assert.deepEqual(listed.labels, { team: 'ops' });

    const doc = JSON.parse(await ok('inspect', ['life'])) as {
      containerd: { sandboxer: string; runtime: string; spec: { hostname: string } };
      tsbox: { state: string; pid: number; info: { hostname: string; stateDir: string } };
    };
    assert.equal(doc.containerd.sandboxer, 'tsbox');
    assert.equal(doc.containerd.spec.hostname, 'box1');
    assert.equal(doc.tsbox.state, 'SANDBOX_READY');
    assert.equal(doc.tsbox.pid, listed.pid);
    assert.equal(doc.tsbox.info.hostname, 'box1');

    // The console output, read where tsbox keeps it.
    let logs = '';
    for (let i = 0; i < 50 && !logs.includes('hello'); i++) {
      logs = await ok('logs', ['life']);
      if (!logs.includes('hello')) await new Promise((r) => setTimeout(r, 100));
    }
    assert.equal(logs, 'hello from box1\n');

    assert.equal((await ok('stop', ['life', '--timeout', '0'])).trim(), 'life');
    const waited = await cli('wait', ['life']);
    assert.equal(waited.code, 137, `wait exits with the sandbox's status (SIGKILL)\n${describeRun(waited)}`);
    assert.equal(waited.stdout, '137\n');
    assert.ok(!processAlive(listed.pid));
    const after = (await ok('ls')).split('\n').find((l) => l.startsWith('life '));
    assert.match(after ?? '', /SANDBOX_NOTREADY\s+-\s+\S+\s+137$/);

    assert.equal((await ok('rm', ['life'])).trim(), 'life');
    const ctrAfter = await d.ctr(['sandboxes', 'ls'], { namespace: ns });
    assert.doesNotMatch(ctrAfter.stdout, /^life\s/m, 'containerd forgot it');
    await fails('inspect', ['life'], EXIT.notFound, /no sandbox life in namespace/);
    assert.ok(!existsSync(path.join(sandboxer?.stateDir ?? '', 'sandboxes', ns, 'life')), "tsbox removed the sandbox's directory");
  });

  test('logs -f follows the output until the sandbox exits; wait exits with its code; rm of a running sandbox stops it', async () => {
    await ok('run', ['--id', 'follow', '--', 'sh', '-c', 'for i in 1 2 3; do echo line $i; sleep 0.2; done; exit 3']);
    const followed = await ok('logs', ['follow', '-f']);
    assert.equal(followed, 'line 1\nline 2\nline 3\n');
    const waited = await cli('wait', ['follow']);
    assert.equal(waited.code, 3, describeRun(waited));
    assert.equal(waited.stdout, '3\n');
    await ok('rm', ['follow']);

    await ok('run', ['--id', 'running']);
    const pid = (JSON.parse(await ok('inspect', ['running'])) as { tsbox: { pid: number } }).tsbox.pid;
    assert.ok(processAlive(pid));
    await ok('rm', ['running']);
    assert.ok(!processAlive(pid), 'rm stopped it');
  });

  test('bad ids and half-known sandboxes: precise errors, distinct exit codes, and rm --force cleans up', async () => {
    const d = containerd;
    const s = sandboxer;
    assert.ok(d !== undefined && s !== undefined);
    await fails('inspect', ['nope'], EXIT.notFound, /neither containerd nor tsbox knows it/);
    await fails('rm', ['nope'], EXIT.notFound, /no sandbox nope/);
    assert.equal((await cli('rm', ['--force', 'nope'])).code, 0, 'rm --force ignores an unknown id');
    const bad = await cli('inspect', ['bad/id']);
    assert.equal(bad.code, EXIT.usage, describeRun(bad));

    await ok('run', ['--id', 'dup']);
    await fails('run', ['--id', 'dup'], EXIT.exists, /sandbox dup exists already/);
    await ok('rm', ['dup']);

    // In containerd's store only: a record whose sandbox tsbox never made.
    const viaContainerd = createSandboxClients(d.address, ns);
    const record: Sandbox = { sandbox_id: 'orphan-record', runtime: { name: 'io.containerd.tsbox.v1', options: null }, sandboxer: 'tsbox', labels: {}, extensions: {} };
    try {
      await viaContainerd.store.call('Create', { sandbox: record });
    } finally {
      viaContainerd.close();
    }
    await fails('inspect', ['orphan-record'], EXIT.mismatch, /in containerd's store .* but tsbox does not know it/);
    await fails('rm', ['orphan-record'], EXIT.mismatch, /tsbox does not know it/);
    await ok('rm', ['--force', 'orphan-record']);
    assert.doesNotMatch((await d.ctr(['sandboxes', 'ls'], { namespace: ns })).stdout, /orphan-record/);

    // Another sandboxer's sandbox: refused with exit 9, and left as it was.
    const theirs = createSandboxClients(d.address, ns);
    try {
      await theirs.store.call('Create', { sandbox: { ...record, sandbox_id: 'not-ours', sandboxer: 'podsandbox' } });
      await fails('inspect', ['not-ours'], EXIT.badState, /belongs to sandboxer "podsandbox", not tsbox/);
      await fails('rm', ['not-ours'], EXIT.badState, /belongs to sandboxer "podsandbox"/);
      assert.match((await d.ctr(['sandboxes', 'ls'], { namespace: ns })).stdout, /not-ours/, 'rm left it alone');
    } finally {
      await theirs.store.call('Delete', { sandbox_id: 'not-ours' });
      theirs.close();
    }

    // In tsbox only: made on tsbox's own socket, never recorded in containerd.
    const direct = createSandboxClients(s.socketPath, ns);
    let pid: number;
    try {
      await direct.controller.call('Create', { sandbox_id: 'orphan-tsbox', sandboxer: 'tsbox', sandbox: record, rootfs: [], annotations: {}, netns_path: '' });
      pid = (await direct.controller.call('Start', { sandbox_id: 'orphan-tsbox', sandboxer: 'tsbox' })).pid;
    } finally {
      direct.close();
    }
    await fails('inspect', ['orphan-tsbox'], EXIT.mismatch, /containerd has no record of it/);
    await fails('run', ['--id', 'orphan-tsbox'], EXIT.exists, /in tsbox only/);
    await ok('rm', ['--force', 'orphan-tsbox']);
    assert.ok(!processAlive(pid), 'rm --force stopped it in tsbox');
    await fails('inspect', ['orphan-tsbox'], EXIT.notFound, /neither/);
  });

  test('containerd not running at --address: exit 3, naming the address', async () => {
    const r = await tsbox(['sandbox', 'ls', '--address', '/nonexistent/containerd.sock']);
    assert.equal(r.code, EXIT.containerdDown, describeRun(r));
    assert.match(r.stderr, /containerd is not running at \/nonexistent\/containerd\.sock/);
    assert.match(r.stderr, /fix: .*--address/);
  });

  test('tsbox not registered in containerd: exit 4, nothing left behind in containerd', async () => {
    const s = sandboxer;
    assert.ok(s !== undefined);
    // A second containerd whose only sandboxer is called something else.
    const other = await startContainerd({ sandboxerSocket: s.socketPath, sandboxerName: 'other' });
    try {
      const r = await tsbox(['sandbox', 'run', '--id', 'unregistered', '--address', other.address, '-n', ns]);
      assert.equal(r.code, EXIT.notRegistered, describeRun(r));
      assert.match(r.stderr, /has no sandboxer named "tsbox"/);
      assert.match(r.stderr, /fix: .*tsbox install/);
      assert.doesNotMatch((await other.ctr(['sandboxes', 'ls'], { namespace: ns })).stdout, /unregistered/, 'no record left in containerd');
    } finally {
      await other.teardown();
    }
  });

  test('tsbox not running behind containerd: exit 5; once it is back the CLI works again', async () => {
    const s = sandboxer;
    assert.ok(s !== undefined);
    await s.stop();
    try {
      await fails('run', ['--id', 'down'], EXIT.tsboxDown, /containerd cannot reach tsbox/);
    } finally {
      await s.start();
    }
    await ok('run', ['--id', 'back']);
    await ok('rm', ['back']);
    assert.doesNotMatch((await containerd?.ctr(['sandboxes', 'ls'], { namespace: ns }))?.stdout ?? '', /down|back/, 'nothing left in containerd');
  });
});
