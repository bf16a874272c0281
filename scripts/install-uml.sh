#!/usr/bin/env bash
# Installs what the cgroup v2 test node needs (scripts/uml-node.sh): Debian 12's user-mode
# Linux kernel (with its modules: overlay, bridge, veth, netfilter) and kmod (insmod). The
# node's init is the host's own systemd, its userland the host's root seen read-only through
# hostfs, so nothing else is needed. Idempotent: does nothing when both are installed.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

log() { printf '==> %s\n' "$*" >&2; }

if [ "$(id -u)" -ne 0 ]; then
  echo "install-uml: must run as root (apt-get)" >&2
  exit 1
fi

missing=()
command -v linux.uml >/dev/null 2>&1 || [ -x /usr/bin/linux.uml ] || missing+=(user-mode-linux/bookworm)
[ -x /usr/sbin/insmod ] || [ -x /sbin/insmod ] || missing+=(kmod/bookworm)
[ -x /lib/systemd/systemd ] || missing+=(systemd/bookworm)
if [ "${#missing[@]}" -gt 0 ]; then
  log "apt-get update"
  apt-get update -qq
  log "installing ${missing[*]}"
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
log "$(dpkg-query -W -f '${Package} ${Version}' user-mode-linux)"
