"""pytest fixtures over the harness: one control plane per session, shared by the conftests importing them."""

from __future__ import annotations

import os
import sys
import time
import uuid
from collections.abc import Iterator

import pytest

from tests.controlplane.cluster import Cluster, start_cluster
from tests.controlplane.harness import ControlPlane, ControlPlaneError, build_binaries
from tests.controlplane.kueue import Kueue, KueueScope, start_kueue
from tests.controlplane.operators import Operators, start_operators

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


# One test cluster (its own control plane, kube-controller-manager, kube-scheduler) per session: its
# controllers would act on the objects of tests that share `control_plane` (they create the default
# service account themselves, and bind their pods with no scheduler).
_cluster: Cluster | None = None
_cluster_failure: str | None = None


@pytest.fixture(scope="session")
def cluster_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The session's test cluster (see tests/controlplane/cluster.py); tests use `cluster`."""
    global _cluster, _cluster_failure
    if _cluster is None and _cluster_failure is None:
        try:
            import kubernetes  # noqa: F401

            _cluster = start_cluster(tmp_path_factory.mktemp("cluster"))
        except ImportError:
            _cluster_failure = "the `kubernetes` Python client is not installed (pip install '.[kube]')"
        except ControlPlaneError as exc:
            _cluster_failure = str(exc)
    if _cluster is None:
        _unavailable(_cluster_failure or "unknown")
    assert _cluster is not None
    mine = _cluster
    yield mine
    # Several modules import this fixture: each is its own session fixture over the one cluster.
    if _cluster is mine:
        mine.stop()
        _cluster = None


@pytest.fixture
def cluster(cluster_session: Cluster) -> Iterator[Cluster]:
    """The test cluster: .add_node(name, fsroot, labels=, taints=, reserved_cpus=, agent=), .nodes,
    .nrt(name), .set_ready(name, ready), .plane (the ControlPlane), .logs(); the nodes a test adds are
    removed after it, and the components' and agents' logs are printed when it fails."""
    plane = cluster_session.plane
    if not plane.apiserver_running():
        # An earlier test (or a process outside this session) took the cluster's API server down; say
        # so with its log's tail, and bring it back on the same port and data as the shared plane's
        # fixture does, rather than failing every later test of the session.
        log = plane.workdir / "kube-apiserver.log"
        tail = log.read_text(errors="replace")[-2000:] if log.exists() else "(no log)"
        print(f"the test cluster's API server was down; restarting it. Its log ends:\n{tail}",
              file=sys.stderr)
        plane.start_apiserver()
    before = set(cluster_session.nodes)
    yield cluster_session
    # Captured output: pytest shows it only for a failing test.
    print(cluster_session.logs())
    cluster_session.stop_controllers()
    for name in set(cluster_session.nodes) - before:
        cluster_session.remove_node(name)


@pytest.fixture
def api(cluster: Cluster) -> Iterator[object]:
    """A KubeClient on the test cluster (admin credentials), closed after the test."""
    from agent.kubeapi.client import KubeClient

    client = KubeClient(cluster.plane.client())
    yield client
    client.close()


@pytest.fixture
def namespace(api: object) -> Iterator[str]:
    """A fresh namespace on the test cluster, deleted after the test."""
    from agent.kubeapi.client import KubeClient

    assert isinstance(api, KubeClient)
    name = f"t-{uuid.uuid4().hex[:10]}"
    api.create("/api/v1/namespaces", {"metadata": {"name": name}})
    yield name
    api.request("DELETE", f"/api/v1/namespaces/{name}")


# One Kueue per session, on a control plane and cluster of its own: its webhooks (failurePolicy Fail)
# would refuse every Job and pod create of the tests sharing `cluster` whenever it is down.
_kueue: Kueue | None = None
_kueue_failure: str | None = None


@pytest.fixture(scope="session")
def kueue_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kueue]:
    """The session's Kueue (see tests/controlplane/kueue.py); tests use `kueue`."""
    global _kueue, _kueue_failure
    from tests.conftest import require

    if _kueue is None and _kueue_failure is None:
        try:
            import kubernetes  # noqa: F401

            started = time.monotonic()
            _kueue = start_kueue(tmp_path_factory.mktemp("kueue"))
            print(f"kueue: cluster and Kueue up in {time.monotonic() - started:.1f} s, Kueue ready "
                  f"{_kueue.ready_seconds:.1f} s after its start", file=sys.stderr)
        except ImportError:
            _kueue_failure = "the `kubernetes` Python client is not installed (pip install '.[kube]')"
        except ControlPlaneError as exc:
            _kueue_failure = str(exc)
    require(_kueue is not None, f"Kueue could not be built or started: {_kueue_failure}")
    assert _kueue is not None
    mine = _kueue
    yield mine
    if _kueue is mine:
        mine.stop_all()
        _kueue = None


@pytest.fixture
def kueue(kueue_session: Kueue) -> Iterator[KueueScope]:
    """Real Kueue v0.17 on its own test cluster, as a KueueScope: .kueue (the process: .log_tail(),
    .restart(), .ready_seconds), .cluster, .api, .namespace(), .resource_flavor(), .cluster_queue(),
    .local_queue(), .admission_check(), .set_check_active(), .create_job(), .workload_of(), .add_node().
    What the test creates through it is deleted after it; Kueue's and the cluster's logs are printed
    when it fails, and a Kueue that died is restarted for the next test."""
    if not kueue_session.running():
        print(f"Kueue was down; restarting it. Its log ends:\n{kueue_session.log_tail(2000)}",
              file=sys.stderr)
        kueue_session.start()
    cluster = kueue_session.cluster
    before = set(cluster.nodes)
    scope = KueueScope(kueue_session)
    try:
        yield scope
    finally:
        # Captured output: pytest shows it only for a failing test.
        print(scope.logs())
        cluster.stop_controllers()
        scope.close()
        for name in set(cluster.nodes) - before:
            cluster.remove_node(name)


# The training operators on the session's Kueue cluster, started by the first test that asks (Kueue
# itself only needs their CRDs, which it installs); their webhook configurations go when they stop.
_operators: Operators | None = None
_operators_failure: str | None = None


@pytest.fixture(scope="session")
def operators(kueue_session: Kueue, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operators]:
    """JobSet, Trainer, the MPI operator and LWS on the Kueue test cluster (tests/controlplane/operators.py):
    .running(name), .log_tail(name), .logs(), .ready_seconds."""
    global _operators, _operators_failure
    from tests.conftest import require

    if _operators is None and _operators_failure is None:
        try:
            started = time.monotonic()
            _operators = start_operators(kueue_session.cluster, tmp_path_factory.mktemp("operators"))
            print(f"operators: up in {time.monotonic() - started:.1f} s ({_operators.ready_seconds})",
                  file=sys.stderr)
        except ControlPlaneError as exc:
            _operators_failure = str(exc)
    require(_operators is not None,
            f"the training operators could not be built or started: {_operators_failure}")
    assert _operators is not None
    mine = _operators
    yield mine
    if _operators is mine:
        mine.stop()
        _operators = None
