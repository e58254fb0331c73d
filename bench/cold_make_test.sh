#!/usr/bin/env bash
# `make test` as a new machine runs it: a clean clone of REV (default HEAD) with every cache empty
# (topolet's ~/.cache/topolet, Go's build and module caches, pip's), CI=true, through .ci/run.
# Prints the set-up and whole wall times at the end (README's measured table, "make test cold").
# Needs root and about 12 GiB free under WORK (default /tmp/topolet-cold); takes about an hour on 2 cores.
# `--check [REV]` runs nothing: it checks those inputs (REV, its .ci/run, root, free space) and ends with
# the same last line, wall 0 (tests/bench/test_bench_smoke.py runs it so).
set -euo pipefail
check=false
if [[ "${1:-}" == "--check" ]]; then check=true; shift; fi
rev="${1:-HEAD}"
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="${WORK:-/tmp/topolet-cold}"
need_gib=12

last_line() {  # rc, wall seconds[, note]: the line README's table is read from
  echo "make test cold: rc $1, wall $2 s${3:+ ($3)}"
}

if $check; then
  bad=0
  if sha=$(git -C "$repo" rev-parse --verify -q "$rev^{commit}"); then
    echo "# rev $rev: ${sha:0:7}"
    git -C "$repo" cat-file -e "$sha:.ci/run" 2>/dev/null || { echo "# .ci/run missing at $rev"; bad=1; }
  else
    echo "# rev $rev: not a commit of $repo"; bad=1
  fi
  [[ $(id -u) == 0 ]] || { echo "# needs root (.ci/run runs as root)"; bad=1; }
  at="$work"
  while [[ ! -d "$at" ]]; do at="$(dirname "$at")"; done
  free_gib=$(( $(df -Pk "$at" | awk 'NR == 2 { print $4 }') / 1024 / 1024 ))
  echo "# WORK $work: $free_gib GiB free under $at (needs about $need_gib)"
  (( free_gib >= need_gib )) || bad=1
  last_line "$bad" 0 "--check: nothing run"
  exit "$bad"
fi

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
last_line "$rc" "$(( $(date +%s) - start ))"
exit "$rc"
