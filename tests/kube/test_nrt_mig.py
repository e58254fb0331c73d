"""MIG instances per zone, by profile, in the NRT: the pure builder over an inventory (tables), and
the inventory read through NVML.  The one GPU stand-in is tests/gpu/fake_nvml.py (NVML only)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from agent.cli.compose import kube_agent
from agent.enforce.state import State
from agent.gpu.capacity import MigInventory, read_mig_inventory
from agent.gpu.planner import ExistingInstance
from agent.kube.kubelet.podresources.client import Device
from agent.kube.publish.nrt_build import build_nrt
from agent.metrics.registry import Metrics
from tests.gpu.fake_nvml import h100_node
from tests.kube.kubelet_standin import wait_for
from tests.kube.podresources_standin import PodResourcesStandIn
from tests.kube.test_enforcement_off import DumpNode, dump_node
from tests.kube.test_nrt import TWO_SOCKETS_AND_CXL, gpu, resources, zones_by_name

__all__ = ["dump_node"]

# H100s: GPUs 0 and 1 on NUMA 0 and 1, both MIG-capable; the startup inventory says GPU 0 and 1
# are in MIG mode, GPU 2 (NUMA 1) is not.
GPUS = (gpu(0, 0, address="0000:18:00.0", mig=True), gpu(1, 1, address="0000:3b:00.0", mig=True),
        gpu(2, 1, address="0000:86:00.0"))


def inst(profile: str, start: int, size: int, in_use: bool = False) -> ExistingInstance:
    return ExistingInstance(profile, start, size, in_use)


MIXED: MigInventory = {
    0: (True, (inst("1g.10gb", 0, 1), inst("1g.10gb", 1, 1, in_use=True), inst("3g.40gb", 4, 4))),
    1: (True, (inst("7g.80gb", 0, 8),)),
    2: (False, ()),
}

# (inventory, {zone: {resource: (capacity, allocatable, available)}} of GPU resources)
ROWS: list[tuple[str, MigInventory | None, dict[str, dict[str, tuple[str, str, str]]]]] = [
    ("instances by profile in the GPU's zone", MIXED, {
        "node-0": {"nvidia.com/mig-1g.10gb": ("2", "2", "1"), "nvidia.com/mig-3g.40gb": ("1", "1", "1")},
        "node-1": {"nvidia.com/mig-7g.80gb": ("1", "1", "1"), "nvidia.com/gpu": ("1", "1", "1")}}),
    ("a profile on two GPUs of one zone adds up", {
        0: (True, (inst("3g.40gb", 0, 4, in_use=True),)),
        1: (True, (inst("3g.40gb", 4, 4),)), 2: (False, ())}, {
        "node-0": {"nvidia.com/mig-3g.40gb": ("1", "1", "0")},
        "node-1": {"nvidia.com/mig-3g.40gb": ("1", "1", "1"), "nvidia.com/gpu": ("1", "1", "1")}}),
    ("MIG mode off since start: a whole GPU again", {0: (False, ()), 1: (True, ()), 2: (False, ())}, {
        "node-0": {"nvidia.com/gpu": ("1", "1", "1")},
        "node-1": {"nvidia.com/gpu": ("1", "1", "1")}}),
    ("MIG mode on since start: instances, not a GPU", {
        0: (True, ()), 1: (True, ()), 2: (True, (inst("2g.20gb", 0, 2),))}, {
        "node-0": {}, "node-1": {"nvidia.com/mig-2g.20gb": ("1", "1", "1")}}),
    ("no inventory: MIG GPUs offer nothing", None, {
        "node-0": {}, "node-1": {"nvidia.com/gpu": ("1", "1", "1")}}),
]


def three_instances(nvml: Any) -> int:
    """Initialise the NVML stand-in and make two 1g.10gb instances on GPU 0 (NUMA 0) and a 3g.40gb
    one on GPU 1; the first instance's id."""
    nvml.nvmlInit()
    first: int = nvml.create_instance(0, "1g.10gb", 0)
    nvml.create_instance(0, "1g.10gb", 1)
    nvml.create_instance(1, "3g.40gb", 0)
    return first


