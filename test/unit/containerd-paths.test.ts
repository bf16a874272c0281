// containerd's root, state and gRPC address as containerd 2.1 reads them from its config:
// imports resolved from the importing file's directory, globs expanded, files merged breadth
// first with a later non-empty value winning, containerd's defaults for what no file sets; and
// tsbox's own settings that disagree with containerd's refused, naming both values.
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { after, describe, test } from 'node:test';
import { ConfigError, defaultConfig, resolveConfig, type Config } from '../../src/config/config.js';
import { readContainerdConfig } from '../../src/config/containerd-config.js';
import { CONTAINERD_DEFAULTS, pathsFromConfig, readContainerdPaths, withContainerdPaths } from '../../src/config/containerd-paths.js';

const problemsOf = (fn: () => unknown): readonly string[] => {
  try {
    fn();
  } catch (err) {
    if (err instanceof ConfigError) return err.problems;
    throw err;
  }
  assert.fail('expected a ConfigError');
};

describe("containerd's paths from its config", () => {
  const dir = mkdtempSync(path.join(tmpdir(), 'ctd-paths-'));
  after(() => rmSync(dir, { recursive: true, force: true }));
  let n = 0;
  /** A fresh directory with these files (relative name → content). */
  const tree = (files: Record<string, string>): string => {
    const root = path.join(dir, `t${++n}`);
    for (const [name, text] of Object.entries(files)) {
      mkdirSync(path.dirname(path.join(root, name)), { recursive: true });
      writeFileSync(path.join(root, name), text);
    }
    return root;
  };
  const config = (overrides: Partial<Config>): Config => ({ ...defaultConfig({}, 0), ...overrides });

  test('no config: containerd\'s defaults', () => {
    const paths = pathsFromConfig(undefined);
    assert.deepEqual({ root: paths.root, state: paths.state, address: paths.address }, { root: '/var/lib/containerd', state: '/run/containerd', address: '/run/containerd/containerd.sock' });
    assert.deepEqual(CONTAINERD_DEFAULTS, { root: paths.root, state: paths.state, address: paths.address });
    const t = tree({ 'config.toml': 'version = 3\n[plugins."io.containerd.cri.v1.runtime"]\n' });
    const none = readContainerdPaths(path.join(t, 'config.toml'));
    assert.deepEqual([none.root, none.state, none.address], ['/var/lib/containerd', '/run/containerd', '/run/containerd/containerd.sock']);
    assert.deepEqual(none.from, { root: undefined, state: undefined, address: undefined });
  });

  test('imports are merged breadth first, relative to the importing file; a later non-empty value wins', () => {
    const t = tree({
      'config.toml': 'version = 3\nroot = "/srv/main/root"\nstate = "/srv/main/state"\nimports = ["sub/a.toml", "conf.d/*.toml"]\n',
      // a.toml's own import is relative to sub/, and comes after everything config.toml queued
      'sub/a.toml': 'version = 3\nroot = "/srv/a/root"\nstate = ""\nimports = ["b.toml"]\n',
      'sub/b.toml': 'version = 3\nroot = "/srv/b/root"\n',
      'conf.d/2-late.toml': 'version = 3\nroot = "/srv/conf2/root"\n[grpc]\n  address = "/srv/conf2/ctd.sock"\n',
      'conf.d/1-early.toml': 'version = 3\n[grpc]\n  address = "/srv/conf1/ctd.sock"\n',
      'b.toml': 'root = "/never/read"\n',
    });
    const parsed = readContainerdConfig(path.join(t, 'config.toml'));
    assert.deepEqual(
      parsed.files.map((f) => path.relative(t, f.path)),
      ['config.toml', 'sub/a.toml', 'conf.d/1-early.toml', 'conf.d/2-late.toml', 'sub/b.toml'],
    );
    const paths = pathsFromConfig(parsed);
    assert.equal(paths.root, '/srv/b/root', 'sub/b.toml is merged last');
    assert.equal(paths.from.root, path.join(t, 'sub/b.toml'));
    assert.equal(paths.state, '/srv/main/state', 'an empty value does not replace one');
    assert.equal(paths.address, '/srv/conf2/ctd.sock', 'glob matches are merged in name order');
  });

  test('a file imported twice (or importing its importer) is read once', () => {
    const t = tree({
      'config.toml': 'imports = ["a.toml", "a.toml"]\nroot = "/r1"\n',
      'a.toml': 'imports = ["config.toml", "./a.toml"]\nstate = "/s1"\n',
    });
    const parsed = readContainerdConfig(path.join(t, 'config.toml'));
    assert.deepEqual(parsed.files.map((f) => path.basename(f.path)), ['config.toml', 'a.toml']);
    assert.deepEqual([pathsFromConfig(parsed).root, pathsFromConfig(parsed).state], ['/r1', '/s1']);
  });

  test('globs: in a directory part too, with ? and [..] classes; no match is no file', () => {
    const t = tree({
      'config.toml': `imports = ["conf.*/x?.toml", "${dir}/absent-*/*.toml", "[ab]*.toml", "nothing-*.toml"]\n`,
      'conf.1/x1.toml': 'root = "/from/conf1"\n',
      'conf.2/x2.toml': 'state = "/from/conf2"\n',
      'conf.2/x10.toml': 'root = "/never"\n',
      'b.toml': '[grpc]\naddress = "/from/b.sock"\n',
      'd.toml': '[grpc]\naddress = "/never.sock"\n',
    });
    const paths = pathsFromConfig(readContainerdConfig(path.join(t, 'config.toml')));
    assert.deepEqual([paths.root, paths.state, paths.address], ['/from/conf1', '/from/conf2', '/from/b.sock']);
  });

  test('an import naming a missing file is an error naming it and its importer, as it stops containerd', () => {
    // Only an entry with "*" is a glob for containerd: "[ab].toml" names that very file.
    const literal = tree({ 'config.toml': 'imports = ["[ab].toml"]\n', 'a.toml': '' });
    assert.deepEqual(problemsOf(() => readContainerdPaths(path.join(literal, 'config.toml'))), [
      `containerd_config: cannot read containerd config ${path.join(literal, '[ab].toml')} (imported by ${path.join(literal, 'config.toml')}): no such file`,
    ]);
    const t = tree({ 'config.toml': 'imports = ["conf.d/*.toml"]\n', 'conf.d/a.toml': 'imports = ["../gone.toml"]\n' });
    assert.deepEqual(problemsOf(() => readContainerdPaths(path.join(t, 'config.toml'))), [
      `containerd_config: cannot read containerd config ${path.join(t, 'gone.toml')} (imported by ${path.join(t, 'conf.d/a.toml')}): no such file`,
    ]);
  });

  test('a config that is missing (not at containerd\'s default path), unreadable or not TOML is an error with the path and position', () => {
    const t = tree({ 'bad.toml': 'version = 3\n[grpc]\naddress = "/x\n', 'dir.toml/x': '' });
    assert.deepEqual(problemsOf(() => readContainerdPaths(path.join(t, 'nope.toml'))), [`containerd_config: cannot read containerd config ${path.join(t, 'nope.toml')}: no such file`]);
    assert.deepEqual(problemsOf(() => readContainerdPaths(path.join(t, 'dir.toml'))), [`containerd_config: cannot read containerd config ${path.join(t, 'dir.toml')}: it is a directory`]);
    const [problem] = problemsOf(() => readContainerdPaths(path.join(t, 'bad.toml')));
    assert.match(problem ?? '', new RegExp(`^containerd_config: containerd config ${path.join(t, 'bad.toml')} is not valid TOML at line 3, column \\d+: `));
  });

  test('values containerd could not use, or tsbox could not follow, are errors', () => {
    const t = tree({ 'config.toml': 'root = 5\nstate = "run/ctd"\nimports = "x.toml"\n', 'ok.toml': 'root = 5\nstate = "run/ctd"\n', 'pat.toml': 'imports = ["[ab*.toml"]\n', 'rev.toml': 'imports = ["[z-a]*.toml"]\n' });
    assert.deepEqual(problemsOf(() => readContainerdPaths(path.join(t, 'config.toml'))), [`containerd_config: containerd config ${path.join(t, 'config.toml')}: imports must be a list of file names`]);
    assert.deepEqual(problemsOf(() => readContainerdPaths(path.join(t, 'ok.toml'))), [
      `containerd config ${path.join(t, 'ok.toml')}: root must be a string, not 5`,
      `containerd config ${path.join(t, 'ok.toml')}: state = "run/ctd" is relative to containerd's working directory, which tsbox cannot know; make it absolute`,
    ]);
    assert.deepEqual(problemsOf(() => readContainerdPaths(path.join(t, 'pat.toml'))), [`containerd_config: bad pattern in imports: ${path.join(t, '[ab*.toml')} (unclosed "[")`]);
    assert.deepEqual(readContainerdConfig(path.join(t, 'rev.toml')).files.length, 1, 'a reversed range matches nothing, as in Go');
  });

  test('tsbox takes containerd\'s paths; a setting that agrees is fine, one that disagrees is refused naming both values', () => {
    const t = tree({ 'config.toml': 'version = 3\nroot = "/srv/ctd/root"\nimports = ["grpc.toml"]\n', 'grpc.toml': '[grpc]\n  address = "/srv/ctd/ctd.sock"\n' });
    const main = path.join(t, 'config.toml');
    const taken = withContainerdPaths(config({ containerdConfig: main }));
    assert.deepEqual([taken.containerdRoot, taken.containerdState, taken.containerdAddress], ['/srv/ctd/root', '/run/containerd', '/srv/ctd/ctd.sock']);
    const agreeing = withContainerdPaths(config({ containerdConfig: main, containerdRoot: '/srv/ctd/root/', containerdState: '/run/containerd', containerdAddress: '/srv/ctd/ctd.sock' }));
    assert.equal(agreeing.containerdRoot, '/srv/ctd/root');

    const problems = problemsOf(() => withContainerdPaths(config({ containerdConfig: main, containerdRoot: '/var/lib/containerd', containerdState: '/srv/other', containerdAddress: '/srv/ctd/ctd.sock' })));
    assert.deepEqual(problems, [
      `containerd_root: /var/lib/containerd (--containerd-root or tsbox's config file) disagrees with containerd's root in ${main}, /srv/ctd/root; leave it out (tsbox follows containerd's config) or make them agree`,
      `containerd_state: /srv/other (--containerd-state or tsbox's config file) disagrees with containerd's default state (${main} and its imports set none), /run/containerd; leave it out (tsbox follows containerd's config) or make them agree`,
    ]);
  });

  test('tsbox\'s own settings: empty means "as containerd says"; a relative one is still refused', () => {
    const base = defaultConfig({}, 0);
    assert.deepEqual([base.containerdRoot, base.containerdState, base.containerdAddress], ['', '', '']);
    assert.deepEqual(problemsOf(() => resolveConfig({ containerdRoot: 'var/lib/containerd' }, {}, base)), ["containerd_root: must be an absolute path (or empty: as containerd's config says)"]);
    assert.equal(resolveConfig({}, { containerdState: 'rel/state' }, base).containerdState, path.resolve('rel/state'), 'a relative flag is taken from the working directory');
  });
});
