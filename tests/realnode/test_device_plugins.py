"""Every device plugin resource, per zone, on a real node: two stand-in device plugins register with the
real kubelet (`tests/realnode/device_plugin.py`), a GPU-like `example.com/gpu` and a NIC-like
`example.com/nic`, each with one device on NUMA node 0 and one on node 1.

The test machine has one NUMA node, so the node's kubelet sees its CPUs split into two
(`tests/realnode/numa_split.py`: its mount namespace binds a two-node `/sys/devices/system/node`) and
runs `topologyManagerPolicy: single-numa-node`; the agent (enforcement on) reads the same split from
`--fsroot`.  Checked: the agent's NRT lists both resources in both zones, `available` dropping as pods
hold devices (the kubelet's pod-resources `GetAllocatableResources` less `List`); a pod asking for one
of each gets both from one zone (the real kubelet's Topology Manager and device manager) and the
agent pins its CPU in that same zone, read back from the cgroup runc made and from pod-resources.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.alloc.exclusive import allocate
from agent.alloc.request import Request
from agent.topology.cpuset import CPUSet
from agent.topology.discover import discover
from tests.conftest import REPO
from tests.controlplane.cluster import Cluster
from tests.kube.kubelet_standin import wait_for
from tests.realnode.conftest import pods_deleted_after, running_node
from tests.realnode.device_plugin import PluginProcess
from tests.realnode.node import (
    NodeAgent,
    RealNode,
    RealNodeParts,
    container_id,
    cpuset_of,
    guaranteed_pod,
    wait,
)
from tests.realnode.numa_split import agent_root, host_cpus
from tests.realnode.test_realnode import NS, get_pod

GPU = "example.com/gpu"
NIC = "example.com/nic"
GPUS = {"gpu-0": 0, "gpu-1": 1}
NICS = {"nic-0": 0, "nic-1": 1}
NUMA_OF = {**GPUS, **NICS}


@pytest.fixture(scope="module")
def numa_node(realnode_cluster: Cluster, realnode_parts: RealNodeParts) -> Iterator[RealNode]:
    """A real node whose kubelet sees two NUMA nodes and aligns devices (single-numa-node)."""
    yield from running_node(realnode_cluster, realnode_parts, numa_split=True,
                            topology_manager_policy="single-numa-node", device_plugins=True)


@pytest.fixture(scope="module")
def plugins(numa_node: RealNode, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[PluginProcess]]:
    """The two stand-in device plugins, registered, their resources on the Node."""
    work = tmp_path_factory.mktemp("device-plugins")
    started: list[PluginProcess] = []
    for name, devices in ((GPU, GPUS), (NIC, NICS)):
        started.append(PluginProcess(numa_node.device_plugins_dir, name, devices, work))
        started[-1].start()
    try:
        wait(lambda: all(((numa_node.node_object() or {}).get("status") or {}).get("allocatable", {})
                         .get(name) == "2" for name in (GPU, NIC)), "the Node to offer both resources")
        yield started
    finally:
        for p in started:
            p.stop()


@pytest.fixture(scope="module")
def fsroot(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The agent's sysfs root: this machine's CPUs in the kubelet's two NUMA nodes."""
    return agent_root(tmp_path_factory.mktemp("numa-split") / "root", host_cpus())


@pytest.fixture(scope="module")
def agent(numa_node: RealNode, plugins: list[PluginProcess], fsroot: Path) -> Iterator[NodeAgent]:
    """`topolet agent` (enforcement on) seeing the node's CPUs in the kubelet's two NUMA nodes."""
    a = NodeAgent(numa_node, "--fsroot", str(fsroot))
    a.start()
    try:
        wait_for(lambda: zone_devices(numa_node) is not None or not a.running(), "the agent's first NRT")
        assert a.running(), a.log()
        yield a
    finally:
        print(f"--- agent ---\n{a.log()[-4000:]}")
        a.stop()


@pytest.fixture
def pods(numa_node: RealNode) -> Iterator[list[str]]:
    yield from pods_deleted_after(numa_node)


def zone_devices(node: RealNode) -> dict[str, dict[str, tuple[int, int]]] | None:
    """{zone: {resource: (capacity, available)}} of the two device resources in the node's NRT."""
    obj = node.cluster.nrt(node.name)
    if obj is None:
        return None
    return {z["name"]: {r["name"]: (int(r["capacity"]), int(r["available"]))
                        for r in z.get("resources") or [] if r["name"] in (GPU, NIC)}
            for z in obj.get("zones") or [] if z.get("type") == "Node"}


def zone_cpus(node: RealNode) -> dict[str, int]:
    obj = node.cluster.nrt(node.name) or {}
    return {z["name"]: int(r["available"]) for z in obj.get("zones") or []
            for r in z.get("resources") or [] if r["name"] == "cpu"}


