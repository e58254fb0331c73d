#!/bin/sh
# Fetch NRI's and ttrpc's protocol definitions from the Go module proxy at the versions containerd
# v2.4.2 ships, copy them here with their origin, and regenerate the *_pb2.py / *_pb2.pyi modules
# with grpcio-tools (pip install grpcio-tools==1.85.1: its protoc writes code for protobuf >= 7.35.1,
# the floor of pyproject's kube extra; messages only, no gRPC stubs: NRI speaks ttrpc).
# Run from anywhere; needs `go` (for `go mod download`).  PYTHON picks the interpreter (default:
# the repository's .venv, else python3).  The copies and the generated modules are committed:
# installing topolet needs neither go nor protoc.
set -eu
NRI_VERSION=v0.12.3
TTRPC_VERSION=v1.2.9
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
python=${PYTHON:-}
if [ -z "$python" ]; then
  if [ -x "$root/.venv/bin/python" ]; then python="$root/.venv/bin/python"; else python=python3; fi
fi

# `go mod download` outside any module: the module cache path of one module@version.
module_dir() {
  scratch=$(mktemp -d)
  (cd "$scratch" && GOFLAGS=-mod=mod go mod download -json "$1") |
    "$python" -c 'import json, sys; d = json.load(sys.stdin); sys.exit(d.get("Error")) if "Dir" not in d else print(d["Dir"])'
  rmdir "$scratch"
}
nri=$(module_dir "github.com/containerd/nri@$NRI_VERSION")
ttrpc=$(module_dir "github.com/containerd/ttrpc@$TTRPC_VERSION")

{
  echo "// Copied unmodified by agent/nri/regenerate.sh from github.com/containerd/nri@$NRI_VERSION"
  echo "// pkg/api/api.proto (Apache-2.0, the header below; https://github.com/containerd/nri)."
  echo
  cat "$nri/pkg/api/api.proto"
} >"$here/api.proto"

# ttrpc's request.proto imports google/rpc/status.proto, which grpcio-tools does not ship; its one
# message is restated in rpc_status.proto under a package of ours (same fields, same wire bytes), so
# these two lines name that file and that package instead.
{
  echo "// Copied by agent/nri/regenerate.sh from github.com/containerd/ttrpc@$TTRPC_VERSION request.proto"
  echo "// (Apache-2.0, https://github.com/containerd/ttrpc/blob/$TTRPC_VERSION/LICENSE), unmodified except the"
  echo "// import of google/rpc/status.proto and its type name: see rpc_status.proto."
  echo
  sed -e 's|^import "google/rpc/status.proto";$|import "agent/nri/rpc_status.proto";|' \
      -e 's|^\tgoogle\.rpc\.Status status = 1;$|\ttopolet.nri.rpc.Status status = 1;|' \
      "$ttrpc/request.proto"
} >"$here/ttrpc.proto"
grep -q '^import "agent/nri/rpc_status.proto";$' "$here/ttrpc.proto"
grep -q 'topolet.nri.rpc.Status status = 1;' "$here/ttrpc.proto"

cd "$root"
# Paths relative to the repository root, so generated modules import each other as agent.nri.*.
"$python" -m grpc_tools.protoc -I . --python_out=. --pyi_out=. \
  agent/nri/api.proto agent/nri/rpc_status.proto agent/nri/ttrpc.proto
# api.proto's enum Field has a value named None: a stub line `None: ...` is not Python, and mypy
# stops at it.  The value stays in the module (api_pb2.Field.Value("None")); only the stub loses it.
sed -i -e '/^ *None: _\?ClassVar\[Field\]$/d' -e '/^None: Field$/d' agent/nri/api_pb2.pyi
"$python" -c 'import ast, sys; [ast.parse(open(f).read(), f) for f in sys.argv[1:]]' agent/nri/*_pb2.pyi
"$python" -c 'import agent.nri.api_pb2, agent.nri.ttrpc_pb2'
echo "regenerated: $(ls agent/nri/*_pb2.py* | tr '\n' ' ')"
