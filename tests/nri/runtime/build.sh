#!/usr/bin/env bash
# Builds nri-runtime (main.go here: NRI's own runtime side, pkg/adaptation, at the version containerd
# v2.4.2 ships, plus a reference plugin on NRI's Go stub) from the Go module proxy, once per input.
#
# Usage: tests/nri/runtime/build.sh   Prints the binary's absolute path on stdout; progress and
# compiler output go to stderr.  The binary is cached under
#   ${TOPOLET_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/topolet}/nri-runtime-<hash>/
# where <hash> covers go.mod, go.sum, main.go and the Go toolchain version.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache_root="${TOPOLET_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/topolet}"
command -v go >/dev/null || { echo "build.sh: go is not on PATH" >&2; exit 2; }

digest="$( (go env GOVERSION; cat "$here/go.mod" "$here/go.sum" "$here"/*.go) | sha256sum | cut -c1-12)"
out_dir="$cache_root/nri-runtime-$digest"
binary="$out_dir/nri-runtime"
if [[ ! -x "$binary" ]]; then
    mkdir -p "$out_dir"
    # One builder at a time per entry: parallel test sessions wait for the first one's binary.
    exec {lock}>"$out_dir/.lock"
    flock "$lock"
    if [[ ! -x "$binary" ]]; then
        echo "build.sh: building nri-runtime (a cold build takes a minute or two)" >&2
        start=$SECONDS
        # nri_no_wasm: the WASM plugin loader (wazero) is not part of what is tested.
        (cd "$here" && CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false" \
            go build -trimpath -tags nri_no_wasm -ldflags="-s -w" -o "$binary.tmp" .) >&2
        mv -f "$binary.tmp" "$binary"
        echo "build.sh: built nri-runtime in $((SECONDS - start)) s" >&2
    fi
    exec {lock}>&-
fi
echo "$binary"
