/**
 * `tsbox install` / `uninstall` into a temp root: the systemd unit passes `systemd-analyze
 * verify`, containerd itself reads the drop-in, an existing containerd config keeps every
 * setting and comment, a config tsbox cannot safely edit is refused with nothing written,
 * and uninstall puts the config back as it was. Also `tsbox ready`, the unit's readiness
 * check.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:net';
import path from 'node:path';
import { parse } from 'smol-toml';
import { type CommandResult, containerdRelease, releaseProgram, runCommand } from '../support/containerd.js';
import { makeTempDir, removeTree, tsboxMain, which } from '../support/tsbox-daemon.js';
import { EXIT } from '../../src/ops/exit-codes.js';
import { DAEMON_NODE_FLAGS } from '../../src/base/node-flags.js';

/** TOML as plain JSON data (smol-toml's tables have no prototype). */
function parseToml(text: string): Record<string, unknown> {
  return JSON.parse(JSON.stringify(parse(text))) as Record<string, unknown>;
}

function tsbox(args: readonly string[]): Promise<CommandResult> {
  return runCommand(process.execPath, [tsboxMain, ...args], 30_000);
}

const UNIT = 'etc/systemd/system/tsbox.service';
const DROP_IN = 'etc/containerd/conf.d/tsbox.toml';
const CONFIG = 'etc/containerd/config.toml';

