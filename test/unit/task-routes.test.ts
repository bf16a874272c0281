// Which CRI runtime handlers' pods tsbox runs the containers of (Task API v3) and which keep
// the version-2 route (containerd runs the handler's shim), from task_api_handlers and the
// handlers containerd's config puts on tsbox.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import type { SandboxerHandler } from '../../src/config/containerd-config.js';
import { RUNC_RUNTIME_TYPE, routeHandlers } from '../../src/config/task-routes.js';

const handler = (name: string, runtimeType: string): SandboxerHandler => ({ name, runtimeType, shim: undefined, file: '/etc/containerd/config.toml', disablePauseImagePull: false });
const NODE = [handler('tsbox', RUNC_RUNTIME_TYPE), handler('tsbox-kata', 'io.containerd.kata.v2'), handler('tsbox-fast', RUNC_RUNTIME_TYPE), handler('tsbox-untyped', '')];

describe('routeHandlers', () => {
  test('* (the default): every handler whose runtime_type is runc\'s; the others keep their shim, saying why', () => {
    const routes = routeHandlers(['*'], NODE);
    assert.deepEqual(routes.taskApi, ['tsbox', 'tsbox-fast']);
    assert.deepEqual(
      routes.version2.map((r) => [r.handler.name, r.why]),
      [
        ['tsbox-kata', 'its runtime_type is "io.containerd.kata.v2", not runc\'s'],
        ['tsbox-untyped', 'its runtime_type is "", not runc\'s'],
      ],
    );
    assert.deepEqual(routes.notRunc, []);
  });

  test('names: exactly those, also one containerd\'s config does not show; a named handler of another runtime is flagged', () => {
    const routes = routeHandlers(['tsbox-fast', 'tsbox-kata', 'elsewhere'], NODE);
    assert.deepEqual(routes.taskApi, ['tsbox-fast', 'tsbox-kata', 'elsewhere']);
    assert.deepEqual(
      routes.version2.map((r) => [r.handler.name, r.why]),
      [
        ['tsbox', 'not in task_api_handlers'],
        ['tsbox-untyped', 'not in task_api_handlers'],
      ],
    );
    assert.deepEqual(routes.notRunc, [{ name: 'tsbox-kata', runtimeType: 'io.containerd.kata.v2' }]);
  });

  test('names and *: the names, and every runc handler besides', () => {
    assert.deepEqual(routeHandlers(['tsbox-kata', '*'], NODE).taskApi, ['tsbox-kata', 'tsbox', 'tsbox-fast']);
  });

  test('none: every handler keeps the version-2 route', () => {
    const routes = routeHandlers([], NODE);
    assert.deepEqual(routes.taskApi, []);
    assert.deepEqual(
      routes.version2.map((r) => r.handler.name),
      NODE.map((h) => h.name),
    );
  });

  test('a handler defined in two of containerd\'s files: the last one read counts, once', () => {
    const routes = routeHandlers(['*'], [handler('tsbox', 'io.containerd.kata.v2'), handler('other', RUNC_RUNTIME_TYPE), handler('tsbox', RUNC_RUNTIME_TYPE)]);
    assert.deepEqual(routes.taskApi, ['tsbox', 'other']);
    assert.deepEqual(routes.version2, []);
  });

  test('containerd\'s config unknown: * names no handler (which runtime each has is not known); names still count', () => {
    assert.deepEqual(routeHandlers(['*'], undefined), { taskApi: [], version2: [], notRunc: [] });
    assert.deepEqual(routeHandlers(['*', 'tsbox'], undefined).taskApi, ['tsbox']);
  });
});
