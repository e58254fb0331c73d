#!/bin/sh
# Installs topolet into the image being built: image/Containerfile runs it once, on either base (the
# offline debootstrap rootfs or debian:bookworm-slim), with the build context (this script and wheels/)
# mounted at the directory it lives in. Everything it leaves must be the same on every run with the same
# inputs, and nothing a build needs (compilers, headers, pip, apt lists) may stay behind.
set -eu

ctx="$(cd "$(dirname "$0")" && pwd)"
site=/usr/local/lib/python3.11/dist-packages

# No documentation, manual pages or translations from any package installed from here on (copyright
# files stay: Debian's licences ask for them to travel with the binaries).
mkdir -p /etc/dpkg/dpkg.cfg.d
cat >/etc/dpkg/dpkg.cfg.d/topolet-nodoc <<'EOF'
path-exclude=/usr/share/doc/*
path-include=/usr/share/doc/*/copyright
path-exclude=/usr/share/man/*
path-exclude=/usr/share/info/*
path-exclude=/usr/share/locale/*
path-exclude=/usr/share/lintian/*
EOF

# Debian's python3 (bookworm: 3.11, what the wheels are built for). The debootstrap base has it already;
# on a public base this is the one step that needs the Debian mirror.
if ! command -v python3 >/dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3 >/dev/null
fi
python3 -c 'import sys; assert sys.version_info[:2] == (3, 11), sys.version' \
    || { echo "install.sh: the wheels are for CPython 3.11" >&2; exit 1; }

# topolet and its locked dependencies, offline, from the context's wheels only. pip runs from its own
# wheel and is not installed. --break-system-packages: Debian marks its interpreter externally managed
# to keep pip out of /usr/lib; pip's target here is /usr/local, which Debian leaves to the admin, in an
# image nothing else will manage.
python3 "$(ls "$ctx"/wheels/pip-*.whl)/pip" install -q --no-index --find-links "$ctx/wheels" \
    --only-binary=:all: --no-compile --no-cache-dir --break-system-packages --root-user-action=ignore \
    --disable-pip-version-check "topolet[gpu,kube]"

# The asynchronous client (kubernetes.aio, 64 MiB, half the package) and the aiohttp stack only it
# imports: the agent and the controller use the synchronous client (agent/kubeapi/client.py), and
# tests/image imports every agent module inside the image to prove nothing else needs them.
rm -rf "$site/kubernetes/aio"
python3 "$(ls "$ctx"/wheels/pip-*.whl)/pip" uninstall -q -y --break-system-packages \
    --root-user-action=ignore --disable-pip-version-check \
    aiohttp aiohttp-retry aiohappyeyeballs aiosignal attrs frozenlist multidict yarl propcache

# Bytecode now, because the agent's root file system is read-only and every start would otherwise
# compile the kubernetes client again. Hash-based (no source mtimes inside) and with a fixed hash seed
# (set and frozenset constants are marshalled in hash order; each worker process inherits the seed),
# so the same sources give the same bytes; unchecked because nothing edits an image's sources.
PYTHONHASHSEED=0 python3 -m compileall -q -j 0 --invalidation-mode unchecked-hash "$site" >/dev/null

# What no running agent reads: documentation, apt's lists and caches, logs, the installer's leftovers.
find /usr/share/doc -mindepth 1 ! -type d ! -name copyright -delete 2>/dev/null || true
find /usr/share/doc -mindepth 1 -type d -empty -delete 2>/dev/null || true
rm -rf /usr/share/man /usr/share/info /usr/share/lintian /usr/share/linda \
       /var/lib/apt/lists/* /var/cache/apt/* /var/cache/debconf/*-old /var/lib/dpkg/*-old \
       /var/cache/ldconfig/aux-cache /var/log/* /root/.cache 2>/dev/null || true
# /tmp, less the build context mounted there
find /tmp -mindepth 1 -maxdepth 1 ! -path "$ctx" -exec rm -rf {} + 2>/dev/null || true
find /usr/share/locale -mindepth 1 -maxdepth 1 ! -name locale.alias -exec rm -rf {} + 2>/dev/null || true

# The image is for running the agent: no compiler or header may have come along with anything above.
for tool in cc gcc g++ clang ld as make; do
    if command -v "$tool" >/dev/null; then echo "install.sh: $tool is in the image" >&2; exit 1; fi
done
if [ -d /usr/include ] && [ -n "$(find /usr/include -name '*.h' -print -quit)" ]; then
    echo "install.sh: C headers are in the image" >&2
    exit 1
fi
topolet --help >/dev/null
