"""pytest fixtures over the harness: one control plane per session, shared by the conftests importing them."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.controlplane.harness import ControlPlane, ControlPlaneError, build_binaries

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

# One control plane for the whole session even when several conftests import these fixtures; a failure
# is remembered so that later tests do not retry a long build.
_plane: ControlPlane | None = None
_failure: str | None = None


def _unavailable(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"control plane required under CI: {reason}")
    pytest.skip(f"no control plane: {reason}")


def _session_plane(tmp_path_factory: pytest.TempPathFactory) -> ControlPlane:
    global _plane, _failure
    if _plane is not None:
        return _plane
    if _failure is None:
        try:
            import kubernetes  # noqa: F401
        except ImportError:
            _failure = "the `kubernetes` Python client is not installed (pip install '.[kube]')"
    if _failure is None:
        try:
            plane = ControlPlane(build_binaries(), tmp_path_factory.mktemp("controlplane"))
            plane.start()
            _plane = plane
        except ControlPlaneError as exc:
            _failure = str(exc)
    if _plane is None:
        _unavailable(_failure or "unknown")
    assert _plane is not None
    return _plane


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """etcd + kube-apiserver on loopback: .url, .kubeconfig, .client(token), .mint_token(...),
    .stop_apiserver(), .start_apiserver(), .write_kubeconfig(path, token)."""
    global _plane
    plane = _session_plane(tmp_path_factory)
    yield plane
    if _plane is plane:
        plane.stop()
        _plane = None


@pytest.fixture(autouse=True)
def _apiserver_up_between_tests() -> Iterator[None]:
    """A test that stopped the API server and failed before restarting it does not take later tests down."""
    yield
    if _plane is not None and not _plane.apiserver_running():
        _plane.start_apiserver()