@pytest.mark.parametrize(("inventory", "want"), [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_mig_resources_per_zone(inventory: MigInventory | None,
                                want: dict[str, dict[str, tuple[str, str, str]]]) -> None:
    zones = zones_by_name(build_nrt(("w", "u"), TWO_SOCKETS_AND_CXL, State(), (), GPUS, mig=inventory))
    for name, expected in want.items():
        got = {k: v for k, v in resources(zones[name]).items() if k.startswith("nvidia.com/")}
        assert got == expected, name
    assert not any(k.startswith("nvidia.com/") for k in resources(zones["node-2"]))


def test_a_gpu_held_whole_in_the_state_is_not_a_mig_question() -> None:
    zones = zones_by_name(build_nrt(("w", "u"), TWO_SOCKETS_AND_CXL, State(), (), GPUS,
                                    assigned_gpus=("0000:86:00.0",), mig=MIXED))
    assert resources(zones["node-1"])["nvidia.com/gpu"] == ("1", "1", "0")
    assert resources(zones["node-1"])["nvidia.com/mig-7g.80gb"] == ("1", "1", "1")


def test_inventory_read_through_nvml() -> None:
    nvml: Any = h100_node(3)
    nvml.nvmlInit()
    nvml.nvmlDeviceSetMigMode(nvml.nvmlDeviceGetHandleByIndex(2), 0)
    small = nvml.create_instance(0, "1g.10gb", 0)
    nvml.create_instance(0, "1g.10gb", 1)
    big = nvml.create_instance(0, "3g.40gb", 4)
    nvml.create_instance(1, "7g.80gb", 0)
    nvml.start_process(0, 4242, big, 0)  # a process on the 3g.40gb instance: in use as well

    got = read_mig_inventory(nvml, {0: {small}})
    assert {i: (mode, [(x.profile, x.start, x.in_use) for x in found])
            for i, (mode, found) in got.items()} == {
        0: (True, [("1g.10gb", 0, True), ("1g.10gb", 1, False), ("3g.40gb", 4, True)]),
        1: (True, [("7g.80gb", 0, False)]),
        2: (False, []),
    }
    zones = zones_by_name(build_nrt(("w", "u"), TWO_SOCKETS_AND_CXL, State(), (), GPUS, mig=got))
    assert resources(zones["node-0"])["nvidia.com/mig-1g.10gb"] == ("2", "2", "1")
    assert resources(zones["node-0"])["nvidia.com/mig-3g.40gb"] == ("1", "1", "0")
    assert resources(zones["node-1"])["nvidia.com/gpu"] == ("1", "1", "1")


# ---- the agent on a real API server --------------------------------------------------------------

def mig_available(node: DumpNode, zone: str) -> dict[str, int]:
    obj = node.nrt() or {}
    return {r["name"]: int(r["available"]) for z in obj.get("zones") or [] if z["name"] == zone
            for r in z.get("resources") or [] if r["name"].startswith("nvidia.com/mig-")}


def test_agent_publishes_mig_instances_less_those_the_kubelet_assigned(
        dump_node: DumpNode, monkeypatch: pytest.MonkeyPatch) -> None:
    # The agent in this process, without enforcement, on the 64-CPU dump; NVML is the stand-in with
    # two H100s in MIG mode (NUMA 0 and 1 by the hand-built inventory), the kubelet's pod-resources
    # socket the gRPC stand-in.
    node = dump_node
    monkeypatch.setenv("POD_NAMESPACE", node.namespace)
    nvml: Any = h100_node(2)
    first = three_instances(nvml)
    with PodResourcesStandIn() as kubelet:
        args = node.in_process_args(kubelet.path, 0.3)
        agent = kube_agent(args, Metrics(), nvml=nvml, gpus=GPUS[:2])
        stop = threading.Event()
        thread = threading.Thread(target=agent.run, args=(stop,), daemon=True)
        thread.start()
        try:
            wait_for(lambda: mig_available(node, "node-0") == {"nvidia.com/mig-1g.10gb": 2}
                     and mig_available(node, "node-1") == {"nvidia.com/mig-3g.40gb": 1},
                     "the NRT to list the MIG instances in their GPUs' zones")
            kubelet.assignments = {(node.namespace, "train", "c0"): [
                Device("nvidia.com/mig-1g.10gb", (f"MIG-GPU-00000000-h100/{first}/0",), frozenset({0}))]}
            node.create_running_pod("train", None)  # a pod change: the agent asks the kubelet again
            wait_for(lambda: mig_available(node, "node-0") == {"nvidia.com/mig-1g.10gb": 1},
                     "the NRT to count the MIG device the kubelet handed out")
            assert mig_available(node, "node-1") == {"nvidia.com/mig-3g.40gb": 1}
        finally:
            stop.set()
            thread.join(30)
            agent.api.close()
