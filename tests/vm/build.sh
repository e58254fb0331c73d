#!/usr/bin/env bash
# Builds the throwaway cgroup-v2 test guest: Debian bookworm's kernel and a `debootstrap --variant=minbase`
# root file system packed as one initramfs, with tests/vm/init.sh as its /init.  The guest runs the
# host's own .venv, shared read-only by tests/vm/guest.py, so the project's packages never go in here.
#
# Usage: tests/vm/build.sh
# Prints `kernel=<path>` and `initrd=<path>` on stdout; progress goes to stderr.  Cached under
#   ${TOPOLET_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/topolet}/vm/<kernel package version>-<hash>/
# where <hash> covers this script, init.sh and the package lists, so a change to any of them builds a
# fresh guest and an unchanged tree costs nothing.  Needs root, debootstrap and a Debian mirror.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache_root="${TOPOLET_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/topolet}/vm"
mirror="${TOPOLET_VM_MIRROR:-http://deb.debian.org/debian}"
suite=bookworm
# What the in-guest tests run: coreutils' sleep, util-linux's mount, kmod's insmod, ip for the loopback,
# Debian's python3.11 for a host whose .venv is built on /usr/bin/python3 (see guest.py), openssl
# for the control plane's test certificates (tests/controlplane/harness.py), and the real node's
# runtime (tests/vm/test_guest_realnode.py): Debian's containerd, runc and CNI plugins as on the host,
# with socat, which carries the host's API server to the guest's loopback.
include=kmod,procps,iproute2,python3,openssl,containerd,runc,containernetworking-plugins,socat
# Modules the init loads, with their dependencies: the 9p shares, the network card of qemu's user
# networking, and what the real node's containers need (overlay snapshots, the ptp plugin's veth pairs).
# Each one costs boot time under emulation; a user that needs more (a disk: virtio_blk ext4) adds them here.
modules="virtio_pci 9pnet_virtio 9p virtio_net overlay veth"

for tool in debootstrap apt-get dpkg-deb cpio; do
    command -v "$tool" >/dev/null || { echo "build.sh: $tool is not installed (make deps)" >&2; exit 2; }
done
[[ $(id -u) -eq 0 ]] || { echo "build.sh: needs root (debootstrap)" >&2; exit 2; }

# linux-image-amd64 is a metapackage; the kernel is the one package it depends on.
kpkg="$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/ { print $2; exit }')"
[[ -n "$kpkg" ]] || { echo "build.sh: apt-cache knows no linux-image-amd64 (apt-get update?)" >&2; exit 2; }
kver="$(apt-cache policy "$kpkg" | awk '/Candidate:/ { print $2 }')"
digest="$( (echo "$kpkg $kver $suite $include $modules"; cat "$here/build.sh" "$here/init.sh") \
    | sha256sum | cut -c1-12)"
out="$cache_root/$kver-$digest"

if [[ ! -s "$out/initrd.img" ]]; then
    mkdir -p "$out"
    exec {lock}>"$out/.lock"
    flock "$lock"
    if [[ ! -s "$out/initrd.img" ]]; then
        start=$SECONDS
        work="$out/work"
        root="$work/root"
        krel="${kpkg#linux-image-}"
        # A finished debootstrap is kept across a failure of the steps after it (it takes minutes).
        if [[ ! -e "$work/debootstrap.done" ]]; then
            rm -rf "$work" && mkdir -p "$work/kernel"
            echo "build.sh: fetching $kpkg $kver" >&2
            (cd "$work" && apt-get download -q "$kpkg=$kver") >&2
            dpkg-deb -x "$work"/"$kpkg"_*.deb "$work/kernel"
            echo "build.sh: debootstrap --variant=minbase $suite (minutes)" >&2
            debootstrap --variant=minbase --include="$include" "$suite" "$root" "$mirror" >&2
            touch "$work/debootstrap.done"
        fi

        # The dependency closure of $modules, in load order, from depmod run on the package's tree.
        rm -rf "$root/kmods" && mkdir -p "$root/kmods/lib"
        cp -a "$work/kernel/lib/modules" "$root/kmods/lib/"
        chroot "$root" depmod -b /kmods "$krel"
        mkdir -p "$root/etc/topolet-vm"
        : >"$root/etc/topolet-vm/modules"
        for m in $modules; do
            chroot "$root" modprobe -d /kmods -S "$krel" --show-depends "$m" | awk '$1 == "insmod" { print $2 }'
        done | awk '!seen[$0]++' | while read -r ko; do
            dest="${ko#/kmods}"
            mkdir -p "$root$(dirname "$dest")"
            # Without its appended signature: checking it costs a second or more per module under
            # emulation, and the kernel does not require it (module.sig_enforce is off).
            chroot "$root" python3 -c '
import struct, sys
data = open(sys.argv[1], "rb").read()
magic = b"~Module signature appended~\n"
if data.endswith(magic):
    (sig_len,) = struct.unpack(">I", data[-len(magic) - 4:-len(magic)])
    data = data[:-len(magic) - 12 - sig_len]
open(sys.argv[2], "wb").write(data)
' "$ko" "$dest"
            echo "$dest" >>"$root/etc/topolet-vm/modules"
        done
        rm -rf "$root/kmods"

        # Trim what a test guest never reads; the initramfs is unpacked into RAM on every boot.
        rm -rf "$root"/usr/share/{doc,man,info,locale} "$root"/var/cache/apt/* "$root"/var/lib/apt/lists/*
        # The real node runs containerd's runc v2 shim and three CNI plugins (tests/realnode/node.py).
        rm -f "$root"/usr/bin/containerd-shim "$root"/usr/bin/containerd-shim-runc-v1
        find "$root/usr/lib/cni" -type f ! -name ptp ! -name host-local ! -name loopback -delete
        install -m 0755 "$here/init.sh" "$root/init"
        cp "$work/kernel/boot/vmlinuz-$krel" "$out/vmlinuz.tmp"
        # Uncompressed: a few hundred MB that the kernel copies faster than it could inflate them.
        (cd "$root" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc --quiet) >"$out/initrd.tmp"
        rm -rf "$work"
        mv -f "$out/vmlinuz.tmp" "$out/vmlinuz"
        mv -f "$out/initrd.tmp" "$out/initrd.img"
        echo "build.sh: built the guest in $((SECONDS - start)) s" >&2
    fi
    exec {lock}>&-
fi
echo "kernel=$out/vmlinuz"
echo "initrd=$out/initrd.img"
