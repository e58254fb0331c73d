#!/usr/bin/env bash
# `make test` as a new machine runs it: a clean clone of REV (default HEAD) with every cache empty
# (topolet's ~/.cache/topolet, Go's build and module caches, pip's), CI=true, through .ci/run.
# Prints the set-up and whole wall times at the end (README's measured table, "make test cold").
# Needs root and about 12 GiB free under WORK (default /tmp/topolet-cold); takes about an hour on 2 cores.
set -euo pipefail
rev="${1:-HEAD}"
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="${WORK:-/tmp/topolet-cold}"
chmod -R u+w "$work" 2>/dev/null || true  # Go's module cache is read-only
rm -rf "$work"
mkdir -p "$work/cache"
git clone -q "$repo" "$work/clone"
cd "$work/clone"
git checkout -q "$rev"
export TOPOLET_CACHE_DIR="$work/cache/topolet" GOCACHE="$work/cache/go-build" \
       GOMODCACHE="$work/cache/gomod" PIP_CACHE_DIR="$work/cache/pip" XDG_CACHE_HOME="$work/cache/xdg" CI=true
start=$(date +%s)
log="$work/run.log"
echo "cold make test of $(git rev-parse --short HEAD), log in $log"
set +e
bash .ci/run 2>&1 | tee "$log" | while IFS= read -r line; do
  case "$line" in
    *"test session starts"*|*" passed"*|*" failed"*) echo "$line" ;;
  esac
  if [[ -z "${tests_at:-}" && "$line" == *"pytest"*"tests"* ]]; then tests_at=$(date +%s); echo "tests start after $(( tests_at - start )) s"; fi
done
rc=${PIPESTATUS[0]}
echo "make test cold: rc $rc, wall $(( $(date +%s) - start )) s"
exit "$rc"
