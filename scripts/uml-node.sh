#!/usr/bin/env bash
# Boots a cgroup v2 test node with systemd as init under user-mode Linux, runs one command in
# it as a systemd oneshot service, prints the command's output as it comes and exits with the
# command's exit status. The node is an ordinary process tree on the host (no KVM): its root
# is an overlay of the host's / (read-only) under a tmpfs, so the host's files are unchanged
# afterwards; nothing of it is left running when this script returns, whatever happened.
#
#   scripts/uml-node.sh [options] [--] COMMAND [ARG...]
#
#   --repo DIR          directory the command starts in (default: this script's repository)
#   --timeout SECONDS   bound on the whole run, boot included (default 3600); when it is hit
#                       the node is killed and the exit status is 124. A kernel panic ends
#                       the run at once with exit status 3 and the kernel's reason on stderr
#   --mem SIZE          the node's memory (default 4G)
#   --env NAME=VALUE    set in the command's environment (repeatable); PATH and every TSBOX_*
#                       and CRITEST_* variable of the caller are passed on anyway
#   --console FILE      keep the node's console (kernel and systemd messages) in FILE
#
# Inside the node the command runs as root in tsbox-node.service (Delegate=yes) after
# multi-user.target, with the repository and the whole host file system at their usual paths
# (writes go to the node's tmpfs), its own /tmp, no network but loopback, and /tsbox-node, a
# directory shared with the host (it holds the command's output). Two nodes at most run at
# once on a machine (each keeps a core busy). Needs root and scripts/install-uml.sh.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
timeout=3600
poweroff_limit=60
mem=4G
console=""
envs=()

usage() { sed -n '2,25p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }
die() { echo "uml-node: $*" >&2; exit 2; }

while [ $# -gt 0 ]; do
  case "$1" in
    --repo) repo="$(cd "${2:?--repo needs a directory}" && pwd)"; shift 2 ;;
    --timeout) timeout="${2:?--timeout needs seconds}"; shift 2 ;;
    --mem) mem="${2:?--mem needs a size}"; shift 2 ;;
    --env) [[ "${2:-}" == [A-Za-z_]*=* ]] || die "--env needs NAME=VALUE, not '${2:-}'"; envs+=("$2"); shift 2 ;;
    --console) console="${2:?--console needs a file}"; shift 2 ;;
    -h|--help) usage ;;
    --) shift; break ;;
    -*) die "unknown option $1" ;;
    *) break ;;
  esac
