"""kubectl (built by ../build.sh from this folder's go.mod), fixtures that apply the daemonset/ base, and
`api_request`, one raw REST call with a bearer token (so a test's request is exactly what it shows).

`kubectl` (session fixture): a Kubectl bound to the control plane's admin kubeconfig.
`applied_base` (module fixture): `kubectl apply -k daemonset/` done, CRDs established; on teardown the
admission policy's binding is removed again, so tests elsewhere that borrow the agent's service account
are not confined by a policy they did not ask for. The namespace stays: without a controller-manager a
deleted namespace never finishes terminating, and the next apply would fail.
"""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import require
from tests.controlplane.harness import BUILD_SCRIPT, BUILD_TIMEOUT_S, ControlPlane

REPO = Path(__file__).resolve().parents[3]
BASE = REPO / "daemonset"
POLICY_BINDING = "topolet-agent-own-node"
# The base's one CRD; NFD's NodeFeature CRD is NFD's to install (tests/data/crds has a copy for tests).
CRDS = ("noderesourcetopologies.topology.node.k8s.io",)
COMMAND_TIMEOUT_S = 120

_built: Path | None = None
_failure: str | None = None


def build_kubectl() -> Path:
    """The kubectl binary from build.sh (built once, then cached); ControlPlane-style error on failure."""
    global _built, _failure
    if _built is None and _failure is None:
        try:
            done = subprocess.run([str(BUILD_SCRIPT), "kubectl"], capture_output=True, text=True,
                                  timeout=BUILD_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            _failure = f"build.sh kubectl: {exc}"
        else:
            paths = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
            if done.returncode != 0 or "kubectl" not in paths:
                _failure = f"build.sh kubectl failed ({done.returncode}):\n{done.stderr[-4000:]}"
            else:
                _built = Path(paths["kubectl"])
    require(_built is not None, f"no kubectl: {_failure}")
    assert _built is not None
    return _built


@dataclass(frozen=True)
class Kubectl:
    """kubectl against one API server with one kubeconfig."""

    binary: Path
    kubeconfig: Path

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run `kubectl ARGS`; with check, a non-zero exit fails the test with kubectl's stderr."""
        done = subprocess.run([str(self.binary), "--kubeconfig", str(self.kubeconfig), *args],
                              capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False)
        if check and done.returncode != 0:
            pytest.fail(f"kubectl {' '.join(args)} exited {done.returncode}:\n{done.stderr}{done.stdout}")
        return done


def kustomize_build(binary: Path, path: Path = BASE) -> str:
    """`kubectl kustomize PATH` (no API server involved): the base's rendered YAML."""
    done = subprocess.run([str(binary), "kustomize", str(path)], capture_output=True, text=True,
                          timeout=COMMAND_TIMEOUT_S, check=False)
    if done.returncode != 0:
        pytest.fail(f"kubectl kustomize {path} exited {done.returncode}:\n{done.stderr}")
    return done.stdout


def base_with_components(folder: Path, *components: str) -> list[dict[str, Any]]:
    """The base with `daemonset/components/<name>` of each name, rendered from an overlay made in
    `folder` as an operator's would include them: every non-empty document."""
    overlay = folder / "overlay"
    overlay.mkdir()
    base = os.path.relpath(BASE, overlay)
    listed = ", ".join(f"{base}/components/{name}" for name in components)
    (overlay / "kustomization.yaml").write_text(f"resources: [{base}]\ncomponents: [{listed}]\n")
    return [d for d in yaml.safe_load_all(kustomize_build(build_kubectl(), overlay)) if d]


@pytest.fixture(scope="session")
def kubectl(control_plane: ControlPlane) -> Kubectl:
    """kubectl with the control plane's admin kubeconfig."""
    return Kubectl(build_kubectl(), control_plane.kubeconfig)


def apply_base(kubectl: Kubectl) -> subprocess.CompletedProcess[str]:
    """`kubectl apply -k daemonset/` and wait until the CRDs it installs are established."""
    done = kubectl.run("apply", "-k", str(BASE))
    kubectl.run("wait", "--for=condition=Established", "--timeout=60s",
                *(f"customresourcedefinition/{name}" for name in CRDS))
    return done


@pytest.fixture(scope="module")
def applied_base(kubectl: Kubectl) -> Iterator[subprocess.CompletedProcess[str]]:
    """The daemonset/ base applied to the control plane (see the module docstring for teardown)."""
    yield apply_base(kubectl)
    kubectl.run("delete", "validatingadmissionpolicybinding", POLICY_BINDING, "--ignore-not-found",
                check=False)


def api_request(plane: ControlPlane, method: str, path: str, token: str | None = None,
                body: Any = None, content_type: str = "application/json",
                impersonate: tuple[str, tuple[str, ...]] | None = None) -> tuple[int, dict[str, Any]]:
    """One REST call to the API server (admin when no token); (HTTP status, decoded JSON body).
    `impersonate`: (user, groups) to act as, with the token's (the admin's) right to impersonate."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(plane.url + path, data=data, method=method)
    req.add_header("Authorization", f"Bearer {token or plane.admin_token}")
    if impersonate is not None:
        req.add_header("Impersonate-User", impersonate[0])
        for group in impersonate[1]:
            req.add_header("Impersonate-Group", group)
    req.add_header("Accept", "application/json")
    if data is not None:
        req.add_header("Content-Type", content_type)
    ctx = ssl.create_default_context(cafile=str(plane.ca_file))
    try:
        with urllib.request.urlopen(req, timeout=30, context=ctx) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    try:
        decoded = json.loads(raw) if raw else {}
    except ValueError:
        decoded = {"message": raw.decode(errors="replace")}
    return status, decoded if isinstance(decoded, dict) else {"items": decoded}
