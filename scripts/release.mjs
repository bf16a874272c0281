// Builds the release artifact (`npm run release` builds first, then runs this):
//   tsbox-<version>-linux-<arch>.tar.gz holding, under tsbox-<version>/,
//     bin/tsbox            launcher (sh) that runs the pinned Node on the program
//     bin/node             the Node runtime this script runs on (pinned: same binary, same version)
//     dist/src/…           the compiled program
//     dist/bin/tsbox-shim  the per-sandbox supervisor
//     dist/bin/tsbox-ctr   the per-container holder of the Task API route (a link to tsbox-shim)
//     dist/bin/tsbox-pause the sandbox process of a pod without a command
//     node_modules/…       production dependencies only
//     package.json, README.md, VERSION
// Needs nothing on the node but libc (Node links only glibc's libraries). Options:
//   --out DIR   where the tarball goes (default .cache/release)
import { execFileSync } from 'node:child_process';
import { chmodSync, copyFileSync, cpSync, existsSync, mkdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { dirname, join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const { values } = parseArgs({ options: { out: { type: 'string' } } });
const out = values.out ?? join(root, '.cache', 'release');
const pkg = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8'));
const arch = { x64: 'amd64', arm64: 'arm64' }[process.arch] ?? process.arch;
const name = `tsbox-${pkg.version}`;
const stage = join(out, 'stage');
const top = join(stage, name);

for (const required of ['dist/src/main.js', 'dist/bin/tsbox-shim', 'dist/bin/tsbox-ctr', 'dist/bin/tsbox-pause']) {
  if (!existsSync(join(root, required))) {
    console.error(`release: ${required} is missing: run "npm run build" first (npm run release does)`);
    process.exit(1);
  }
}
// The daemon's Node flags (src/base/node-flags.ts), from the build being released.
const { DAEMON_NODE_FLAGS } = await import(join(root, 'dist', 'src', 'base', 'node-flags.js'));

rmSync(stage, { recursive: true, force: true });
mkdirSync(join(top, 'bin'), { recursive: true });

cpSync(join(root, 'dist', 'src'), join(top, 'dist', 'src'), { recursive: true });
// The holder's name is a link to the one program (scripts/build-shim.mjs): kept a link, as it is.
cpSync(join(root, 'dist', 'bin'), join(top, 'dist', 'bin'), { recursive: true, verbatimSymlinks: true });
// The program is ES modules: package.json's "type" says so to Node.
writeFileSync(
  join(top, 'package.json'),
  `${JSON.stringify({ name: pkg.name, version: pkg.version, type: 'module', private: true, license: pkg.license, dependencies: pkg.dependencies }, null, 2)}\n`,
);
copyFileSync(join(root, 'README.md'), join(top, 'README.md'));

// Production dependencies, exactly the versions installed here (npm's own resolution).
const prod = execFileSync('npm', ['ls', '--omit=dev', '--all', '--parseable'], { cwd: root, encoding: 'utf8' })
  .split('\n')
  .filter((p) => p.startsWith(join(root, 'node_modules') + '/'))
  .map((p) => relative(root, p))
  // Nested copies come with their parent directory.
  .filter((p, _i, all) => !all.some((other) => other !== p && p.startsWith(`${other}/node_modules/`)));
for (const dir of prod) cpSync(join(root, dir), join(top, dir), { recursive: true, dereference: true });

copyFileSync(process.execPath, join(top, 'bin', 'node'));
chmodSync(join(top, 'bin', 'node'), 0o755);
writeFileSync(
  join(top, 'bin', 'tsbox'),
  `#!/bin/sh
# tsbox launcher: the Node runtime shipped beside it runs the program; nothing else needed.
here=$(dirname "$(readlink -f "$0")")
TSBOX_LAUNCHER="$here/tsbox" exec "$here/node" ${DAEMON_NODE_FLAGS.join(' ')} "$here/../dist/src/main.js" "$@"
`,
  { mode: 0o755 },
);
writeFileSync(join(top, 'VERSION'), `tsbox ${pkg.version}\nnode ${process.version}\n${process.platform}-${arch}\n`);

const tarball = join(out, `${name}-linux-${arch}.tar.gz`);
execFileSync('tar', ['-C', stage, '--owner=0', '--group=0', '-czf', tarball, name]);
rmSync(stage, { recursive: true, force: true });
console.log(`${tarball} (${(statSync(tarball).size / 1048576).toFixed(1)} MiB; node ${process.version}, ${prod.length} packages)`);
