"""The agent's image for tests: built by image/build.sh, unpacked by umoci, run by chroot.

`build(out)` runs `image/build.sh` with IMAGE_OUT=out (default build/image, where `make image` writes;
nothing is rebuilt when the inputs are unchanged) and returns what it wrote to `image.env`;
`unpack(image, bundle)` unpacks the OCI layout into an OCI runtime bundle (rootfs/ and config.json,
the process the image's config describes); `run(bundle, argv)` runs a command in that root file system
the way the DaemonSet's container sees it: read-only root, its own /tmp, /proc and a minimal /dev,
optional read-only bind mounts, the image's environment and user. Every mount lives in a mount
namespace of its own (`unshare --mount`), so it goes when the command ends, whatever the test does.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.conftest import REPO

BUILD_SCRIPT = REPO / "image" / "build.sh"
# Where `make image` writes: tests and `make image` share one build, redone only when its inputs change.
DEFAULT_OUT = REPO / "build" / "image"
# A cold build runs debootstrap (minutes) and downloads the wheels; a warm one takes about 1.5 minutes.
BUILD_TIMEOUT_S = 1200


class ImageError(RuntimeError):
    """A step of building, unpacking or running the image failed."""


def build(out: Path = DEFAULT_OUT, arch: str | None = None) -> dict[str, str]:
    """Build the image from the working tree into `out` (or find it up to date); its image.env's variables.

    `arch` (Debian's name) builds for that architecture, under qemu-user when it is not the host's."""
    env = {k: v for k, v in os.environ.items() if k not in ("IMAGE_BASE", "IMAGE_TREE", "IMAGE_ARCH")}
    env["IMAGE_OUT"] = str(out)
    if arch is not None:
        env["IMAGE_ARCH"] = arch
    done = subprocess.run([str(BUILD_SCRIPT)], env=env, capture_output=True, text=True,
                          timeout=BUILD_TIMEOUT_S, check=False)
    if done.returncode != 0:
        raise ImageError(f"image/build.sh exited {done.returncode}:\n{done.stderr[-4000:]}")
    values: dict[str, str] = {}
    for line in (out / "image.env").read_text().splitlines():
        key, _, value = line.partition("=")
        values[key] = value
    return values


@contextlib.contextmanager
def output_lock(out: Path = DEFAULT_OUT) -> Iterator[None]:
    """Hold image/build.sh's lock on `out`, shared: a build under way there finishes before a read."""
    out.mkdir(parents=True, exist_ok=True)
    with open(out / ".lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_SH)
        yield


def unpack(oci_ref: str, bundle: Path, out: Path = DEFAULT_OUT) -> dict[str, Any]:
    """`umoci unpack` the image `oci_ref` (layout:tag, in `out`) into `bundle`; its runtime config.json."""
    with output_lock(out):
        done = subprocess.run(["umoci", "unpack", "--image", oci_ref, str(bundle)],
                              capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ImageError(f"umoci unpack {oci_ref} exited {done.returncode}:\n{done.stderr[-4000:]}")
    config: dict[str, Any] = json.loads((bundle / "config.json").read_text())
    return config


# Runs as `sh -c SCRIPT sh ROOTFS UID GID BINDS ARGV...` inside `unshare --mount`, in the image's
# environment: the mounts below are private to that namespace and vanish with it.
_RUN_SCRIPT = r"""
set -eu
root="$1"; uid="$2"; gid="$3"; binds="$4"; shift 4
mount --bind "$root" "$root"
mount -t proc proc "$root/proc"
mount -t tmpfs -o size=16m tmpfs "$root/tmp"
mount -t tmpfs -o size=1m,mode=0755 tmpfs "$root/dev"
for node in null zero random urandom; do
    : >"$root/dev/$node"
    mount --bind "/dev/$node" "$root/dev/$node"
done
# binds: one "SOURCE:TARGET" a line, each mounted read-only
printf '%s\n' "$binds" | while IFS=: read -r src dst; do
    [ -n "$src" ] || continue
    mount --bind "$src" "$root$dst"
    mount -o remount,bind,ro "$root$dst"
done
# readOnlyRootFilesystem: the root itself read-only, the mounts above as they are
mount -o remount,bind,ro "$root"
exec chroot --userspec="$uid:$gid" "$root" "$@"
"""


def run(bundle: Path, config: dict[str, Any], argv: list[str], *, uid: int | None = None,
        binds: dict[Path, str] | None = None, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    """Run argv in the bundle's root file system with the image's environment (and user, unless `uid`)."""
    process = config["process"]
    user = process.get("user", {})
    run_uid = user.get("uid", 0) if uid is None else uid
    run_gid = user.get("gid", 0) if uid is None else uid
    for dst in (binds or {}).values():
        if ":" in dst or "\n" in dst:
            raise ImageError(f"bind target {dst!r} cannot be passed to the run script")
        (bundle / "rootfs" / dst.lstrip("/")).mkdir(parents=True, exist_ok=True)
    bind_lines = "\n".join(f"{src}:{dst}" for src, dst in (binds or {}).items())
    env = dict(item.split("=", 1) for item in process.get("env", []))
    cmd = [shutil.which("unshare") or "/usr/bin/unshare", "--mount", "--propagation", "private",
           "/bin/sh", "-c", _RUN_SCRIPT, "sh", str(bundle / "rootfs"), str(run_uid), str(run_gid),
           bind_lines, *argv]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s, check=False)


def describe(done: subprocess.CompletedProcess[str]) -> str:
    """One failure message: the command's exit status and output."""
    return (f"{shlex.join(done.args[-4:])} exited {done.returncode}\n"
            f"stdout: {done.stdout[-2000:]}\nstderr: {done.stderr[-2000:]}")
