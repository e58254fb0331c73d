#!/usr/bin/env bash
# Builds the agent's OCI image (`make image`) from this repository alone: the project's wheel and its
# locked dependencies (image/requirements.txt) installed by image/install.sh through image/Containerfile,
# on a base that is either the offline debootstrap rootfs (image/base.sh, the default) or a public one.
#
# Usage: image/build.sh
# Environment:
#   IMAGE_BASE      a base image to build on instead of the debootstrap rootfs, e.g.
#                   docker.io/library/debian:bookworm-slim (pulled, so it needs a registry)
#   IMAGE_ARCH      Debian's name for the image's architecture: amd64 or arm64 (default the host's).
#                   A foreign one runs the recipe under qemu-user (image/binfmt.sh), on a base of its
#                   own, with the locked wheels for that platform; the project's C helper is compiled
#                   there too, in a build base with gcc (image/base.sh build), cached like the base.
#   IMAGE_OUT       output directory (default build/image for the host's architecture,
#                   build/image-<arch> for another; image/index.py combines them)
#   IMAGE_TREE      a commit whose files the project's wheel is built from (git archive), instead of
#                   the working tree; the recipe (image/) is always the working tree's
#   IMAGE_CONTEXT_ONLY=1  only prepare IMAGE_OUT/context (install.sh and wheels/) for another builder:
#                   docker build -f image/Containerfile --build-arg BASE=debian:bookworm-slim build/image/context
#   SOURCE_DATE_EPOCH  every timestamp in the image (default: the built commit's time)
# The image's revision label is the built commit (HEAD for the working tree, edited or not).
#
# Writes, under IMAGE_OUT:
#   topolet-<version>.tar   docker-archive tarball tagged localhost/topolet:<version>, for
#                           `ctr -n k8s.io images import`, `docker load` and `podman load`
#   oci/                    the same image as an OCI layout (gzip layers), ref <version>
#   image.env               IMAGE_REF, IMAGE_ARCHIVE, IMAGE_OCI, IMAGE_DIGEST (OCI manifest digest),
#                           IMAGE_ID (config digest), size figures: shell-sourceable, read by tests/image
# and prints the digest, the sizes (compressed layer and unpacked) and the biggest directories.
# The same inputs (tree, lock, base, SOURCE_DATE_EPOCH) give the same digest: see image/README.md.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache_root="${TOPOLET_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/topolet}/image"
host_arch="$(dpkg --print-architecture)"
arch="${IMAGE_ARCH:-$host_arch}"
case "$arch" in
    amd64) multiarch=x86_64-linux-gnu; wheel_platform=x86_64 ;;
    arm64) multiarch=aarch64-linux-gnu; wheel_platform=aarch64 ;;
    *) echo "build.sh: IMAGE_ARCH=$arch: amd64 or arm64" >&2; exit 2 ;;
esac
if [[ "$arch" == "$host_arch" ]]; then
    out="$(realpath -m "${IMAGE_OUT:-$repo/build/image}")"
else
    out="$(realpath -m "${IMAGE_OUT:-$repo/build/image-$arch}")"
fi
python="${PYTHON:-$repo/.venv/bin/python}"

context_only="${IMAGE_CONTEXT_ONLY:-}"
tools=(git)
# buildah also prepares another architecture's context: its wheel is compiled in a container.
[[ -n "$context_only" && "$arch" == "$host_arch" ]] || tools+=(buildah)
for tool in "${tools[@]}"; do
    command -v "$tool" >/dev/null || { echo "build.sh: $tool is not installed (make image-deps)" >&2; exit 2; }
done
[[ ( -n "$context_only" && "$arch" == "$host_arch" ) || "$(id -u)" == 0 ]] \
    || { echo "build.sh: buildah's chroot isolation and vfs storage need root" >&2; exit 2; }
"$python" -c 'import sys; assert sys.version_info[:2] == (3, 11)' 2>/dev/null \
    || { echo "build.sh: $python must be CPython 3.11, the image's interpreter" >&2; exit 2; }

