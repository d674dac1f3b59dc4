#!/usr/bin/env bash
# Makes the `debian:bookworm-slim` base image locally, for machines that reach a Debian mirror but
# no container registry: a debootstrap minbase root file system, trimmed the way Debian's official
# slim images are (no docs, man pages or translations; apt keeps no caches), written as a tar file.
#
#   docker/debian-base.sh OUT.tar [MIRROR]
#
# Then `podman import OUT.tar localhost/debian:bookworm-slim` (or `docker import`) and tag it
# `docker.io/library/debian:bookworm-slim`, so that the Dockerfiles' unchanged FROM lines resolve
# without a pull. MIRROR defaults to the first URI in this host's apt sources; the image's apt
# sources are bookworm, bookworm-updates and bookworm-security on that mirror, like the official
# image's. Needs root and debootstrap.
set -euo pipefail
out="${1:?usage: docker/debian-base.sh OUT.tar [MIRROR]}"
sources=/etc/apt/sources.list.d/debian.sources
mirror="${2:-$(awk '/^URIs:/ {print $2; exit}' "$sources" 2>/dev/null || true)}"
mirror="${mirror:-http://deb.debian.org/debian}"
security="$(awk '/^URIs:.*security/ {print $2; exit}' "$sources" 2>/dev/null || true)"
security="${security:-${mirror%/debian}/debian-security}"

work="$(mktemp -d "${TMPDIR:-/var/tmp}/ztrain-debian-base.XXXXXX")"
trap 'rm -rf "$work"' EXIT
rootfs="$work/rootfs"

debootstrap --variant=minbase bookworm "$rootfs" "$mirror" > "$work/debootstrap.log" 2>&1 || {
  tail -20 "$work/debootstrap.log" >&2
  exit 1
}
# The official slim images' dpkg filter, so that later apt runs in images built on this one do not
# unpack these files either; the ones debootstrap already unpacked are removed by the same rules.
cat > "$rootfs/etc/dpkg/dpkg.cfg.d/docker" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
EOF
find "$rootfs/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
find "$rootfs/usr/share/doc" -mindepth 1 -type d -empty -delete
rm -rf "$rootfs"/usr/share/{man,groff,info,lintian,linda}/*
find "$rootfs/usr/share/locale" -mindepth 1 -maxdepth 1 -not -name locale.alias -exec rm -rf {} +

# apt: no package caches in image layers, no translations, no recommends pulled in by accident.
cat > "$rootfs/etc/apt/apt.conf.d/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
echo 'Acquire::Languages "none";' > "$rootfs/etc/apt/apt.conf.d/docker-no-languages"
rm -f "$rootfs/etc/apt/sources.list"
cat > "$rootfs/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $mirror
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: $security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
rm -rf "$rootfs"/var/cache/apt/* "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/log/*.log \
  "$rootfs"/var/log/apt/* "$rootfs"/tmp/* "$rootfs/debootstrap"

tar --numeric-owner -C "$rootfs" -cf "$out.part" .
mv "$out.part" "$out"
echo "debian-base: $out ($(du -m "$out" | cut -f1) MB) from $mirror"
