#!/usr/bin/env bash
# The .deb's maintainer scripts (packaging/debian/), in a Debian root where the package is
# installed: tests/package/test_package.sh runs it after its checks. The root has no systemd, so
# first the scripts must work without it (a reinstall, as an upgrade runs them); then systemctl,
# deb-systemd-invoke and deb-systemd-helper are replaced by stubs that log their arguments and
# /run/systemd/system is made, as on a machine booted with systemd, and the scripts must do what
# debhelper's dh_installsystemd --no-enable --no-start does for ztraind.service:
#   upgrade: daemon-reload and try-restart (a running ztraind runs the new programs), no stop;
#   remove:  stop before the files go (no ztraind left running a deleted binary), daemon-reload;
#   purge:   deb-systemd-helper purge;
# and neither remove nor purge deletes the service's data in /var/lib/ztrain (Debian policy:
# remove keeps it; this package keeps it on purge too, docs/deploy/systemd.md). Last, without
# systemd again, install, remove and purge succeed.
# Usage: tests/package/check_maintainer_scripts.sh ROOT DEB (DEB: its path inside ROOT)
set -euo pipefail
root="$1"
deb="$2"
fail() { echo "test-package: FAIL: $*" >&2; exit 1; }
in_root() { chroot "$root" /usr/bin/env -i PATH=/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin \
  HOME=/root LANG=C.UTF-8 DEBIAN_FRONTEND=noninteractive "$@"; }
dpkg_quiet() { in_root "$@" > "$root/tmp/dpkg.log" 2>&1 || { cat "$root/tmp/dpkg.log"; fail "$*"; }; }

for s in postinst prerm postrm; do
  [ -x "$root/var/lib/dpkg/info/ztrain.$s" ] || fail "the package has no $s"
done
dpkg_quiet dpkg -i "$deb"
echo "ok    the maintainer scripts run without systemd (install, reinstall)"

calls="$root/tmp/systemd-calls"
stubs=(systemctl deb-systemd-invoke deb-systemd-helper)
for s in "${stubs[@]}"; do
  # Each call, and again marked if the package's files were gone by then.
  printf '#!/bin/sh\necho "%s $*" >> /tmp/systemd-calls\n[ -e /usr/bin/ztraind ] || echo "%s $* (files removed)" >> /tmp/systemd-calls\n' \
    "$s" "$s" > "$root/usr/local/sbin/$s"
  chmod 755 "$root/usr/local/sbin/$s"
done
mkdir -p "$root/run/systemd/system" "$root/var/lib/ztrain/runs/job1"
echo checkpoint > "$root/var/lib/ztrain/runs/job1/ckpt"
expect() {  # what, expected call... : each expected call was made, then forget the calls
  local what="$1"; shift
  for c in "$@"; do
    grep -qxF "$c" "$calls" 2>/dev/null || { cat "$calls" 2>/dev/null; fail "$what: no '$c'"; }
  done
  rm -f "$calls"
}

dpkg_quiet dpkg -i "$deb"
expect "upgrade" "systemctl --system daemon-reload" "deb-systemd-invoke try-restart ztraind.service"
echo "ok    an upgrade reloads systemd and restarts ztraind if it runs"
dpkg_quiet dpkg --remove ztrain
[ ! -e "$root/usr/bin/ztraind" ] || fail "remove left /usr/bin/ztraind"
! grep -qF "stop ztraind.service (files removed)" "$calls" \
  || fail "remove stopped ztraind only after its files were removed"
expect "remove" "deb-systemd-invoke stop ztraind.service" "systemctl --system daemon-reload"
[ -f "$root/var/lib/ztrain/runs/job1/ckpt" ] || fail "remove deleted /var/lib/ztrain"
echo "ok    remove stops ztraind and keeps /var/lib/ztrain"
dpkg_quiet dpkg --purge ztrain
expect "purge" "deb-systemd-helper purge ztraind.service"
[ -f "$root/var/lib/ztrain/runs/job1/ckpt" ] || fail "purge deleted /var/lib/ztrain"
echo "ok    purge forgets the unit's state and keeps /var/lib/ztrain"

for s in "${stubs[@]}"; do rm -f "$root/usr/local/sbin/$s"; done
rmdir "$root/run/systemd/system" "$root/run/systemd"
dpkg_quiet dpkg -i "$deb"
dpkg_quiet dpkg --remove ztrain
dpkg_quiet dpkg --purge ztrain
echo "ok    install, remove and purge without systemd"
