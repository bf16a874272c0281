/**
 * An earlier build of tsbox, made from the repository's own history: the sources of `commit`
 * (git archive) in .cache/builds/<commit>, with this checkout's node_modules (the dependencies
 * must be the same: checked) and built with its own build script. What an operator upgrades
 * from.
 */
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, rmSync, symlinkSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

/** This file compiles to `<repo>/dist/test/support/`. */
const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..', '..');

/**
 * The last build whose pods' task calls went through one node-wide task front
 * (native/tsbox-front.c), before each pod's own process relayed them.
 */
export const NODE_WIDE_FRONT_BUILD = '3884b33d4075d15a739e3666a220fd4f050aae66';

/** Builds `commit` once (kept in .cache/builds); the path of its main.js. */
export function formerBuild(commit: string): string {
  const dir = path.join(repoRoot, '.cache', 'builds', commit);
  const main = path.join(dir, 'dist', 'src', 'main.js');
  if (existsSync(path.join(dir, '.built'))) return main;
  try {
    execFileSync('git', ['-C', repoRoot, 'cat-file', '-e', `${commit}^{commit}`], { stdio: 'ignore' });
  } catch {
    // git's own message says only that the object is missing; this one says why and what to do.
    throw new Error(`commit ${commit} is not in this clone's history (a shallow clone?): the upgrade test builds it; clone without --depth`);
  }
  const theirs = execFileSync('git', ['-C', repoRoot, 'show', `${commit}:package-lock.json`], { encoding: 'utf8', maxBuffer: 64 << 20 });
  const ours = readFileSync(path.join(repoRoot, 'package-lock.json'), 'utf8');
  if (theirs !== ours) {
    throw new Error(`commit ${commit} locks other dependencies than this checkout: its build would need its own npm ci`);
  }
  rmSync(dir, { recursive: true, force: true });
  mkdirSync(dir, { recursive: true });
  execFileSync('sh', ['-c', `git -C "$1" archive "$2" | tar -x -C "$3"`, 'sh', repoRoot, commit, dir], { stdio: 'inherit' });
  symlinkSync(path.join(repoRoot, 'node_modules'), path.join(dir, 'node_modules'));
  execFileSync(process.execPath, [path.join(dir, 'scripts', 'build-shim.mjs')], { cwd: dir, stdio: 'inherit' });
  execFileSync(process.execPath, [path.join(repoRoot, 'node_modules', 'typescript', 'bin', 'tsc'), '-p', path.join(dir, 'tsconfig.json')], { cwd: dir, stdio: 'inherit' });
  execFileSync('touch', [path.join(dir, '.built')]);
  return main;
}
