#!/usr/bin/env bash
# Installs containerd 2.x (and runc) from Debian's sid suite on Debian 12, pinned low so that
# nothing else on the machine is upgraded. Idempotent: does nothing when containerd >= 2 is
# already on PATH. Also installs musl-tools (the pod's programs' C library) and unpacks the reference .proto packages the wire tests compare against
# into .cache/debian-protos (never installed, only read).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${TSBOX_CACHE_DIR:-$here/.cache}"

log() { printf '==> %s\n' "$*" >&2; }

if [ "$(id -u)" -ne 0 ]; then
  echo "install-containerd: must run as root (apt-get)" >&2
  exit 1
fi

# shellcheck source=scripts/apt-sid.sh
. "$here/scripts/apt-sid.sh"

have_containerd2() {
  command -v containerd >/dev/null 2>&1 && containerd --version 2>/dev/null | grep -Eq ' v?2\.'
}

if ! have_containerd2; then
  sid_apt_update
  log "installing containerd from sid"
  # Refuse anything that would upgrade libc6 or other base packages.
  if apt-get -s install --no-install-recommends containerd/sid runc 2>/dev/null | grep -q '^Inst libc6 '; then
    echo "install-containerd: containerd/sid would upgrade libc6; refusing" >&2
    exit 1
  fi
  apt-get install -y -qq --no-install-recommends containerd/sid runc >/dev/null
  # The package's postinst may start a system containerd; tests run their own.
  systemctl stop containerd >/dev/null 2>&1 || true
fi
log "$(containerd --version)"

# The install tests check tsbox's systemd unit with systemd-analyze verify.
if ! command -v systemd-analyze >/dev/null 2>&1; then
  sid_apt_update
  log "installing systemd (for systemd-analyze)"
  apt-get install -y -qq --no-install-recommends systemd >/dev/null
fi

# The program a pod runs (native/, scripts/build-shim.mjs) is linked with musl where it is
# installed: Debian's musl-tools, from the release itself.
if ! command -v musl-gcc >/dev/null 2>&1; then
  sid_apt_update
  log "installing musl-tools (the C library the pod's programs are linked with)"
  apt-get install -y -qq --no-install-recommends musl-tools >/dev/null
fi

# Downloads Debian packages (never installs them) and unpacks them all into DEST.
unpack_debs() {
  local dest=$1 debs
  shift
  debs=$(mktemp -d)
  mkdir -p "$dest"
  chmod 0777 "$debs" # apt-get download runs as the _apt user
  (cd "$debs" && apt-get download -qq "$@")
  for deb in "$debs"/*.deb; do dpkg-deb -x "$deb" "$dest"; done
  rm -rf "$debs"
}

# The reference packages: containerd's API, containerd/cgroups, Kubernetes' CRI, ttrpc (its
# Request and Response) and gogo's copy of googleapis (google.rpc.Status, which ttrpc's
# Response carries). The marker names them, so adding one unpacks the set anew.
protos="$cache/debian-protos"
proto_debs="golang-github-containerd-containerd-api-dev/sid golang-github-containerd-cgroups-dev/sid golang-k8s-cri-api-dev/sid golang-github-containerd-ttrpc-dev/sid golang-github-gogo-googleapis-dev/sid"
if [ "$(cat "$protos/.complete" 2>/dev/null)" != "$proto_debs" ]; then
  sid_apt_update
  log "unpacking reference .proto packages into $protos"
  rm -rf "$protos"
  # shellcheck disable=SC2086 # one word per package
  unpack_debs "$protos/root" $proto_debs
  printf '%s' "$proto_debs" > "$protos/.complete"
fi

# A static busybox for the images the end-to-end tests build (pods with containers, no
# registry): unpacked from Debian 12's package into the cache, never installed.
busybox="$cache/busybox"
if [ ! -x "$busybox/bin/busybox" ]; then
  sid_apt_update
  log "unpacking busybox-static into $busybox"
  rm -rf "$busybox"
  unpack_debs "$busybox/root" busybox-static/bookworm
  mkdir -p "$busybox/bin" && cp "$busybox/root/bin/busybox" "$busybox/bin/busybox"
  rm -rf "$busybox/root"
fi

# CNI plugins (bridge, host-local, loopback) for the pods with a network namespace of their
# own; the tests give them addresses in 127.0.0.0/8 only, so nothing leaves the machine.
if [ ! -x /usr/lib/cni/bridge ] || [ ! -x /usr/lib/cni/host-local ] || [ ! -x /usr/lib/cni/loopback ]; then
  sid_apt_update
  log "installing containernetworking-plugins"
  apt-get install -y -qq --no-install-recommends containernetworking-plugins >/dev/null
fi

# The containerd releases nodes run beside Debian's 2.1 (2.3, the long-term release, and 2.4),
# for the tests that run on them: unpacked from ../shared/tools/containerd (or
# TSBOX_CONTAINERD_RELEASES), checked against its SHA256SUMS, into .cache/containerd/VERSION
# (containerd, ctr, containerd-shim-runc-v2). Never installed.
releases="${TSBOX_CONTAINERD_RELEASES:-$here/../shared/tools/containerd}"
if [ ! -f "$releases/SHA256SUMS" ]; then
  echo "install-containerd: $releases/SHA256SUMS not found: the containerd 2.3 and 2.4 archives are needed (TSBOX_CONTAINERD_RELEASES names their folder)" >&2
  exit 1
fi
while read -r sum archive; do
  version="${archive#containerd-}"
  version="${version%-linux-amd64.tar.xz}"
  dest="$cache/containerd/$version"
  if [ "$(cat "$dest/.sha256" 2>/dev/null)" = "$sum" ] && [ -x "$dest/containerd" ]; then continue; fi
  log "unpacking containerd $version into $dest"
  (cd "$releases" && printf '%s  %s\n' "$sum" "$archive" | sha256sum --check --quiet -)
  rm -rf "$dest" && mkdir -p "$dest"
  tar -C "$dest" -xJf "$releases/$archive"
  # The archive's files may sit in a bin/ folder: the programs go to the top.
  if [ -d "$dest/bin" ]; then mv "$dest"/bin/* "$dest"/ && rmdir "$dest/bin"; fi
  for program in containerd ctr containerd-shim-runc-v2; do
    [ -x "$dest/$program" ] || { echo "install-containerd: $archive has no $program" >&2; exit 1; }
  done
  printf '%s' "$sum" > "$dest/.sha256"
done < "$releases/SHA256SUMS"
