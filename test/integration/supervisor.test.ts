/**
 * The supervisor's isolating syscalls fail loudly: when making `/` private or mounting the
 * pod's /proc fails, Start fails naming the call and its errno, and nothing is left (no
 * process, no mount, no cgroup, no running record); the daemon serves on. The failures are
 * provoked by test/fixtures/deny-mount.c, a seccomp filter in front of the real supervisor.
 */
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { repoRoot } from '../support/containerd-clients.js';
import { GrpcStatus, expectCode } from '../support/grpc-client.js';
import { sandboxCgroupDirs, sandboxProcesses, uniqueNamespace } from '../support/host.js';
import { startSandboxerDaemon, tsboxSandboxer, tsboxShim } from '../support/tsbox-daemon.js';
import { withLog } from './fixtures.js';

/** The proc mounts of the host, as mountinfo lines: a pod's /proc must never appear here. */
function procMounts(): string[] {
  return readFileSync('/proc/self/mountinfo', 'utf8')
    .split('\n')
    .filter((line) => / - proc /.test(line));
}

const cases = [
  { mode: 'private', error: 'mount / MS_REC|MS_PRIVATE: Operation not permitted' },
  { mode: 'proc', error: 'mount proc at /proc: Operation not permitted' },
] as const;

describe('a supervisor whose mounts fail', () => {
  const scratch = mkdtempSync(path.join(os.tmpdir(), 'tsbox-deny-mount-'));
  const denyMount = path.join(scratch, 'deny-mount');

  before(() => {
    execFileSync(process.env['CC'] ?? 'cc', ['-O2', '-Wall', '-Wextra', '-Werror', '-o', denyMount, path.join(repoRoot, 'test', 'fixtures', 'deny-mount.c')]);
  });

  after(() => rmSync(scratch, { recursive: true, force: true }));

  for (const { mode, error } of cases) {
    test(`${mode}: Start fails with "${error}" and leaves nothing; the daemon serves on`, async () => {
      // The supervisor tsbox runs: the real one, behind the seccomp filter.
      const shim = path.join(scratch, `shim-deny-${mode}`);
      writeFileSync(shim, `#!/bin/sh\nexec ${denyMount} ${mode} ${tsboxShim} "$@"\n`, { mode: 0o755 });
      const daemon = await startSandboxerDaemon(tsboxSandboxer({ args: ['--shim-path', shim] }), { label: `tsbox-deny-${mode}-` });
      const ns = uniqueNamespace(`deny-${mode}`);
      try {
        await withLog(daemon, async () => {
          const client = daemon.client(ns);
          const id = `deny-${mode}`;
          daemon.track(ns, id);
          const mountsBefore = procMounts();
          await client.create({ sandboxId: id, sandbox: { sandboxId: id, runtime: { name: 'io.containerd.tsbox.v1' } } });
          const err = await expectCode(client.start({ sandboxId: id }, { timeoutMs: 10_000 }), GrpcStatus.FAILED_PRECONDITION);
          assert.ok(err.details.includes(error), `"${err.details}" should say "${error}"`);

          const left = sandboxProcesses(daemon.stateDir, ns, id);
          assert.deepEqual([...left.supervisors, ...left.sandbox], [], 'processes left by the failed Start');
          assert.deepEqual(procMounts(), mountsBefore, 'a proc mount appeared on the host');
          for (const cgroup of sandboxCgroupDirs(ns, id)) assert.equal(existsSync(cgroup), false, `${cgroup} left behind`);
          const status = await client.status({ sandboxId: id });
          assert.equal(status.state, 'SANDBOX_UNKNOWN', 'the sandbox should be just created again');
          assert.equal(status.pid, 0);

          await client.shutdown({ sandboxId: id }, { timeoutMs: 5000 });
          await expectCode(client.status({ sandboxId: id }), GrpcStatus.NOT_FOUND);
          assert.equal(existsSync(daemon.sandboxDir(ns, id)), false, 'the sandbox dir outlived Shutdown');
          // The daemon serves on: another sandbox is created and answered for.
          const next = `${id}-next`;
          daemon.track(ns, next);
          await client.create({ sandboxId: next, sandbox: { sandboxId: next, runtime: { name: 'io.containerd.tsbox.v1' } } });
          assert.equal((await client.status({ sandboxId: next })).state, 'SANDBOX_UNKNOWN');
          await client.shutdown({ sandboxId: next });
        });
      } finally {
        await daemon.teardown();
      }
    });
  }
});
