#!/usr/bin/env bash
# The cgroup v2 node tier of the test suite: boots a user-mode Linux node with systemd as init
# (scripts/uml-node.sh) and runs in it, one part after the other,
#   node       the tests only a cgroup v2 node can check (test/node/*.test.ts)
#   pods       the whole-pod end-to-end tests and the integration tests that touch cgroups;
#              pods-1 and pods-2 are its two parts, for two nodes side by side (pods-2: tsbox
#              doctor's, the churn of 10 pods per route and what containerd 2.3 and 2.4 ask;
#              pods-1: the rest)
#   critest    Kubernetes' CRI validation suite on tsbox pods (both routes) against podsandbox,
#              all in the node
#   critest-tsbox  the suite on tsbox pods of the shim route only, against podsandbox's results
#              of the machine's own run (.cache/critest-podsandbox.json, left by
#              scripts/critest.sh)
#   critest-task   the same on tsbox pods of the Task API route
# then prints each part's result and time. Exits non-zero when a part fails. Needs root, a
# build (npm run build) and network for the preparation (run from scripts/test.sh, last).
#
#   scripts/test-uml-node.sh [--repo DIR] [--timeout SECONDS] [PART...]   (default: all parts)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"

# Relative to the repository, where the inside part runs.
POD_TESTS_1=(
  dist/test/e2e/pods.test.js dist/test/e2e/pods-task-api.test.js dist/test/e2e/restart.test.js dist/test/e2e/containerd.test.js
  dist/test/e2e/cri.test.js
  dist/test/integration/rpc.test.js dist/test/integration/namespaces.test.js
  dist/test/integration/process.test.js dist/test/integration/stop.test.js
)
POD_TESTS_2=(dist/test/e2e/doctor.test.js dist/test/e2e/churn.test.js dist/test/e2e/containerd-2.3.test.js dist/test/e2e/containerd-2.4.test.js)
ALL_PARTS=(node pods critest)
PODSANDBOX_RESULTS=.cache/critest-podsandbox.json

# Inside the node: run the parts, then the summary.
if [ "${1:-}" = --inside ]; then
  shift
  cd "$repo"
  # Only a cgroup v2 node with systemd as pid 1 is this tier's node.
  if [ "$(stat -f -c %T /sys/fs/cgroup)" != cgroup2fs ] || [ "$(basename "$(readlink /proc/1/exe)")" != systemd ]; then
    echo "test-uml-node: --inside runs only in the node (cgroup2 at /sys/fs/cgroup, systemd as pid 1)" >&2
    exit 2
  fi
  # A write to the repository that the host must never see (checked there afterwards).
  echo "written inside the node" > .tsbox-node-probe
  echo "==> node up: kernel $(uname -r), $(awk '{printf "%.0f", $1}' /proc/uptime) s since boot, controllers: $(cat /sys/fs/cgroup/cgroup.controllers)"
  # A pod takes seconds here: 10 pods come and go per route in the churn test instead of 100.
  export TSBOX_CHURN_PODS="${TSBOX_CHURN_PODS:-10}"
  summary=()
  failed=0
  for part in "$@"; do
    echo
    echo "==> node tier: $part"
    start=$SECONDS
    rc=0
    case "$part" in
      node) node --test --test-concurrency=1 --expose-gc dist/test/node/*.test.js || rc=$? ;;
      pods) node --test --test-concurrency=1 --expose-gc "${POD_TESTS_1[@]}" "${POD_TESTS_2[@]}" || rc=$? ;;
      pods-1) node --test --test-concurrency=1 --expose-gc "${POD_TESTS_1[@]}" || rc=$? ;;
      pods-2) node --test --test-concurrency=1 --expose-gc "${POD_TESTS_2[@]}" || rc=$? ;;
      critest) bash scripts/critest.sh || rc=$? ;;
      critest-tsbox) CRITEST_ROUTES=shim bash scripts/critest.sh --reference "$PODSANDBOX_RESULTS" || rc=$? ;;
      critest-task) CRITEST_ROUTES=task bash scripts/critest.sh --reference "$PODSANDBOX_RESULTS" || rc=$? ;;
    esac
    [ "$rc" -eq 0 ] && result=passed || { result="FAILED (exit $rc)"; failed=1; }
    summary+=("$(printf '  %-14s %-18s %4d s' "$part" "$result" $((SECONDS - start)))")
  done
  echo
  echo "==> node tier (cgroup v2, systemd, user-mode Linux): time per part"
  printf '%s\n' "${summary[@]}"
  exit "$failed"
fi

# Bound on the whole node tier, boot included: 75 min (on a slow machine it passed 60: the last part was cut there).
timeout=4500
parts=()
while [ $# -gt 0 ]; do
  case "$1" in
    --repo) repo="$(cd "${2:?--repo needs a directory}" && pwd)"; shift 2 ;;
    --timeout) timeout="${2:?--timeout needs seconds}"; shift 2 ;;
    node|pods|pods-1|pods-2|critest|critest-tsbox|critest-task) parts+=("$1"); shift ;;
    *) echo "test-uml-node: unknown argument $1 (parts: ${ALL_PARTS[*]})" >&2; exit 2 ;;
  esac
done
[ "${#parts[@]}" -gt 0 ] || parts=("${ALL_PARTS[@]}")
cd "$repo"

# Everything the node cannot fetch (it has no network) is made ready here.
bash "$here/install-uml.sh"
[ -d dist/test/node ] || { echo "test-uml-node: no build in $repo (npm run build)" >&2; exit 1; }
if [[ " ${parts[*]} " == *" critest"* ]]; then bash "$repo/scripts/critest.sh" --prepare; fi
if [[ " ${parts[*]} " == *" critest-"* ]] && [ ! -f "$PODSANDBOX_RESULTS" ]; then
  echo "test-uml-node: critest-tsbox and critest-task need podsandbox's results in $repo/$PODSANDBOX_RESULTS (run scripts/critest.sh first)" >&2
  exit 1
fi

started=$SECONDS
rc=0
bash "$here/uml-node.sh" --repo "$repo" --timeout "$timeout" -- bash scripts/test-uml-node.sh --inside "${parts[@]}" &
node_run=$!
# Stopped (scripts/test.sh ending, ^C): the node is stopped too, and awaited.
trap 'kill -TERM "$node_run" 2>/dev/null || true' TERM INT
while :; do
  rc=0
  wait "$node_run" || rc=$?
  kill -0 "$node_run" 2>/dev/null || break
done
trap - TERM INT
echo "==> node tier: $((SECONDS - started)) s in all, boot and power-off included (exit $rc)"
if [ -e .tsbox-node-probe ]; then
  echo "test-uml-node: a file written inside the node reached the host: $repo/.tsbox-node-probe" >&2
  rm -f .tsbox-node-probe
  rc=1
fi
exit "$rc"
