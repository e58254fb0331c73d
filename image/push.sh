#!/usr/bin/env bash
# Builds the image for every architecture (image/build.sh), combines them into one OCI image index
# (image/index.py) and, given a registry, pushes the index and its images there with skopeo
# (`make image-push REGISTRY=registry.example.com/team`).
#
# Usage: image/push.sh [REGISTRY]
#   without REGISTRY: only build/image-index/oci (ref <version>), the multi-architecture layout
#   with REGISTRY:    also pushes it to docker://REGISTRY/topolet:<version>-<commit> and prints the digest
#                     to pull and the chart's --set flags to install it with
# Environment:
#   IMAGE_ARCHES            the architectures, Debian's names (default "amd64 arm64")
#   IMAGE_PUSH_TLS_VERIFY   false for a registry served over plain HTTP (a local test registry)
#   IMAGE_PUSH_CREDS        user:password for the registry (else skopeo's auth file, `skopeo login`)
# Every build.sh variable (IMAGE_TREE, SOURCE_DATE_EPOCH, ...) applies to each architecture's build.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-$repo/.venv/bin/python}"
registry="${1:-}"
arches="${IMAGE_ARCHES:-amd64 arm64}"
host_arch="$(dpkg --print-architecture)"
version="$(sed -nE 's/^version = "([^"]+)"/\1/p' "$repo/pyproject.toml" | head -1)"
[[ -n "${IMAGE_TREE:-}" ]] \
    && version="$(git -C "$repo" show "${IMAGE_TREE}:pyproject.toml" | sed -nE 's/^version = "([^"]+)"/\1/p' | head -1)"
index="$repo/build/image-index/oci"
[[ -z "$registry" ]] || command -v skopeo >/dev/null \
    || { echo "push.sh: skopeo is not installed (make image-deps)" >&2; exit 2; }

layouts=()
for arch in $arches; do
    echo "push.sh: building $arch" >&2
    IMAGE_ARCH="$arch" "$repo/image/build.sh"
    if [[ "$arch" == "$host_arch" ]]; then
        layouts+=("$repo/build/image/oci")
    else
        layouts+=("$repo/build/image-$arch/oci")
    fi
done
digest="$("$python" "$repo/image/index.py" "$index" "$version" "${layouts[@]}")"
echo "push.sh: image index $digest ($arches): oci:$index:$version" >&2
[[ -n "$registry" ]] || exit 0

# A tag of the build's own, <version>-<commit> (-dirty for an edited tree): a node that cached an
# earlier build under the bare version would keep running it with pullPolicy IfNotPresent.
commit="$(git -C "$repo" rev-parse --short=12 "${IMAGE_TREE:-HEAD}")"
[[ -n "${IMAGE_TREE:-}" || -z "$(git -C "$repo" status --porcelain --untracked-files=no)" ]] || commit+="-dirty"
tag="$version-$commit"
dest="docker://${registry%/}/topolet:$tag"
args=(--all --preserve-digests --digestfile "$repo/build/image-index/pushed-digest")
[[ "${IMAGE_PUSH_TLS_VERIFY:-true}" == true ]] || args+=(--dest-tls-verify=false)
[[ -z "${IMAGE_PUSH_CREDS:-}" ]] || args+=(--dest-creds "$IMAGE_PUSH_CREDS")
skopeo copy -q "${args[@]}" "oci:$index:$version" "$dest" >&2
pushed="$(cat "$repo/build/image-index/pushed-digest")"
[[ "$pushed" == "$digest" ]] \
    || { echo "push.sh: the registry stored $pushed, not the index built ($digest)" >&2; exit 1; }
echo "pushed ${registry%/}/topolet:$tag"
echo "digest $pushed"
echo "pull   ${registry%/}/topolet@$pushed"
# What the chart installs with: the digest pins exactly this build on every node.
echo "helm   --set image.repository=${registry%/}/topolet --set image.tag=$tag --set image.digest=$pushed"
