// Compiles the native helpers into dist/bin: the per-sandbox supervisor (native/tsbox-shim.c),
// the per-container holder (native/tsbox-ctr.c) and the task front (native/tsbox-front.c).
// Rebuilds each only when its source is newer than its binary.
import { execFileSync } from 'node:child_process';
import { mkdirSync, statSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
// A file that does not exist is older than any other: it gets built.
const mtime = (p) => { try { return statSync(p).mtimeMs; } catch { return -1; /* absent */ } };
// The shim and the holder include native/unmount-tree.h.
const shared = mtime(join(root, 'native', 'unmount-tree.h'));
for (const name of ['tsbox-shim', 'tsbox-ctr', 'tsbox-front']) {
  const src = join(root, 'native', `${name}.c`);
  const out = join(root, 'dist', 'bin', name);
  if (mtime(out) < Math.max(mtime(src), shared)) {
    mkdirSync(dirname(out), { recursive: true });
    const cc = process.env.CC ?? 'cc';
    execFileSync(cc, ['-O2', '-Wall', '-Wextra', '-Werror', '-o', out, src], { stdio: 'inherit' });
  }
}
