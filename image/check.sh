#!/usr/bin/env bash
# Reproducibility check (`make image-check`): builds the image twice from one commit (default HEAD),
# each in an output directory and container storage of its own, and fails unless both builds give the
# same OCI manifest digest, the same image ID and byte-identical docker-archive tarballs.
#
# Usage: image/check.sh [COMMIT]
# A commit rather than the working tree: files edited between the two builds would be a change of
# input, not a failure to reproduce. Takes two warm builds (about 3 minutes on 2 cores).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
commit="$(git -C "$repo" rev-parse "${1:-HEAD}^{commit}")"
work="$(mktemp -d "${TMPDIR:-/tmp}/topolet-image-check.XXXXXX")"
trap 'rm -rf "$work" || true' EXIT

for run in 1 2; do
    echo "check.sh: build $run of $commit" >&2
    IMAGE_TREE="$commit" IMAGE_OUT="$work/$run" "$repo/image/build.sh" 2>"$work/build-$run.log" \
        || { cat "$work/build-$run.log" >&2; exit 1; }
done

value() { sed -n "s/^$1=//p" "$work/$2/image.env"; }
status=0
for key in IMAGE_DIGEST IMAGE_ID; do
    a="$(value "$key" 1)"
    b="$(value "$key" 2)"
    if [[ "$a" == "$b" ]]; then
        echo "check.sh: $key $a (both builds)"
    else
        echo "check.sh: $key differs: $a vs $b" >&2
        status=1
    fi
done
sums="$(sha256sum "$(value IMAGE_ARCHIVE 1)" "$(value IMAGE_ARCHIVE 2)" | cut -d' ' -f1 | sort -u | wc -l)"
if [[ "$sums" == 1 ]]; then
    echo "check.sh: docker-archive tarballs identical"
else
    echo "check.sh: docker-archive tarballs differ" >&2
    status=1
fi
# The size line is for the reader: a log without it is no failure to reproduce.
grep '^image size' "$work/build-1.log" || true
[[ $status == 0 ]] && echo "check.sh: reproducible"
exit $status
