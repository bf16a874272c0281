/**
 * The daemon's Node flags (src/base/node-flags.ts) where they cannot be imported: the shebang of
 * the package's bin, `npm start`, and the scripts that start tsbox (critest, the control-plane
 * benchmark). A launch point that drops them runs a daemon whose young generation grows to
 * Node's default (tens of MiB more on a node).
 */
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';
import { DAEMON_NODE_FLAGS } from '../../src/base/node-flags.js';
import { repoRoot } from '../support/containerd-clients.js';

const flags = DAEMON_NODE_FLAGS.join(' ');
const read = (file: string): string => readFileSync(path.join(repoRoot, file), 'utf8');

test('the package\'s bin runs node with the daemon\'s flags (its shebang)', () => {
  assert.equal(read('src/main.ts').split('\n')[0], `#!/usr/bin/env -S node ${flags}`);
  // tsc keeps the shebang: the built bin is what npm links.
  assert.equal(read('dist/src/main.js').split('\n')[0], `#!/usr/bin/env -S node ${flags}`);
});

test('npm start, critest and the control-plane benchmark start the daemon with them', () => {
  const pkg = JSON.parse(read('package.json')) as { scripts: Record<string, string> };
  assert.match(pkg.scripts['start'] ?? '', new RegExp(`node ${flags} dist/src/main\\.js serve`));
  assert.match(read('scripts/critest.sh'), new RegExp(`node ${flags} dist/src/main\\.js serve`));
  assert.match(read('scripts/bench.sh'), new RegExp(`node ${flags} \\$here/dist/src/main\\.js serve`));
});
