#!/usr/bin/env bash
# `make test-package`: the Debian package as a user gets it. Runs `make package` (the programs
# built for installing in build-package/: prefix /usr, the dashboard in /usr/share/ztrain/web,
# the CPU kernels for any x86-64, no tests, no CUDA; the .deb made with CPack), checks the
# packaged programs themselves (tests/package/check_portable.py: no instruction beyond x86-64's
# baseline outside the kernels picked at run time; ztraind's default --web-dir is
# /usr/share/ztrain/web), installs the .deb with apt into a fresh Debian 12 root (debootstrap
# minbase, kept for a week in /var/tmp/ztrain-package/ as the container test keeps its base),
# and there, from the installed files only:
#   - the programs, man pages, completions, unit and examples are where packaging/ says;
#   - the demo job from /usr/share/doc/ztrain/examples/demo trains (its data made from the
#     installed documentation, since the package holds no C sources) and samples;
#   - ztraind with no --web-dir serves the dashboard and Debian's Chart.js, and the job through
#     the CLI's submit/watch;
# and then the maintainer scripts for ztraind.service, on upgrade, remove and purge, with and
# without systemd (tests/package/check_maintainer_scripts.sh), and lintian's verdict on the .deb
# where lintian is installed.
# Needs root (chroot, mounts) and a Debian mirror. Usage: tests/package/test_package.sh [JOBS]
set -euo pipefail
root_dir="$(cd "$(dirname "$0")/../.." && pwd)"
jobs="${1:-2}"
build="$root_dir/build-package"
cache=/var/tmp/ztrain-package
chroot_dir="$cache/root"

echo "test-package: make package (the programs for /usr in $build)"
log="$(mktemp)"
make -C "$root_dir" package JOBS="$jobs" PACKAGE_BUILD="$build" > "$log" 2>&1 \
  || { tail -30 "$log"; exit 1; }
rm -f "$log"
deb="$(ls "$build"/ztrain_*.deb)"
echo "test-package: $(basename "$deb"): $(dpkg-deb -f "$deb" Depends)"
# The control file's description as `apt show` prints it: continuation lines of text (Debian
# policy 5.6.13), none beginning with the ';' of a CMake list, none over 80 characters.
description="$(dpkg-deb -f "$deb" Description)"
! grep -nE '^ ?;|.{81}' <<<"$description" \
  || { echo "test-package: FAIL: the package's Description has a line above"; exit 1; }
echo "ok    the package's Description is $(wc -l <<<"$description") lines of text"

# The packaged programs, before anything is installed: they must run on any x86-64 CPU (no
# -march=native code outside the kernels picked at run time) and find the installed dashboard.
unpacked="$(mktemp -d)"
trap 'rm -rf "$unpacked"' EXIT
dpkg-deb -x "$deb" "$unpacked"
/usr/bin/python3 "$root_dir/tests/package/check_portable.py" \
  "$unpacked/usr/bin/ztrain-worker" "$unpacked/usr/bin/ztraind" "$unpacked/usr/bin/ztrain"
web_dir="$("$unpacked/usr/bin/ztraind" --help \
  | sed -n 's/.*--web-dir DIR .*(default \(.*\))$/\1/p')"
[ "$web_dir" = /usr/share/ztrain/web ] \
  || { echo "test-package: FAIL: the packaged ztraind's default --web-dir is '$web_dir'," \
            "not /usr/share/ztrain/web"; exit 1; }
echo "ok    the packaged ztraind's default --web-dir is /usr/share/ztrain/web"
rm -rf "$unpacked"
trap - EXIT

# A fresh root, remade when older than a week (debootstrap takes a few minutes).
mkdir -p "$cache"
if [ ! -f "$cache/root.tar" ] || [ -n "$(find "$cache/root.tar" -mtime +7)" ]; then
  sources=/etc/apt/sources.list.d/debian.sources
  mirror="$(awk '/^URIs:/ {print $2; exit}' "$sources" 2>/dev/null || true)"
  mirror="${mirror:-http://deb.debian.org/debian}"
  rm -rf "$cache/new"
  echo "test-package: debootstrap bookworm from $mirror"
  debootstrap --variant=minbase bookworm "$cache/new" "$mirror" > "$cache/debootstrap.log" 2>&1 \
    || { tail -20 "$cache/debootstrap.log"; exit 1; }
  tar -C "$cache/new" -cf "$cache/root.tar" .
  rm -rf "$cache/new"
fi
rm -rf "$chroot_dir"
mkdir -p "$chroot_dir"
tar -C "$chroot_dir" -xf "$cache/root.tar"

cleanup() {
  for m in dev/shm proc; do umount "$chroot_dir/$m" 2>/dev/null || true; done
}
trap cleanup EXIT
mount -t proc proc "$chroot_dir/proc"
mount -t tmpfs -o size=256m tmpfs "$chroot_dir/dev/shm"
cp /etc/resolv.conf "$chroot_dir/etc/resolv.conf"
cp "$deb" "$chroot_dir/tmp/"

in_root() { chroot "$chroot_dir" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
  LANG=C.UTF-8 OMP_NUM_THREADS=2 "$@"; }

echo "test-package: apt-get install ./$(basename "$deb") in the fresh root"
in_root apt-get update -qq > "$cache/apt.log" 2>&1 || { tail -20 "$cache/apt.log"; exit 1; }
in_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
  "/tmp/$(basename "$deb")" >> "$cache/apt.log" 2>&1 || { tail -30 "$cache/apt.log"; exit 1; }

