#!/usr/bin/env bash
# Kubernetes' CRI validation suite (critest, from ../shared/tools/critest or CRITEST_DIR) on
# tsbox pods, against containerd's own podsandbox in the same run: every spec that passes with
# containerd's default handler must pass with handler tsbox. Needs root and a built tsbox.
#
#   scripts/critest.sh            both runs and the comparison
#   scripts/critest.sh --prepare  only the stand-in images the suite pulls (built once into
#                                 CRITEST_IMAGES, default .cache/critest-images; building them
#                                 downloads Debian's busybox, so a node without network needs
#                                 them prepared beforehand)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
tool="${CRITEST_DIR:-../shared/tools/critest}"
if [ ! -f "$tool/run-critest.sh" ]; then
  echo "critest: $tool/run-critest.sh not found (set CRITEST_DIR)" >&2
  exit 1
fi
images="${CRITEST_IMAGES:-$PWD/.cache/critest-images}"
if [ ! -f "$images/images.list" ]; then
  echo "==> critest: building the stand-in images into $images" >&2
  rm -rf "$images.new"
  bash "$tool/images/build-images.sh" "$images.new" > "$images.log" 2>&1 || {
    tail -n 20 "$images.log" >&2
    echo "critest: building the images failed (log $images.log)" >&2
    exit 1
  }
  mv "$images.new" "$images"
  rm -f "$images.log"
fi
[ "${1:-}" = --prepare ] && exit 0
base="$(mktemp -d /tmp/crt.XXXXXX)"
# Kept when something failed, for the logs (containerd's, tsbox's, critest's) in it.
trap 'if [ "$ok" = 1 ]; then rm -rf "$base"; else echo "critest: work dir kept: $base" >&2; fi' EXIT
ok=0
run() { # handler work-dir
  local handler="$1" work="$2"
  local cmd="node dist/src/main.js serve --socket {socket} --state-dir {state}"
  # tsbox must know the private containerd's directories: that is where CRI looks for pod files.
  cmd+=" --containerd-root $work/ctrd/root --containerd-state $work/ctrd/state --containerd-address $work/ctrd/containerd.sock"
  echo "==> critest: handler $handler" >&2
  mkdir -p "$work" && cp -a "$images" "$work/images"
  CRITEST_WORK="$work" TSBOX_CMD="$cmd" bash "$tool/run-critest.sh" "$handler" > "$work.out" 2> "$work.err" || true
  tail -n 1 "$work.out" >&2
}
run default "$base/d"
run tsbox "$base/t"
node scripts/critest-compare.mjs "$base/d/results-default.json" "$base/t/results-tsbox.json" || {
  echo "--- critest on tsbox (stderr tail) ---" >&2
  tail -n 30 "$base/t.err" >&2
  exit 1
}
ok=1