tree="${IMAGE_TREE:-}"
revision="$(git -C "$repo" rev-parse "${tree:-HEAD}^{commit}")"
export SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-$(git -C "$repo" log -1 --format=%ct "$revision")}"
if [[ -n "$tree" ]]; then
    version="$(git -C "$repo" show "$revision:pyproject.toml" | sed -nE 's/^version = "([^"]+)"/\1/p' | head -1)"
else
    version="$(sed -nE 's/^version = "([^"]+)"/\1/p' "$repo/pyproject.toml" | head -1)"
fi
name=localhost/topolet
ref="$name:$version"
start=$SECONDS
step() { echo "build.sh: [$((SECONDS - start)) s] $*" >&2; }

# One build at a time per output directory: the storage and context below are rebuilt from nothing.
mkdir -p "$out"
exec {lock}>"$out/.lock"
flock "$lock"

# Private container storage, emptied on every build: nothing from an earlier build (or from other
# buildah users on this machine) can leak into this one. vfs because overlay mounts are not available
# everywhere this runs; chroot isolation because user namespaces are not either.
storage="$out/storage"
buildah_() {
    nice -n 19 buildah --root "$storage/root" --runroot "$storage/run" --storage-driver vfs "$@"
}
# `set +e`: an EXIT trap must never change the exit status (under `set -e` a failing command in it
# would end the shell with its own status, e.g. a finished build with exit 1 and no message).
cleanup() {
    set +e
    buildah_ rm --all >/dev/null 2>&1
    rm -rf "$storage" "$out/context" "$out/src"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
rm -rf "$storage" "$out/context" "$out/src"
mkdir -p "$out/context/wheels"

step "wheels"
# 1. Dependency wheels, verified against the lock's hashes, downloaded once per lock and architecture.
lock_hash="$(sha256sum "$repo/image/requirements.txt" | cut -c1-12)"
wheels="$cache_root/wheels-$arch-$lock_hash"
# CPython 3.11 on glibc (bookworm's 2.36): the host interpreter's own tags for the host's architecture,
# the manylinux tags the lock's aarch64 hashes name for arm64.
platform_args=()
[[ "$arch" == "$host_arch" ]] || platform_args=(--python-version 3.11 --implementation cp --abi cp311
    --platform "manylinux_2_28_$wheel_platform" --platform "manylinux_2_17_$wheel_platform"
    --platform "manylinux2014_$wheel_platform")
mkdir -p "$cache_root"
exec {wheels_lock}>"$wheels.lock"
flock "$wheels_lock"
if [[ ! -f "$wheels/.complete" ]]; then
    echo "build.sh: downloading the locked wheels into $wheels" >&2
    mkdir -p "$wheels"
    # The lock's hashes name exactly the wheels pip picks for the image's tags, and a mismatch fails
    # here rather than in the image.
    "$python" -m pip download -q --disable-pip-version-check --no-deps --require-hashes \
        --only-binary=:all: "${platform_args[@]}" -r "$repo/image/requirements.txt" -d "$wheels" >&2
    touch "$wheels/.complete"
fi
cp "$wheels"/*.whl "$out/context/wheels/"
exec {wheels_lock}>&-

step "topolet wheel"
# 2. The project's wheel, built from a copy of the tree at a fixed path, so no stale build/ output and
# no path of the caller's reaches the compiled helper: the working tree (tracked and untracked files,
# less what git ignores), or with IMAGE_TREE the files of that commit alone.
mkdir -p "$out/src"
if [[ -n "$tree" ]]; then
    git -C "$repo" archive "$revision" | tar -x -C "$out/src"
else
    (cd "$repo" && git ls-files -z --cached --others --exclude-standard \
        | while IFS= read -r -d '' f; do [[ -e "$f" ]] && printf '%s\0' "$f"; done \
        | tar --null --no-recursion -T - -cf -) | tar -x -C "$out/src"
fi
# -g0: pyenv's and Debian's CFLAGS carry -g, whose DWARF names the build directory.
if [[ "$arch" == "$host_arch" ]]; then
    CFLAGS="-g0 -ffile-prefix-map=$out/src=." nice -n 19 "$python" -m pip wheel -q --disable-pip-version-check \
        --no-deps --no-build-isolation -w "$out/context/wheels" "$out/src" >"$out/wheel.log" 2>&1 \
        || { cat "$out/wheel.log" >&2; echo "build.sh: building the topolet wheel failed" >&2; exit 1; }
else
    # Another architecture's C helper is compiled by that architecture's gcc, under qemu-user, in the
    # cached build base (Debian's gcc and Python headers), with the locked cffi and the same setuptools
    # as the host's build (which writes wheels itself since 70.1), fetched once: the same build as
    # above, only slower.
    build_tools="$("$python" -c 'import setuptools; print(f"setuptools=={setuptools.__version__}")')"
    tools="$cache_root/build-tools-$(echo "$build_tools" | sha256sum | cut -c1-12)"
    if [[ ! -f "$tools/.complete" ]]; then
        "$python" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
            -d "$tools" "$build_tools" >&2
        touch "$tools/.complete"
    fi
    build_tarball="$(IMAGE_ARCH="$arch" "$repo/image/base.sh" build)"
    # Cached by what goes into it (the tree's files, the build base, the tools, this script), since the
    # compile under emulation is what a warm foreign build would otherwise spend its time on.
    wheel_key="$( { (cd "$out/src" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum)
                    echo "$build_tarball $build_tools"; sha256sum "${BASH_SOURCE[0]}"; } | sha256sum | cut -c1-16)"
    wheel_cache="$cache_root/topolet-wheel-$arch-$wheel_key"
    if [[ ! -f "$wheel_cache/.complete" ]]; then
        rm -rf "$wheel_cache"
        mkdir -p "$wheel_cache"
        bctr="$(buildah_ from --arch "$arch" scratch)"
        tar -C "$(buildah_ mount "$bctr")" --numeric-owner --xattrs -xpf "$build_tarball"
        buildah_ umount "$bctr" >/dev/null
        buildah_ run --isolation chroot -v "$out/src:/src" -v "$wheel_cache:/out" -v "$wheels:/deps:ro" \
            -v "$tools:/tools:ro" "$bctr" -- sh -ec '
            pip="$(ls /deps/pip-*.whl)/pip"
            python3 "$pip" install -q --no-index --find-links /deps --find-links /tools --no-cache-dir \
                --break-system-packages --root-user-action=ignore --disable-pip-version-check \
                cffi pycparser setuptools
            CFLAGS="-g0 -ffile-prefix-map=/src=." python3 "$pip" wheel -q --disable-pip-version-check \
                --no-deps --no-build-isolation --no-cache-dir -w /out /src' >"$out/wheel.log" 2>&1 \
            || { cat "$out/wheel.log" >&2; echo "build.sh: building the topolet wheel for $arch failed" >&2; exit 1; }
        buildah_ rm "$bctr" >/dev/null
        touch "$wheel_cache/.complete"
    fi
    cp "$wheel_cache"/topolet-*.whl "$out/context/wheels/"
fi
cp "$repo/image/install.sh" "$out/context/"
if [[ -n "$context_only" ]]; then
    rm -rf "$out/src"
    trap - EXIT
    step "context ready: $out/context (build it with image/Containerfile and --build-arg BASE=<image>)"
    exit 0
fi

# Up to date: an image in $out built from the same inputs (its image.env says which) is not built again.
# The inputs: every wheel (the project's is reproducible, so it stands for the tree that goes into the
# image), the recipe, the base, the timestamps and the revision. A public IMAGE_BASE is a tag that
# moves, so it is always built.
inputs=""
if [[ -z "${IMAGE_BASE:-}" ]]; then
    tarball="$(IMAGE_ARCH="$arch" "$repo/image/base.sh")"
    inputs="$( { (cd "$out/context" && sha256sum install.sh wheels/*.whl)
                 (cd "$repo/image" && cat Containerfile build.sh) | sha256sum
                 echo "$arch $tarball $SOURCE_DATE_EPOCH $revision $version"
                 buildah --version; } | sha256sum | cut -c1-16)"
    if [[ -f "$out/image.env" && -f "$out/topolet-$version.tar" && -f "$out/oci/index.json" ]] \
            && grep -qx "IMAGE_INPUTS=$inputs" "$out/image.env"; then
        step "up to date: $(sed -n 's/^IMAGE_DIGEST=//p' "$out/image.env") (inputs $inputs)"
        exit 0
    fi
fi
rm -f "$out/image.env"

step "base"
# 3. The base: the debootstrap rootfs committed as a local image, or the named public one.
if [[ -n "${IMAGE_BASE:-}" ]]; then
    base="$IMAGE_BASE"
    pull=--pull=missing
else
    base="localhost/topolet-base:bookworm-$(basename "$tarball" .tar | sed 's/^base-bookworm-//')"
    ctr="$(buildah_ from --arch "$arch" scratch)"
    tar -C "$(buildah_ mount "$ctr")" --numeric-owner --xattrs -xpf "$tarball"
    buildah_ umount "$ctr" >/dev/null
    buildah_ commit -q --timestamp "$SOURCE_DATE_EPOCH" "$ctr" "$base" >/dev/null
    buildah_ rm "$ctr" >/dev/null
    pull=--pull=never
fi

# 4. The one recipe. --squash: one layer, so what install.sh deletes (docs, apt lists, the wheels'
# bind mount) is gone from the image rather than hidden by a later layer; --timestamp: the image's
# created time and every file's mtime are SOURCE_DATE_EPOCH.
step "building $ref on $base"
buildah_ build -q --isolation chroot --squash $pull --platform "linux/$arch" --timestamp "$SOURCE_DATE_EPOCH" \
    --layers=false --build-arg BASE="$base" --build-arg VERSION="$version" \
    --build-arg REVISION="$revision" \
    -f "$repo/image/Containerfile" -t "$ref" "$out/context" >/dev/null

step "export"
# 5. Export: an OCI layout (gzip layers, the form a registry serves: its manifest digest is the image's
# digest) and a docker-archive for containerd's `ctr images import`, which names the image after its tag.
archive="$out/topolet-$version.tar"
rm -rf "$out/oci" "$archive"
buildah_ push -q --format oci --digestfile "$out/digest" "$ref" "oci:$out/oci:$version" >/dev/null
buildah_ push -q --format docker "$ref" "docker-archive:$archive:$ref" >/dev/null
digest="$(cat "$out/digest")"
rm -f "$out/digest"
image_id="sha256:$(buildah_ inspect --type image --format '{{.FromImageID}}' "$ref")"

step "sizes"
# Sizes: the compressed layer as a registry serves it, the unpacked layer, and the biggest directories.
manifest_blob="$out/oci/blobs/sha256/${digest#sha256:}"
compressed="$("$python" -c 'import json,sys; m=json.load(open(sys.argv[1])); print(sum(l["size"] for l in m["layers"]))' "$manifest_blob")"
ctr="$(buildah_ from --pull=never --arch "$arch" "$ref")"
rootfs="$(buildah_ mount "$ctr")"
unpacked="$(du -sb --apparent-size "$rootfs" | cut -f1)"
(cd "$rootfs" && du -s -m --apparent-size usr/local/lib/python3.11/dist-packages/* usr/lib/python3.11 \
    "usr/lib/$multiarch" usr/bin usr/sbin usr/share/* var etc) | sort -rn >"$out/du.txt"
biggest="$(head -10 "$out/du.txt")"
rm -f "$out/du.txt"
buildah_ umount "$ctr" >/dev/null

mib() { "$python" -c "import sys; print(f'{int(sys.argv[1]) / 2**20:.1f}')" "$1"; }
cat >"$out/image.env" <<EOF
IMAGE_REF=$ref
IMAGE_ARCH=$arch
IMAGE_INPUTS=$inputs
IMAGE_ARCHIVE=$archive
IMAGE_OCI=$out/oci:$version
IMAGE_DIGEST=$digest
IMAGE_ID=$image_id
IMAGE_BASE=$base
IMAGE_COMPRESSED_BYTES=$compressed
IMAGE_UNPACKED_BYTES=$unpacked
SOURCE_DATE_EPOCH=$SOURCE_DATE_EPOCH
EOF
{
    echo "image $ref ($arch) on $base (SOURCE_DATE_EPOCH=$SOURCE_DATE_EPOCH), built in $((SECONDS - start)) s"
    echo "  digest   $digest"
    echo "  id       $image_id"
    echo "  archive  $archive"
    echo "  biggest directories (MiB):"
    echo "$biggest" | sed 's/^/    /'
    echo "image size: $(mib "$compressed") MiB compressed | $(mib "$unpacked") MiB unpacked"
} >&2
