#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs what the tests need (containerd 2.x
# from Debian, the reference .proto files, npm packages), builds, checks lint and generated
# code, then runs unit, integration, hostile-peer and end-to-end tests on this machine, and the
# cgroup v2 node tier in user-mode Linux nodes with systemd (scripts/test-uml-node.sh): two
# nodes, one beside the machine's tests and one after them.
# Must run as root (containerd, namespaces, cgroups): a test that cannot get them fails, it is
# never skipped.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

step() { printf '\n==> %s\n' "$*"; }

if [ "$(id -u)" -ne 0 ]; then
  echo "npm test: must run as root (it starts containerd and sandboxes in their own namespaces)" >&2
  exit 1
fi

step "install containerd and reference definitions, and the user-mode Linux node"
bash scripts/install-containerd.sh
bash scripts/install-uml.sh

if [ ! -d node_modules/@grpc/grpc-js ]; then
  step "npm ci"
  npm ci --ignore-scripts --no-audit --no-fund
fi

step "build"
npm run -s build

step "generated code is up to date"
before=$(git status --porcelain -- src/gen proto 2>/dev/null || true)
npm run -s gen
after=$(git status --porcelain -- src/gen proto 2>/dev/null || true)
if [ "$before" != "$after" ] || ! git diff --quiet -- src/gen; then
  git --no-pager diff --stat -- src/gen
  echo "src/gen is stale: run 'npm run gen' and commit the result" >&2
  exit 1
fi

step "lint"
npm run -s lint

step "CRI validation (critest): tsbox pods against containerd's podsandbox"
bash scripts/critest.sh

failed=()
# The hostile-peer tier holds tsbox to answers within a second while it is attacked: it runs
# before any node shares the machine's cores.
step "hostile-peer tests"
node --test --test-concurrency=1 --expose-gc dist/test/hostile/*.test.js || failed+=("hostile-peer tests")

# The cgroup v2 node tier runs in two user-mode Linux nodes, one core each: critest on tsbox
# pods (both routes, against the podsandbox results just taken) from now on, beside the
# machine's other tests; the node's own tests and the whole-pod tests once those are done. A
# node's output is kept in .cache and printed when it ends.
mkdir -p .cache
critest_log=.cache/node-critest.log
step "cgroup v2 node with systemd (user-mode Linux), in the background: critest on tsbox (both routes) -> $critest_log"
bash scripts/test-uml-node.sh critest-tsbox critest-task > "$critest_log" 2>&1 &
critest_node=$!
# Whatever ends this script ends that node too (uml-node.sh kills it on TERM).
trap 'kill -TERM "$critest_node" 2>/dev/null || true; wait "$critest_node" 2>/dev/null || true' EXIT

step "tests"
node --test --test-concurrency=1 --expose-gc \
  dist/test/unit/*.test.js dist/test/integration/*.test.js dist/test/e2e/*.test.js \
  || failed+=("tests on this machine")

step "cgroup v2 node with systemd (user-mode Linux): node tests, pods, integration"
bash scripts/test-uml-node.sh node pods || failed+=("node tier: node tests and pods")

step "cgroup v2 node with systemd (user-mode Linux): critest on tsbox (both routes), as it ran"
rc=0
wait "$critest_node" || rc=$?
trap - EXIT
cat "$critest_log"
[ "$rc" -eq 0 ] || failed+=("node tier: critest (exit $rc)")

if [ "${#failed[@]}" -gt 0 ]; then
  printf '\nnpm test: FAILED: %s\n' "${failed[@]}" >&2
  exit 1
fi
printf '\nnpm test: every part passed\n'
