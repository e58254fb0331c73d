#!/usr/bin/env bash
# Builds the offline base of the agent's image: a minimal Debian bookworm root file system with
# Debian's python3, made with `debootstrap --variant=minbase`, packed as a tarball with sorted entries,
# numeric owners and clamped mtimes.
#
# Usage: image/base.sh [runtime|build]   prints the absolute path of the cached tarball on stdout
#   runtime (default)  what the image is built on: minbase and python3
#   build              the same plus a C compiler and Python's headers, for building the project's
#                      wheel on an architecture the host's toolchain does not target (image/build.sh)
#
# The tarball is cached under
#   ${TOPOLET_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/topolet}/image/<flavour>-bookworm-<arch>-<hash>.tar
# where <hash> covers the mirror, suite, architecture, variant, package list, debootstrap's version and
# this script,
# so the same inputs reuse one base (and give one image digest) and a change to any of them makes a
# fresh one. A mirror that moves (deb.debian.org gets point releases) changes nothing once cached;
# point IMAGE_MIRROR at a snapshot.debian.org date to pin the packages themselves, or delete the cache
# entry to take the mirror's current ones.
#
# Environment: IMAGE_MIRROR (default http://deb.debian.org/debian, the mirror /etc/apt/sources.list.d
# names), IMAGE_BASE_EPOCH (the mtime every entry is clamped to; default 2025-05-20, the snapshot date
# the apt sources name), IMAGE_ARCH (Debian's name for the architecture, default the host's: amd64 or
# arm64; a foreign one runs debootstrap's second stage under qemu-user, registered by image/binfmt.sh).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache_root="${TOPOLET_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/topolet}/image"
mirror="${IMAGE_MIRROR:-http://deb.debian.org/debian}"
suite=bookworm
variant=minbase
arch="${IMAGE_ARCH:-$(dpkg --print-architecture)}"
flavour="${1:-runtime}"
# python3 is the agent's interpreter (bookworm's 3.11, the version the wheels are built for); nothing
# else beyond minbase's essential set. The build flavour adds what compiling the cffi helper needs.
case "$flavour" in
    runtime) packages=python3; name=base ;;
    build) packages=python3,python3-dev,gcc,libc6-dev; name=build ;;
    *) echo "base.sh: unknown flavour $flavour (runtime or build)" >&2; exit 2 ;;
esac
epoch="${IMAGE_BASE_EPOCH:-1747699200}"

command -v debootstrap >/dev/null || { echo "base.sh: debootstrap is not installed (make image-deps)" >&2; exit 2; }
[[ "$(id -u)" == 0 ]] || { echo "base.sh: debootstrap needs root (chroot, mknod)" >&2; exit 2; }

digest="$( (echo "$mirror $suite $arch $variant $packages $epoch"; dpkg-query -W -f='${Version}\n' debootstrap
            cat "${BASH_SOURCE[0]}") | sha256sum | cut -c1-12)"
tarball="$cache_root/$name-$suite-$arch-$digest.tar"
mkdir -p "$cache_root"
exec {lock}>"$tarball.lock"
flock "$lock"
if [[ -s "$tarball" ]]; then
    echo "$tarball"
    exit 0
fi

# A foreign architecture: debootstrap's second stage runs the target's own binaries in the chroot.
[[ "$arch" == "$(dpkg --print-architecture)" ]] || "$here/binfmt.sh" "$arch"

work="$(mktemp -d "$cache_root/.base-XXXXXX")"
target="$work/rootfs"
# debootstrap mounts proc and sys in the target for the second stage; a failure can leave them there.
# An EXIT trap must never change the exit status: under `set -e` any command in it that fails (a grep
# that matches nothing under pipefail, the usual case once debootstrap has unmounted what it mounted)
# would end the shell with that command's status, turning a finished build into exit 1 with no message.
# `set +e` first, so the status the script exited with is the one its caller sees.
cleanup() {
    set +e
    local m
    findmnt -rn -o TARGET | grep -F "$target" | sort -r | while read -r m; do umount -l "$m" 2>/dev/null; done
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "base.sh: debootstrap --arch=$arch --variant=$variant $suite ($packages) from $mirror (minutes, once)" >&2
start=$SECONDS
# --merged-usr: bookworm's layout (/bin -> usr/bin), as in debian:bookworm-slim.
nice -n 19 debootstrap --arch="$arch" --variant="$variant" --merged-usr --include="$packages" \
    --keyring=/usr/share/keyrings/debian-archive-keyring.gpg "$suite" "$target" "$mirror" >"$work/debootstrap.log" 2>&1 || {
    tail -20 "$work/debootstrap.log" >&2
    echo "base.sh: debootstrap failed (log above)" >&2
    exit 1
}

# What a run leaves behind that says when or where it ran rather than what it installed: logs, apt's
# downloaded lists and archives, debconf's and dpkg's backups, the ld.so cache's aux file, the build
# host's name and resolver.
rm -rf "$target"/var/log/* "$target"/var/cache/apt/* "$target"/var/lib/apt/lists/* \
       "$target"/var/cache/debconf/*-old "$target"/var/lib/dpkg/*-old "$target"/var/cache/ldconfig/aux-cache \
       "$target"/tmp/* "$target"/root/.cache
: >"$target/etc/hostname"
rm -f "$target/etc/resolv.conf"
# The image's own file, not the build host's; an empty machine-id is what systemd-less images carry.
: >"$target/etc/machine-id"
dpkg-query --admindir="$target/var/lib/dpkg" -W -f='${Package} ${Version}\n' >"$work/packages.txt"

tar -C "$target" --sort=name --numeric-owner --mtime="@$epoch" --clamp-mtime \
    --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime --xattrs \
    -cf "$tarball.tmp" .
mv -f "$work/packages.txt" "${tarball%.tar}.packages.txt"
mv -f "$tarball.tmp" "$tarball"
echo "base.sh: base ready in $((SECONDS - start)) s ($(du -m "$tarball" | cut -f1) MiB): $tarball" >&2
echo "$tarball"
