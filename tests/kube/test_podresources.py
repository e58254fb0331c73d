"""The kubelet's pod-resources API: our client against a real gRPC server on a real unix socket (the
kubelet's other stand-in, podresources_standin.py), failure modes (no socket, garbage, a hung or
silent server, a restart), GPU → NUMA mapping, and CPUs that follow a container's GPUs: through the
allocator on a synthetic 2-NUMA machine, and through the agent's PodPinner into real cgroups.
"""

from __future__ import annotations

import logging
import os
import secrets
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.alloc.exclusive import allocate
from agent.alloc.request import Request
from agent.alloc.synthetic import synthetic_topology
from agent.api.podplan import ContainerPlan, PodPlan, PodWarning
from agent.api.qos import QOSClass
from agent.enforce.cgroup import CgroupLayout, create_cgroup, detect_layout, read_cpuset, read_procs
from agent.enforce.kubepods import CgroupDriver, container_cgroup_path
from agent.enforce.state_file import StateFile
from agent.errors import AllocationError, EnforcementError
from agent.gpu.model import GPU
from agent.kube.kubelet.podresources import api_pb2
from agent.kube.kubelet.podresources.client import Device, PodResourcesClient
from agent.kube.kubelet.podresources.locality import GPULocator, gpu_numa_nodes, gpu_of, is_gpu_resource
from agent.kube.pods.pinner import PodPinner
from agent.metrics.registry import Metrics
from agent.pinning.engine import PinningEngine
from agent.topology.cpuset import CPUSet
from agent.topology.model import Topology
from tests.conftest import require
from tests.kube.kubelet_standin import KubeNode, _remove_tree, kube_node, proc_cpus, wait_for
from tests.kube.podresources_standin import PodResourcesStandIn, SilentSocket, short_tmpdir

__all__ = ["kube_node"]

GPU_A = "GPU-1b4a5c2e-0000-4000-8000-00000000000a"
GPU_B = "GPU-1b4a5c2e-0000-4000-8000-00000000000b"
NS = "team-a"

ASSIGNED = {
    (NS, "train", "worker"): [Device("nvidia.com/gpu", (GPU_B,), frozenset({1}))],
    (NS, "train", "sidecar"): [],
    (NS, "infer", "server"): [Device("nvidia.com/gpu", ("0",), frozenset()),
                              Device("example.com/nic", ("vf-3",), frozenset({0}))],
    ("team-b", "train", "worker"): [Device("nvidia.com/gpu", (GPU_A,), frozenset({0}))],
}

# what the device plugin hands out; the kubelet stand-in does not check it
GPU_REQUEST = {"nvidia.com/gpu": "1"}


def gpu(index: int, uuid_: str, numa: int) -> GPU:
    return GPU(index=index, uuid=uuid_, name="NVIDIA H100 80GB HBM3", product="NVIDIA-H100-80GB-HBM3",
               memory_bytes=80 << 30, pci_address=f"0000:{0x18 + index:02x}:00.0", pci_device_id=0x2330,
               numa_node=numa, local_cpus=CPUSet(), minor=index, compute_capability=(9, 0),
               mig_capable=True, mig_mode_current=False, mig_mode_pending=False)


INVENTORY = (gpu(0, GPU_A, 0), gpu(1, GPU_B, 1), gpu(2, "GPU-0000000c", -1))


@pytest.fixture
def standin() -> Iterator[PodResourcesStandIn]:
    every_gpu = [Device("nvidia.com/gpu", (GPU_A,), frozenset({0})),
                 Device("nvidia.com/gpu", (GPU_B,), frozenset({1}))]
    with PodResourcesStandIn(ASSIGNED, allocatable_devices=every_gpu, allocatable_cpus=[2, 3, 5]) as s:
        yield s


# -- the client against the stand-in ------------------------------------------------------------


def test_list_gives_every_containers_devices_with_their_numa_nodes(standin: PodResourcesStandIn) -> None:
    client = PodResourcesClient(standin.path)
    got = client.list()
    assert got == {key: list(devices) for key, devices in ASSIGNED.items()}
    assert standin.calls == ["List"]
    assert client.failures == 0


