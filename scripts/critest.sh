#!/usr/bin/env bash
# Kubernetes' CRI validation suite (critest, from ../shared/tools/critest or CRITEST_DIR) on
# tsbox pods, against containerd's own podsandbox in the same run: every spec that passes with
# containerd's default handler must pass with handler tsbox, on each of tsbox's two routes for a
# pod's containers: the Task API route (version 3: tsbox runs them; the default) and the shim
# route (version 2: containerd's runc shim; --task-api-handlers ''). Needs root and a built tsbox.
# CRITEST_ROUTES (default "shim task") chooses the routes. CRITEST_CONTAINERD names a release
# that scripts/install-containerd.sh unpacked into .cache/containerd (e.g. 2.3.4; default the
# containerd on PATH), CRITEST_BIN_DIR another critest (e.g. ../shared/tools/critest/bin-v1.36);
# podsandbox's results are then kept under a name of their own (critest-podsandbox-2.3.4-bin-v1.36.json).
#
# A spec that fails only on tsbox is run again, alone (--ginkgo.focus), up to twice, when at
# most three did: containerd 2.1 has races on the version-2 route that a run hits now and then
# (a StopPodSandbox whose kill meets a pod's runc shim as it ends, with the pod's last container,
# fails with "ttrpc: closed"; see DESIGN.md, "Stop and CRI's view of the pod's containers").
# Only a spec that fails on every rerun counts; the output says which specs were rerun and how.
#
#   scripts/critest.sh            both runs and the comparison; podsandbox's results are kept
#                                 in .cache/critest-podsandbox.json for --reference
#   scripts/critest.sh --podsandbox
#                                 podsandbox only: its results kept in
#                                 .cache/critest-podsandbox.json, for --reference
#   scripts/critest.sh --reference FILE
#                                 tsbox only, against podsandbox's results in FILE (an earlier
#                                 run's, on another node of the same machine): stricter, never
#                                 looser, than a podsandbox run here, since a spec podsandbox
#                                 would fail here must still pass on tsbox
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
if [ -n "${CRITEST_CONTAINERD:-}" ]; then
  release_dir="$PWD/.cache/containerd/$CRITEST_CONTAINERD"
  [ -x "$release_dir/containerd" ] || { echo "critest: no containerd $CRITEST_CONTAINERD in $release_dir (run scripts/install-containerd.sh)" >&2; exit 1; }
  export PATH="$release_dir:$PATH"
fi
[ -z "${CRITEST_BIN_DIR:-}" ] || export CRITEST_BIN_DIR="$(cd "$CRITEST_BIN_DIR" && pwd)"
# podsandbox's results, named after the containerd and critest they came from.
reference_file=".cache/critest-podsandbox${CRITEST_CONTAINERD:+-$CRITEST_CONTAINERD}${CRITEST_BIN_DIR:+-$(basename "$CRITEST_BIN_DIR")}.json"
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
reference=""
podsandbox_only=0
[ "${1:-}" = --podsandbox ] && podsandbox_only=1
if [ "${1:-}" = --reference ]; then
  reference="$(cd "$(dirname "${2:?--reference needs a results file}")" && pwd)/$(basename "$2")"
  [ -f "$reference" ] || { echo "critest: no podsandbox results at $reference (run scripts/critest.sh first)" >&2; exit 1; }
