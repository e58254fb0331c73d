"""The admission tests' shared fixtures: an API client and a fresh namespace on the test cluster."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tests.controlplane.cluster import Cluster
from tests.controlplane.fixtures import cluster, cluster_session

__all__ = ["api", "cluster", "cluster_session", "namespace"]


@pytest.fixture
def api(cluster: Cluster) -> Iterator[object]:
    from agent.kube.client import KubeClient

    client = KubeClient(cluster.plane.client())
    yield client
    client.close()


@pytest.fixture
def namespace(api: object) -> Iterator[str]:
    from agent.kube.client import KubeClient

    assert isinstance(api, KubeClient)
    name = f"t-{uuid.uuid4().hex[:10]}"
    api.create("/api/v1/namespaces", {"metadata": {"name": name}})
    yield name
    api.request("DELETE", f"/api/v1/namespaces/{name}")
