"""Lease leader election against the real API server (clocks are driven by the test, not slept on)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from agent.kubeapi.client import KubeClient, resource_path
from agent.kubeapi.leader import LeaderElector
from tests.controlplane.fixtures import _apiserver_up_between_tests, control_plane

__all__ = ["_apiserver_up_between_tests", "control_plane"]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def kube(control_plane: Any) -> Iterator[KubeClient]:
    client = KubeClient(control_plane.client())
    yield client
    client.close()


@pytest.fixture
def namespace(kube: KubeClient) -> str:
    name = f"lease-{uuid.uuid4().hex[:8]}"
    kube.create(resource_path("", "v1", "namespaces"), {"metadata": {"name": name}})
    return name


def _elector(kube: KubeClient, namespace: str, identity: str, clock: Clock) -> LeaderElector:
    return LeaderElector(kube, namespace, "topolet-controller", identity, clock=clock)


def _holder(kube: KubeClient, namespace: str) -> Any:
    lease = kube.get(resource_path("coordination.k8s.io", "v1", "leases", "topolet-controller",
                                   namespace=namespace))
    return lease["spec"].get("holderIdentity"), lease["spec"].get("leaseTransitions")


def test_one_leader_and_release(kube: KubeClient, namespace: str) -> None:
    clock = Clock()
    a, b = _elector(kube, namespace, "a", clock), _elector(kube, namespace, "b", clock)
    assert a.try_acquire_or_renew() and a.is_leader
    assert not b.try_acquire_or_renew() and not b.is_leader
    clock.now += 5
    assert a.try_acquire_or_renew()  # renews
    assert not b.try_acquire_or_renew()  # the renewal is a change b observes: a is alive
    assert _holder(kube, namespace) == ("a", 0)
    a.release()
    assert not a.is_leader
    assert b.try_acquire_or_renew() and b.is_leader
    assert _holder(kube, namespace) == ("b", 1)


def test_expired_leader_is_replaced_and_stops_leading(kube: KubeClient, namespace: str) -> None:
    clock_a, clock_b = Clock(), Clock()
    a, b = _elector(kube, namespace, "a", clock_a), _elector(kube, namespace, "b", clock_b)
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()
    # a stops renewing (killed, or cut off from the API server): b waits a lease duration it observed.
    clock_b.now += 14
    assert not b.try_acquire_or_renew()
    clock_b.now += 2
    assert b.try_acquire_or_renew() and b.is_leader
    assert _holder(kube, namespace) == ("b", 1)
    # a's own view: without a renewal for renew_deadline it is no longer leader, before b may take over.
    clock_a.now += 10
    assert not a.is_leader
    assert not a.try_acquire_or_renew()
    assert not a.is_leader
