#!/usr/bin/env bash
# npm run bench: first whole pods through CRI, tsbox against containerd's own podsandbox in
# one run (the figures a node feels), with one container each (pods.md) and without containers
# (pods-sandbox-only.md: the sandbox alone); then, as information, tsbox's control plane
# against the Go reference server (goref) and tsbox's real-work figures with real processes.
# Prints the tables and writes JSON files. A benchmark, not a test: nothing passes or fails on a number.
#   PODS_ONLY=1 npm run bench          # only the pods;  PODS=0 npm run bench: all but the pods
#
#   npm run bench                       # 3 rounds of 5 s per scenario (~15 min on 2 cores)
#   ROUNDS=1 DURATION=3s npm run bench  # quicker
#   SBBENCH_DIR=... (default ../shared/tools/sbbench), SBBENCH_OUT=... (default .cache/sbbench)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
here="$(pwd)"
export SBBENCH_OUT="${SBBENCH_OUT:-$here/.cache/sbbench}"
sbbench="${SBBENCH_DIR:-$here/../shared/tools/sbbench}"
stamp="$(date -u +%Y%m%dT%H%M%SZ)"
out="${BENCH_OUT:-$here/.cache/bench/$stamp}"
mkdir -p "$out"

[ -d node_modules/@grpc/grpc-js ] || npm ci --ignore-scripts --no-audit --no-fund >&2
npm run -s build >&2
if [ "${PODS:-1}" != 0 ]; then
  echo "==> pods with one container through CRI: tsbox vs podsandbox, alternating" >&2
  node dist/bench/pods.js --json "$out/pods.json" ${QUICK:+--rounds 1 --serial 4 --concurrent 8 --memory-pods 4 --scale 20} | tee "$out/pods.md"
  echo "==> pod sandboxes without containers through CRI: tsbox vs podsandbox, alternating" >&2
  node dist/bench/pods.js --sandbox-only --scale 0 --json "$out/pods-sandbox-only.json" ${QUICK:+--rounds 1 --serial 4 --concurrent 8 --memory-pods 4} \
    | tee "$out/pods-sandbox-only.md"
fi
[ -z "${PODS_ONLY:-}" ] || { echo "results: $out" >&2; exit 0; }

if [ ! -x "$sbbench/compare.sh" ]; then
  echo "bench: the sbbench harness is not at $sbbench (set SBBENCH_DIR)" >&2
  exit 1
fi
if [ ! -x "$SBBENCH_OUT/bin/sbload" ] || [ ! -x "$SBBENCH_OUT/bin/goref" ]; then
  echo "==> building goref and sbload from Debian packages into $SBBENCH_OUT" >&2
  SBBENCH_SKIP_NODE=1 "$sbbench/build.sh" >&2
fi

echo "==> control plane: tsbox (noop backend) vs goref, alternating" >&2
# waitfanout holds N×W Waits on one connection: W=5 keeps them (5 000) under the 8 192 streams
# tsbox allows on a connection (src/transport/limits.ts), past which grpc-go queues calls.
ROUNDS="${ROUNDS:-3}" DURATION="${DURATION:-5s}" WARMUP="${WARMUP:-2s}" W="${W:-5}" OUT="$out/compare" \
  B_LABEL=tsbox B_CMD="node --max-semi-space-size=1 $here/dist/src/main.js serve --socket {SOCK} --state-dir {DIR} --backend noop --log-level warn" \
  "$sbbench/compare.sh" > /dev/null

echo "==> real work: process backend" >&2
node dist/bench/real-work.js --sbload "$SBBENCH_OUT/bin/sbload" ${QUICK:+--quick} > "$out/real-work.json"

node dist/bench/report.js --compare "$out/compare/runs.jsonl" --real-work "$out/real-work.json" \
  --json "$out/bench.json" --machine "$(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(uname -sr)"
echo "results: $out" >&2