done
[ $# -gt 0 ] || usage
[[ "$timeout" =~ ^[1-9][0-9]*$ ]] || die "--timeout must be a number of seconds, not '$timeout'"
[ "$(id -u)" -eq 0 ] || die "must run as root (the node reads the host's files as root)"
# The kernel scripts/install-uml.sh installed (or another one's directory: linux.uml, modules/).
kernel_dir="$(readlink -f "${TSBOX_UML_KERNEL_DIR:-/usr/local/lib/tsbox-uml/current}" || true)"
uml="$kernel_dir/linux.uml"
[ -x "$uml" ] && [ -d "$kernel_dir/modules/kernel" ] \
  || die "no user-mode Linux kernel in ${TSBOX_UML_KERNEL_DIR:-/usr/local/lib/tsbox-uml/current} (linux.uml, modules/): run scripts/install-uml.sh (as root)"
[[ "$here$repo" != *[[:space:]]* ]] || die "the repository path must not contain spaces (it goes on the kernel command line)"

# A node keeps one core busy: at most two run at once on a machine (lock slots
# /tmp/tsbox-uml-node.lock.1 and .2); a third waits for the first slot.
slot=""
for n in 1 2; do
  exec 9>"/tmp/tsbox-uml-node.lock.$n"
  if flock -n 9; then slot=$n; break; fi
  exec 9>&-
done
if [ -z "$slot" ]; then
  echo "uml-node: two nodes already run on this machine; waiting for the first (/tmp/tsbox-uml-node.lock.1)" >&2
  exec 9>/tmp/tsbox-uml-node.lock.1
  flock 9
fi

node="$(mktemp -d /tmp/tsbox-uml-node.XXXXXX)"
share="$node/share"
mkdir "$node/rw" "$node/root" "$share" "$node/uml"
pid=""

# Everything the node runs on the host carries this on its command line (UML's processes
# are copies of the kernel's process).
marker="uml_dir=$node/uml"
node_processes() {
  # "[u]ml_dir=..." matches the marker but not grep's own command line.
  grep -lsa -- "[u]${marker#u}" /proc/[0-9]*/cmdline | sed 's|^/proc/\([0-9]*\)/cmdline$|\1|' | tr '\n' ' ' | sed 's/ $//'
  return 0
}

stop_node() {
  if [ -n "$pid" ]; then
    # unshare --kill-child: its death kills the kernel's process, whose pid namespace takes
    # every other process of the node with it.
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    pid=""
  fi
  local left tries=0
  while left="$(node_processes)"; [ -n "$left" ]; do
    if [ "$tries" -ge 100 ]; then
      echo "uml-node: processes of the node are still alive: $left" >&2
      return 1
    fi
    kill -KILL $left 2>/dev/null || true
    sleep 0.1
    tries=$((tries + 1))
  done
}

# The console's last lines, without systemd's "Job ... running" progress lines.
console_tail() {
  echo "--- node console (last $1 lines) ---" >&2
  sed 's/\x1b\[[0-9;]*[A-Za-z]//g; s/\x1bM//g; s/\r//g' "$node/console.log" | grep -av 'Job .* running (' | grep -av '^[[:space:]]*$' | tail -n "$1" >&2
}

cleanup() {
  local rc=$?
  stop_node || rc=1
  [ -n "$console" ] && cp "$node/console.log" "$console" 2>/dev/null
  rm -rf "$node"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# The command, as a script the service runs.
{
  echo '#!/bin/bash'
  printf 'export %q\n' "PATH=$PATH"
  while IFS='=' read -r name _; do
    case "$name" in TSBOX_*|CRITEST_*) printf 'export %q\n' "$name=${!name}" ;; esac
  done < <(env)
  for e in "${envs[@]}"; do printf 'export %q\n' "$e"; done
  printf 'cd %q\n' "$repo"
  printf 'exec'
  printf ' %q' "$@"
  printf '\n'
} > "$share/command"
cat > "$share/run" <<'EOF'
#!/bin/bash
# Runs the command, then records its exit status where the host reads it.
touch /tsbox-node/started
bash /tsbox-node/command > /tsbox-node/output 2>&1 < /dev/null
echo $? > /tsbox-node/status.new
mv /tsbox-node/status.new /tsbox-node/status
EOF
cat > "$share/tsbox-node.service" <<'EOF'
[Unit]
Description=The command given to scripts/uml-node.sh
After=multi-user.target
SuccessAction=poweroff-force
FailureAction=poweroff-force

[Service]
Type=oneshot
Environment=HOME=/root
ExecStart=/bin/bash /tsbox-node/run
Delegate=yes
TimeoutStartSec=infinity
EOF

# UML keeps the node's memory in a file in TMPDIR: /dev/shm when it has room for all of it
# (a container's /dev/shm is often 64 MiB), else the node's own directory.
mem_bytes="$(numfmt --from=iec "$mem")"
shm_free="$(df --output=avail -B1 /dev/shm 2>/dev/null | tail -n 1 | tr -d ' ' || echo 0)"
memdir=/dev/shm
if ! [ "${shm_free:-0}" -gt "$mem_bytes" ] 2>/dev/null; then memdir="$node/uml"; fi

# Boots the node and waits for it to power off (or for a bound); sets $reason when it hit one,
# and $panic when the kernel panicked (user-mode Linux may then hang instead of exiting).
boot() {
  started=$SECONDS
  reason=""
  panic=""
  # The node: the host's / as a read-only hostfs root, our init, a cgroup v2 systemd; the
  # console goes to a file, no other terminal; UML's own files stay in the node's directory.
  TMPDIR="$memdir" unshare --pid --fork --kill-child -- "$uml" \
    "mem=$mem" umid=tsbox-node "$marker" \
    root=/dev/root rootfstype=hostfs rootflags=/ ro \
    "init=$here/uml-node-init.sh" "tsbox_node_dir=$node" "tsbox_node_modules=$(readlink -f "$kernel_dir/modules")" \
    systemd.unified_cgroup_hierarchy=1 systemd.show_status=error \
    con=null ssl=null con0=null,fd:1 \
    > "$node/console.log" 2>&1 < /dev/null &
  pid=$!

  tail -n +1 -F --pid="$pid" "$share/output" 2>/dev/null &
  tailer=$!

  local boot_limit=$(( timeout < 180 ? timeout : 180 )) elapsed finished=""
  while kill -0 "$pid" 2>/dev/null; do
    elapsed=$((SECONDS - started))
    # The command's status is recorded: the run is over whether or not the node manages to
    # power off (user-mode Linux can hang in its halt, reaping the host processes that were
    # the node's). Past a bound, say what those processes were doing and kill them.
    if [ -f "$share/status" ]; then
      [ -n "$finished" ] || finished=$SECONDS
      if [ $((SECONDS - finished)) -ge "$poweroff_limit" ]; then
        echo "uml-node: the command finished but the node did not power off within ${poweroff_limit} s; killing it. Its processes on the host:" >&2
        local p
        for p in $(node_processes); do
          echo "  $p $(tr '\0' ' ' < "/proc/$p/cmdline" 2>/dev/null | cut -c1-80) state=$(awk '{print $3}' "/proc/$p/stat" 2>/dev/null) wchan=$(cat "/proc/$p/wchan" 2>/dev/null)" >&2
        done
        console_tail 15
        break
      fi
    fi
    if grep -saq 'Kernel panic' "$node/console.log"; then
      panic=1
      reason="the node's kernel panicked after $elapsed s"
      break
    fi
    if [ ! -e "$share/started" ] && [ "$elapsed" -ge "$boot_limit" ]; then
      reason="the node did not start the command within ${boot_limit} s of booting"
      break
    fi
    if [ "$elapsed" -ge "$timeout" ]; then
      reason="the node did not finish within --timeout ${timeout} s; killed"
      break
    fi
    sleep 1
  done
  stop_node
  wait "$tailer" 2>/dev/null || true
}

# The kernel's own words before and at its panic: the lines that say what failed.
panic_lines() {
  sed 's/\x1b\[[0-9;]*[A-Za-z]//g; s/\r//g' "$node/console.log" \
    | grep -av 'Kernel command line' | grep -aiE 'uml-node-init|panic|failed|error|errno|unable|cannot|not syncing|Attempted to kill' | tail -n 12 >&2
}

# A kernel panic fails the run at once, with the kernel's reason: booting again would panic
# again (a kernel that cannot run on this CPU, a broken module or init).
exit_if_panicked() {
  [ -n "$panic" ] || return 0
  echo "uml-node: $reason ($(readlink -f "$uml") $("$uml" --version 2>/dev/null)); the kernel said:" >&2
  panic_lines
  exit 3
}

boot
exit_if_panicked
# A node that never reached the command (its init failed before it, or it stopped) is booted
# once more, saying so: that is the machine, not the command under test.
if [ ! -e "$share/started" ]; then
  echo "uml-node: the node did not reach the command (${reason:-it stopped}); console tail, then one more boot:" >&2
  console_tail 30
  boot
  exit_if_panicked
fi

if [ -n "$reason" ]; then
  echo "uml-node: $reason" >&2
  console_tail 30
  exit 124
fi
if [ ! -f "$share/status" ]; then
  echo "uml-node: the node stopped before the command finished (after $((SECONDS - started)) s)" >&2
  console_tail 30
  exit 1
fi
echo "uml-node: node up, ran and stopped in $((SECONDS - started)) s" >&2
exit "$(cat "$share/status")"