def test_get_answers_for_one_pod_and_an_unknown_pod_has_no_devices(standin: PodResourcesStandIn) -> None:
    client = PodResourcesClient(standin.path)
    assert client.get(NS, "train") == {"worker": tuple(ASSIGNED[(NS, "train", "worker")]), "sidecar": ()}
    assert client.get("team-b", "train") == {"worker": tuple(ASSIGNED[("team-b", "train", "worker")])}
    assert client.get(NS, "absent") == {}
    assert standin.calls == ["Get", "Get", "Get"]
    # An unknown pod is an answer, not a failure: the next pod is still asked.
    assert client.get(NS, "infer") == {"server": tuple(ASSIGNED[(NS, "infer", "server")])}
    assert client.failures == 0


def test_get_falls_back_to_list_on_a_kubelet_without_it() -> None:
    with PodResourcesStandIn(ASSIGNED, get=False) as s:
        client = PodResourcesClient(s.path)
        assert client.get(NS, "train") == {"worker": tuple(ASSIGNED[(NS, "train", "worker")]), "sidecar": ()}
        assert client.get(NS, "infer") == {"server": tuple(ASSIGNED[(NS, "infer", "server")])}
        assert s.calls == ["Get", "List", "List"]  # Get is not asked again once it proved missing
        assert client.failures == 0


def test_allocatable_resources(standin: PodResourcesStandIn) -> None:
    got = PodResourcesClient(f"unix://{standin.path}").allocatable()
    assert got is not None
    assert got.cpu_ids == {2, 3, 5}
    assert got.devices == (Device("nvidia.com/gpu", (GPU_A,), frozenset({0})),
                           Device("nvidia.com/gpu", (GPU_B,), frozenset({1})))
    assert standin.calls == ["GetAllocatableResources"]


def test_cpu_ids_and_memory_fields_travel_on_the_wire() -> None:
    # Field numbers must be the kubelet's: a message encoded with ours decodes with the same fields.
    msg = api_pb2.ContainerResources(
        name="c", cpu_ids=[4, 5], memory=[api_pb2.ContainerMemory(memory_type="hugepages-1Gi", size=1 << 30)],
        devices=[api_pb2.ContainerDevices(resource_name="r", device_ids=["x"],
                                          topology=api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=3)]))])
    wire = msg.SerializeToString()
    # name=1 (len), devices=2 (len), cpu_ids=3 (packed), memory=4 (len): keys 0x0a, 0x12, 0x1a, 0x22.
    assert wire[0] == 0x0A and b"\x12" in wire and b"\x1a\x02\x04\x05" in wire and b"\x22" in wire
    assert api_pb2.ContainerResources.FromString(wire) == msg


def test_malformed_values_in_a_wellformed_answer_are_dropped() -> None:
    bad = [
        api_pb2.PodResources(name="", namespace=NS, containers=[api_pb2.ContainerResources(name="c")]),
        api_pb2.PodResources(name="p", namespace=NS, containers=[
            api_pb2.ContainerResources(name="", devices=[api_pb2.ContainerDevices(resource_name="r",
                                                                                 device_ids=["d"])]),
            api_pb2.ContainerResources(name="c", devices=[
                api_pb2.ContainerDevices(resource_name="", device_ids=["d"]),
                api_pb2.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=[]),
                api_pb2.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=["", GPU_A],
                                         topology=api_pb2.TopologyInfo(nodes=[
                                             api_pb2.NUMANode(ID=-1), api_pb2.NUMANode(ID=1 << 40),
                                             api_pb2.NUMANode(ID=2)])),
            ])]),
    ]
    with PodResourcesStandIn(raw_pods=bad) as s:
        got = PodResourcesClient(s.path).list()
    assert got == {(NS, "p", "c"): [Device("nvidia.com/gpu", (GPU_A,), frozenset({2}))]}


# -- failures: no info, never an exception ------------------------------------------------------


def test_absent_socket_is_the_feature_off(caplog: pytest.LogCaptureFixture) -> None:
    folder = short_tmpdir()
    try:
        client = PodResourcesClient(os.path.join(folder, "kubelet.sock"))
        with caplog.at_level(logging.INFO, logger="agent.kube.kubelet.podresources.client"):
            assert client.list() == {}
            assert client.get(NS, "train") is None
            assert client.allocatable() is None
        assert client.failures == 0
        assert not client.available
        # Said once, at INFO: an absent kubelet socket is a configuration, not an error.
        assert [r.levelno for r in caplog.records] == [logging.INFO]
    finally:
        os.rmdir(folder)


