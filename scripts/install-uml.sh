#!/usr/bin/env bash
# Installs what the cgroup v2 test node needs (scripts/uml-node.sh): a user-mode Linux kernel
# with its modules (overlay, bridge, veth, netfilter), kmod (insmod), and what Kubernetes' CRI
# validation suite installs on first use (its loopback registry and skopeo), since the node has
# no network. The node's init is the host's own systemd, its userland the host's root seen
# read-only through hostfs. Idempotent: does nothing when everything is installed.
#
# The kernel is Debian sid's user-mode-linux (7.x), not Debian 12's (6.1): the 6.1 kernel
# panics at init on a CPU with AMX ("ptrace set fp regs failed, errno = 14": its buffer for
# the host's extended FPU state is smaller than an AMX CPU's), and it runs the node's tests
# several times slower. sid's kernel needs a newer glibc than Debian 12's, so nothing of it is
# installed as a package: its .deb and sid's libc6 .deb are unpacked into
# /usr/local/lib/tsbox-uml/<version>, and the kernel binary's ELF interpreter and run path are
# pointed at that libc (patchelf). The host's libc and packages are untouched. uml-node.sh
# finds the kernel through the link /usr/local/lib/tsbox-uml/current.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

log() { printf '==> %s\n' "$*" >&2; }

if [ "$(id -u)" -ne 0 ]; then
  echo "install-uml: must run as root (apt-get)" >&2
  exit 1
fi
# shellcheck source=scripts/apt-sid.sh
. "$here/apt-sid.sh"

missing=()
[ -x /usr/sbin/insmod ] || [ -x /sbin/insmod ] || missing+=(kmod/bookworm)
[ -x /lib/systemd/systemd ] || missing+=(systemd/bookworm)
command -v docker-registry >/dev/null 2>&1 || missing+=(docker-registry/bookworm)
command -v skopeo >/dev/null 2>&1 || missing+=(skopeo/bookworm)
command -v patchelf >/dev/null 2>&1 || missing+=(patchelf/bookworm)
if [ "${#missing[@]}" -gt 0 ]; then
  sid_apt_update
  log "installing ${missing[*]}"
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  if [[ " ${missing[*]} " == *" docker-registry/bookworm "* ]] && [ -d /run/systemd/system ]; then
    # Its package starts a registry on :5000 under systemd; the validation suite runs its own.
    systemctl disable --now docker-registry.service >/dev/null
  fi
fi

base=/usr/local/lib/tsbox-uml
current="$base/current"
if [ ! -f "$current/.complete" ]; then
  sid_apt_update
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
  chmod 0777 "$work" # apt-get download runs as the _apt user
  log "downloading sid's user-mode-linux and libc6 (unpacked into $base, never installed)"
  (cd "$work" && apt-get download -qq user-mode-linux/sid libc6/sid)
  version="$(dpkg-deb -f "$work"/user-mode-linux_*.deb Version)"
  dir="$base/$version"
  rm -rf "$dir.new"
  mkdir -p "$dir.new/root"
  for deb in "$work"/*.deb; do dpkg-deb -x "$deb" "$dir.new/root"; done
  # Where the libc will be once the directory is renamed into place (below).
  libdir="$dir/root/usr/lib/x86_64-linux-gnu"
  [ -e "$dir.new${libdir#"$dir"}/ld-linux-x86-64.so.2" ] || { echo "install-uml: sid's libc6 has no ld-linux-x86-64.so.2" >&2; exit 1; }
  release="$(ls "$dir.new/root/usr/lib/uml/modules")"
  [ -n "$release" ] && [ -d "$dir.new/root/usr/lib/uml/modules/$release/kernel" ] || { echo "install-uml: no modules in the user-mode-linux package" >&2; exit 1; }
  cp "$dir.new/root/usr/bin/linux.uml" "$dir.new/linux.uml"
  patchelf --set-interpreter "$libdir/ld-linux-x86-64.so.2" --set-rpath "$libdir" "$dir.new/linux.uml"
  ln -sfn "root/usr/lib/uml/modules/$release" "$dir.new/modules"
  printf '%s\n' "$version" > "$dir.new/.complete"
  rm -rf "$dir"
  mv "$dir.new" "$dir"
  "$dir/linux.uml" --version >/dev/null || { echo "install-uml: $dir/linux.uml does not run" >&2; exit 1; }
  ln -sfn "$dir" "$current.new"
  mv -T "$current.new" "$current"
fi
log "user-mode-linux $(cat "$current/.complete") (kernel $("$current/linux.uml" --version)) in $(readlink -f "$current")"
