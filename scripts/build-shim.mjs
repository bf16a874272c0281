// Compiles the native helpers into dist/bin: the per-sandbox supervisor, which is also the pod's
// relay (native/tsbox-shim.c with native/relay.c), and the per-container holder
// (native/tsbox-ctr.c). Rebuilds each only when one of its sources or the headers is newer than
// its binary.
import { execFileSync } from 'node:child_process';
import { mkdirSync, readdirSync, statSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const native = join(root, 'native');
// A file that does not exist is older than any other: it gets built.
const mtime = (p) => { try { return statSync(p).mtimeMs; } catch { return -1; /* absent */ } };
// Every header (native/unmount-tree.h, native/relay.h) counts for every binary.
const headers = readdirSync(native).filter((name) => name.endsWith('.h')).map((name) => join(native, name));
const binaries = {
  'tsbox-shim': ['tsbox-shim.c', 'relay.c'],
  'tsbox-ctr': ['tsbox-ctr.c'],
};
for (const [name, sources] of Object.entries(binaries)) {
  const srcs = sources.map((source) => join(native, source));
  const out = join(root, 'dist', 'bin', name);
  if (mtime(out) < Math.max(...[...srcs, ...headers].map(mtime))) {
    mkdirSync(dirname(out), { recursive: true });
    const cc = process.env.CC ?? 'cc';
    execFileSync(cc, ['-O2', '-Wall', '-Wextra', '-Werror', '-o', out, ...srcs], { stdio: 'inherit' });
  }
}
