/**
 * Crashes of the real daemon with real sandbox processes (README "State, restarts and
 * recovery"; SPEC.md sections 3 and 5): tsbox is SIGKILLed at every named crash point of its
 * operations, and from outside while sandboxes change; a supervisor is SIGKILLed; records are
 * tampered with or corrupted while tsbox is stopped. After each restart every sandbox must be
 * fully there or fully gone, no process may run without a record, and every exit status must
 * be the real one, the same on every Wait.
 */
import { after, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, readFileSync, readdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { CRASH_POINTS } from '../../src/controller/controller.js';
import {
  existingCgroupDirs,
  procInfo,
  readExitFile,
  readPidFile,
  sandboxProcesses,
  uniqueNamespace,
} from '../support/host.js';
import {
  KILLED,
  type Observed,
  assertNoUnrecordedProcesses,
  assertSameExit,
  commandSandbox,
  exitOnTrigger,
  expectDaemonGone,
  logRecords,
  ms,
  observeSandbox,
  pauseSandbox,
  readRecord,
} from '../support/crash-invariants.js';
import { ignoreError } from '../../src/base/errors.js';
import { GrpcStatus, expectCode } from '../support/grpc-client.js';
import { type TsboxClient, type TsboxDaemon, createTsbox, processAlive, waitFor } from '../support/tsbox-daemon.js';
import { within } from '../support/processes.js';

/** Every daemon a test made, torn down in `after` whatever happened. */
const daemons: TsboxDaemon[] = [];
/** Processes the tests started themselves (stand-ins for a reused pid). */
const ownChildren: ChildProcess[] = [];

after(async () => {
  for (const child of ownChildren) {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
  }
  for (const d of daemons) await d.teardown();
});

async function newDaemon(): Promise<TsboxDaemon> {
  const d = await createTsbox('tsbox-crash', { closeClientsOnExit: true });
  daemons.push(d);
  return d;
}

/** Runs a test body; on failure the daemon's log joins the message. */
async function withLog(d: TsboxDaemon | undefined, body: () => Promise<void>): Promise<void> {
  try {
    await body();
  } catch (err) {
    if (err instanceof Error && d !== undefined) err.message = `${err.message}\n${d.logTail(40)}`;
    throw err;
  }
}


/** Starts a sandbox and remembers its pid for the teardown. */
async function createAndStart(
  d: TsboxDaemon,
  client: TsboxClient,
  request: ReturnType<typeof pauseSandbox>,
): Promise<number> {
  const id = request.sandboxId ?? '';
  await client.create(request, { timeoutMs: 20_000 });
  const started = await client.start({ sandboxId: id }, { timeoutMs: 20_000 });
  assert.ok(started.pid > 0, `Start pid ${started.pid}`);
  d.track(client.namespace, undefined, started.pid);
  return started.pid;
}

/** Stop(0), then every Wait says 137, the same every time. */
async function stopAndExpectKilled(client: TsboxClient, id: string): Promise<void> {
  await client.stop({ sandboxId: id, timeoutSecs: 0 }, { timeoutMs: 20_000 });
  const waits = await Promise.all([0, 1, 2].map(() => client.wait({ sandboxId: id }, { timeoutMs: 10_000 })));
  assertSameExit(waits);
  assert.equal(waits[0]?.exitStatus, KILLED, 'Stop(0) ends the sandbox with 128 + SIGKILL');
}

/** Shutdown, then the sandbox is gone from tsbox and from the host. */
async function shutdownAndExpectGone(d: TsboxDaemon, ns: string, id: string): Promise<void> {
  await d.client(ns).shutdown({ sandboxId: id }, { timeoutMs: 20_000 });
  const seen = await observeSandbox(d, ns, id);
  assert.equal(seen.kind, 'gone', `after Shutdown: ${JSON.stringify(seen)}`);
}

/** A process of the test's own that a tampered record names: it must survive untouched. */
function startStranger(): { pid: number; wrongStart: string; assertUntouched(): void } {
  const child = spawn('sleep', ['600'], { stdio: 'ignore' });
  child.on('error', () => undefined);
  ownChildren.push(child);
  const pid = child.pid;
  assert.ok(pid !== undefined, 'sleep started');
  const startTime = procInfo(pid)?.startTime;
  assert.ok(startTime !== undefined);
  return {
    pid,
    wrongStart: String(Number(startTime) + 1),
    assertUntouched() {
      assert.ok(processAlive(pid), `pid ${pid}, which is not a sandbox, was not killed`);
      assert.equal(procInfo(pid)?.startTime, startTime, `pid ${pid} is still the same process`);
    },
  };
}

/**
 * What a crash at `point` must leave after the restart. Points are matched by their
 * operation and position (CRASH_POINTS may grow), the rule of each is in its comment.
 */
function expectedAfter(point: string, seen: Observed): void {
  const bad = `after a crash at ${point}: ${JSON.stringify(seen)}`;
  const [phase, where = ''] = point.split(':');
  const killed = seen.kind === 'exited' && seen.status === KILLED;
  switch (phase) {
    case 'create':
      // The record is durable: the sandbox is there, created.
      assert.equal(seen.kind, 'created', bad);
      break;
    case 'start':
      // Once the running record is durable the sandbox runs, recovered from its record;
      // before, the Start never answered and is undone: the sandbox is created again.
      assert.equal(seen.kind, where === 'after-record' ? 'running' : 'created', bad);
      break;
    case 'stop':
      // Either the SIGKILL landed (the supervisor recorded 137) or the sandbox still runs
      // and a repeated Stop ends it.
      assert.ok(seen.kind === 'running' || killed, bad);
      break;
    case 'exit':
      // The supervisor recorded the real status: tsbox must report it, saved or not.
      assert.ok(seen.kind === 'exited' && seen.status === 3, bad);
      break;
    case 'shutdown':
      if (where === 'after-remove') assert.equal(seen.kind, 'gone', bad);
      else if (where === 'before-remove') assert.ok(killed, bad);
      else assert.ok(seen.kind === 'running' || killed || seen.kind === 'gone', bad);
      break;
    default:
      assert.fail(`no rule for crash point ${point}`);
  }
}

describe('kill -9 at each crash point, then a restart', () => {
  for (const point of CRASH_POINTS) {
    test(point, async () => {
      const d = await newDaemon();
      const ns = uniqueNamespace('crash');
      const id = 'sb-1';
      d.track(ns);
      const dir = d.sandboxDir(ns, id);
      const trigger = path.join(d.dir, 'exit-now');
      const [phase] = point.split(':') as [string];
      await withLog(d, async () => {
        await d.start({ crashAt: point });
        const client = d.client(ns);
        const request = phase === 'exit' ? commandSandbox(id, exitOnTrigger(trigger, 3)) : pauseSandbox(id);

        if (phase === 'create') {
          await expectDaemonGone(client.create(request, { timeoutMs: 20_000 }), 'Create');
        } else {
          await client.create(request, { timeoutMs: 20_000 });
          if (phase === 'start') {
            await expectDaemonGone(client.start({ sandboxId: id }, { timeoutMs: 20_000 }), 'Start');
          } else {
            const started = await client.start({ sandboxId: id }, { timeoutMs: 20_000 });
            d.track(ns, undefined, started.pid);
            if (phase === 'exit') {
              const held = client.wait({ sandboxId: id });
              // A round trip on the same channel: the Wait is in flight before the exit.
              assert.equal((await client.status({ sandboxId: id }, { timeoutMs: 10_000 })).state, 'SANDBOX_READY');
              writeFileSync(trigger, '');
              await within(expectDaemonGone(held, 'the held Wait'), 20_000, 'the held Wait to fail');
            } else if (phase === 'stop') {
              await expectDaemonGone(client.stop({ sandboxId: id, timeoutSecs: 0 }, { timeoutMs: 20_000 }), 'Stop(0)');
            } else {
              await expectDaemonGone(client.shutdown({ sandboxId: id }, { timeoutMs: 20_000 }), 'Shutdown');
            }
          }
        }
        const died = await within(d.exited(), 20_000, `tsbox to die at ${point}`);
        assert.equal(died.signal, 'SIGKILL', `tsbox died at ${point} by SIGKILL (code ${died.code})`);
        // Whatever the supervisor started, remember it (for the teardown and the checks).
        const pids = readPidFile(dir);
        if (pids !== undefined) {
          d.track(ns, undefined, pids.shimPid);
          d.track(ns, undefined, pids.pid);
        }
        const exitFile = readExitFile(dir);

        await d.start();
        const seen = await observeSandbox(d, ns, id);
        await assertNoUnrecordedProcesses(d, [ns]);
        expectedAfter(point, seen);
        if (seen.kind === 'created' && pids !== undefined) {
          // The process of the Start that never answered was killed, not adopted.
          assert.equal(processAlive(pids.pid), false, `sandbox pid ${pids.pid} of the undone Start is gone`);
          assert.equal(processAlive(pids.shimPid), false, `supervisor ${pids.shimPid} of the undone Start is gone`);
        }
        if (seen.kind === 'running' && pids !== undefined) assert.equal(seen.pid, pids.pid, 'the recorded process');
        if (seen.kind === 'exited' && phase === 'exit') {
          // The exit time is the supervisor's, from before the restart.
          assert.ok(exitFile !== undefined, 'the supervisor wrote the exit before the restart');
          assert.deepEqual(seen.exitedAt, { seconds: exitFile.seconds, nanos: exitFile.nanos });
        }

        // The sandbox can be completed from here.
        switch (seen.kind) {
          case 'created': {
            const pid = (await client.start({ sandboxId: id }, { timeoutMs: 20_000 })).pid;
            d.track(ns, undefined, pid);
            const running = await observeSandbox(d, ns, id);
            assert.ok(running.kind === 'running' && running.pid === pid, `after a new Start: ${JSON.stringify(running)}`);
            await stopAndExpectKilled(client, id);
            break;
          }
          case 'running':
            await stopAndExpectKilled(client, id);
            break;
          case 'exited': {
            // The exit is durable: the same answer after one more restart.
            await d.stop();
            await d.start();
            const again = await observeSandbox(d, ns, id);
            assert.deepEqual(again, seen, 'the same exit after another restart');
            break;
          }
          case 'gone':
            break;
        }
        const final = await observeSandbox(d, ns, id);
        if (final.kind === 'exited') assert.equal(final.status, phase === 'exit' ? 3 : KILLED, 'the real exit status');
        await shutdownAndExpectGone(d, ns, id);
        await assertNoUnrecordedProcesses(d, [ns]);
      });
    });
  }
});

describe('changes while tsbox is away', () => {
  test('exits while tsbox is down keep their real status and time; running sandboxes are watched again', async () => {
    const d = await newDaemon();
    const ns = uniqueNamespace('away');
    d.track(ns);
    await withLog(d, async () => {
      await d.start();
      const client = d.client(ns);
      const trigger42 = path.join(d.dir, 'exit-42');
      const trigger5 = path.join(d.dir, 'exit-5');
      const killedPid = await createAndStart(d, client, pauseSandbox('killed'));
      await createAndStart(d, client, commandSandbox('exits-42', exitOnTrigger(trigger42, 42)));
      const runningPid = await createAndStart(d, client, pauseSandbox('runs-on'));
      const laterPid = await createAndStart(d, client, commandSandbox('exits-5-later', exitOnTrigger(trigger5, 5)));

      const downAt = Date.now();
      const died = await d.kill9();
      assert.equal(died.signal, 'SIGKILL');
      // While tsbox is down: one sandbox is SIGKILLed from outside, one exits with 42.
      process.kill(killedPid, 'SIGKILL');
      writeFileSync(trigger42, '');
      for (const id of ['killed', 'exits-42']) {
        await waitFor(() => readExitFile(d.sandboxDir(ns, id)) !== undefined, {
          what: `the supervisor of ${id} to record its exit`,
        });
      }
      assert.ok(processAlive(runningPid) && processAlive(laterPid), 'the other sandboxes run on without tsbox');
      const exitFiles = new Map(['killed', 'exits-42'].map((id) => [id, readExitFile(d.sandboxDir(ns, id))]));

      const restartAt = Date.now();
      await d.start();
      for (const [id, status] of [
        ['killed', KILLED],
        ['exits-42', 42],
      ] as const) {
        const seen = await observeSandbox(d, ns, id);
        assert.ok(seen.kind === 'exited', `${id}: ${JSON.stringify(seen)}`);
        assert.equal(seen.status, status, `${id} exit status`);
        const exitedAtMs = ms(seen.exitedAt, `${id} exited_at`);
        assert.ok(exitedAtMs >= downAt && exitedAtMs <= restartAt, `${id} exited while tsbox was down`);
        const file = exitFiles.get(id);
        assert.deepEqual(seen.exitedAt, { seconds: file?.seconds, nanos: file?.nanos }, 'the time the supervisor recorded');
      }
      const runs = await observeSandbox(d, ns, 'runs-on');
      assert.deepEqual(runs.kind === 'running' ? runs.pid : runs, runningPid, 'still running, same pid');
      const later = await observeSandbox(d, ns, 'exits-5-later');
      assert.deepEqual(later.kind === 'running' ? later.pid : later, laterPid, 'still running, same pid');
      await assertNoUnrecordedProcesses(d, [ns]);

      // Watched again: an exit of its own is seen, and Stop(0) works.
      const held = client.wait({ sandboxId: 'exits-5-later' });
      writeFileSync(trigger5, '');
      const heldExit = await within(held, 20_000, 'the Wait of a recovered sandbox that exits by itself');
      assert.equal(heldExit.exitStatus, 5);
      await stopAndExpectKilled(client, 'runs-on');
      for (const id of ['killed', 'exits-42', 'runs-on', 'exits-5-later']) await shutdownAndExpectGone(d, ns, id);
    });
  });

  test('a killed supervisor ends its sandbox, as a killed runc shim ends its pod: the sandbox process is killed and its exit reported as 255 (unknown)', async () => {
    const d = await newDaemon();
    const ns = uniqueNamespace('orphan');
    d.track(ns);
    await withLog(d, async () => {
      await d.start();
      const client = d.client(ns);
      const startOrphan = async (id: string): Promise<{ id: string; pid: number; shimPid: number }> => {
        const pid = await createAndStart(d, client, pauseSandbox(id));
        const pids = readPidFile(d.sandboxDir(ns, id));
        assert.ok(pids !== undefined && pids.pid === pid, `pid file of ${id}: ${JSON.stringify(pids)}`);
        assert.equal(procInfo(pid)?.ppid, pids.shimPid, 'the supervisor is the parent of the sandbox process');
        d.track(ns, undefined, pids.shimPid);
        return { id, pid, shimPid: pids.shimPid };
      };
      const killSupervisor = async (o: { shimPid: number }): Promise<void> => {
        process.kill(o.shimPid, 'SIGKILL');
        await waitFor(() => !processAlive(o.shimPid), { what: `supervisor ${o.shimPid} to die` });
      };
      /** Gone with its supervisor: a Wait answers 255, Status says not ready, its process is gone. */
      const expectUnknownExit = async (orphans: readonly { id: string; pid: number }[]): Promise<void> => {
        const exits = await within(Promise.all(orphans.map((o) => client.wait({ sandboxId: o.id }))), 30_000, 'the Waits of sandboxes whose supervisor was killed');
        for (const [i, o] of orphans.entries()) {
          assert.equal(exits[i]?.exitStatus, 255, `${o.id}: without its supervisor the status is unknown`);
          const seen = await observeSandbox(d, ns, o.id);
          assert.ok(seen.kind === 'exited' && seen.status === 255, JSON.stringify(seen));
          assert.equal((await client.status({ sandboxId: o.id }, { timeoutMs: 10_000 })).state, 'SANDBOX_NOTREADY');
          await waitFor(() => !processAlive(o.pid), { what: `${o.id}: its sandbox process ${o.pid} ended with its supervisor` });
        }
      };

      // The supervisor tsbox started is killed while tsbox runs.
      const whileUp = await startOrphan('shim-killed-while-up');
      await killSupervisor(whileUp);
      await expectUnknownExit([whileUp]);

      // One supervisor is killed while tsbox is down, one after tsbox recovered its sandbox.
      const whileDown = await startOrphan('shim-killed-while-down');
      const afterRestart = await startOrphan('shim-killed-after-restart');
      await d.kill9();
      await killSupervisor(whileDown);
      await d.start();
      await killSupervisor(afterRestart);
      await expectUnknownExit([whileDown, afterRestart]);

      await d.stop();
      await d.start();
      for (const o of [whileUp, whileDown, afterRestart]) {
        const seen = await observeSandbox(d, ns, o.id);
        assert.ok(seen.kind === 'exited' && seen.status === 255, `${o.id} after a restart: ${JSON.stringify(seen)}`);
        await shutdownAndExpectGone(d, ns, o.id);
      }
    });
  });

  test('a recorded sandbox pid that names another live process is neither reported nor killed', async () => {
    const d = await newDaemon();
    const ns = uniqueNamespace('reuse');
    d.track(ns);
    await withLog(d, async () => {
      await d.start();
      const client = d.client(ns);
      await createAndStart(d, client, pauseSandbox('sb'));
      const stranger = startStranger();

      await d.stop();
      // The record names the stranger as the sandbox process, with a start time that is not
      // the stranger's: what a pid reused after the sandbox ended looks like. The supervisor
      // still runs.
      const record = readRecord(d, ns, 'sb');
      const handle = record['backend'] as Record<string, unknown>;
      writeFileSync(
        path.join(d.sandboxDir(ns, 'sb'), 'record.json'),
        JSON.stringify({
          ...record,
          pid: stranger.pid,
          backend: { ...handle, pid: stranger.pid, pidStart: stranger.wrongStart },
        }),
      );
      await d.start();

      const status = await client.status({ sandboxId: 'sb', verbose: true }, { timeoutMs: 10_000 });
      // Stop and Shutdown may not be able to finish (what the sandbox is cannot be trusted);
      // they must not touch the stranger either way.
      await client.stop({ sandboxId: 'sb', timeoutSecs: 0 }, { timeoutMs: 5_000 }).catch(ignoreError('either answer will do'));
      await client.shutdown({ sandboxId: 'sb' }, { timeoutMs: 5_000 }).catch(ignoreError('either answer will do'));
      stranger.assertUntouched();
      assert.notEqual(
        status.pid,
        stranger.pid,
        `Status must not report pid ${stranger.pid}, which is not the sandbox: ${JSON.stringify(status)}`,
      );
      const info = JSON.parse(status.info['info'] ?? '{}') as { pid?: unknown };
      assert.notEqual(info.pid, stranger.pid, 'nor verbose info');
    });
  });

  test('a supervisor and sandbox that died while tsbox was down, their pids reused: 255, strangers untouched', async () => {
    const d = await newDaemon();
    const ns = uniqueNamespace('reuse2');
    d.track(ns);
    await withLog(d, async () => {
      await d.start();
      const client = d.client(ns);
      await createAndStart(d, client, pauseSandbox('sb'));
      const pids = readPidFile(d.sandboxDir(ns, 'sb'));
      assert.ok(pids !== undefined);
      await d.stop();
      // Supervisor first, so that no exit is recorded; then the sandbox process.
      for (const pid of [pids.shimPid, pids.pid]) {
        process.kill(pid, 'SIGKILL');
        await waitFor(() => !processAlive(pid), { what: `pid ${pid} to die` });
      }
      assert.equal(readExitFile(d.sandboxDir(ns, 'sb')), undefined, 'no exit was recorded');
      const shimStranger = startStranger();
      const stranger = startStranger();
      const record = readRecord(d, ns, 'sb');
      writeFileSync(
        path.join(d.sandboxDir(ns, 'sb'), 'record.json'),
        JSON.stringify({
          ...record,
          pid: stranger.pid,
          backend: {
            shimPid: shimStranger.pid,
            shimStart: shimStranger.wrongStart,
            pid: stranger.pid,
            pidStart: stranger.wrongStart,
          },
        }),
      );
      await d.start();

      const seen = await observeSandbox(d, ns, 'sb');
      assert.ok(seen.kind === 'exited' && seen.status === 255, `the exit cannot be known: ${JSON.stringify(seen)}`);
      await client.stop({ sandboxId: 'sb', timeoutSecs: 0 }, { timeoutMs: 10_000 });
      await shutdownAndExpectGone(d, ns, 'sb');
      shimStranger.assertUntouched();
      stranger.assertUntouched();
    });
  });

  test('corrupt records are quarantined and logged; the valid sibling is served', async () => {
    const d = await newDaemon();
    const ns = uniqueNamespace('corrupt');
    d.track(ns);
    await withLog(d, async () => {
      await d.start();
      const client = d.client(ns);
      const goodPid = await createAndStart(d, client, pauseSandbox('good'));
      const truncatedPid = await createAndStart(d, client, pauseSandbox('truncated'));
      await client.create(pauseSandbox('garbage'), { timeoutMs: 10_000 });
      const v2Pid = await createAndStart(d, client, pauseSandbox('version-2'));
      await d.stop();

      const recordPath = (id: string): string => path.join(d.sandboxDir(ns, id), 'record.json');
      const truncatedText = readFileSync(recordPath('truncated'), 'utf8');
      const written = new Map<string, string>([
        ['truncated', truncatedText.slice(0, Math.floor(truncatedText.length / 2))],
        ['garbage', '\u0000\u00ffnot a record at all\u0001'],
        ['version-2', JSON.stringify({ ...readRecord(d, ns, 'version-2'), version: 2 })],
      ]);
      for (const [id, text] of written) writeFileSync(recordPath(id), text);
      const pidsOf = new Map([
        ['truncated', readPidFile(d.sandboxDir(ns, 'truncated'))],
        ['version-2', readPidFile(d.sandboxDir(ns, 'version-2'))],
      ]);
      for (const pids of pidsOf.values()) if (pids !== undefined) d.track(ns, undefined, pids.shimPid);

      await d.start();
      const good = await observeSandbox(d, ns, 'good');
      assert.deepEqual(good.kind === 'running' ? good.pid : good, goodPid, 'the valid sibling is served as before');

      const quarantine = path.join(d.stateDir, 'quarantine');
      const quarantined = existsSync(quarantine) ? readdirSync(quarantine) : [];
      const logLines = logRecords(d).filter((r) => typeof r['msg'] === 'string' && /quarantin/.test(r['msg']));
      for (const [id, text] of written) {
        await expectCode(client.status({ sandboxId: id }, { timeoutMs: 10_000 }), GrpcStatus.NOT_FOUND);
        const seen = await observeSandbox(d, ns, id);
        assert.equal(seen.kind, 'gone', `${id}: ${JSON.stringify(seen)}`);
        const file = quarantined.find((name) => name.startsWith(`${ns}@${id}.`));
        assert.ok(file !== undefined, `${id}'s record is in ${quarantine}: ${quarantined.join(', ')}`);
        assert.equal(readFileSync(path.join(quarantine, file), 'utf8'), text, 'the record is kept as it was');
        const line = logLines.find((r) => r['file'] === recordPath(id));
        assert.ok(line !== undefined, `a log line names ${recordPath(id)}`);
        assert.ok(typeof line['reason'] === 'string' && line['reason'] !== '', `and the reason: ${JSON.stringify(line)}`);
      }
      assert.match(String(logLines.find((r) => r['file'] === recordPath('truncated'))?.['reason']), /JSON/);
      assert.match(String(logLines.find((r) => r['file'] === recordPath('version-2'))?.['reason']), /version/);
      for (const [id, pid] of [
        ['truncated', truncatedPid],
        ['version-2', v2Pid],
      ] as const) {
        assert.equal(processAlive(pid), false, `the process of quarantined ${id} does not run on without a record`);
        assert.deepEqual(sandboxProcesses(d.stateDir, ns, id), { supervisors: [], sandbox: [] });
        assert.deepEqual(existingCgroupDirs(ns, id), [], `no cgroup left for quarantined ${id}`);
      }
      await assertNoUnrecordedProcesses(d, [ns]);
      await stopAndExpectKilled(client, 'good');
      await shutdownAndExpectGone(d, ns, 'good');
    });
  });
});
