"""Every device plugin resource per zone in the NodeResourceTopology: `zone_devices` (pure), the
builder, and the agent's kubelet reader against the pod-resources stand-in (what the kubelet offers,
`GetAllocatableResources`, less what containers hold, `List`)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent.api.objects import is_extended_resource
from agent.enforce.state import State
from agent.kube.kubelet.podresources.client import Device
from agent.kube.kubelet.resources import Kubelet
from agent.kube.publish.nrt_build import build_nrt, zone_devices
from tests.kube.podresources_standin import PodResourcesStandIn, short_tmpdir
from tests.kube.test_nrt import TWO_SOCKETS_AND_CXL, resources, zones_by_name
from tests.kube.test_nrt_devices import GPUS, UUID

NIC = "example.com/nic"
HCA = "rdma/hca"


def nic(device_id: str, *numa: int) -> Device:
    return Device(NIC, (device_id,), frozenset(numa))


@pytest.mark.parametrize(("name", "ok"), [
    ("example.com/nic", True),
    ("nvidia.com/gpu", True),
    ("rdma/hca_shared_devices_a", True),
    ("intel.com/sriov_netdevice", True),
    ("cpu", False),
    ("hugepages-2Mi", False),
    ("kubernetes.io/nic", False),  # the kubernetes.io domain is the API's own
    ("node.kubernetes.io/nic", False),
    ("requests.example.com/nic", False),  # a quota's name, not a resource
    ("Example.com/nic", False),  # the domain is a lower-case DNS subdomain
    ("example.com/", False),
    ("example.com/-nic", False),
    ("example.com/" + "n" * 64, False),
    ("example.com/a/b", False),
    (7, False),
])
def test_extended_resource_names(name: object, ok: bool) -> None:
    assert is_extended_resource(name) is ok


@pytest.mark.parametrize(("offered", "held", "expected"), [
    ((), (), {}),
    # one per zone, one held on node 1
    ((nic("n0", 0), nic("n1", 1), nic("n2", 1)), (nic("n2", 1),),
     {0: {NIC: (1, 1)}, 1: {NIC: (2, 1)}}),
    # two resources side by side in one zone
    ((nic("n0", 0), Device(HCA, ("h0", "h1"), frozenset({0}))), (Device(HCA, ("h1",), frozenset({0})),),
     {0: {NIC: (1, 1), HCA: (2, 1)}}),
    # a device naming several nodes counts once, in the lowest published one
    ((nic("n0", 1, 0),), (), {0: {NIC: (1, 1)}}),
    ((nic("n0", 5, 1),), (), {1: {NIC: (1, 1)}}),
    # without a NUMA node (or with one this node does not publish): in no zone
    ((nic("n0"), nic("n1", 7)), (), {}),
    # an id listed twice is one device; an id held under another resource name is not this one
    ((nic("n0", 0), nic("n0", 0)), (Device(HCA, ("n0",), frozenset({0})),), {0: {NIC: (1, 1)}}),
])
def test_zone_devices(offered: tuple[Device, ...], held: tuple[Device, ...],
                      expected: dict[int, dict[str, tuple[int, int]]]) -> None:
    assert zone_devices(offered, held, {0, 1, 2}) == expected


def test_builder_publishes_devices_per_zone_beside_gpus() -> None:
    offered = (nic("n0", 0), nic("n1", 0), nic("n2", 1), Device(HCA, ("h0",), frozenset({2})))
    held = (nic("n1", 0),)
    obj = build_nrt(("w", "u"), TWO_SOCKETS_AND_CXL, State(), (), GPUS, offered_devices=offered,
                    held_devices=held)
    zones = zones_by_name(obj)
    assert resources(zones["node-0"])[NIC] == ("2", "2", "1")
    assert resources(zones["node-1"])[NIC] == ("1", "1", "1")
    assert resources(zones["node-2"])[HCA] == ("1", "1", "1")  # a memory-only zone lists it too
    assert NIC not in resources(zones["node-2"])
    assert resources(zones["node-0"])["nvidia.com/gpu"] == ("2", "2", "2")  # GPUs as before
    assert build_nrt(("w", "u"), TWO_SOCKETS_AND_CXL, State(), (), GPUS) == build_nrt(
        ("w", "u"), TWO_SOCKETS_AND_CXL, State(), (), GPUS, offered_devices=(), held_devices=())


def test_kubelet_reads_devices_offered_and_held() -> None:
    folder = short_tmpdir()
    offered = [nic("n0", 0), nic("n1", 1), Device("nvidia.com/gpu", (UUID[0],), frozenset({0})),
               Device("bad name/x", ("z",), frozenset({0}))]
    held = {("ns", "p", "c"): [nic("n1", 1)]}
    no_gpus = Kubelet(os.path.join(folder, "kubelet.sock"), ())
    with_gpus = Kubelet(os.path.join(folder, "kubelet.sock"), GPUS[:1])
    with PodResourcesStandIn(held, folder=folder, allocatable_devices=offered) as standin:
        assert not no_gpus.refresh_devices()  # nothing known to ask about yet: grpc stays unloaded
        no_gpus.check_cpu_manager()  # the kubelet offers devices: now they are read
        assert no_gpus.device_resources == {NIC, "nvidia.com/gpu"}
        assert no_gpus.refresh_devices()
        # Without NVML's GPUs the kubelet's GPUs are devices like any other; a bad name is dropped.
        assert {d.resource for d in no_gpus.offered_devices} == {NIC, "nvidia.com/gpu"}
        assert no_gpus.held_devices == (nic("n1", 1),)
        assert not no_gpus.refresh_devices()  # unchanged
        standin.assignments = {}
        assert no_gpus.refresh_devices() and no_gpus.held_devices == ()
        # With NVML's GPUs, GPUs stay on their own path.
        assert with_gpus.refresh_devices()
        assert {d.resource for d in with_gpus.offered_devices} == {NIC}
    # The kubelet gone: its last answer stands.
    assert not no_gpus.refresh_devices()
    assert {d.resource for d in no_gpus.offered_devices} == {NIC, "nvidia.com/gpu"}
    os.rmdir(folder)


def test_a_pod_the_kubelet_has_not_admitted_yet_is_asked_about_again() -> None:
    # The pod-cgroup route pins as soon as the pod is bound; the kubelet assigns devices when it
    # admits the pod, moments later.  Until then Get says "not found" (not a failure: no back-off).
    from agent.kube.kubelet.podresources.client import PodResourcesClient
    from agent.kube.kubelet.podresources.locality import GPULocator
    from agent.topology.discover import discover
    from tests.realnode.numa_split import agent_root

    topology = discover(str(agent_root(Path(short_tmpdir()) / "root", [0, 1])))
    with PodResourcesStandIn({}) as standin:
        client = PodResourcesClient(standin.path)
        slept: list[float] = []

        def admit(seconds: float) -> None:
            slept.append(seconds)
            if len(slept) == 2:  # the kubelet knows the pod, its devices not assigned yet
                standin.assignments = {("ns", "p", "c"): []}
            if len(slept) == 3:  # the kubelet admits the pod
                standin.assignments = {("ns", "p", "c"): [nic("n1", 1)]}

        locator = GPULocator(client, lambda: (), sleep=admit)
        assert locator.numa_nodes("ns", "p", "c", topology) == frozenset({1})
        assert len(slept) == 3 and client.failures == 0
        # A pod it never admits: pinned without its devices' nodes once the wait is over.
        now = [0.0]
        never = GPULocator(client, lambda: (), wait=1.0, sleep=lambda s: now.__setitem__(0, now[0] + s),
                           clock=lambda: now[0])
        assert never.numa_nodes("ns", "other", "c", topology) is None
        assert client.failures == 0
        client.close()


def test_a_resource_no_device_plugin_serves_is_asked_about_once() -> None:
    # The NRI route answers CreateContainer within the runtime's timeout: a container asking only for
    # an extended resource no plugin serves must not wait for devices no admission will show.
    from agent.kube.kubelet.podresources.client import PodResourcesClient
    from agent.kube.kubelet.podresources.locality import GPULocator
    from agent.topology.discover import discover
    from tests.realnode.numa_split import agent_root

    topology = discover(str(agent_root(Path(short_tmpdir()) / "root", [0, 1])))
    with PodResourcesStandIn({("ns", "p", "c"): []}) as standin:
        client = PodResourcesClient(standin.path)
        slept: list[float] = []
        locator = GPULocator(client, lambda: (), sleep=slept.append)
        assert locator.numa_nodes("ns", "p", "c", topology, admitting=False) is None
        assert slept == [] and standin.calls.count("Get") == 1
        client.close()
