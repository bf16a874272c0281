// Compiles the per-sandbox supervisor (native/tsbox-shim.c) into dist/bin/tsbox-shim.
// Rebuilds only when the source is newer than the binary.
import { execFileSync } from 'node:child_process';
import { mkdirSync, statSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const src = join(root, 'native', 'tsbox-shim.c');
const out = join(root, 'dist', 'bin', 'tsbox-shim');
// A file that does not exist is older than any other: it gets built.
const mtime = (p) => { try { return statSync(p).mtimeMs; } catch { return -1; /* absent */ } };
if (mtime(out) < mtime(src)) {
  mkdirSync(dirname(out), { recursive: true });
  const cc = process.env.CC ?? 'cc';
  execFileSync(cc, ['-O2', '-Wall', '-Wextra', '-Werror', '-o', out, src], { stdio: 'inherit' });
}