def test_a_socket_that_appears_later_is_used() -> None:
    folder = short_tmpdir()
    client = PodResourcesClient(os.path.join(folder, "kubelet.sock"))
    assert client.list() == {}
    with PodResourcesStandIn(ASSIGNED, folder=folder) as s:
        assert client.list() == {key: list(devices) for key, devices in ASSIGNED.items()}
        assert s.calls == ["List"]
    os.rmdir(folder)


def test_garbage_answers_are_no_info() -> None:
    with PodResourcesStandIn(ASSIGNED, mode="garbage") as s:
        client = PodResourcesClient(s.path, backoff=0)
        assert client.list() == {}
        assert client.get(NS, "train") is None
        assert client.allocatable() is None
        assert s.calls == ["List", "Get", "GetAllocatableResources"]
        assert client.failures == 3


def test_a_hung_server_times_out_and_is_left_alone_for_a_while() -> None:
    with PodResourcesStandIn(ASSIGNED, mode="hang") as s:
        client = PodResourcesClient(s.path, timeout=0.3, backoff=3600)
        assert client.list() == {}
        assert client.get(NS, "train") is None
        assert client.allocatable() is None
        assert s.calls == ["List"]  # the later calls did not wait on it again
        assert client.failures == 1


def test_a_silent_socket_that_is_not_grpc_times_out() -> None:
    with SilentSocket() as s:
        client = PodResourcesClient(s.path, timeout=0.3)
        assert client.list() == {}
        assert client.failures == 1
        assert s.accepted >= 1  # it did reach the socket, and got nothing back


def test_a_restarted_kubelet_is_read_again() -> None:
    folder = short_tmpdir()
    client = PodResourcesClient(os.path.join(folder, "kubelet.sock"), timeout=2.0, backoff=0)
    first = PodResourcesStandIn({(NS, "a", "c"): [Device("nvidia.com/gpu", ("0",), frozenset())]},
                                folder=folder).start()
    assert set(client.list()) == {(NS, "a", "c")}
    first.stop()
    assert client.list() == {}  # kubelet down: no info
    with PodResourcesStandIn({(NS, "b", "c"): []}, folder=folder):
        assert set(client.list()) == {(NS, "b", "c")}
    os.rmdir(folder)


# -- device ids and NUMA nodes (pure) -----------------------------------------------------------


@pytest.mark.parametrize(("device_id", "index"), [
    (GPU_A, 0),
    (GPU_B.upper().replace("GPU-", "GPU-"), 1),  # UUID case does not matter
    ("1", 1),
    ("0", 0),
    (f"{GPU_B}::3", 1),  # a time-slicing replica of GPU B
    ("1::0", 1),
    (f"MIG-{GPU_A}/7/0", 0),  # an old-style MIG id names its GPU
    ("1:2", 1),  # index strategy, MIG device 2 of GPU 1
    ("7", None),  # no such index
    ("GPU-ffffffff", None),
    ("MIG-4f1c7d0a-0000-4000-8000-000000000000", None),  # new MIG UUIDs do not name their GPU
    ("", None),
    ("abc", None),
    ("99999999999999999999", None),
])
def test_gpu_of(device_id: str, index: int | None) -> None:
    got = gpu_of(device_id, INVENTORY)
    assert (got.index if got is not None else None) == index


