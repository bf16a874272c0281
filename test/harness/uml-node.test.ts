/**
 * The test node itself (scripts/uml-node.sh): the kernel scripts/install-uml.sh installed boots
 * here as a cgroup v2 node with systemd, runs a command and hands back its exit status; a
 * kernel that panics fails the run at once, with the kernel's own reason, rather than waiting
 * out the time bound (exit status 124). Runs on the host, beside at most one other node (the
 * script allows two at once), so it is not part of the machine's tiers.
 */
import { after, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, readlinkSync, rmSync, symlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { repoRoot } from '../support/containerd-clients.js';

const script = path.join(repoRoot, 'scripts', 'uml-node.sh');
const installed = '/usr/local/lib/tsbox-uml/current';

interface Run {
  code: number | null;
  stdout: string;
  stderr: string;
}

function umlNode(args: readonly string[], env: NodeJS.ProcessEnv = {}): Promise<Run> {
  return new Promise((resolve, reject) => {
    const child = spawn('bash', [script, ...args], { env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (chunk: Buffer) => (stdout += chunk.toString()));
    child.stderr.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
    child.on('error', reject);
    child.on('close', (code) => resolve({ code, stdout, stderr }));
  });
}

/** Host processes of any node this test booted (they carry the node's directory). */
function nodeProcesses(marker: string): string[] {
  const found: string[] = [];
  for (const pid of readdirSync('/proc').filter((name) => /^\d+$/.test(name))) {
    try {
      if (readFileSync(`/proc/${pid}/cmdline`, 'latin1').includes(marker)) found.push(pid);
    } catch {
      // gone meanwhile
    }
  }
  return found;
}

describe('the cgroup v2 test node (scripts/uml-node.sh)', () => {
  const dirs: string[] = [];
  after(() => {
    for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
  });

  test('boots with cgroup v2 and systemd as init, runs the command and returns its exit status', async () => {
    const run = await umlNode([
      '--timeout',
      '300',
      '--',
      'bash',
      '-c',
      'echo "fs=$(stat -f -c %T /sys/fs/cgroup) init=$(basename "$(readlink /proc/1/exe)") controllers=$(cat /sys/fs/cgroup/cgroup.controllers) kernel=$(uname -r)"; exit 7',
    ]);
    assert.equal(run.code, 7, `the command's exit status comes back\n${run.stderr}`);
    const line = /fs=(\S+) init=(\S+) controllers=(.*) kernel=(\S+)/.exec(run.stdout);
    assert.ok(line, `the command's output comes back: ${run.stdout}\n${run.stderr}`);
    assert.equal(line[1], 'cgroup2fs');
    assert.equal(line[2], 'systemd');
    for (const controller of ['cpu', 'io', 'memory', 'pids']) {
      assert.ok(line[3]?.split(' ').includes(controller), `controller ${controller} in ${line[3]}`);
    }
    const release = path.basename(readlinkSync(path.join(installed, 'modules')));
    assert.equal(line[4], release, 'the node runs the kernel install-uml.sh installed');
  });

  test('a kernel panic fails the run at once (exit 3, not the time bound\'s 124) with the kernel\'s reason', async () => {
    // The installed kernel, with its modules under a name that is not its release: the node's
    // init refuses them and exits, and the kernel panics ("Attempted to kill init").
    const dir = mkdtempSync(path.join(tmpdir(), 'tsbox-uml-panic-'));
    dirs.push(dir);
    mkdirSync(path.join(dir, 'm', '0.0'), { recursive: true });
    symlinkSync(path.join(installed, 'modules', 'kernel'), path.join(dir, 'm', '0.0', 'kernel'));
    symlinkSync(path.join('m', '0.0'), path.join(dir, 'modules'));
    symlinkSync(path.join(installed, 'linux.uml'), path.join(dir, 'linux.uml'));
    // The bound is far above the seconds a panic takes: hitting it would say 124.
    const run = await umlNode(['--timeout', '600', '--', 'true'], { TSBOX_UML_KERNEL_DIR: dir });
    assert.equal(run.code, 3, `exit status 3 for a panic\n${run.stderr}`);
    assert.match(run.stderr, /kernel panicked/);
    assert.match(run.stderr, /Kernel panic - not syncing: Attempted to kill init/, 'the kernel\'s own words');
    assert.match(run.stderr, /uml-node-init: .*is not named after the kernel's release/, 'what made init fail');
    assert.deepEqual(nodeProcesses(dir), [], 'nothing of the node is left running');
  });
});
