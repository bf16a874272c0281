// The task records' schema and version (src/tasks/task-record.ts): what this build writes reads
// back; what earlier builds wrote (no version; earlier still, no runc root, no sandbox) reads as
// version 1; a record of a newer version, not JSON, not of the schema, or in another's
// directory is refused with a reason that says which.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import {
  TASK_RECORD_VERSION,
  execDirName,
  readExecRecord,
  readTaskRecord,
  taskDirName,
} from '../../src/tasks/task-record.js';
import { FORMER_EXEC_JSON, FORMER_TASK_JSON, formerExecJson, formerTaskJson } from '../support/task-records.js';

const POD = '9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b';
const CONTAINER = '4f1c0a6e2b9d8e7f6a5b4c3d2e1f0a9b8c7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f';
const EXEC = '0b6f1a2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8';
const DIR = taskDirName('k8s.io', CONTAINER);

function reason(read: { ok: boolean; reason?: string }): string {
  assert.equal(read.ok, false, 'refused');
  return read.reason ?? '';
}

describe('task.json', () => {
  test("the earlier build's exact format (no version) reads as version 1, every field kept", () => {
    const read = readTaskRecord(FORMER_TASK_JSON, DIR);
    assert.ok(read.ok, read.ok ? '' : read.reason);
    assert.deepEqual(read.record, {
      version: 1,
      namespace: 'k8s.io',
      id: CONTAINER,
      bundle: `/run/containerd/io.containerd.runtime.v2.task/k8s.io/${CONTAINER}`,
      stdin: '',
      stdout: `/run/containerd/io.containerd.grpc.v1.cri/containers/${CONTAINER}/io/2211839514/${CONTAINER}-stdout`,
      stderr: `/run/containerd/io.containerd.grpc.v1.cri/containers/${CONTAINER}/io/2211839514/${CONTAINER}-stderr`,
      terminal: false,
      systemdCgroup: false,
      runcPath: 'runc',
      runcRoot: '/run/containerd/tsbox/runc/k8s.io',
      sandboxId: POD,
    });
  });

  test('the fixture is what the earlier build wrote: JSON.stringify of its record', () => {
    const fields = JSON.parse(FORMER_TASK_JSON) as Parameters<typeof formerTaskJson>[0];
    assert.equal(formerTaskJson(fields), FORMER_TASK_JSON);
  });

  test('earlier formats: a tsbox that kept one runc root (no runcRoot), and one before tasks named their sandbox', () => {
    const fields = { namespace: 'default', id: 'c1', bundle: '/b/c1', stdin: '', stdout: '/f/out', stderr: '', terminal: true, systemdCgroup: true, runcPath: '/usr/sbin/runc' };
    const read = readTaskRecord(formerTaskJson(fields), taskDirName('default', 'c1'));
    assert.ok(read.ok, read.ok ? '' : read.reason);
    assert.equal(read.record.version, 1);
    assert.equal(read.record.runcRoot, undefined, 'recovery fills it in from where the record was found');
    assert.equal(read.record.sandboxId, undefined);
    assert.equal(read.record.terminal, true);
  });

  test("this build's record (with its version) reads back as written", () => {
    const record = { ...JSON.parse(FORMER_TASK_JSON), version: TASK_RECORD_VERSION } as Record<string, unknown>;
    const read = readTaskRecord(JSON.stringify(record), DIR);
    assert.ok(read.ok, read.ok ? '' : read.reason);
    assert.deepEqual(read.record, record);
  });

  test('a newer version is refused, naming both versions', () => {
    const text = JSON.stringify({ ...JSON.parse(FORMER_TASK_JSON), version: 2 });
    assert.match(reason(readTaskRecord(text, DIR)), /version 2 is newer than this build reads \(1\)/);
    // Newer even if its fields would do: what they mean may have changed.
  });

  test('not JSON, not an object, fields missing or of the wrong type, an unknown version: refused with the reason', () => {
    assert.match(reason(readTaskRecord(FORMER_TASK_JSON.slice(0, 40), DIR)), /not JSON/);
    assert.match(reason(readTaskRecord('[1,2]', DIR)), /not a JSON object/);
    assert.match(reason(readTaskRecord('null', DIR)), /not a JSON object/);
    const { bundle: _bundle, ...noBundle } = JSON.parse(FORMER_TASK_JSON) as Record<string, unknown>;
    assert.match(reason(readTaskRecord(JSON.stringify(noBundle), DIR)), /not a version 1 record.*bundle/s);
    assert.match(reason(readTaskRecord(JSON.stringify({ ...JSON.parse(FORMER_TASK_JSON), terminal: 'no' }), DIR)), /terminal/);
    assert.match(reason(readTaskRecord(JSON.stringify({ ...JSON.parse(FORMER_TASK_JSON), version: 0 }), DIR)), /version/);
    assert.match(reason(readTaskRecord(JSON.stringify({ ...JSON.parse(FORMER_TASK_JSON), version: '1' }), DIR)), /version/);
  });

  test("a record in another task's directory is refused (its directory is the hash of its namespace and id)", () => {
    assert.match(reason(readTaskRecord(FORMER_TASK_JSON, taskDirName('k8s.io', 'other'))), /names task k8s\.io\/4f1c.*whose directory is not/);
    assert.match(reason(readTaskRecord(FORMER_TASK_JSON, taskDirName('default', CONTAINER))), /whose directory is not/);
  });
});

describe('exec.json', () => {
  test("the earlier build's exact format (no version) reads as version 1", () => {
    const read = readExecRecord(FORMER_EXEC_JSON, execDirName(EXEC));
    assert.ok(read.ok, read.ok ? '' : read.reason);
    assert.equal(read.record.version, 1);
    assert.equal(read.record.execId, EXEC);
    assert.deepEqual(read.record.spec['args'], ['/bin/sh', '-c', 'echo hello; exit 5']);
    assert.equal(read.record.terminal, false);
    const fields = JSON.parse(FORMER_EXEC_JSON) as Parameters<typeof formerExecJson>[0];
    assert.equal(formerExecJson(fields), FORMER_EXEC_JSON, 'the fixture is JSON.stringify of the record');
  });

  test('a newer version, a spec that is not an object, or the wrong directory: refused', () => {
    const dir = execDirName(EXEC);
    assert.match(reason(readExecRecord(JSON.stringify({ ...JSON.parse(FORMER_EXEC_JSON), version: 3 }), dir)), /version 3 is newer/);
    assert.match(reason(readExecRecord(JSON.stringify({ ...JSON.parse(FORMER_EXEC_JSON), spec: ['sh'] }), dir)), /spec/);
    assert.match(reason(readExecRecord(FORMER_EXEC_JSON, execDirName('e2'))), /names exec 0b6f.*whose directory is not/);
  });
});