@pytest.mark.parametrize(("devices", "cpu_nodes", "expected"), [
    # reported topology wins over the inventory (GPU A is on node 0 in the inventory)
    ([Device("nvidia.com/gpu", (GPU_A,), frozenset({1}))], {0, 1}, {1}),
    # no reported topology: the inventory places it, by UUID or by index
    ([Device("nvidia.com/gpu", (GPU_B,), frozenset())], {0, 1}, {1}),
    ([Device("nvidia.com/gpu", ("0",), frozenset())], {0, 1}, {0}),
    # GPUs on two nodes: both
    ([Device("nvidia.com/gpu", (GPU_A, GPU_B), frozenset())], {0, 1}, {0, 1}),
    # MIG slices count as GPUs
    ([Device("nvidia.com/mig-1g.10gb", (f"MIG-{GPU_B}/1/0",), frozenset())], {0, 1}, {1}),
    # every other device plugin resource counts by the node its plugin reported (CPUs follow all of
    # a container's devices), never by the GPU inventory
    ([Device("example.com/nic", ("vf-1",), frozenset({1}))], {0, 1}, {1}),
    ([Device("nvidia.com/gpux", ("0",), frozenset({1}))], {0, 1}, {1}),
    ([Device("nvidia.com/gpux", ("0",), frozenset())], {0, 1}, None),
    ([Device("nvidia.com/gpu", (GPU_A,), frozenset({0})),
      Device("example.com/nic", ("vf-1",), frozenset({1}))], {0, 1}, {0, 1}),
    # GPU of unknown place, unknown GPU, no GPU at all
    ([Device("nvidia.com/gpu", ("GPU-0000000c",), frozenset())], {0, 1}, None),
    ([Device("nvidia.com/gpu", ("GPU-ffff",), frozenset())], {0, 1}, None),
    ([], {0, 1}, None),
    # a node without CPUs (or one this machine does not have) is no place for CPUs
    ([Device("nvidia.com/gpu", ("x",), frozenset({4}))], {0, 1}, None),
    ([Device("nvidia.com/gpu", ("x",), frozenset({1, 4}))], {0, 1}, {1}),
])
def test_gpu_numa_nodes(devices: list[Device], cpu_nodes: set[int], expected: set[int] | None) -> None:
    got = gpu_numa_nodes(devices, INVENTORY, cpu_nodes)
    assert got == (frozenset(expected) if expected is not None else None)


def test_gpu_resource_names() -> None:
    assert is_gpu_resource("nvidia.com/gpu")
    assert is_gpu_resource("nvidia.com/mig-3g.40gb")
    assert not is_gpu_resource("nvidia.com/gpu.shared")
    assert not is_gpu_resource("amd.com/gpu")


# -- CPUs follow the GPUs: allocator on a synthetic 2-NUMA machine ------------------------------

TWO_NUMA = synthetic_topology(sockets=1, numa_per_socket=2, l3_per_numa=1, cores_per_l3=4, threads=2)


def node_cpus(topology: Topology, node: int) -> CPUSet:
    return next(n.cpus for n in topology.numa_nodes if n.id == node)


def locator_for(standin: PodResourcesStandIn, inventory: tuple[GPU, ...] = INVENTORY) -> GPULocator:
    return GPULocator(PodResourcesClient(standin.path), lambda: inventory)


@pytest.mark.parametrize("policy", ["single-numa-node", "restricted", "best-effort"])
@pytest.mark.parametrize(("pod", "gpu_node"), [(("team-b", "train"), 0), ((NS, "train"), 1)])
def test_a_container_gets_cpus_on_its_gpus_node(standin: PodResourcesStandIn, policy: str,
                                                 pod: tuple[str, str], gpu_node: int) -> None:
    near = locator_for(standin).numa_nodes(*pod, "worker", TWO_NUMA)
    assert near == frozenset({gpu_node})
    got = allocate(TWO_NUMA, TWO_NUMA.cpus, Request(4, policy, preferred_numa=near))
    assert got <= node_cpus(TWO_NUMA, gpu_node)


def test_without_a_gpu_the_same_request_lands_elsewhere(standin: PodResourcesStandIn) -> None:
    # The sidecar holds no GPU: no preference, and the allocator's own choice is node 0, so the
    # GPU test above did move the CPUs.
    assert locator_for(standin).numa_nodes(NS, "train", "sidecar", TWO_NUMA) is None
    got = allocate(TWO_NUMA, TWO_NUMA.cpus, Request(4, "best-effort"))
    assert got <= node_cpus(TWO_NUMA, 0)


def test_inventory_places_a_gpu_the_kubelet_did_not_place(standin: PodResourcesStandIn) -> None:
    # "infer/server" holds GPU index 0 without topology; the inventory says node 0 — or node 1 in
    # another, where its NIC (reported on node 0) keeps node 0 in the answer too
    inventory = (replace(INVENTORY[0], numa_node=1),)
    assert locator_for(standin).numa_nodes(NS, "infer", "server", TWO_NUMA) == frozenset({0})
    assert locator_for(standin, inventory).numa_nodes(NS, "infer", "server", TWO_NUMA) == frozenset({0, 1})


