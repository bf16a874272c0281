// The container holder's records: the pid file it writes before answering (both pids with
// the start times that make them trustworthy after a restart), and the decision whether a
// container's other processes must be killed when its init ends (a pid namespace that is not
// its own, as the runc shim's ShouldKillAllOnExit).
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { parseHolderRecord, sharesPidNamespace } from '../../src/runtime/container-holder.js';

describe('parseHolderRecord', () => {
  test('reads both pids and their start times', () => {
    assert.deepEqual(parseHolderRecord('5686 1524434 5696 1524438\n'), { holderPid: 5686, holderStart: '1524434', pid: 5696, pidStart: '1524438' });
    assert.deepEqual(parseHolderRecord('1 0 2 3'), { holderPid: 1, holderStart: '0', pid: 2, pidStart: '3' });
  });

  test('refuses a torn, empty or foreign file', () => {
    for (const text of ['', '5686 1524434 5696\n', '5686 1524434 5696 x\n', '0 1 2 3\n', '-1 1 2 3\n', '5686  1524434 5696 1524438\n', '1 2 3 4\n5\n']) {
      assert.equal(parseHolderRecord(text), undefined, JSON.stringify(text));
    }
  });
});

describe('sharesPidNamespace', () => {
  test('a pid namespace of its own: the kernel ends the rest with the init', () => {
    assert.equal(sharesPidNamespace({ linux: { namespaces: [{ type: 'mount' }, { type: 'pid' }] } }), false);
    assert.equal(sharesPidNamespace({ linux: { namespaces: [{ type: 'pid', path: '' }] } }), false);
  });

  test("a pod's shared namespace (joined by path) or the host's: the holder kills the rest", () => {
    assert.equal(sharesPidNamespace({ linux: { namespaces: [{ type: 'pid', path: '/proc/42/ns/pid' }] } }), true);
    assert.equal(sharesPidNamespace({ linux: { namespaces: [{ type: 'network' }] } }), true);
    assert.equal(sharesPidNamespace({ linux: {} }), true);
    assert.equal(sharesPidNamespace({}), true);
    assert.equal(sharesPidNamespace(null), true);
  });
});
