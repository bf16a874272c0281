/**
 * `tsbox doctor` on the end-to-end setup (a real containerd 2.x with tsbox registered and a
 * CRI handler of runc's runtime_type, whose containers tsbox runs over its Task API): it
 * passes, and when one part is taken away it fails with exit 10, naming that part and its fix.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, readFileSync, symlinkSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { type CommandResult, type Containerd, containerdUnavailableReason, runCommand, startContainerd } from '../support/containerd.js';
import { type SandboxerDaemon, createSandboxerDaemon, makeTempDir, removeTree, tsboxMain, tsboxSandboxer, which } from '../support/tsbox-daemon.js';
import { EXIT } from '../../src/ops/exit-codes.js';
import * as grpc from '@grpc/grpc-js';
import { VersionService } from '../../src/gen/containerd/services/version/v1/version.js';

function run(args: readonly string[], env: NodeJS.ProcessEnv = process.env): Promise<CommandResult> {
  return runCommand(process.execPath, [tsboxMain, ...args], 60_000, env);
}

describe('tsbox doctor', () => {
  let sandboxer: SandboxerDaemon | undefined;
  let containerd: Containerd | undefined;
  let scratch = '';

  /** doctor as an operator runs it: containerd's socket comes from containerd's config. */
  function doctor(extra: { containerdConfig?: string; env?: NodeJS.ProcessEnv; args?: readonly string[] } = {}): Promise<CommandResult> {
    const d = containerd;
    const s = sandboxer;
    if (d === undefined || s === undefined) throw new Error('not started');
    return run(
      ['doctor', '--containerd-config', extra.containerdConfig ?? d.paths.configPath, '--socket', s.socketPath, '--state-dir', s.stateDir, ...(extra.args ?? [])],
      extra.env,
    );
  }

  function expectProblem(r: CommandResult, problem: RegExp, fix: RegExp): void {
    assert.equal(r.code, EXIT.unhealthy, `doctor should fail\n${r.stdout}${r.stderr}`);
    const line = r.stdout.split('\n').findIndex((l) => l.startsWith('FAIL') && problem.test(l));
    assert.ok(line >= 0, `a FAIL line matching ${String(problem)}\n${r.stdout}`);
    assert.match(r.stdout.split('\n')[line + 1] ?? '', fix);
  }

  /** A copy of the test containerd's config, changed by `edit`. */
  function configVariant(name: string, edit: (text: string) => string): string {
    const d = containerd;
    if (d === undefined) throw new Error('not started');
    const file = path.join(scratch, name);
    writeFileSync(file, edit(readFileSync(d.paths.configPath, 'utf8')));
    return file;
  }

  before(async () => {
    const missing = containerdUnavailableReason();
    if (missing !== undefined) throw new Error(missing);
    scratch = await makeTempDir('doctor-');
    // As `tsbox install` registers it (handler tsbox, runc's runtime_type), and as an operator
    // starts tsbox: with containerd's config, where it finds that handler (its pods' containers
    // then go over tsbox's Task API, the default).
    const base = tsboxSandboxer({ defaultRoutes: true });
    const s = await createSandboxerDaemon({
      ...base,
      command: (p) => {
        const cmd = base.command(p);
        if (containerd === undefined) throw new Error('containerd must run before tsbox is started');
        return { ...cmd, args: [...cmd.args, '--containerd-config', containerd.paths.configPath] };
      },
    });
    sandboxer = s;
    containerd = await startContainerd({ sandboxerSocket: s.socketPath, runtimeType: 'io.containerd.runc.v2' });
    await s.start();
  });

  after(async () => {
    await containerd?.teardown();
    await sandboxer?.teardown();
    if (scratch !== '') await removeTree(scratch);
  });

  test('passes on the test setup', async () => {
    const r = await doctor();
    assert.equal(r.code, 0, `${r.stdout}${r.stderr}`);
    assert.doesNotMatch(r.stdout, /^FAIL/m);
    const d = containerd;
    assert.ok(d !== undefined);
    assert.ok(r.stdout.includes(`ok    containerd's root ${d.paths.root}, state ${d.paths.state}, socket ${d.address} (from ${d.paths.configPath})\n`), r.stdout);
    assert.ok(r.stdout.includes(`containerd at ${d.address} reaches tsbox`), 'it reached containerd on the socket its config names');
    for (const ok of [
      /containerd 2\.\d+\.\d+ at \S+ \(≥ 2\.0\)/,
      /registered as sandbox proxy plugin "tsbox"/,
      /CRI runtime handler "tsbox" runs on tsbox; tsbox runs its containers with runc over the Task API, without a shim per pod$/,
      /cgroup v[12]/,
      /runc/,
      /reaches tsbox/,
      /tsbox answers on/,
      /each pod of handler "tsbox" gets a task socket of its own below \S+\/state\/s \(containerd speaks the Task API v3 to the pod's process\)/,
      /state dir/,
    ]) {
      assert.match(r.stdout, new RegExp(`^ok .*${ok.source}`, 'm'));
    }
    // The running containerd's release, and what it does with a sandboxer (2.1: none of 2.3's or 2.4's asks).
    assert.match(r.stdout, /^note {2}containerd 2\.1\.\d+ ignores the pod's spec from Start/m);
    assert.doesNotMatch(r.stdout, /sandbox image/, 'containerd 2.1 pulls no pause image for tsbox pods');
  });

  test('a containerd of a release tsbox does not know: doctor names it and says what it did not check', async () => {
    // A stand-in for containerd's socket whose version service says 2.9.1 (a later release).
    const socket = path.join(scratch, 'later-containerd.sock');
    const server = new grpc.Server();
    server.addService(VersionService, { version: (_call: unknown, done: (err: null, res: { version: string; revision: string }) => void) => done(null, { version: 'v2.9.1', revision: 'test' }) });
    await new Promise<void>((resolve, reject) => server.bindAsync(`unix:${socket}`, grpc.ServerCredentials.createInsecure(), (err) => (err === null ? resolve() : reject(err))));
    try {
      const r = await doctor({ args: ['--address', socket] });
      assert.match(r.stdout, /^note {2}containerd 2\.9\.1 runs at \S+, a release tsbox does not know \(it knows 2\.0 to 2\.4\): what it asks of a sandboxer is not checked$/m, r.stdout);
      assert.doesNotMatch(r.stdout, /sandbox image/);
    } finally {
      server.forceShutdown();
    }
  });

  test('with the Task API route off, says the handler\'s containers use containerd\'s runc shim', async () => {
    const r = await doctor({ args: ['--task-api-handlers', ''] });
    assert.equal(r.code, 0, `${r.stdout}${r.stderr}`);
    assert.match(r.stdout, /^ok +CRI runtime handler "tsbox" runs on tsbox; its containers use .*containerd-shim-runc-v2$/m);
    assert.doesNotMatch(r.stdout, /Task API/);
  });

  test("fails when the pods' task sockets below the state dir would be too long for a unix socket", async () => {
    const r = await doctor({ args: ['--state-dir', path.join(scratch, 'x'.repeat(80))] });
    expectProblem(r, /the pods' task sockets below .* would be \d+ bytes long, more than a unix socket's 107: the pods of handler "tsbox" cannot start/, /fix: give tsbox a shorter --state-dir/);
  });

  test('follows the imports of containerd\'s config', async () => {
    const d = containerd;
    assert.ok(d !== undefined);
    const text = readFileSync(d.paths.configPath, 'utf8');
    const at = text.indexOf('# The sandboxer');
    mkdirSync(path.join(scratch, 'conf.d'), { recursive: true });
    writeFileSync(path.join(scratch, 'conf.d', '50-tsbox.toml'), `version = 3\n${text.slice(at)}`);
    const main = path.join(scratch, 'imports.toml');
    writeFileSync(main, `imports = ["conf.d/*.toml"]\n${text.slice(0, at)}`);
    const r = await doctor({ containerdConfig: main });
    assert.equal(r.code, 0, r.stdout);
    assert.match(r.stdout, /registered as sandbox proxy plugin "tsbox" .*conf\.d\/50-tsbox\.toml/);
  });

  test("fails naming both values when a setting disagrees with containerd's config, and an import that is missing", async () => {
    const d = containerd;
    assert.ok(d !== undefined);
    const r = await doctor({ args: ['--containerd-state', '/run/containerd'] });
    expectProblem(
      r,
      new RegExp(`containerd_state: /run/containerd .* disagrees with containerd's state in ${d.paths.configPath}, ${d.paths.state}`),
      /fix: leave the setting out \(tsbox follows containerd's config\)/,
    );
    const missing = configVariant('missing-import.toml', (t) => `imports = ["${path.join(scratch, 'gone.toml')}"]\n${t}`);
    expectProblem(await doctor({ containerdConfig: missing }), new RegExp(`cannot read containerd config ${path.join(scratch, 'gone.toml')} \\(imported by ${missing}\\): no such file`), /fix: /);
  });

  test('fails naming the missing proxy plugin', async () => {
    const file = configVariant('no-proxy.toml', (t) => t.replace(/\[proxy_plugins\.tsbox\][^[]*/, ''));
    expectProblem(await doctor({ containerdConfig: file }), /no \[proxy_plugins\.tsbox\]/, /fix: .*tsbox install/);
  });

  test('fails naming a proxy plugin at another socket', async () => {
    const file = configVariant('wrong-socket.toml', (t) => t.replace(/(\[proxy_plugins\.tsbox\][^[]*address = )"[^"]*"/, '$1"/run/elsewhere.sock"'));
    expectProblem(await doctor({ containerdConfig: file }), /points at "\/run\/elsewhere\.sock", but tsbox serves/, /fix: set address/);
  });

  test('fails naming a runtime_type whose shim is not installed', async () => {
    const file = configVariant('bad-shim.toml', (t) => t.replace('io.containerd.runc.v2', 'io.containerd.nosuch.v1'));
    expectProblem(await doctor({ containerdConfig: file }), /needs shim binary containerd-shim-nosuch-v1, which is not on PATH/, /fix: set runtime_type = "io\.containerd\.runc\.v2"/);
  });

  test('fails naming a missing CRI handler and a config that is not TOML', async () => {
    const noHandler = configVariant('no-handler.toml', (t) => t.replace(/\[plugins\.'io\.containerd\.cri\.v1\.runtime'\.containerd\.runtimes\.tsbox\][^[]*/, ''));
    expectProblem(await doctor({ containerdConfig: noHandler }), /no CRI runtime handler with sandboxer = "tsbox"/, /fix: /);
    const broken = configVariant('broken.toml', (t) => `${t}\n[[[nonsense\n`);
    expectProblem(await doctor({ containerdConfig: broken }), /is not valid TOML/, /fix: /);
  });

  test('fails naming runc when it is not on PATH', async () => {
    const bin = path.join(scratch, 'bin');
    mkdirSync(bin, { recursive: true });
    for (const b of ['containerd', 'containerd-shim-runc-v2']) symlinkSync(which(b) ?? b, path.join(bin, b));
    expectProblem(await doctor({ env: { ...process.env, PATH: bin } }), /runc is not on PATH/, /fix: apt-get install runc/);
  });

  test('fails naming the socket when tsbox is not running', async () => {
    const s = sandboxer;
    assert.ok(s !== undefined);
    await s.stop();
    try {
      const r = await doctor();
      expectProblem(r, /tsbox's socket .* does not exist: tsbox is not running/, /fix: systemctl start tsbox/);
      expectProblem(r, /containerd at .* cannot reach tsbox/, /fix: start tsbox/);
    } finally {
      await s.start();
    }
  });
});
