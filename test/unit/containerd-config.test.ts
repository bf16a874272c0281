// Which CRI runtime handlers put pods on tsbox, and whether their runtime_type names a shim
// binary that can run the pods' containers (SPEC.md section 7), read from containerd's config
// and its imports, as tsbox checks at start-up.
import assert from 'node:assert/strict';
import { chmodSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { after, describe, test } from 'node:test';
import { findShim, readContainerdConfig, sandboxerHandlers, shimBinaryName } from '../../src/config/containerd-config.js';

describe('CRI handlers of a sandboxer', () => {
  const dir = mkdtempSync(path.join(tmpdir(), 'cri-handlers-'));
  after(() => rmSync(dir, { recursive: true, force: true }));
  const bin = path.join(dir, 'bin');
  mkdirSync(bin);
  writeFileSync(path.join(bin, 'containerd-shim-runc-v2'), '#!/bin/sh\n');
  chmodSync(path.join(bin, 'containerd-shim-runc-v2'), 0o755);

  test('runtime_type names its shim binary the way containerd does', () => {
    assert.equal(shimBinaryName('io.containerd.runc.v2'), 'containerd-shim-runc-v2');
    assert.equal(shimBinaryName('io.containerd.kata.v2'), 'containerd-shim-kata-v2');
    assert.equal(shimBinaryName('/opt/bin/my-shim'), '/opt/bin/my-shim');
    assert.equal(findShim('io.containerd.runc.v2', bin), path.join(bin, 'containerd-shim-runc-v2'));
    assert.equal(findShim('io.containerd.tsbox.v1', bin), undefined);
  });

  test('handlers come from the main file and its imports (v3 and v2 plugin names), with their shim found or not', () => {
    const main = path.join(dir, 'config.toml');
    mkdirSync(path.join(dir, 'conf.d'));
    writeFileSync(
      main,
      `version = 3
imports = ["conf.d/*.toml"]
[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.tsbox]
  runtime_type = "io.containerd.runc.v2"
  sandboxer = "tsbox"
`,
    );
    writeFileSync(
      path.join(dir, 'conf.d', 'old.toml'),
      `[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.legacy]
  runtime_type = "io.containerd.tsbox.v1"
  sandboxer = "tsbox"
`,
    );
    const found = sandboxerHandlers(readContainerdConfig(main), 'tsbox', bin).map((h) => ({ ...h, shim: h.shim === undefined ? undefined : path.basename(h.shim) }));
    assert.deepEqual(
      found.map((h) => [h.name, h.runtimeType, path.basename(h.file)]),
      [
        ['tsbox', 'io.containerd.runc.v2', 'config.toml'],
        ['legacy', 'io.containerd.tsbox.v1', 'old.toml'],
      ],
    );
    assert.equal(found[0]?.shim, 'containerd-shim-runc-v2', 'found on the PATH given');
    assert.equal(found[1]?.shim, undefined, 'io.containerd.tsbox.v1 names no shim binary');
  });

  test('a config that is not TOML is an error naming the file and the position', () => {
    const bad = path.join(dir, 'bad.toml');
    writeFileSync(bad, 'version = 3\nroot = = "/x"\n');
    assert.throws(() => readContainerdConfig(bad), { message: `containerd config ${bad} is not valid TOML at line 2, column 8: invalid value` });
  });
});
