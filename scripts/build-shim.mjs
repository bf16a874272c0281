// Compiles the native program, tsbox-shim, from the supervision library (native/supervise.c) and
// what it is: the per-sandbox supervisor, which is also the pod's relay (native/tsbox-shim.c with
// native/relay.c), and, run under the name tsbox-ctr (a symbolic link beside it), the
// per-container holder (native/tsbox-ctr.c). One program file, so that every pod's processes and
// holders share its pages; linked statically, as runc and the pause image's program are, so that
// no process of a pod carries the dynamic loader and libc's relocated data of its own (this
// halves a pod process's memory: bench/pods.ts --breakdown shows each kind's).
// Two builds, both with warnings (the linker's too) as errors:
//   dist/bin/           -O2, static, what tsbox runs and the release ships
//   dist/bin-sanitize/  AddressSanitizer (with LeakSanitizer) and UndefinedBehaviorSanitizer,
//                       any finding fatal, for test/integration/native-sanitizers.test.ts
//                       (dynamic: the sanitizers' runtimes are shared libraries)
// (gcc's libasan and libubsan come with it on Debian, as dependencies of libgcc-*-dev).
// What the programs and tsbox must agree on (ttrpc's framing and the bounds the relay shares
// with tsbox's ttrpc server, the protocol between a pod's process and tsbox, what one request to
// `tsbox-shim serve` may carry) is defined once, in TypeScript: it runs after tsc and writes
// those values into dist/native-gen/tsbox-contract.h, which the programs include.
// Rebuilds a binary only when one of its sources, a header or this script is newer than it.
import { execFileSync } from 'node:child_process';
import { lstatSync, mkdirSync, readFileSync, readdirSync, readlinkSync, renameSync, statSync, symlinkSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const native = join(root, 'native');
const generated = join(root, 'dist', 'native-gen');
const contractHeader = join(generated, 'tsbox-contract.h');

// The contract, from the compiled TypeScript (tsc has run).
const load = (module) => import(pathToFileURL(join(root, 'dist', 'src', module)).href);
const limits = await load('ttrpc/limits.js');
const podLink = await load('ttrpc/pod-link.js');
const helper = await load('runtime/helper-service.js');
const { findOnPath } = await load('config/containerd-config.js');
const whole = (name, value, suffix) => {
  if (!Number.isSafeInteger(value) || value < 0) throw new Error(`${name} is not a whole number: ${value}`);
  return `#define ${name} ${value}${suffix}`;
};
const text = (name, value) => {
  if (!/^[A-Za-z0-9._]+$/.test(value)) throw new Error(`${name} is not a plain name: ${value}`);
  return `#define ${name} "${value}"`;
};
const contract = [
  '/* Written by scripts/build-shim.mjs from the TypeScript named beside each group: do not edit. */',
  '#ifndef TSBOX_CONTRACT_H',
  '#define TSBOX_CONTRACT_H',
  '/* ttrpc\'s framing and the bounds the relay shares with the ttrpc server (src/ttrpc/limits.ts). */',
  whole('HEADER_BYTES', limits.HEADER_BYTES, ''),
  whole('MAX_MESSAGE_BYTES', limits.MAX_MESSAGE_BYTES, 'u'),
  whole('MAX_PARTIAL_FRAME_BYTES', limits.MAX_PARTIAL_FRAME_BYTES, 'ull'),
  whole('FRAME_ARRIVAL_MS', limits.FRAME_ARRIVAL_MS, ''),
  whole('MAX_QUEUED_OUTPUT_BYTES', limits.MAX_QUEUED_OUTPUT_BYTES, 'u'),
  whole('SWEEP_MS', limits.SWEEP_MS, ''),
  '/* The protocol between a pod\'s process and tsbox (src/ttrpc/pod-link.ts). */',
  text('POD_SERVICE', podLink.POD_SERVICE),
  whole('POD_PROTOCOL_VERSION', podLink.POD_PROTOCOL_VERSION, ''),
  text('POD_HELLO', podLink.POD_HELLO),
  text('POD_CANCEL', podLink.POD_CANCEL),
  text('FORMER_FRONT_SERVICE', podLink.FORMER_FRONT_SERVICE),
  '/* What one request to `tsbox-shim serve` may carry (src/runtime/helper-service.ts). */',
  whole('SERVE_MAX_ARGS', helper.SERVE_MAX_ARGS, ''),
  whole('SERVE_MAX_BYTES', helper.SERVE_MAX_BYTES, ''),
  '#endif',
  '',
].join('\n');
// Written only when it changes, so that its time says when the programs must be rebuilt.
let current = '';
try {
  current = readFileSync(contractHeader, 'utf8');
} catch {
  // not written yet
}
if (current !== contract) {
  mkdirSync(generated, { recursive: true });
  writeFileSync(contractHeader, contract);
}
// A file that does not exist is older than any other: it gets built.
const mtime = (p) => { try { return statSync(p).mtimeMs; } catch { return -1; /* absent */ } };
// Every header (native/supervise.h, native/relay.h) counts for every binary, and so do the flags here.
const inputs = [fileURLToPath(import.meta.url), contractHeader, ...readdirSync(native).filter((name) => name.endsWith('.h')).map((name) => join(native, name))];
// The pause (native/pause.c) is a program of its own, with no C library: a pod holds one for its
// whole life, and it costs a stack page (see that file). Both builds hold the same one.
const pause = { name: 'tsbox-pause', source: join(native, 'pause.c') };
const pauseFlags = ['-O2', '-static', '-nostdlib', '-ffreestanding', '-fno-builtin', '-fno-tree-loop-distribute-patterns', '-fno-stack-protector', '-fno-asynchronous-unwind-tables'];
const program = 'tsbox-shim';
const sources = ['tsbox-shim.c', 'relay.c', 'tsbox-ctr.c', 'supervise.c'].map((source) => join(native, source));
// The names the program also answers to (native/holder.h), links to it in the same directory.
const aliases = ['tsbox-ctr'];
const warnings = ['-Wall', '-Wextra', '-Werror', '-Wl,--fatal-warnings'];
const cc = process.env.CC ?? 'cc';
// The program every pod runs two or more of is linked with musl where it is installed (Debian's
// musl-tools; npm test installs it): a static musl program is a sixth of a static glibc one
// (147 against 875 KB of code) and writes a few pages of its own where glibc's start writes
// eight to ten, which each process of a pod keeps for its life. Elsewhere it is the system's C compiler
// and library. The sanitizer build is always the system's (AddressSanitizer needs glibc).
const podCc = process.env.TSBOX_POD_CC ?? (findOnPath('musl-gcc') !== undefined ? 'musl-gcc' : cc);
if (podCc === cc && process.env.TSBOX_POD_CC === undefined) process.stderr.write(`build-shim: musl-gcc not found: ${program} is linked with the system's C library (install musl-tools for smaller pod processes)\n`);
const builds = {
  bin: { cc: podCc, flags: ['-O2', '-static', '-fno-inline-functions-called-once', '-fdata-sections', '-Wl,--sort-section=alignment', ...warnings] },
  'bin-sanitize': { cc, flags: ['-fsanitize=address,undefined', '-fno-sanitize-recover=all', '-fno-omit-frame-pointer', '-g', '-O1', ...warnings] },
};
for (const [dir, { cc: compiler, flags }] of Object.entries(builds)) {
  const out = join(root, 'dist', dir, program);
  // The compiler it was built with: another one (musl installed since) builds it again.
  const stamp = join(generated, `${dir}-${program}.cc`);
  let built = '';
  try {
    built = readFileSync(stamp, 'utf8');
  } catch {
    // never built here
  }
  if (built !== compiler || mtime(out) < Math.max(...[...sources, ...inputs].map(mtime))) {
    mkdirSync(dirname(out), { recursive: true });
    execFileSync(compiler, [...flags, '-I', generated, '-o', out, ...sources], { stdio: 'inherit' });
    writeFileSync(stamp, compiler);
  }
  const pauseOut = join(root, 'dist', dir, pause.name);
  if (mtime(pauseOut) < Math.max(mtime(pause.source), ...inputs.map(mtime))) {
    execFileSync(cc, [...pauseFlags, ...warnings, '-o', pauseOut, pause.source], { stdio: 'inherit' });
  }
  for (const alias of aliases) {
    const link = join(root, 'dist', dir, alias);
    let target;
    try {
      target = lstatSync(link).isSymbolicLink() ? readlinkSync(link) : undefined;
    } catch {
      target = undefined; // absent
    }
    if (target === program) continue;
    // Replaced in one step (an earlier build left a program file there, or nothing).
    symlinkSync(program, `${link}.new`);
    renameSync(`${link}.new`, link);
  }
}
