/**
 * What must hold for a sandbox after any crash and restart of tsbox (README "State, restarts
 * and recovery"; SPEC.md sections 3 and 5): it is either fully there, with a Status that
 * agrees with the host (its process exists exactly when Status says SANDBOX_READY, and is the
 * pid Status names), or fully gone (NOT_FOUND, no process, no directory, no cgroup). Exits
 * answer at once and the same every time. No sandbox process runs without a record.
 *
 * Also the requests the crash tests send: sandboxes that run a pause process, or a shell that
 * exits with a chosen code once the test creates a trigger file.
 */
import assert from 'node:assert/strict';
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import type {
  ControllerCreateRequest,
  ControllerWaitResponse,
  DeepPartial,
} from '../../src/gen/containerd/services/sandbox/v1/sandbox.js';
import type { Timestamp } from '../../src/gen/google/protobuf/timestamp.js';
import {
  cgroupPathsOf,
  existingCgroupDirs,
  processesInNamespaceCgroups,
  readPidFile,
  sandboxCgroupName,
  sandboxProcesses,
  supervisorsOfStateDir,
} from './host.js';
import { GrpcStatus, codeName, expectCode, isServiceError, timestampMs } from './grpc-client.js';
import { type TsboxClient, type TsboxDaemon, waitFor } from './tsbox-daemon.js';

/** Whether the state dir holds a record of (ns, id) that a restart would load: its record.json. */
export function hasDurableRecord(stateDir: string, ns: string, id: string): boolean {
  return existsSync(join(stateDir, 'sandboxes', ns, id, 'record.json'));
}

/** Type URL of an OCI runtime spec as containerd sends it (SPEC.md section 2). */
export const OCI_SPEC_TYPE = 'types.containerd.io/opencontainers/runtime-spec/1/Spec';

/** The exit status of a process killed by SIGKILL (128 + 9), what Stop(0) produces. */
export const KILLED = 137;

/** Create for a sandbox that runs tsbox's built-in pause process. */
export function pauseSandbox(id: string): DeepPartial<ControllerCreateRequest> {
  return { sandboxId: id, sandbox: { sandboxId: id, runtime: { name: 'io.containerd.tsbox.v1' } } };
}

/** Create for a sandbox whose process is `args` (an OCI spec in `sandbox.spec`). */
export function commandSandbox(id: string, args: readonly string[]): DeepPartial<ControllerCreateRequest> {
  const spec = { ociVersion: '1.1.0', process: { args, env: [], cwd: '/' } };
  return {
    sandboxId: id,
    sandbox: {
      sandboxId: id,
      runtime: { name: 'io.containerd.tsbox.v1' },
      spec: { typeUrl: OCI_SPEC_TYPE, value: Buffer.from(JSON.stringify(spec)) },
    },
  };
}

/**
 * A process that runs until `trigger` exists, then exits with `code`. The sandbox shares the
 * host's file system, so the test ends it by creating the file; the shell checks for it every
 * 50 ms (the sandbox's own loop: the test never sleeps).
 */
export function exitOnTrigger(trigger: string, code: number): string[] {
  return ['/bin/sh', '-c', `while [ ! -e "$1" ]; do sleep 0.05; done; exit ${code}`, 'sh', trigger];
}

/** Milliseconds since the epoch of a Timestamp, which must be set. */
export function ms(t: Timestamp | undefined, what: string): number {
  const value = timestampMs(t);
  assert.ok(value !== undefined && value > 0, `${what} must be set`);
  return value;
}

/** Awaits a call that must fail because the daemon died under it. */
export async function expectDaemonGone(call: Promise<unknown>, what: string): Promise<void> {
  try {
    await call;
  } catch (err) {
    assert.ok(isServiceError(err), `${what}: ${String(err)}`);
    // grpc-js reports a connection lost mid-call as UNAVAILABLE; a stream torn down before
    // its status as INTERNAL or UNKNOWN. Never an answer that claims success or NOT_FOUND.
    assert.ok(
      [GrpcStatus.UNAVAILABLE, GrpcStatus.INTERNAL, GrpcStatus.UNKNOWN].includes(err.code),
      `${what} failed with ${codeName(err.code)} (${err.details}); expected UNAVAILABLE`,
    );
    return;
  }
  assert.fail(`${what} succeeded although the daemon was killed during it`);
}