def test_single_numa_node_must_stay_on_the_gpus_node_and_best_effort_only_prefers(
        standin: PodResourcesStandIn) -> None:
    near = locator_for(standin).numa_nodes(NS, "train", "worker", TWO_NUMA)
    assert near == frozenset({1})
    free = TWO_NUMA.cpus - CPUSet(node_cpus(TWO_NUMA, 1).sorted()[:6])  # node 1 keeps 2 free CPUs
    with pytest.raises(AllocationError):
        allocate(TWO_NUMA, free, Request(4, "single-numa-node", preferred_numa=near))
    with pytest.raises(AllocationError):
        allocate(TWO_NUMA, free, Request(4, "restricted", preferred_numa=near))
    assert allocate(TWO_NUMA, free, Request(4, "best-effort", preferred_numa=near)) <= node_cpus(TWO_NUMA, 0)


def test_no_socket_means_no_preference() -> None:
    folder = short_tmpdir()
    try:
        locator = GPULocator(PodResourcesClient(os.path.join(folder, "kubelet.sock")), lambda: INVENTORY)
        assert locator.numa_nodes(NS, "train", "worker", TWO_NUMA) is None
    finally:
        os.rmdir(folder)


def test_a_failing_inventory_leaves_reported_nodes_usable() -> None:
    def broken() -> tuple[GPU, ...]:
        raise RuntimeError("NVML exploded")

    assigned = {(NS, "p", "c"): [Device("nvidia.com/gpu", ("0",), frozenset()),
                                 Device("nvidia.com/gpu", ("1",), frozenset({1}))]}
    with PodResourcesStandIn(assigned) as s:
        locator = GPULocator(PodResourcesClient(s.path), broken)
        assert locator.numa_nodes(NS, "p", "c", TWO_NUMA) == frozenset({1})


@settings(max_examples=60, deadline=None)
@given(taken=st.sets(st.sampled_from(TWO_NUMA.cpus.sorted())), n=st.integers(1, 8),
       gpu_node=st.sampled_from([0, 1]),
       policy=st.sampled_from(["single-numa-node", "restricted", "best-effort"]))
def test_property_room_on_the_gpus_node_means_cpus_there(taken: set[int], n: int, gpu_node: int,
                                                         policy: str) -> None:
    free = TWO_NUMA.cpus - CPUSet(taken)
    home = node_cpus(TWO_NUMA, gpu_node)
    request = Request(n, policy, preferred_numa=frozenset({gpu_node}))
    if len(free & home) >= n:
        assert allocate(TWO_NUMA, free, request) <= home
    elif policy != "best-effort":
        with pytest.raises(AllocationError):
            allocate(TWO_NUMA, free, request)


# -- CPUs follow the GPUs: the agent's PodPinner into real cgroups ------------------------------


@dataclass
class RealNode:
    layout: CgroupLayout
    cpus: tuple[int, int]
    state: StateFile


@pytest.fixture
def real_node(tmp_path: Path) -> Iterator[RealNode]:
    """A private cpuset root holding two real CPUs (removed afterwards)."""
    require(os.geteuid() == 0, "needs root to write cgroups")
    try:
        system = detect_layout()
    except EnforcementError as exc:
        require(False, f"needs a cpuset cgroup hierarchy: {exc}")
        raise
    require(os.access(system.root, os.W_OK), f"cpuset hierarchy {system.root} is not writable")
    cpus, mems = read_cpuset(system, "", effective=True)
    require(len(cpus) >= 2, "needs at least 2 CPUs")
    a, b = cpus.sorted()[:2]
    rel = f"topolet-podres-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    create_cgroup(system, rel, cpus=CPUSet([a, b]), mems=mems)
    root = system.abspath(rel)
    try:
        yield RealNode(CgroupLayout(system.version, root), (a, b), StateFile(str(tmp_path / "state")))
    finally:
        _remove_tree(root)


