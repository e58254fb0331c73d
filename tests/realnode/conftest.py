"""Fixtures for the real-node tests: a real kubelet, containerd and runc here (tests/realnode/node.py).

`real_node` (module scope) is a `RealNode` with `cpuManagerPolicy: none` registered with
`realnode_cluster`: the session's test cluster (`cluster_session`: its own control plane,
kube-controller-manager, kube-scheduler), or, with TOPOLET_REALNODE_CLUSTER set, the cluster another
machine runs (tests/realnode/remote.py: the host of tests/vm's cgroup v2 guest, which runs these tests
with only the node inside).  `realnode_parts` are the binaries and image.  They need root, writable
cgroups, the Debian packages of `make deps` (containerd, runc, containernetworking-plugins,
busybox-static) and the kubelet build: without them the tests skip, and fail under CI=true.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import require
from tests.controlplane.cluster import Cluster
from tests.controlplane.fixtures import api, cluster, cluster_session, namespace
from tests.realnode.node import RealNode, RealNodeError, RealNodeParts, find_parts
from tests.realnode.remote import attach, forward_api, load_remote, remote_parts

__all__ = ["api", "cluster", "cluster_session", "namespace", "pods", "realnode_cluster", "realnode_parts",
           "real_node"]

_parts: RealNodeParts | None = None
_parts_failure: str | None = None


@pytest.fixture(scope="session")
def realnode_parts() -> RealNodeParts:
    """The kubelet (built once), containerd, runc, the CNI plugins and the busybox image."""
    global _parts, _parts_failure
    require(os.geteuid() == 0, "a real node needs root (cgroups, mounts, network namespaces)")
    if _parts is None and _parts_failure is None:
        remote = load_remote()
        try:
            _parts = find_parts() if remote is None else remote_parts(remote)
        except RealNodeError as exc:
            _parts_failure = str(exc)
    require(_parts is not None, f"no real node: {_parts_failure}")
    assert _parts is not None
    return _parts


@pytest.fixture(scope="session")
def realnode_cluster(request: pytest.FixtureRequest,
                     tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The cluster the real nodes join: `cluster_session`, or the remote one (TOPOLET_REALNODE_CLUSTER),
    its API server carried to this machine's loopback for the session."""
    remote = load_remote()
    if remote is None:
        yield request.getfixturevalue("cluster_session")
        return
    workdir = tmp_path_factory.mktemp("remote-cluster")
    forwarder = forward_api(remote, workdir / "api-forward.log")
    try:
        yield attach(remote, workdir)
    finally:
        forwarder.stop()


def start_node(cluster: Cluster, parts: RealNodeParts, **kw: Any) -> RealNode:
    """A started RealNode (a failure to start is a test failure, with the daemons' logs)."""
    node = RealNode(cluster, parts, **kw)
    node.start()
    return node


def running_node(cluster: Cluster, parts: RealNodeParts, **kw: Any) -> Iterator[RealNode]:
    """A fixture's body: a started RealNode, its logs printed and everything cleaned up after."""
    node = start_node(cluster, parts, **kw)
    try:
        yield node
    finally:
        print(node.logs())
        node.stop()


def pods_deleted_after(node: RealNode) -> Iterator[list[str]]:
    """A fixture's body: a list the test adds the names of its pods in `default` to; they are deleted
    (and waited for) after it."""
    from tests.realnode.node import wait
    from tests.realnode.test_realnode import delete_pod, get_pod

    names: list[str] = []
    yield names
    with node.api() as api:
        for name in names:
            delete_pod(api, name)
        for name in names:
            wait(lambda n=name: get_pod(api, n) is None, f"pod {name} gone")


@pytest.fixture(scope="module")
def real_node(realnode_cluster: Cluster, realnode_parts: RealNodeParts) -> Iterator[RealNode]:
    """A real node with `cpuManagerPolicy: none`, stopped (everything cleaned up) after the module."""
    yield from running_node(realnode_cluster, realnode_parts)


@pytest.fixture
def pods(real_node: RealNode) -> Iterator[list[str]]:
    """Names of pods a test creates in `default` on the real node; deleted (and waited for) after it."""
    yield from pods_deleted_after(real_node)