/** What a sandbox is after a restart, as far as both tsbox and the host tell. */
export type Observed =
  | { readonly kind: 'gone' }
  | { readonly kind: 'created' }
  | { readonly kind: 'running'; readonly pid: number; readonly createdAtMs: number }
  | { readonly kind: 'exited'; readonly status: number; readonly exitedAt: Timestamp };

function parseInfo(info: Record<string, string>): Record<string, unknown> {
  const raw = info['info'];
  assert.ok(raw !== undefined, 'verbose Status must carry info["info"]');
  const parsed: unknown = JSON.parse(raw);
  assert.ok(typeof parsed === 'object' && parsed !== null && !Array.isArray(parsed), 'info["info"] is a JSON object');
  return parsed as Record<string, unknown>;
}

/** Waits (bounded) until nothing of the sandbox runs on the host. */
async function expectNoProcess(d: TsboxDaemon, ns: string, id: string, why: string): Promise<void> {
  await waitFor(
    () => {
      const found = sandboxProcesses(d.stateDir, ns, id);
      return found.supervisors.length === 0 && found.sandbox.length === 0;
    },
    {
      what: `no process of ${ns}/${id} (${why})`,
      timeoutMs: 10_000,
      describe: () => `still running: ${JSON.stringify(sandboxProcesses(d.stateDir, ns, id))}\n${d.logTail(30)}`,
    },
  );
}

/** Wait must block: a short deadline passes and nothing else happens. */
async function expectWaitBlocks(client: TsboxClient, id: string, why: string): Promise<void> {
  await expectCode(client.wait({ sandboxId: id }, { timeoutMs: 300 }), GrpcStatus.DEADLINE_EXCEEDED).catch(
    (err: unknown) => {
      throw new Error(`Wait of a sandbox that is ${why} must block: ${(err as Error).message}`);
    },
  );
}

/**
 * Asks tsbox about (ns, id) and checks the answer against the host; returns what it is.
 * Every kind is checked for consistency: see the file comment.
 */
export async function observeSandbox(d: TsboxDaemon, ns: string, id: string): Promise<Observed> {
  const client = d.client(ns);
  const dir = d.sandboxDir(ns, id);
  let status;
  try {
    status = await client.status({ sandboxId: id, verbose: true }, { timeoutMs: 10_000 });
  } catch (err) {
    if (!isServiceError(err) || err.code !== GrpcStatus.NOT_FOUND) throw err;
    await expectCode(client.wait({ sandboxId: id }, { timeoutMs: 10_000 }), GrpcStatus.NOT_FOUND);
    await expectCode(client.start({ sandboxId: id }, { timeoutMs: 10_000 }), GrpcStatus.NOT_FOUND);
    assert.equal(existsSync(dir), false, `${dir} must not exist for a sandbox tsbox does not know`);
    await expectNoProcess(d, ns, id, 'NOT_FOUND');
    assert.deepEqual(existingCgroupDirs(ns, id), [], 'no cgroup of a sandbox tsbox does not know');
    return { kind: 'gone' };
  }
  const info = parseInfo(status.info);
  assert.ok(hasDurableRecord(d.stateDir, ns, id), `a sandbox tsbox serves has its record: ${dir}/record.json`);
  switch (status.state) {
    case 'SANDBOX_READY': {
      const { pid } = status;
      assert.ok(pid > 0, `READY with pid ${pid}`);
      assert.equal(info['pid'], pid, 'verbose info names the same pid');
      assert.equal(timestampMs(status.exitedAt), undefined, 'no exited_at while READY');
      const createdAtMs = ms(status.createdAt, 'created_at of a READY sandbox');
      const found = sandboxProcesses(d.stateDir, ns, id);
      assert.ok(found.sandbox.includes(pid), `READY pid ${pid} is a live process of the sandbox: ${JSON.stringify(found)}`);
      assert.ok(
        cgroupPathsOf(pid).some((p) => p.endsWith(`/${sandboxCgroupName(ns, id)}`)),
        `pid ${pid} is in the sandbox's cgroup: ${cgroupPathsOf(pid).join(', ')}`,
      );
      assert.equal(readPidFile(dir)?.pid, pid, 'the supervisor recorded the same sandbox pid');
      await expectWaitBlocks(client, id, 'READY');
      return { kind: 'running', pid, createdAtMs };
    }
    case 'SANDBOX_NOTREADY': {
      assert.equal(status.pid, 0, 'pid 0 once exited');
      const exitedAtMs = ms(status.exitedAt, 'exited_at of a NOTREADY sandbox');
      await expectNoProcess(d, ns, id, 'NOTREADY');
      const first = await client.wait({ sandboxId: id }, { timeoutMs: 10_000 });
      for (let i = 0; i < 3; i++) {
        assert.deepEqual(await client.wait({ sandboxId: id }, { timeoutMs: 10_000 }), first, 'Wait answers the same every time');
      }
      assert.equal(ms(first.exitedAt, 'Wait exited_at'), exitedAtMs, 'Wait and Status agree on exited_at');
      assert.equal(info['exitStatus'], first.exitStatus, 'verbose info names the same exit status');
      return { kind: 'exited', status: first.exitStatus, exitedAt: first.exitedAt as Timestamp };
    }
    case 'SANDBOX_UNKNOWN': {
      assert.equal(status.pid, 0, 'pid 0 before Start');
      assert.equal(status.createdAt, undefined, 'no created_at before Start');
      await expectNoProcess(d, ns, id, 'created, never started');
      await expectWaitBlocks(client, id, 'created');
      return { kind: 'created' };
    }
    default:
      assert.fail(`unexpected state ${status.state}`);
  }
}

