#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs what the tests need (containerd 2.x
# from Debian, the reference .proto files, the user-mode Linux kernel, npm packages), builds,
# runs the hostile-peer tier alone (its bounds are answers within a second under attack), then
# checks lint and generated code and runs the other tests in five lanes at once:
#
#   critest   on this machine: Kubernetes' CRI validation suite on podsandbox, then on tsbox
#             pods of each route against podsandbox's results; then on containerd 2.3.4 (the
#             long-term release) critest v1.36 on podsandbox and tsbox pods
#   containerd 2.3   on this machine: the pods (both routes), restart, CRI and churn tests on
#             containerd 2.3.4
#   machine   on this machine: generated code, lint, then the unit, integration and
#             end-to-end tiers, two test files at a time
#   node A    a cgroup v2 node with systemd (user-mode Linux, scripts/test-uml-node.sh): the
#             whole-pod end-to-end tests and the integration tests that touch cgroups; then,
#             in a node booted anew, critest on tsbox pods of the Task API route
#   node B    the node's harness checked from the host (it boots, and a kernel panic fails at
#             once), then another such node: the node's own tests, tsbox doctor's and the churn
#             of pods; then, in a node booted anew, critest on tsbox pods of the shim route
#
# critest on tsbox, on the machine and in the nodes, is held to podsandbox's results of the
# machine's run in this same suite: the nodes' critest waits for them (a lock the machine
# holds until its podsandbox run has ended).
#
# The nodes run at a lower CPU priority than the machine's tests, whose bounds are the
# tighter. Each background lane's output goes to .cache/test-logs/ and is printed when the
# lane ends; at the end comes the time each part took.
# Must run as root (containerd, namespaces, cgroups): a test that cannot get them fails, it is
# never skipped.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if [ "$(id -u)" -ne 0 ]; then
  echo "npm test: must run as root (it starts containerd and sandboxes in their own namespaces)" >&2
  exit 1
fi

