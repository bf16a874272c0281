#!/usr/bin/env bash
# Installs what the cgroup v2 test node needs (scripts/uml-node.sh): Debian 12's user-mode
# Linux kernel (with its modules: overlay, bridge, veth, netfilter) and kmod (insmod). The
# node's init is the host's own systemd, its userland the host's root seen read-only through
# hostfs; the node has no network, so what Kubernetes' CRI validation suite installs on first
# use (its loopback registry and skopeo) is installed here, on the host. Idempotent: does
# nothing when everything is installed.
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
command -v docker-registry >/dev/null 2>&1 || missing+=(docker-registry/bookworm)
command -v skopeo >/dev/null 2>&1 || missing+=(skopeo/bookworm)
if [ "${#missing[@]}" -gt 0 ]; then
  log "apt-get update"
  apt-get update -qq
  log "installing ${missing[*]}"
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  if [[ " ${missing[*]} " == *" docker-registry/bookworm "* ]] && [ -d /run/systemd/system ]; then
    # Its package starts a registry on :5000 under systemd; the validation suite runs its own.
    systemctl disable --now docker-registry.service >/dev/null
  fi
fi
log "$(dpkg-query -W -f '${Package} ${Version}' user-mode-linux)"