@pytest.mark.root
@pytest.mark.parametrize("gpu_node", [0, 1])
def test_agent_pins_a_gpu_container_next_to_its_gpu(real_node: RealNode, gpu_node: int) -> None:
    # The machine has one NUMA node; the engine is told its two CPUs sit on two (CPU a on node 0,
    # CPU b on node 1), so where the container lands shows the GPU's pull.
    a, b = real_node.cpus
    topology = synthetic_topology(1, 2, 1, 1, 1, cpu_ids=[a, b])
    engine = PinningEngine(topology, real_node.layout, real_node.state)
    uid, cid = str(uuid.uuid4()), f"containerd://{secrets.token_hex(32)}"
    rel = container_cgroup_path(uid, QOSClass.GUARANTEED, cid, None, CgroupDriver.CGROUPFS)
    create_cgroup(real_node.layout, rel, cpus=CPUSet([a, b]))
    proc = subprocess.Popen(["sleep", "120"])
    try:
        with open(os.path.join(real_node.layout.abspath(rel), "cgroup.procs"), "w") as f:
            f.write(str(proc.pid))
        assigned = {(NS, "train", "worker"): [Device("nvidia.com/gpu", (GPU_A,), frozenset({gpu_node}))]}
        warnings: list[PodWarning] = []
        with PodResourcesStandIn(assigned) as s:
            locator = GPULocator(PodResourcesClient(s.path), lambda: ())
            pinner = PodPinner(
                engine, Metrics(), lambda _plan, w: warnings.append(w),
                gpu_numa=lambda p, c: locator.numa_nodes(p.namespace, p.name, c.name, topology))
            plan = PodPlan(uid, NS, "train", QOSClass.GUARANTEED,
                           (ContainerPlan("worker", cid, cpus=1, numa_policy="single-numa-node"),))
            pinner.apply(plan)
            assert s.calls[:1] == ["Get"]
        want = CPUSet([(a, b)[gpu_node]])
        assert warnings == []
        assert read_cpuset(real_node.layout, rel)[0] == want
        assert proc_cpus(proc.pid) == str((a, b)[gpu_node])
        assert proc.pid in read_procs(real_node.layout, rel)
        (held,) = real_node.state.load().allocations
        assert held.cpus == want and held.owner.container == "worker"
    finally:
        proc.kill()
        proc.wait()


# -- the agent itself, on a real API server, reading the stand-in's socket ----------------------


def test_agent_reads_the_kubelets_socket_for_gpu_pods(kube_node: KubeNode) -> None:
    # One NUMA node here: node 0 is where the GPU is and the only place for CPUs; a GPU reported on
    # a node this machine does not have must not get a single-numa-node pod refused.
    node = kube_node
    strict = {"topolet.io/numa-policy": "single-numa-node"}
    assigned = {
        (node.namespace, "near", "c0"): [Device("nvidia.com/gpu", ("0",), frozenset({0}))],
        (node.namespace, "elsewhere", "c0"): [Device("nvidia.com/gpu", ("1",), frozenset({7}))],
    }
    with PodResourcesStandIn(assigned) as s:
        node.start_agent("--pod-resources-socket", s.path)
        near = node.run_pod("near", cpu="1", memory="64Mi", annotations=strict, extended=GPU_REQUEST)
        one_cpu = wait_for(lambda: _single_cpu(near.containers["c0"].pid), "the GPU pod to get one CPU")
        assert one_cpu <= node_cpus(discover_here(), 0)
        node.kubelet.delete_pod(near)
        wait_for(lambda: not StateFile(node.state_dir).load(missing_ok=True).allocations, "the CPU freed")
        elsewhere = node.run_pod("elsewhere", cpu="1", memory="64Mi", annotations=strict,
                                 extended=GPU_REQUEST)
        wait_for(lambda: _single_cpu(elsewhere.containers["c0"].pid), "the second GPU pod to get one CPU")
        assert "Get" in s.calls
    assert "devices on NUMA [0]" in node.log_text()
    assert "AllocationFailed" not in node.log_text()
    assert node.agent is not None and node.agent.poll() is None


def test_agent_pins_without_device_info_when_the_socket_serves_garbage(kube_node: KubeNode) -> None:
    node = kube_node
    with PodResourcesStandIn({}, mode="garbage") as s:
        node.start_agent("--pod-resources-socket", s.path)
        pod = node.run_pod("gpu", cpu="1", memory="64Mi", extended=GPU_REQUEST)
        wait_for(lambda: _single_cpu(pod.containers["c0"].pid), "the pod to get one CPU")
        assert s.calls  # it was asked, and its garbage changed nothing
    assert node.agent is not None and node.agent.poll() is None


def _single_cpu(pid: int) -> CPUSet | None:
    text = proc_cpus(pid)
    cpus = CPUSet.parse(text) if text else None
    return cpus if cpus is not None and len(cpus) == 1 else None


def discover_here() -> Topology:
    from agent.topology.discover import discover

    return discover("/")
