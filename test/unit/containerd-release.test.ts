/**
 * What each containerd release asks of tsbox (src/ops/containerd-release.ts), by the version
 * strings containerd itself prints: `containerd --version` and its version service.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { parseRelease, traitsOf } from '../../src/ops/containerd-release.js';

test('reads the release from what containerd prints', () => {
  assert.deepEqual(parseRelease('2.1.9+ds1 abc123'), [2, 1, 9]);
  assert.deepEqual(parseRelease('v2.3.4'), [2, 3, 4]);
  assert.deepEqual(parseRelease('v2.4.0-dev+main'), [2, 4, 0]);
  assert.equal(parseRelease('devel'), undefined);
});

test('2.1 and 2.2 ask nothing new; 2.3 keeps the spec, passes resource updates and pulls the pause image; 2.4 lets a handler skip the pull', () => {
  const row = (r: [number, number, number]) => {
    const t = traitsOf(r);
    return [t.known, t.keepsPodSpec, t.updatesPodResources, t.pullsPauseImage, t.knowsDisablePausePull, t.statsFromMetrics, t.shutdownAfterDelete, t.defaultSandboxImage];
  };
  assert.deepEqual(row([2, 1, 9]), [true, false, false, false, false, false, false, 'registry.k8s.io/pause:3.10']);
  assert.deepEqual(row([2, 2, 7]), [true, false, false, false, false, false, false, 'registry.k8s.io/pause:3.10']);
  assert.deepEqual(row([2, 3, 4]), [true, true, true, true, false, false, false, 'registry.k8s.io/pause:3.10.2']);
  assert.deepEqual(row([2, 4, 0]), [true, true, true, true, true, true, true, 'registry.k8s.io/pause:3.10.2']);
  assert.equal(traitsOf([2, 5, 0]).known, false, 'a release tsbox has not read');
  assert.equal(traitsOf([1, 7, 30]).known, false);
});
