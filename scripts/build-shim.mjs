// Compiles the native programs, each from its own sources and the supervision library they
// share (native/supervise.c): the per-sandbox supervisor, which is also the pod's relay
// (native/tsbox-shim.c with native/relay.c), and the per-container holder (native/tsbox-ctr.c).
// Two builds of each, both with warnings as errors:
//   dist/bin/           -O2, what tsbox runs and the release ships
//   dist/bin-sanitize/  AddressSanitizer (with LeakSanitizer) and UndefinedBehaviorSanitizer,
//                       any finding fatal, for test/integration/native-sanitizers.test.ts
// (gcc's libasan and libubsan come with it on Debian, as dependencies of libgcc-*-dev).
// Rebuilds a binary only when one of its sources, a header or this script is newer than it.
import { execFileSync } from 'node:child_process';
import { mkdirSync, readdirSync, statSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const native = join(root, 'native');
// A file that does not exist is older than any other: it gets built.
const mtime = (p) => { try { return statSync(p).mtimeMs; } catch { return -1; /* absent */ } };
// Every header (native/supervise.h, native/relay.h) counts for every binary, and so do the flags here.
const inputs = [fileURLToPath(import.meta.url), ...readdirSync(native).filter((name) => name.endsWith('.h')).map((name) => join(native, name))];
const library = ['supervise.c'];
const binaries = {
  'tsbox-shim': ['tsbox-shim.c', 'relay.c', ...library],
  'tsbox-ctr': ['tsbox-ctr.c', ...library],
};
const warnings = ['-Wall', '-Wextra', '-Werror'];
const builds = {
  bin: ['-O2', ...warnings],
  'bin-sanitize': ['-fsanitize=address,undefined', '-fno-sanitize-recover=all', '-fno-omit-frame-pointer', '-g', '-O1', ...warnings],
};
const cc = process.env.CC ?? 'cc';
for (const [dir, flags] of Object.entries(builds)) {
  for (const [name, sources] of Object.entries(binaries)) {
    const srcs = sources.map((source) => join(native, source));
    const out = join(root, 'dist', dir, name);
    if (mtime(out) < Math.max(...[...srcs, ...inputs].map(mtime))) {
      mkdirSync(dirname(out), { recursive: true });
      execFileSync(cc, [...flags, '-o', out, ...srcs], { stdio: 'inherit' });
    }
  }
}
