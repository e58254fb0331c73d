#!/usr/bin/env bash
# Lets this machine run another architecture's binaries: registers Debian's qemu-user-static for it
# with the kernel's binfmt_misc, from the rule the package ships (/usr/lib/binfmt.d/qemu-<cpu>.conf).
# The rule's F flag makes the kernel open the interpreter now, so it also serves chroots that do not
# contain it (debootstrap's second stage, buildah's chroot isolation).
#
# Usage: image/binfmt.sh ARCH     ARCH is Debian's name (arm64); a no-op when already registered.
# Needs root. The registration is the kernel's, for the whole machine, until reboot: nothing to undo.
set -euo pipefail

arch="${1:?usage: image/binfmt.sh ARCH}"
case "$arch" in
    arm64) cpu=aarch64 ;;
    amd64) cpu=x86_64 ;;
    *) echo "binfmt.sh: no qemu-user mapping for $arch" >&2; exit 2 ;;
esac
misc=/proc/sys/fs/binfmt_misc
rule="/usr/lib/binfmt.d/qemu-$cpu.conf"

[[ -f "$misc/register" ]] || mount -t binfmt_misc binfmt_misc "$misc" 2>/dev/null \
    || { echo "binfmt.sh: cannot mount binfmt_misc at $misc (needs root)" >&2; exit 2; }
if [[ -f "$misc/qemu-$cpu" ]]; then
    grep -qx enabled "$misc/qemu-$cpu" || echo 1 >"$misc/qemu-$cpu"
    exit 0
fi
[[ -f "$rule" ]] || { echo "binfmt.sh: $rule is missing (apt-get install qemu-user-static)" >&2; exit 2; }
# The kernel parses the rule's \x escapes itself; a concurrent registration of the same name says
# EEXIST, which is as good as ours.
cat "$rule" >"$misc/register" 2>/dev/null || [[ -f "$misc/qemu-$cpu" ]] \
    || { echo "binfmt.sh: registering $rule failed" >&2; exit 1; }
