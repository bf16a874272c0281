#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs what the tests need (containerd 2.x
# from Debian, the reference .proto files, npm packages), builds, checks lint and generated
# code, then runs unit, integration, hostile-peer and end-to-end tests on this machine, and last
# the cgroup v2 node tier in a user-mode Linux node with systemd (scripts/test-uml-node.sh).
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

step "tests"
node --test --test-concurrency=1 --expose-gc \
  dist/test/unit/*.test.js dist/test/integration/*.test.js dist/test/hostile/*.test.js dist/test/e2e/*.test.js

step "cgroup v2 node with systemd (user-mode Linux): node tests, pods, integration, critest on tsbox (both routes)"
bash scripts/test-uml-node.sh node pods critest-tsbox critest-task