logs=.cache/test-logs
mkdir -p "$logs"
rm -f "$logs"/*
times="$logs/times.tsv"
suite_started=$SECONDS

step() { printf '\n==> %s\n' "$*"; }
# part LANE NAME COMMAND...: runs the command, records its time and outcome in $times; what it
# printed is also kept in a file of its own, whose end is printed again last when it failed.
part() {
  local lane="$1" name="$2" started=$SECONDS rc=0 out
  shift 2
  out="$logs/part-$(printf '%s-%s' "$lane" "$name" | tr -c 'A-Za-z0-9.\n' '-').log"
  if "$@" 2>&1 | tee "$out"; then rc=0; else rc=${PIPESTATUS[0]}; fi
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$lane" "$name" $((started - suite_started)) $((SECONDS - started)) "$rc" "$out" >> "$times"
  return "$rc"
}

step "install containerd, reference definitions and the user-mode Linux kernel"
part setup install bash -c 'bash scripts/install-containerd.sh && bash scripts/install-uml.sh'
if [ ! -d node_modules/@grpc/grpc-js ]; then
  step "npm ci"
  part setup "npm ci" npm ci --ignore-scripts --no-audit --no-fund
fi
step "build"
part setup build npm run -s build
step "critest's stand-in images"
part setup "critest images" bash scripts/critest.sh --prepare

failed=()
# The hostile-peer tier holds tsbox to answers within a second while it is attacked (a fresh
# connection's Status among 20 000 connections in flight): it runs first, alone on the machine,
# before any lane shares its cores.
step "hostile-peer tests, alone"
part machine "hostile-peer tier" node --test --test-concurrency=1 --expose-gc dist/test/hostile/*.test.js || failed+=("hostile-peer tests")

# The lanes start now: everything they need is built. The nodes' critest waits for the
# podsandbox results the machine's critest leaves; the machine holds this lock until then.
reference_lock="$logs/critest-reference.lock"
exec 8> "$reference_lock"
flock 8
node_lane_a() {
  exec 8>&-
  local rc=0
  part "node A" "pods, integration (cgroups)" nice -n 10 bash scripts/test-uml-node.sh pods-1 || rc=1
  flock "$reference_lock" true
  part "node A" "critest tsbox (Task API route)" nice -n 10 bash scripts/test-uml-node.sh critest-task || rc=1
  return "$rc"
}
node_lane_b() {
  exec 8>&-
  local rc=0
  part "node B" "the node itself (uml-node.sh)" node --test --test-concurrency=1 dist/test/harness/*.test.js || rc=1
  part "node B" "node tests, doctor, churn" nice -n 10 bash scripts/test-uml-node.sh node pods-2 || rc=1
  flock "$reference_lock" true
  part "node B" "critest tsbox (shim route)" nice -n 10 bash scripts/test-uml-node.sh critest-tsbox || rc=1
  return "$rc"
}
# The machine's checks that need no critest: generated code, lint, then the unit,
# integration and end-to-end tiers, two test files at a time.
gen_check() {
  local before after
  before=$(git status --porcelain -- src/gen proto 2>/dev/null || true)
  npm run -s gen
  after=$(git status --porcelain -- src/gen proto 2>/dev/null || true)
  if [ "$before" != "$after" ] || ! git diff --quiet -- src/gen; then
    git --no-pager diff --stat -- src/gen
    echo "src/gen is stale: run 'npm run gen' and commit the result" >&2
    return 1
  fi
}
machine_tests() {
  exec 8>&-
  local rc=0
  part machine "generated code" gen_check || rc=1
  part machine lint npm run -s lint || rc=1
  part machine "unit, integration, end-to-end" node --test --test-concurrency=2 --expose-gc \
    dist/test/unit/*.test.js dist/test/integration/*.test.js dist/test/e2e/*.test.js || rc=1
  return "$rc"
}
# containerd 2.3.4's end-to-end tiers: pods on both routes, restarts, CRI, churn (20 pods per
# route). Mostly waiting on containerd and runc, so a lane of its own from the start.
containerd23_tests() {
  exec 8>&-
  part "containerd 2.3" "end-to-end on containerd 2.3.4" env TSBOX_E2E_CONTAINERD=2.3.4 TSBOX_CHURN_PODS=20 \
    node --test --test-concurrency=1 --expose-gc dist/test/e2e/pods-task-api.test.js dist/test/e2e/pods.test.js \
    dist/test/e2e/restart.test.js dist/test/e2e/cri.test.js dist/test/e2e/churn.test.js
}
step "in the background: node A -> $logs/node-a.log, node B -> $logs/node-b.log, the machine's tests -> $logs/machine.log, containerd 2.3.4's -> $logs/containerd-2.3.log"
node_lane_a > "$logs/node-a.log" 2>&1 &
lane_a=$!
node_lane_b > "$logs/node-b.log" 2>&1 &
lane_b=$!
machine_tests > "$logs/machine.log" 2>&1 &
lane_m=$!
containerd23_tests > "$logs/containerd-2.3.log" 2>&1 &
lane_c=$!
# Whatever ends this script ends the lanes too (uml-node.sh kills its node on TERM).
trap 'kill -TERM "$lane_a" "$lane_b" "$lane_m" "$lane_c" 2>/dev/null || true; wait 2>/dev/null || true' EXIT

step "CRI validation (critest): containerd's podsandbox, the reference for every run on tsbox"
part critest "podsandbox" bash scripts/critest.sh --podsandbox || failed+=("critest on podsandbox")
flock -u 8
exec 8>&-
step "CRI validation (critest): tsbox pods of each route against podsandbox's results"
part critest "tsbox (both routes)" bash scripts/critest.sh --reference .cache/critest-podsandbox.json || failed+=("critest on this machine")
# containerd 2.3, the long-term release (unpacked by install-containerd.sh): critest v1.36, which
# also checks what CRI v1.33 to v1.36 added, on podsandbox and on tsbox pods (after the runs
# above: critest's registry and bridge are one per machine). Its end-to-end tiers are lane
# "containerd 2.3"; 2.3's and 2.4's own asks are test/e2e/containerd-2.3.test.ts and
# containerd-2.4.test.ts, in the machine's tests.
step "containerd 2.3.4: critest v1.36 on podsandbox and on tsbox pods (Task API route)"
part critest "containerd 2.3.4: critest v1.36" env CRITEST_CONTAINERD=2.3.4 CRITEST_BIN_DIR=../shared/tools/critest/bin-v1.36 CRITEST_ROUTES=task \
  bash scripts/critest.sh || failed+=("critest v1.36 on containerd 2.3.4")

lane() { # name pid log
  local rc=0
  wait "$2" || rc=$?
  step "$1, as it ran"
  cat "$3"
  [ "$rc" -eq 0 ] || failed+=("$1 (exit $rc)")
}
lane "the machine's tests (generated code, lint, unit, integration, end-to-end)" "$lane_m" "$logs/machine.log"
lane "containerd 2.3.4: pods on both routes, restarts, CRI, churn" "$lane_c" "$logs/containerd-2.3.log"

lane "node A (cgroup v2, systemd): whole-pod tests, critest on the Task API route" "$lane_a" "$logs/node-a.log"
lane "node B (cgroup v2, systemd): node tests, doctor, churn, critest on the shim route" "$lane_b" "$logs/node-b.log"
trap - EXIT

step "time per part (started: seconds after the suite's start)"
awk -F'\t' 'BEGIN { printf "%-8s %-40s %8s %8s  %s\n", "lane", "part", "started", "seconds", "result" }
  { printf "%-8s %-40s %8d %8d  %s\n", $1, $2, $3, $4, ($5 == 0 ? "passed" : "FAILED (exit " $5 ")") }' "$times"
printf 'the whole suite: %d s\n' $((SECONDS - suite_started))

if [ "${#failed[@]}" -gt 0 ]; then
  # Each failed part's last words, here at the end where a truncated log still shows them.
  while IFS=$'\t' read -r lane name _ _ rc out; do
    [ "$rc" = 0 ] && continue
    step "$lane, $name: FAILED (exit $rc); the last 80 lines it printed ($out)"
    tail -n 80 "$out"
  done < "$times"
  printf '\nnpm test: FAILED: %s\n' "${failed[@]}" >&2
  exit 1
fi
printf '\nnpm test: every part passed\n'
