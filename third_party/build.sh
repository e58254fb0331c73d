#!/usr/bin/env bash
# Builds the benchmarks' peers (the folders beside this script, each with its own build.sh) once per
# input, as tests/controlplane/build.sh caches the control plane.
#
# Usage: third_party/build.sh [PEER...]   (every peer when none named; today: scheduler-plugins-nrt)
# Prints one `<peer>=<absolute path of its binary>` line per peer on stdout (its other outputs, such as
# CRDs, lie beside the binary); progress and compiler output go to stderr. A peer is cached under
#   ${TOPOLET_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/topolet}/peers/<peer>-<hash>/
# where <hash> covers every file of the peer's folder and the Go toolchain version, so a change to any
# of them builds afresh and an unchanged tree costs nothing. Go's own build cache (GOCACHE) is the one
# the control plane's builds fill, so the shared Kubernetes packages are compiled once.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache_root="${TOPOLET_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/topolet}/peers"

command -v go >/dev/null || { echo "build.sh: go is not on PATH" >&2; exit 2; }
go_version="$(go env GOVERSION)"

# peer -> the binary its build.sh leaves in the output folder.
declare -A binary_of=([scheduler-plugins-nrt]=kube-scheduler)

build_one() {
    local peer="$1"
    local dir="$here/$peer"
    local digest
    digest="$( (echo "$go_version"; cd "$dir" && find . -type f -print0 | LC_ALL=C sort -z \
        | xargs -0 sha256sum) | sha256sum | cut -c1-12)"
    local out_dir="$cache_root/$peer-$digest"
    local binary="$out_dir/${binary_of[$peer]}"
    if [[ ! -x "$binary" ]]; then
        mkdir -p "$out_dir"
        # One builder at a time per entry: parallel sessions wait for the first one's binary.
        exec {lock}>"$out_dir/.lock"
        flock "$lock"
        if [[ ! -x "$binary" ]]; then
            echo "build.sh: building $peer (about a minute with the control plane's Go build cache warm)" >&2
            local start=$SECONDS
            bash "$dir/build.sh" "$out_dir" >&2
            echo "build.sh: built $peer in $((SECONDS - start)) s" >&2
        fi
        exec {lock}>&-
    fi
    echo "$peer=$binary"
}

peers=("$@")
[[ ${#peers[@]} -gt 0 ]] || peers=("${!binary_of[@]}")
for p in "${peers[@]}"; do
    [[ -n "${binary_of[$p]:-}" ]] || { echo "build.sh: unknown peer '$p'" >&2; exit 2; }
    build_one "$p"
done
