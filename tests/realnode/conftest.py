"""Fixtures for the real-node tests: a real kubelet, containerd and runc here (tests/realnode/node.py).

`real_node` (module scope) is a `RealNode` with `cpuManagerPolicy: none` registered with the session's
test cluster (`cluster_session`: its own control plane, kube-controller-manager, kube-scheduler);
`realnode_parts` the binaries and image.  They need root, writable cgroups, the Debian packages of
`make deps` (containerd, runc, containernetworking-plugins, busybox-static) and the kubelet build:
without them the tests skip, and fail under CI=true.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.conftest import require
from tests.controlplane.cluster import Cluster
from tests.controlplane.fixtures import api, cluster, cluster_session, namespace
from tests.realnode.node import RealNode, RealNodeError, RealNodeParts, find_parts

__all__ = ["api", "cluster", "cluster_session", "namespace", "pods", "realnode_parts", "real_node"]

_parts: RealNodeParts | None = None
_parts_failure: str | None = None


@pytest.fixture(scope="session")
def realnode_parts() -> RealNodeParts:
    """The kubelet (built once), containerd, runc, the CNI plugins and the busybox image."""
    global _parts, _parts_failure
    require(os.geteuid() == 0, "a real node needs root (cgroups, mounts, network namespaces)")
    if _parts is None and _parts_failure is None:
        try:
            _parts = find_parts()
        except RealNodeError as exc:
            _parts_failure = str(exc)
    require(_parts is not None, f"no real node: {_parts_failure}")
    assert _parts is not None
    return _parts


def start_node(cluster: Cluster, parts: RealNodeParts, **kw: str) -> RealNode:
    """A started RealNode (a failure to start is a test failure, with the daemons' logs)."""
    node = RealNode(cluster, parts, **kw)
    node.start()
    return node


def running_node(cluster: Cluster, parts: RealNodeParts, **kw: str) -> Iterator[RealNode]:
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
    from tests.kube.kubelet_standin import wait_for
    from tests.realnode.test_realnode import delete_pod, get_pod

    names: list[str] = []
    yield names
    with node.api() as api:
        for name in names:
            delete_pod(api, name)
        for name in names:
            wait_for(lambda n=name: get_pod(api, n) is None, f"pod {name} gone")


@pytest.fixture(scope="module")
def real_node(cluster_session: Cluster, realnode_parts: RealNodeParts) -> Iterator[RealNode]:
    """A real node with `cpuManagerPolicy: none`, stopped (everything cleaned up) after the module."""
    yield from running_node(cluster_session, realnode_parts)


@pytest.fixture
def pods(real_node: RealNode) -> Iterator[list[str]]:
    """Names of pods a test creates in `default` on the real node; deleted (and waited for) after it."""
    yield from pods_deleted_after(real_node)