# Everything below runs inside the root, from the installed files only.
cat > "$chroot_dir/tmp/check.sh" <<'EOF'
set -euo pipefail
fail() { echo "test-package: FAIL: $*" >&2; exit 1; }
for f in /usr/bin/ztrain /usr/bin/ztraind /usr/bin/ztrain-worker \
         /usr/share/man/man1/ztrain.1.gz /usr/share/man/man1/ztraind.1.gz \
         /usr/share/man/man1/ztrain-worker.1.gz \
         /usr/share/bash-completion/completions/ztrain /usr/share/zsh/vendor-completions/_ztrain \
         /usr/lib/systemd/system/ztraind.service /usr/share/ztrain/web/index.html \
         /usr/share/doc/ztrain/examples/demo/job.json /usr/share/doc/ztrain/LICENSE \
         /usr/share/doc/ztrain/copyright; do
  [ -e "$f" ] || fail "$f is not installed"
done
echo "ok    the programs, man pages, completions, unit, dashboard and examples are installed"
head -1 /usr/share/doc/ztrain/copyright \
  | grep -qx 'Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/' \
  || fail "/usr/share/doc/ztrain/copyright is not in Debian's copyright format"
grep -q '/usr/share/common-licenses/Apache-2.0' /usr/share/doc/ztrain/copyright \
  || fail "/usr/share/doc/ztrain/copyright does not name /usr/share/common-licenses/Apache-2.0"
echo "ok    /usr/share/doc/ztrain/copyright is in Debian's format"
ztrain --version && ztraind --version && ztrain-worker --version

mkdir -p /tmp/demo && cp /usr/share/doc/ztrain/examples/demo/*.json /tmp/demo/
# The demo's data: the installed documentation as bytes (the package has no C sources).
for _ in 1 2 3 4 5 6 7 8; do cat /usr/share/doc/ztrain/docs/*.md; done > /tmp/demo/train.txt
cat /usr/share/doc/ztrain/README.md > /tmp/demo/val.txt
cd /tmp/demo
ztrain validate job.json --set train.max_steps=10 > /dev/null
ztrain run job.json --set train.max_steps=10 --set train.eval_interval=5 --out runs/demo
steps=$(grep -c '"train/global_step"' runs/demo/metrics.jsonl)
[ "$steps" -ge 1 ] || fail "no metrics in runs/demo/metrics.jsonl"
grep -q '"train/global_step": *10' runs/demo/metrics.jsonl || grep -q '"train/global_step":10' runs/demo/metrics.jsonl \
  || fail "the run did not reach step 10"
ztrain sample ckpt --prompt "The " --tokens 20 > /dev/null
echo "ok    the demo job trains from the installed files and samples"

ztraind --grpc-addr 127.0.0.1:0 --http-addr 127.0.0.1:0 --state-dir /tmp/state \
  --data-root /tmp/demo --runs-root /tmp/runs > /tmp/ztraind.log 2>&1 &
daemon=$!
for _ in $(seq 300); do grep -q 'ztraind: ready' /tmp/ztraind.log && break; sleep 0.1; done
ready=$(grep -m1 'ztraind: ready' /tmp/ztraind.log) || { cat /tmp/ztraind.log; fail "ztraind did not start"; }
grpc=$(sed -n 's/.* grpc=\([^ ]*\).*/\1/p' <<<"$ready")
port=$(sed -n 's/.* http=http:\/\/[^:]*:\([0-9]*\).*/\1/p' <<<"$ready")
get() {  # GET path -> status line and body, over bash's /dev/tcp (the root has no curl)
  exec 3<>"/dev/tcp/127.0.0.1/$port"
  printf 'GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' "$1" >&3
  cat <&3
  exec 3<&-
}
get / | head -1 | grep -q ' 200 ' || fail "the dashboard is not served from /usr/share/ztrain/web"
get /vendor/chart.js/chart.js | head -1 | grep -q ' 200 ' || fail "Chart.js is not served"
echo "ok    ztraind serves the dashboard and Debian's Chart.js from the installed files"
id=$(ZTRAIN_SERVER=$grpc ztrain submit job.json --set train.max_steps=5)
ZTRAIN_SERVER=$grpc ztrain watch "$id" > /dev/null || fail "job $id did not succeed"
echo "ok    a job submitted to the installed ztraind succeeds"
kill -TERM $daemon; wait $daemon
EOF
in_root bash /tmp/check.sh
"$root_dir/tests/package/check_maintainer_scripts.sh" "$chroot_dir" "/tmp/$(basename "$deb")"
if command -v lintian > /dev/null; then
  # Its errors about the maintainer scripts fail; the rest are shown (known: no changelog, the
  # programs unstripped, as check_portable.py reads their symbols, OpenBLAS's RUNPATH, the
  # maintainer's address).
  tags="$(lintian "$deb" 2>&1 || true)"
  echo "$tags"
  ! grep -E '^E: .*(maintainer-script|postinst|prerm|postrm|systemd)' <<<"$tags" \
    || { echo "test-package: FAIL: lintian on the maintainer scripts"; exit 1; }
  echo "ok    lintian finds no error in the maintainer scripts"
fi
echo "test-package: PASSED"
