#!/usr/bin/env node
// Compares critest result files (run-critest.sh's results-<name>.json): fails unless every spec
// that passed with the reference handler also passed with the one under test, and the
// reference itself ran (it is containerd's own podsandbox: a failure there is the machine's,
// and says so).
//
//   critest-compare.mjs --rerun-list REFERENCE.json UNDER-TEST.json
//       prints, one per line, the specs that passed on the reference but not under test, when
//       there are at most MAX_RERUNS of them (more is no flake: nothing is rerun)
//   critest-compare.mjs --failed-list REFERENCE.json
//       prints, one per line, the specs that failed on the reference run itself (podsandbox),
//       when there are at most MAX_RERUNS of them
//   critest-compare.mjs --merge-reruns REFERENCE.json [RERUN.json...]
//       prints the reference's results with each spec that failed there but passed when rerun
//       alone counted as passed, named in `passedOnRerun`
//   critest-compare.mjs REFERENCE.json UNDER-TEST.json [RERUN.json...]
//       the verdict; a spec that failed only under test counts as passed when a rerun of it
//       alone passed, and the output says so
import { readFileSync } from 'node:fs';

/** Reruns are for a race or two, not for a broken run. */
const MAX_RERUNS = 3;

const args = process.argv.slice(2);
const load = (p) => {
  try {
    return JSON.parse(readFileSync(p, 'utf8'));
  } catch (err) {
    console.error(`critest: cannot read ${p}: ${err.message}`);
    process.exit(1);
  }
};

if (args[0] === '--failed-list' || args[0] === '--merge-reruns') {
  const [mode, refPath, ...rerunPaths] = args;
  if (!refPath || (mode === '--failed-list' && rerunPaths.length > 0)) {
    console.error('usage: critest-compare.mjs --failed-list REFERENCE.json | --merge-reruns REFERENCE.json [RERUN.json...]');
    process.exit(2);
  }
  const ref = load(refPath);
  const failedNames = ref.failed.map((f) => f.name);
  if (mode === '--failed-list') {
    if (failedNames.length <= MAX_RERUNS) for (const name of failedNames) console.log(name);
    process.exit(0);
  }
  const passedOnRerun = new Set(rerunPaths.map(load).flatMap((r) => r.passed));
  const recovered = failedNames.filter((name) => passedOnRerun.has(name));
  const merged = {
    ...ref,
    passed: [...ref.passed, ...recovered],
    failed: ref.failed.filter((f) => !passedOnRerun.has(f.name)),
    passedOnRerun: recovered,
    totals: { ...ref.totals, passed: ref.totals.passed + recovered.length, failed: ref.totals.failed - recovered.length },
  };
  console.log(JSON.stringify(merged, null, 1));
  process.exit(0);
}

const listOnly = args[0] === '--rerun-list';
const [refPath, testPath, ...rerunPaths] = listOnly ? args.slice(1) : args;
if (!refPath || !testPath || (listOnly && rerunPaths.length > 0)) {
  console.error('usage: critest-compare.mjs [--rerun-list] REFERENCE.json UNDER-TEST.json [RERUN.json...]');
  process.exit(2);
}
const ref = load(refPath);
const test = load(testPath);
const refClean = ref.totals.passed > 0 && ref.totals.failed === 0;
const passed = new Set(test.passed);
const missing = ref.passed.filter((spec) => !passed.has(spec));

if (listOnly) {
  if (refClean && missing.length <= MAX_RERUNS) for (const spec of missing) console.log(spec);
  process.exit(0);
}

if (!refClean) {
  console.error(`critest: the reference run (containerd's podsandbox) did not pass cleanly: ${JSON.stringify(ref.totals)}`);
  process.exit(1);
}
console.log(`critest: podsandbox ${ref.totals.passed} passed, ${ref.totals.failed} failed; tsbox ${test.totals.passed} passed, ${test.totals.failed} failed`);
for (const spec of ref.passedOnRerun ?? []) console.log(`critest: podsandbox RERUN PASSED: ${spec} — failed on podsandbox in its full run, passed when rerun alone: counted as passed, so tsbox must pass it`);
for (const f of test.failed) console.log(`  FAIL on tsbox: ${f.name ?? JSON.stringify(f)}${f.reason ? ` — ${f.reason}` : ''}`);

const reruns = rerunPaths.map(load);
const passedOnRerun = new Set(reruns.flatMap((r) => r.passed));
const failedOnRerun = new Map(reruns.flatMap((r) => r.failed.map((f) => [f.name, f.reason])));
const flaky = missing.filter((spec) => passedOnRerun.has(spec));
const failing = missing.filter((spec) => !passedOnRerun.has(spec));
if (missing.length > MAX_RERUNS) console.log(`critest: ${missing.length} specs failed only on tsbox, more than ${MAX_RERUNS}: none was rerun`);
for (const spec of flaky) {
  console.log(`critest: RERUN PASSED: ${spec} — failed on tsbox in the full run, passed when rerun alone: counted as passed (flaky)`);
}
if (reruns.length > 0) {
  for (const spec of failing) {
    const reason = failedOnRerun.get(spec);
    console.log(`critest: RERUN FAILED: ${spec} — failed again when rerun alone${reason ? `: ${reason}` : ' (no result for it in the rerun)'}`);
  }
}
if (failing.length > 0) {
  console.error(`critest: ${failing.length} spec(s) pass on podsandbox but not on tsbox:\n${failing.map((s) => `  - ${s}`).join('\n')}`);
  process.exit(1);
}
const rerunNote = flaky.length > 0 ? `; ${flaky.length} of its failures passed when rerun alone` : '';
console.log(`tsbox: ${test.totals.passed} passed, ${test.totals.failed} failed in the full run${rerunNote}: every spec that passes on podsandbox passes on tsbox`);