def device_pod(name: str, node: str, *, guaranteed: bool) -> dict[str, Any]:
    """A pod asking for one GPU-like and one NIC-like device; Guaranteed with one CPU, or Burstable."""
    pod = guaranteed_pod(name, node, cpu="1" if guaranteed else "100m", limits=guaranteed)
    res = pod["spec"]["containers"][0]["resources"]
    for part in ("requests", "limits"):  # extended resources are asked for in limits (= requests)
        res.setdefault(part, {}).update({GPU: "1", NIC: "1"})
    return pod


def start(node: RealNode, pods: list[str], name: str, *, guaranteed: bool) -> tuple[dict[str, Any], int]:
    pods.append(name)
    with node.api() as api:
        api.create(f"/api/v1/namespaces/{NS}/pods", device_pod(name, node.name, guaranteed=guaranteed))
        pod = wait(lambda: (p := get_pod(api, name)) is not None and container_id(p) and p,
                   f"pod {name} running")
    pid = wait(lambda: node.task_pids().get(str(container_id(pod))), f"the task of {name}")
    return pod, int(pid)


GET = """
import json, sys
from agent.kube.kubelet.podresources.client import PodResourcesClient
found = PodResourcesClient(sys.argv[1]).get(sys.argv[2], sys.argv[3]) or {}
print(json.dumps([[d.resource, list(d.ids)] for d in found.get("c", ())]))
"""


def held_devices(node: RealNode, name: str) -> dict[str, set[str]]:
    """{resource: device ids} the kubelet's pod-resources API says the pod's container holds (asked
    from a child process: no gRPC in the test process, see tests/realnode/device_plugin.py)."""
    done = subprocess.run([sys.executable, "-c", GET, str(node.pod_resources_socket), NS, name],
                          capture_output=True, text=True, cwd=REPO, timeout=60, check=True)
    out: dict[str, set[str]] = {}
    for resource, ids in json.loads(done.stdout.strip().splitlines()[-1]):
        out.setdefault(resource, set()).update(ids)
    return out


def test_devices_per_zone_aligned_with_each_other_and_the_cpus(numa_node: RealNode, agent: NodeAgent,
                                                               plugins: list[PluginProcess],
                                                               fsroot: Path, pods: list[str]) -> None:
    # Both resources in both zones, all free.
    free = {"node-0": {GPU: (1, 1), NIC: (1, 1)}, "node-1": {GPU: (1, 1), NIC: (1, 1)}}
    wait_for(lambda: zone_devices(numa_node) == free, "both device resources in both NRT zones")

    # A Burstable pod's devices are aligned too (the kubelet's device manager hints whatever the
    # QoS): both from one zone, which the NRT shows taken; it holds no CPU exclusively.
    start(numa_node, pods, "burstable", guaranteed=False)
    first = held_devices(numa_node, "burstable")
    assert set(first) == {GPU, NIC} and all(len(ids) == 1 for ids in first.values()), first
    (zone,) = {NUMA_OF[i] for ids in first.values() for i in ids}
    other = 1 - zone
    wait_for(lambda: zone_devices(numa_node) == {f"node-{zone}": {GPU: (1, 0), NIC: (1, 0)},
                                                 f"node-{other}": {GPU: (1, 1), NIC: (1, 1)}},
             f"the NRT to show zone {zone}'s devices taken")

    # A Guaranteed pod gets the other zone's GPU and NIC, and the agent pins its CPU there.
    pod, pid = start(numa_node, pods, "aligned", guaranteed=True)
    got = held_devices(numa_node, "aligned")
    assert {NUMA_OF[i] for ids in got.values() for i in ids} == {other}, got
    assert set(got) == {GPU, NIC}
    topology = discover(str(fsroot))
    near = next(n.cpus for n in topology.numa_nodes if n.id == other)
    pinned = wait_for(lambda: (c := CPUSet.parse(cpuset_of(pid)[1])) <= near and c,
                      "the pin in the devices' zone")
    assert len(pinned) == 1
    held = [a for a in agent.state().allocations if a.owner.pod_uid == pod["metadata"]["uid"]]
    assert [a.cpus for a in held] == [pinned]
    wait_for(lambda: zone_devices(numa_node) == {f"node-{zone}": {GPU: (1, 0), NIC: (1, 0)},
                                                 f"node-{other}": {GPU: (1, 0), NIC: (1, 0)}},
             "the NRT to show every device taken")
    assert zone_cpus(numa_node)[f"node-{other}"] == len(near) - 1
    # What the CPUs followed: without devices the allocator would take zone 0's CPUs on this machine.
    if other == 1:
        assert allocate(topology, topology.cpus, Request(1, "best-effort")) <= next(
            n.cpus for n in topology.numa_nodes if n.id == 0)
    # The kubelet asked the plugins for exactly the devices pod-resources reports.
    assert {i for p in plugins for ids in p.allocated() for i in ids} >= got[GPU] | got[NIC]