describe('tsbox install and uninstall', () => {
  let dir = '';
  let n = 0;
  /** A fresh root, optionally with a containerd config.toml in it. */
  function freshRoot(containerdConfig?: string): string {
    const root = path.join(dir, `root-${n++}`);
    mkdirSync(path.join(root, 'etc', 'containerd'), { recursive: true });
    if (containerdConfig !== undefined) writeFileSync(path.join(root, CONFIG), containerdConfig);
    return root;
  }

  before(async () => {
    dir = await makeTempDir('install-');
  });
  after(async () => {
    await removeTree(dir);
  });

  test('a fresh node: unit, drop-in and a config that imports it; systemd and containerd accept them', async () => {
    const root = freshRoot();
    const r = await tsbox(['install', '--root', root, '--socket', '/run/tsbox/custom.sock']);
    assert.equal(r.code, 0, r.stderr);
    for (const f of [UNIT, DROP_IN, CONFIG]) assert.match(r.stdout, new RegExp(`^created +${path.join(root, f)}$`, 'm'), 'it prints what it changed');

    const unit = readFileSync(path.join(root, UNIT), 'utf8');
    for (const line of ['KillMode=process', 'Delegate=yes', 'Restart=on-failure', 'Type=exec']) assert.match(unit, new RegExp(`^${line}$`, 'm'));
    // The daemon runs with its Node flags (src/base/node-flags.ts), as the package's bin does.
    assert.ok(unit.includes(`\nExecStart=${[process.execPath, ...DAEMON_NODE_FLAGS].join(' ')} `), unit);
    assert.match(unit, /^ExecStart=.* serve --socket \/run\/tsbox\/custom\.sock .*--containerd-config \/etc\/containerd\/config\.toml /m, 'the unit names containerd\'s config, where tsbox reads containerd\'s paths');
    assert.match(unit, /^ExecStartPost=.* ready --socket \/run\/tsbox\/custom\.sock /m);
    const analyze = which('systemd-analyze');
    assert.ok(analyze !== undefined, 'systemd-analyze is needed (apt-get install systemd)');
    const verify = await runCommand(analyze, ['verify', path.join(root, UNIT)], 30_000);
    assert.equal(verify.code, 0, verify.stderr);
    assert.equal(verify.stderr.trim(), '', 'systemd-analyze verify has nothing to say about the unit');

    const config = parseToml(readFileSync(path.join(root, CONFIG), 'utf8'));
    assert.deepEqual(config, { version: 3, imports: ['/etc/containerd/conf.d/tsbox.toml'] });
    // containerd itself merges the drop-in (imported here by its path below the temp root).
    const probe = path.join(root, 'probe.toml');
    writeFileSync(probe, `version = 3\nimports = [${JSON.stringify(path.join(root, DROP_IN))}]\n`);
    const dump = await runCommand(which('containerd') ?? 'containerd', ['--config', probe, 'config', 'dump'], 30_000);
    assert.equal(dump.code, 0, dump.stderr);
    const merged = parseToml(dump.stdout) as {
      proxy_plugins: Record<string, { type: string; address: string }>;
      plugins: Record<string, { containerd: { runtimes: Record<string, { runtime_type: string; sandboxer: string }> } }>;
    };
    assert.deepEqual({ type: merged.proxy_plugins['tsbox']?.type, address: merged.proxy_plugins['tsbox']?.address }, { type: 'sandbox', address: '/run/tsbox/custom.sock' });
    const handler = merged.plugins['io.containerd.cri.v1.runtime']?.containerd.runtimes['tsbox'];
    assert.deepEqual({ runtime_type: handler?.runtime_type, sandboxer: handler?.sandboxer }, { runtime_type: 'io.containerd.runc.v2', sandboxer: 'tsbox' });

    const again = await tsbox(['install', '--root', root, '--socket', '/run/tsbox/custom.sock']);
    assert.equal(again.code, 0);
    assert.equal(again.stdout.split('\n').filter((l) => l.startsWith('unchanged')).length, 3, again.stdout);

    const removed = await tsbox(['uninstall', '--root', root]);
    assert.equal(removed.code, 0, removed.stderr);
    for (const f of [UNIT, DROP_IN, CONFIG]) assert.ok(!existsSync(path.join(root, f)), `${f} removed`);
  });

  test('an existing containerd config: only an imports entry is added, and uninstall restores it byte for byte', async () => {
    const original = `# our node's containerd
version = 3
root = "/var/lib/containerd"

[grpc]
  address = "/run/containerd/containerd.sock"   # keep this comment

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
`;
    const root = freshRoot(original);
    const r = await tsbox(['install', '--root', root]);
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stdout, /added \/etc\/containerd\/conf\.d\/tsbox\.toml to the imports of/);
    const text = readFileSync(path.join(root, CONFIG), 'utf8');
    assert.match(text, /# keep this comment/);
    const before = parseToml(original);
    assert.deepEqual(parseToml(text), { ...before, imports: ['/etc/containerd/conf.d/tsbox.toml'] });
    assert.equal((await tsbox(['uninstall', '--root', root])).code, 0);
    assert.equal(readFileSync(path.join(root, CONFIG), 'utf8'), original);

    const withImports = `version = 3\nimports = ["/etc/containerd/site.toml"]\n\n[debug]\n  level = "info"\n`;
    const root2 = freshRoot(withImports);
    assert.equal((await tsbox(['install', '--root', root2])).code, 0);
    assert.deepEqual(parseToml(readFileSync(path.join(root2, CONFIG), 'utf8'))['imports'], ['/etc/containerd/site.toml', '/etc/containerd/conf.d/tsbox.toml']);
    assert.equal((await tsbox(['uninstall', '--root', root2])).code, 0);
    assert.equal(readFileSync(path.join(root2, CONFIG), 'utf8'), withImports);

    // `containerd config migrate` writes an empty list: it is filled, then emptied again.
    const emptyImports = `version = 3\nimports = []\n\n[debug]\n  level = "info"\n`;
    const root3 = freshRoot(emptyImports);
    assert.equal((await tsbox(['install', '--root', root3])).code, 0);
    assert.deepEqual(parseToml(readFileSync(path.join(root3, CONFIG), 'utf8'))['imports'], ['/etc/containerd/conf.d/tsbox.toml']);
    assert.equal((await tsbox(['uninstall', '--root', root3])).code, 0);
    assert.equal(readFileSync(path.join(root3, CONFIG), 'utf8'), emptyImports);
  });

  for (const [what, text, message] of [
    ['not valid TOML', 'version = 3\n[grpc\naddress = 1\n', /is not valid TOML, so tsbox will not edit it/],
    ['version 2', 'version = 2\n[plugins."io.containerd.grpc.v1.cri"]\n', /is a version 2 config/],
    ['version 1 (no version key)', '[plugins.cri]\n  sandbox_image = "pause"\n', /is a version 1 config/],
  ] as const) {
    test(`a containerd config that is ${what} is refused with exit 11 and nothing is written`, async () => {
      const root = freshRoot(text);
      const r = await tsbox(['install', '--root', root]);
      assert.equal(r.code, EXIT.refused, `${r.stdout}${r.stderr}`);
      assert.match(r.stderr, message);
      assert.match(r.stderr, /fix: /);
      assert.equal(readFileSync(path.join(root, CONFIG), 'utf8'), text, 'the config is untouched');
      assert.ok(!existsSync(path.join(root, UNIT)) && !existsSync(path.join(root, DROP_IN)), 'nothing else was installed');
    });
  }

  // The release of the containerd on PATH decides disable_pause_image_pull: each containerd reads the drop-in back.
  for (const [release, disabled, says] of [
    ['system', false, /pulls no sandbox image for tsbox pods/],
    ['2.3.4', false, /containerd 2\.3\.4 pulls the sandbox image \(registry\.k8s\.io\/pause:3\.10\.2 unless pinned_images\.sandbox names another\) for every pod, also tsbox's: keep it on the node/],
    ['2.4.0-dev.20260822', true, /containerd 2\.4\.0: disable_pause_image_pull is set on handler tsbox/],
  ] as const) {
    test(`with containerd ${release} on PATH: disable_pause_image_pull ${disabled ? 'set' : 'not set'}, and that containerd reads the drop-in`, async () => {
      const dir = containerdRelease(release).dir;
      const binary = releaseProgram('containerd', containerdRelease(release));
      assert.ok(binary !== undefined, `containerd ${release} is there (scripts/install-containerd.sh)`);
      const root = freshRoot();
      const env = { ...process.env, PATH: dir === undefined ? process.env['PATH'] : `${dir}:${process.env['PATH'] ?? ''}` };
      const r = await runCommand(process.execPath, [tsboxMain, 'install', '--root', root], 30_000, env);
      assert.equal(r.code, 0, r.stderr);
      assert.match(r.stdout, says);
      const probe = path.join(root, 'probe.toml');
      writeFileSync(probe, `version = 3\nimports = [${JSON.stringify(path.join(root, DROP_IN))}]\n`);
      const dump = await runCommand(binary, ['--config', probe, 'config', 'dump'], 30_000);
      assert.equal(dump.code, 0, dump.stderr);
      const merged = parseToml(dump.stdout) as { plugins: Record<string, { containerd: { runtimes: Record<string, Record<string, unknown>> } }> };
      const handler = merged.plugins['io.containerd.cri.v1.runtime']?.containerd.runtimes['tsbox'];
      assert.equal(handler?.['sandboxer'], 'tsbox');
      assert.equal(handler?.['disable_pause_image_pull'] === true, disabled, JSON.stringify(handler));
    });
  }
});

describe('tsbox ready', () => {
  let dir = '';
  let server: Server | undefined;
  before(async () => {
    dir = await makeTempDir('ready-');
  });
  after(async () => {
    server?.close();
    await removeTree(dir);
  });

  test('returns 0 once the socket accepts connections, exit 5 when it never does', async () => {
    const socket = path.join(dir, 'tsbox.sock');
    const missing = await tsbox(['ready', '--socket', socket, '--timeout', '1']);
    assert.equal(missing.code, EXIT.tsboxDown, missing.stderr);
    assert.match(missing.stderr, /did not start serving on .*tsbox\.sock within 1 s/);
    const pending = tsbox(['ready', '--socket', socket, '--timeout', '30']);
    const s = createServer((c) => c.destroy());
    server = s;
    await new Promise<void>((resolve) => s.listen(socket, resolve));
    assert.equal((await pending).code, 0);
  });
});