/**
 * No process runs without a record: every live supervisor of the state dir and every process
 * in a cgroup of `namespaces` belongs to a sandbox tsbox reports as SANDBOX_READY.
 */
export async function assertNoUnrecordedProcesses(d: TsboxDaemon, namespaces: readonly string[]): Promise<void> {
  const owners = new Map<string, { ns: string; id: string }>();
  for (const { pid, dir } of supervisorsOfStateDir(d.stateDir)) {
    const [ns, id] = dir.split('/').slice(-2) as [string, string];
    owners.set(`${ns}/${id}`, { ns, id });
    assert.ok(hasDurableRecord(d.stateDir, ns, id), `supervisor ${pid} runs for ${dir}, which has no durable record`);
  }
  for (const ns of namespaces) {
    for (const pid of processesInNamespaceCgroups(ns)) {
      const path = cgroupPathsOf(pid).find((p) => p.startsWith(`/tsbox/${ns}@`)) ?? '';
      const id = path.slice(`/tsbox/${ns}@`.length).split('/')[0] ?? '';
      owners.set(`${ns}/${id}`, { ns, id });
    }
  }
  for (const { ns, id } of owners.values()) {
    let state: string;
    try {
      state = (await d.client(ns).status({ sandboxId: id }, { timeoutMs: 10_000 })).state;
    } catch (err) {
      state = isServiceError(err) ? codeName(err.code) : String(err);
    }
    if (state !== 'SANDBOX_READY') {
      // It may be on its way out (an exit being recorded): give it a bounded moment.
      await waitFor(
        () => {
          const found = sandboxProcesses(d.stateDir, ns, id);
          return found.supervisors.length === 0 && found.sandbox.length === 0;
        },
        {
          what: `processes of ${ns}/${id}, which tsbox reports as ${state}, to be gone`,
          timeoutMs: 10_000,
          describe: () => JSON.stringify(sandboxProcesses(d.stateDir, ns, id)),
        },
      );
    }
  }
}

/** Checks that every waiter got the same exit. */
export function assertSameExit(results: readonly ControllerWaitResponse[]): void {
  for (const r of results) assert.deepEqual(r, results[0], 'every Wait gets the same answer');
}

/** The JSON log lines of the daemon (pino), parsed; other lines are skipped. */
export function logRecords(d: TsboxDaemon): Record<string, unknown>[] {
  const out: Record<string, unknown>[] = [];
  for (const line of d.logText().split('\n')) {
    if (!line.startsWith('{')) continue;
    try {
      out.push(JSON.parse(line) as Record<string, unknown>);
    } catch {
      // a line torn by SIGKILL
    }
  }
  return out;
}

/** The record file of a sandbox, parsed. */
export function readRecord(d: TsboxDaemon, ns: string, id: string): Record<string, unknown> {
  return JSON.parse(readFileSync(`${d.sandboxDir(ns, id)}/record.json`, 'utf8')) as Record<string, unknown>;
}
