#!/usr/bin/env node
// Post-processing step of `npm run gen` (after `buf generate`, see buf.gen.yaml).
//
// ts-proto's output already compiles under our strict tsconfig (strict,
// noUncheckedIndexedAccess, exactOptionalPropertyTypes), so this step does not
// rewrite code. It only makes the result checkable:
//   - fails if a module the server imports was not generated (e.g. a plugin option
//     or buf.gen.yaml change silently dropped the well-known types);
//   - normalizes line endings and the final newline so that running `npm run gen`
//     twice leaves no diff on any platform.
import { readdir, readFile, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const genDir = path.join(root, 'src', 'gen');

/** Modules the rest of tsbox imports; each must exist after generation. */
const expected = [
  'containerd/services/sandbox/v1/sandbox.ts',
  'containerd/types/sandbox.ts',
  'containerd/types/mount.ts',
  'containerd/types/platform.ts',
  'containerd/types/metrics.ts',
  'cgroups/v1/metrics.ts',
  'cgroups/v2/metrics.ts',
  'runtime/v1/pod_sandbox_config.ts',
  'runtime/v1/containers.ts',
  'containerd/task/v3/shim.ts',
  'containerd/runc/v1/options.ts',
  'containerd/events/task.ts',
  'containerd/services/events/v1/events.ts',
  'containerd/v1/types/task.ts',
  'ttrpc/request.ts',
  'google/rpc/status.ts',
  'google/protobuf/any.ts',
  'google/protobuf/empty.ts',
  'google/protobuf/timestamp.ts',
];

/** Lists every .ts file under dir, as paths relative to dir with '/' separators, sorted. */
async function listTs(dir) {
  const entries = await readdir(dir, { recursive: true, withFileTypes: true });
  return entries
    .filter((e) => e.isFile() && e.name.endsWith('.ts'))
    .map((e) => path.relative(dir, path.join(e.parentPath ?? e.path, e.name)).split(path.sep).join('/'))
    .sort();
}

const files = await listTs(genDir);
const missing = expected.filter((f) => !files.includes(f));
if (missing.length > 0) {
  console.error(`fix-gen: buf generate did not produce: ${missing.join(', ')}`);
  process.exitCode = 1;
} else {
  let changed = 0;
  for (const rel of files) {
    const file = path.join(genDir, rel);
    const text = await readFile(file, 'utf8');
    const normalized = `${text.replace(/\r\n?/g, '\n').trimEnd()}\n`;
    if (normalized !== text) {
      await writeFile(file, normalized);
      changed += 1;
    }
  }
  console.log(`fix-gen: ${files.length} generated modules checked, ${changed} normalized`);
}
