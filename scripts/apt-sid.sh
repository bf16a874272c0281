# Sourced by the install scripts: Debian sid among apt's sources with a low pin (nothing comes
# from it unless asked for by name), and apt-get update only when something is missing and
# apt's lists of sid are absent or older than six hours (sid's pool drops superseded versions).
sid_list=/etc/apt/sources.list.d/tsbox-sid.list
sid_pin=/etc/apt/preferences.d/tsbox-sid
if [ ! -f "$sid_list" ]; then
  printf '==> %s\n' "adding Debian sid with a low pin" >&2
  echo 'deb http://deb.debian.org/debian sid main' > "$sid_list"
  printf 'Package: *\nPin: release a=unstable\nPin-Priority: 100\n' > "$sid_pin"
fi
sid_updated=0
sid_apt_update() {
  [ "$sid_updated" = 0 ] || return 0
  sid_updated=1
  if [ -z "$(find /var/lib/apt/lists -maxdepth 1 -name '*_sid_main_binary-amd64_Packages*' -mmin -360 2>/dev/null)" ]; then
    printf '==> apt-get update\n' >&2
    apt-get update -qq
  fi
}
