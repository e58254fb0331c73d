#!/bin/sh
# Regenerate api_pb2.py, api_pb2_grpc.py and api_pb2.pyi from api.proto with grpcio-tools
# (pip install grpcio-tools).  Run from anywhere; PYTHON picks the interpreter (default: the
# repository's .venv, else python3).  The generated modules are committed: installing topolet
# needs no protoc.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../../.." && pwd)
python=${PYTHON:-}
if [ -z "$python" ]; then
  if [ -x "$root/.venv/bin/python" ]; then python="$root/.venv/bin/python"; else python=python3; fi
fi
cd "$root"
# The proto path is given relative to the repository root so that the generated gRPC module
# imports its messages as agent.kube.kubelet.podresources.api_pb2.
"$python" -m grpc_tools.protoc -I . --python_out=. --pyi_out=. --grpc_python_out=. \
  agent/kube/kubelet/podresources/api.proto
echo "regenerated: $(ls agent/kube/kubelet/podresources/api_pb2*.py* | tr '\n' ' ')"
