#!/bin/sh
# The first process of a test node booted by scripts/uml-node.sh, inside user-mode Linux. The
# kernel mounted the host's / read-only (hostfs) as root; this builds the node's own root, an
# overlay whose lower layer is that read-only view and whose upper layer lives on a tmpfs (so
# the host's files never change), adds what the node needs on top, and hands over to systemd.
#
# Set by uml-node.sh on the kernel command line (the kernel passes it in the environment):
#   tsbox_node_dir  the node's directory on the host: rw/ and root/ are empty mount points,
#                   share/ holds the unit's command and receives its output and exit status.
#   tsbox_node_modules  the kernel's modules (a host directory named after the kernel's release).
set -eu

fail() {
  echo "uml-node-init: $*" >&2
  # Without a working init the kernel panics and the node stops, which uml-node.sh reports.
  exit 1
}

dir="${tsbox_node_dir:?tsbox_node_dir not set on the kernel command line}"
release="$(uname -r)"
modules="${tsbox_node_modules:?tsbox_node_modules not set on the kernel command line}"
[ -d "$modules/kernel" ] || fail "$modules/kernel not found (scripts/install-uml.sh installs the kernel and its modules)"
[ "${modules##*/}" = "$release" ] || fail "$modules is not named after the kernel's release $release"

# overlay is a module of the UML kernel; insmod (kmod) needs no /lib/modules yet.
insmod "$modules/kernel/fs/overlayfs/overlay.ko" || fail "insmod overlay.ko failed"

mount -t tmpfs -o mode=0755 tsbox-node-rw "$dir/rw" || fail "tmpfs on $dir/rw failed"
mkdir "$dir/rw/upper" "$dir/rw/work"
mount -t overlay tsbox-node-root -o "lowerdir=/,upperdir=$dir/rw/upper,workdir=$dir/rw/work" "$dir/root" \
  || fail "overlay on $dir/root failed"
root="$dir/root"

# The node's own /tmp, and the shared directory (read-write hostfs) at a fixed place.
mount -t tmpfs -o mode=1777 tsbox-node-tmp "$root/tmp"
mkdir -p "$root/tsbox-node"
mount -t hostfs tsbox-node-share -o "$dir/share" "$root/tsbox-node" || fail "hostfs $dir/share failed"

# The kernel's modules where modprobe (and the kernel's module autoloading) look for them.
mkdir -p "$root/usr/lib/modules"
ln -sfn "$modules" "$root/usr/lib/modules/$release"

# Units: whatever the host's administrator enabled stays off (the node has no network and no
# disks of its own, and the tests run their own containerd and registry), and so does the
# console's login prompt; the command runs as a oneshot service that powers the node off when
# it ends, whatever its result.
units="$root/etc/systemd/system"
for wanted in "$units"/*.wants/*; do
  [ -e "$wanted" ] || [ -L "$wanted" ] || continue
  ln -sfn /dev/null "$units/${wanted##*/}"
done
ln -sfn /dev/null "$units/console-getty.service"
cp "$dir/share/tsbox-node.service" "$units/tsbox-node.service"
mkdir -p "$units/multi-user.target.wants"
ln -sfn ../tsbox-node.service "$units/multi-user.target.wants/tsbox-node.service"

# The overlay becomes the root of the mount namespace (not just of this process, as chroot
# would make it): whatever enters a mount namespace later (setns, as runc does) finds the
# overlay as its root, never the hostfs view below it.
mkdir -p "$root/.tsbox-node-oldroot"
cd "$root"
pivot_root . .tsbox-node-oldroot || fail "pivot_root into the overlay failed"
umount -l /.tsbox-node-oldroot || fail "cannot detach the old root"
rmdir /.tsbox-node-oldroot
cd /
exec /lib/systemd/systemd --log-target=console