fi
base="$(mktemp -d /tmp/crt.XXXXXX)"
# Kept when something failed, for the logs (containerd's, tsbox's, critest's) in it.
trap 'if [ "$ok" = 1 ]; then rm -rf "$base"; else echo "critest: work dir kept: $base" >&2; fi' EXIT
ok=0
# As an operator starts tsbox: containerd's config is the only containerd setting; tsbox takes
# containerd's root, state and socket (all in the private containerd's work dir) from it.
# By default the handler's pods' containers are run by tsbox itself (the Task API route).
task_cmd="node --max-semi-space-size=1 dist/src/main.js serve --socket {socket} --state-dir {state} --containerd-config {containerd_config}"
# The version-2 route: the same, with no handler on the Task API (containerd's runc shim per pod).
shim_cmd="$task_cmd --task-api-handlers ''"
tsbox_cmd="$task_cmd"
run() { # handler work-dir [result-name focus]
  local handler="$1" work="$2" name="${3:-}" focus="${4:-}"
  local out="$work.out" err="$work.err"
  [ -z "$name" ] || { out="$work.$name.out"; err="$work.$name.err"; }
  echo "==> critest: handler $handler${name:+ ($name)}${route:+, $route route}" >&2
  if [ ! -d "$work/images" ]; then
    mkdir -p "$work" && cp -a "$images" "$work/images"
    # critest v1.36's image specs also pull registry.k8s.io/pause:3.9 (from two registry names,
    # counting its tags): an image no other spec pulls stands in for it (the digest spec that
    # pulls test-image-digest is skipped here), so that no sandbox image shares its tags.
    printf '%s\n' "test-image-digest pause:3.9" >> "$work/images/images.list"
  fi
  local attempt
  for attempt in 1 2; do
    CRITEST_WORK="$work" TSBOX_CMD="$tsbox_cmd" RESULT_NAME="${name:-$handler}" FOCUS="$focus" \
      bash "$tool/run-critest.sh" "$handler" > "$out" 2> "$err" || true
    # critest ran (its log exists): its results say the rest.
    [ -f "$work/results/${name:-$handler}/critest.log" ] && break
    # The harness failed before critest started (its registry, an image push, containerd):
    # what it said and the log it named, then one more try, saying so.
    echo "critest: the harness stopped before critest ran (attempt $attempt); its stderr ($err), its end:" >&2
    tail -n 8 "$err" >&2 || true
    local named
    named="$(grep -o '(see [^)]*)' "$err" | tail -n 1 | sed 's/^(see //; s/)$//' || true)"
    if [ -n "$named" ] && [ -f "$named" ]; then
      echo "--- $named, its end ---" >&2
      tail -n 20 "$named" >&2
    fi
  done
  tail -n 1 "$out" >&2
}
# A spec's full name as a Go regexp that matches it literally (--ginkgo.focus).
focus_of() { node -e 'process.stdout.write(process.argv[1].replace(/[\\.+*?()|[\]{}^$]/g, "\\$&"))' "$1"; }
# Whether a results file lists the spec as passed.
passed_in() { node -e 'const r = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8")); process.exit(r.passed.includes(process.argv[2]) ? 0 : 1)' "$1" "$2"; }
route=""
if [ -z "$reference" ]; then
  rm -f "$reference_file"
  run default "$base/d"
  if [ -f "$base/d/results-default.json" ]; then
    # A containerd race (a StopPodSandbox whose kill meets the ending runc shim: "ttrpc:
    # closed") hits podsandbox pods too on a busy machine: a spec that failed on podsandbox is
    # run again alone, as on tsbox, and counts as passed for the reference only when a rerun
    # passes (the results file names it).
    reruns=()
    i=0
    while IFS= read -r spec; do
      i=$((i + 1))
      echo "==> critest: \"$spec\" failed on podsandbox: running it again, alone (up to twice)" >&2
      for attempt in 1 2; do
        name="default-rerun-$i-$attempt"
        run default "$base/d" "$name" "$(focus_of "$spec")" < /dev/null
        [ -f "$base/d/results-$name.json" ] || { echo "critest: the rerun left no results (see $base/d.$name.err)" >&2; continue; }
        reruns+=("$base/d/results-$name.json")
        passed_in "$base/d/results-$name.json" "$spec" && break
      done
    done < <(node scripts/critest-compare.mjs --failed-list "$base/d/results-default.json")
    node scripts/critest-compare.mjs --merge-reruns "$base/d/results-default.json" "${reruns[@]}" > "$reference_file"
  fi
  reference="$reference_file"
  if [ "$podsandbox_only" = 1 ]; then
    [ -f "$reference_file" ] || { echo "critest: podsandbox's run left no results (see $base/d.err)" >&2; exit 1; }
    ok=1
    exit 0
  fi
else
  echo "==> critest: podsandbox's results from $reference" >&2
fi

check_route() { # route: runs the suite on tsbox pods of that route, reruns, compares
  route="$1"
  local work="$base/$route"
  if [ "$route" = task ]; then tsbox_cmd="$task_cmd"; else tsbox_cmd="$shim_cmd"; fi
  run tsbox "$work"
  # The route the suite ran on, as tsbox logged it at start-up for the handler.
  local want='"handler":"tsbox","route":"version-2"'
  [ "$route" = shim ] || want='"handler":"tsbox","route":"task-api"'
  if ! grep -qF "$want" "$work/results/tsbox/tsbox.log"; then
    echo "critest: tsbox did not put handler tsbox on the $route route (no $want in $work/results/tsbox/tsbox.log)" >&2
    # What the run said, here: the work dir may be on a node that is gone once it has stopped.
    echo "--- the run's stderr ($work.err), its end ---" >&2
    tail -n 40 "$work.err" >&2 || true
    return 1
  fi
  local reruns=() i=0 spec focus attempt name result
  while IFS= read -r spec; do
    i=$((i + 1))
    echo "==> critest: \"$spec\" failed on tsbox ($route route) but passes on podsandbox: running it again, alone (up to twice)" >&2
    focus="$(focus_of "$spec")"
    for attempt in 1 2; do
      name="tsbox-rerun-$i-$attempt"
      run tsbox "$work" "$name" "$focus" < /dev/null
      result="$work/results-$name.json"
      if [ ! -f "$result" ]; then
        echo "critest: the rerun left no results (see $work.$name.err)" >&2
        continue
      fi
      reruns+=("$result")
      passed_in "$result" "$spec" && break
    done
  done < <(node scripts/critest-compare.mjs --rerun-list "$reference" "$work/results-tsbox.json")
  echo "==> critest: $route route" >&2
  node scripts/critest-compare.mjs "$reference" "$work/results-tsbox.json" "${reruns[@]}" || {
    echo "--- critest on tsbox, $route route (stderr tail) ---" >&2
    tail -n 30 "$work.err" >&2
    return 1
  }
}
failed=0
for r in ${CRITEST_ROUTES:-shim task}; do
  case "$r" in shim|task) ;; *) echo "critest: unknown route '$r' in CRITEST_ROUTES (shim, task)" >&2; exit 2 ;; esac
done
for r in ${CRITEST_ROUTES:-shim task}; do check_route "$r" || failed=1; done
[ "$failed" = 0 ] || exit 1
ok=1
