#!/usr/bin/env node
// Compares two critest result files (run-critest.sh's results-<name>.json): fails unless
// every spec that passed with the reference handler also passed with the one under test, and
// the reference itself ran (it is containerd's own podsandbox: a failure there is the
// machine's, and says so).
import { readFileSync } from 'node:fs';

const [refPath, testPath] = process.argv.slice(2);
if (!refPath || !testPath) {
  console.error('usage: critest-compare.mjs REFERENCE.json UNDER-TEST.json');
  process.exit(2);
}
const load = (p) => {
  try {
    return JSON.parse(readFileSync(p, 'utf8'));
  } catch (err) {
    console.error(`critest: cannot read ${p}: ${err.message}`);
    process.exit(1);
  }
};
const ref = load(refPath);
const test = load(testPath);
if (ref.totals.passed === 0 || ref.totals.failed > 0) {
  console.error(`critest: the reference run (containerd's podsandbox) did not pass cleanly: ${JSON.stringify(ref.totals)}`);
  process.exit(1);
}
const passed = new Set(test.passed);
const missing = ref.passed.filter((spec) => !passed.has(spec));
console.log(`critest: podsandbox ${ref.totals.passed} passed, ${ref.totals.failed} failed; tsbox ${test.totals.passed} passed, ${test.totals.failed} failed`);
for (const f of test.failed) console.log(`  FAIL on tsbox: ${f.name ?? JSON.stringify(f)}${f.reason ? ` — ${f.reason}` : ''}`);
if (missing.length > 0) {
  console.error(`critest: ${missing.length} spec(s) pass on podsandbox but not on tsbox:\n${missing.map((s) => `  - ${s}`).join('\n')}`);
  process.exit(1);
}
console.log(`${test.totals.passed} passed, ${test.totals.failed} failed`);
