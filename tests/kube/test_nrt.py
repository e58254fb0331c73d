"""NodeResourceTopology: the pure builder (tables, properties), the pod fingerprint, and the publisher
against a real API server (create, write-on-change, available following the state, API outage)."""

from __future__ import annotations

import dataclasses
import re
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import xxhash
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.api import nrt
from agent.api.fingerprint import counted_set, pod_set_fingerprint
from agent.api.resources import hugepages_resource_name
from agent.enforce.state import Allocation, Owner, State
from agent.errors import ConfigError, KubeAPIError
from agent.gpu.model import GPU
from agent.kube.publish import nrt_publisher as kube_nrt
from agent.kube.publish.nrt import nrt_object
from agent.kube.publish.nrt_publisher import NRTPublisher
from agent.kubeapi.client import agent_namespace, load_api_client, node_name
from agent.topology import record
from agent.topology.cpuset import EMPTY, CPUSet
from agent.topology.model import CPUInfo, Hugepages, NumaNode, Topology
from tests.controlplane.harness import ControlPlane

CRD_DIR = Path(__file__).resolve().parents[2] / "daemonset" / "crds"
NRT_CRD = CRD_DIR / "noderesourcetopologies.yaml"
GiB, MiB = 1 << 30, 1 << 20


def _quantity_pattern() -> re.Pattern[str]:
    """The quantity pattern our CRD enforces (the same one Kubernetes' resource.Quantity accepts)."""
    crd = yaml.safe_load(NRT_CRD.read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    res = schema["properties"]["zones"]["items"]["properties"]["resources"]["items"]["properties"]
    return re.compile(res["capacity"]["pattern"])


QUANTITY = _quantity_pattern()


# ---- a machine to describe -----------------------------------------------------------------------

def machine(nodes: Sequence[tuple[Sequence[int], int, Sequence[tuple[int, int]]]],
            distances: Sequence[Sequence[int]] | None = None) -> Topology:
    """A topology from (cpus, memory bytes, [(hugepage size, pages)]) per NUMA node (ids 0..n-1);
    a node without CPUs is memory-only."""
    ids = range(len(nodes))
    if distances is None:
        distances = [[10 if a == b else 20 for b in ids] for a in ids]
    numa = tuple(
        NumaNode(id=i, cpus=CPUSet(cpus), memory_bytes=mem, memory_free_bytes=mem,
                 hugepages=tuple(Hugepages(size_bytes=s, total=n, free=n) for s, n in pools),
                 distances=tuple(distances[i]), memory_only=not cpus,
                 local_cpus=CPUSet(cpus) if cpus else CPUSet(nodes[0][0]), tier="DRAM" if cpus else "CXL")
        for i, (cpus, mem, pools) in enumerate(nodes))
    online = CPUSet(c for cpus, _, _ in nodes for c in cpus)
    return Topology(cpus=online, offline=EMPTY, packages=(), cores=(), caches=(), numa_nodes=numa, kinds=(),
                    pci_devices=(),
                    cpu_info=CPUInfo(vendor="test", family=0, model=0, model_name="test", flags=frozenset(),
                                     hypervisor=False, arch="x86_64"))


def allocation(alloc_id: str, cpus: Sequence[int]) -> Allocation:
    return Allocation(id=alloc_id, cpus=CPUSet(cpus), mems=EMPTY, cgroup=f"topolet/{alloc_id}",
                      owner=Owner(pod_uid=f"uid-{alloc_id}", container="main"), policy="single-numa-node",
                      created_at=0.0)


# Two CPU nodes of 4 CPUs, 2 MiB and 1 GiB pools on node 0, and a CXL memory-only node 2.
TWO_SOCKETS_AND_CXL = machine(
    [([0, 1, 2, 3], 64 * GiB, [(2 * MiB, 512), (GiB, 2)]), ([4, 5, 6, 7], 64 * GiB, []), ([], 128 * GiB, [])],
    [[10, 21, 14], [21, 10, 24], [14, 24, 10]],
)


def zones_by_name(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {z["name"]: z for z in obj["zones"]}


def resources(zone: dict[str, Any]) -> dict[str, tuple[str, str, str]]:
    return {r["name"]: (r["capacity"], r["allocatable"], r["available"]) for r in zone.get("resources", [])}


def attributes(obj: dict[str, Any]) -> dict[str, str]:
    return {a["name"]: a["value"] for a in obj["attributes"]}


# ---- the builder ---------------------------------------------------------------------------------

def test_object_identity_owner_and_attributes() -> None:
    obj = nrt_object({"metadata": {"name": "worker-1", "uid": "u-1"}}, TWO_SOCKETS_AND_CXL, State(),
                     topology_manager_policy="single-numa-node", topology_manager_scope="pod",
                     pods_fingerprint="pfp0v0010123456789abcdef", pods_fingerprint_method="all")
    assert (obj["apiVersion"], obj["kind"]) == ("topology.node.k8s.io/v1alpha2", "NodeResourceTopology")
    assert obj["metadata"]["name"] == "worker-1"
    assert "namespace" not in obj["metadata"]
    assert obj["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": "worker-1", "uid": "u-1"}]
    assert attributes(obj) == {
        "topologyManagerPolicy": "single-numa-node",
        "topologyManagerScope": "pod",
        "nodeTopologyPodsFingerprint": "pfp0v0010123456789abcdef",
        "nodeTopologyPodsFingerprintMethod": "all",
    }
    assert obj["topologyPolicies"] == ["SingleNUMANodePodLevel"]


def test_pinning_route_attribute_only_once_chosen() -> None:
    node = ("worker-1", "u-1")
    assert "topolet.io/pinning-route" not in attributes(nrt_object(node, TWO_SOCKETS_AND_CXL, State()))
    for route in ("nri", "pod-cgroup"):
        obj = nrt_object(node, TWO_SOCKETS_AND_CXL, State(), pinning_route=route)
        assert attributes(obj)["topolet.io/pinning-route"] == route


def test_zones_costs_and_resources() -> None:
    state = State(allocations=(allocation("a", [2, 3]), allocation("b", [4])), reserved=CPUSet([0]))
    obj = nrt_object(("worker-1", "u-1"), TWO_SOCKETS_AND_CXL, state, reserved=CPUSet([1]),
                     gpu_capacity={1: {"nvidia.com/gpu": (2, 1)}, -1: {"nvidia.com/gpu": (1, 1)}})
    zones = zones_by_name(obj)
    assert list(zones) == ["node-0", "node-1", "node-2"]
    assert all(z["type"] == "Node" for z in zones.values())
    assert zones["node-0"]["costs"] == [{"name": "node-0", "value": 10}, {"name": "node-1", "value": 21},
                                        {"name": "node-2", "value": 14}]
    assert zones["node-2"]["costs"] == [{"name": "node-0", "value": 14}, {"name": "node-1", "value": 24},
                                        {"name": "node-2", "value": 10}]
    pools = 512 * 2 * MiB + 2 * GiB
    assert resources(zones["node-0"]) == {
        # CPUs 0 (the state's reserved) and 1 (ours) are not allocatable; 2, 3 are held exclusively.
        "cpu": ("4", "2", "0"),
        "memory": (str(64 * GiB), str(64 * GiB - pools), str(64 * GiB - pools)),
        "hugepages-2Mi": (str(GiB), str(GiB), str(GiB)),
        "hugepages-1Gi": (str(2 * GiB), str(2 * GiB), str(2 * GiB)),
    }
    assert resources(zones["node-1"]) == {
        "cpu": ("4", "4", "3"),
        "memory": (str(64 * GiB),) * 3,
        "nvidia.com/gpu": ("2", "2", "1"),
    }
    # The memory-only node is a zone of its own with memory and no CPU; the GPU of unknown locality
    # (-1) is in no zone.
    assert resources(zones["node-2"]) == {"memory": (str(128 * GiB),) * 3}
    assert sum(int(resources(z).get("nvidia.com/gpu", ("0",))[0]) for z in zones.values()) == 2


def test_available_follows_the_state() -> None:
    empty = nrt_object(("n", "u"), TWO_SOCKETS_AND_CXL, State())
    held = nrt_object(("n", "u"), TWO_SOCKETS_AND_CXL, State(allocations=(allocation("a", [5, 6, 7]),)))
    assert resources(zones_by_name(empty)["node-1"])["cpu"] == ("4", "4", "4")
    assert resources(zones_by_name(held)["node-1"])["cpu"] == ("4", "4", "1")
    assert resources(zones_by_name(held)["node-0"]) == resources(zones_by_name(empty)["node-0"])


@pytest.mark.parametrize(("size", "name"), [
    (64 << 10, "hugepages-64Ki"), (2 * MiB, "hugepages-2Mi"), (32 * MiB, "hugepages-32Mi"),
    (512 * MiB, "hugepages-512Mi"), (GiB, "hugepages-1Gi"), (16 * GiB, "hugepages-16Gi"),
    (1536 * MiB, "hugepages-1536Mi"),
])
def test_hugepage_resource_names(size: int, name: str) -> None:
    assert hugepages_resource_name(size) == name


@pytest.mark.parametrize(("policy", "scope", "legacy"), [
    ("none", "container", "None"),
    ("best-effort", "container", "BestEffortContainerLevel"),
    ("restricted", "pod", "RestrictedPodLevel"),
    ("single-numa-node", "container", "SingleNUMANodeContainerLevel"),
])
def test_kubelet_policy_values_pass_verbatim(policy: str, scope: str, legacy: str) -> None:
    obj = nrt_object(("n", "u"), TWO_SOCKETS_AND_CXL, State(), topology_manager_policy=policy,
                     topology_manager_scope=scope)
    assert attributes(obj)["topologyManagerPolicy"] == policy
    assert attributes(obj)["topologyManagerScope"] == scope
    assert obj["topologyPolicies"] == [legacy]


@pytest.mark.parametrize("kwargs", [
    {"topology_manager_policy": "SingleNUMANode"},
    {"topology_manager_scope": "node"},
    {"pods_fingerprint": "not-a-fingerprint"},
    {"pods_fingerprint_method": "some"},
    {"gpu_capacity": {0: {"nvidia.com/gpu": (1, 2)}}},
])
def test_invalid_inputs_are_refused(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        nrt_object(("n", "u"), TWO_SOCKETS_AND_CXL, State(), **kwargs)


@pytest.mark.parametrize("node", [("n", ""), ("Not_A_Name", "u"), {"metadata": {"name": "n"}}, object()])
def test_node_without_name_or_uid_is_refused(node: object) -> None:
    with pytest.raises(ConfigError):
        nrt_object(node, TWO_SOCKETS_AND_CXL, State())


def test_node_as_client_object() -> None:
    from kubernetes import client as k8s

    node = k8s.V1Node(metadata=k8s.V1ObjectMeta(name="w", uid="u-9"))
    assert nrt_object(node, TWO_SOCKETS_AND_CXL, State())["metadata"]["ownerReferences"][0]["uid"] == "u-9"


@pytest.mark.parametrize(("far_id", "zones"), [
    (64, ["node-0", "node-64"]),
    (1023, ["node-0", "node-1023"]),  # the controller's reader takes ids up to the same bound
    (1024, ["node-0"]),  # past Linux's 1024 NUMA nodes: no kernel numbers one so
])
def test_numa_ids_up_to_the_shared_bound_are_published(far_id: int, zones: list[str]) -> None:
    topo = machine([([0], GiB, []), ([1], GiB, [])])
    far = record.replace(topo.numa_nodes[1], id=far_id)
    topo = record.replace(topo, numa_nodes=(topo.numa_nodes[0], far))
    assert [z["name"] for z in nrt_object(("n", "u"), topo, State())["zones"]] == zones


@st.composite
def machines_and_states(draw: st.DrawFn) -> tuple[Topology, State, CPUSet]:
    n = draw(st.integers(1, 6))
    cpu_counts = draw(st.lists(st.integers(0, 6), min_size=n, max_size=n).filter(any))
    nodes: list[tuple[list[int], int, list[tuple[int, int]]]] = []
    next_cpu = 0
    for count in cpu_counts:
        cpus = list(range(next_cpu, next_cpu + count))
        next_cpu += count
        pools = draw(st.lists(st.tuples(st.sampled_from([64 << 10, 2 * MiB, 32 * MiB, GiB]),
                                        st.integers(0, 64)), max_size=2, unique_by=lambda p: p[0]))
        nodes.append((cpus, draw(st.integers(0, 1 << 40)), pools))
    # A symmetric table, 10 on the diagonal, like the kernel's.
    upper = {(a, b): draw(st.integers(11, 255)) for a in range(n) for b in range(a + 1, n)}
    table = [[10 if a == b else upper[(min(a, b), max(a, b))] for b in range(n)] for a in range(n)]
    topo = machine(nodes, table)
    online = topo.cpus.sorted()
    reserved = CPUSet(draw(st.lists(st.sampled_from(online), max_size=2)))
    free = [c for c in online if c not in reserved]
    taken = draw(st.lists(st.sampled_from(free), unique=True, max_size=len(free))) if free else []
    allocs = tuple(allocation(f"a{i}", [c]) for i, c in enumerate(taken))
    return topo, State(allocations=allocs), reserved


@settings(max_examples=60, deadline=None)
@given(machines_and_states())
def test_builder_properties(case: tuple[Topology, State, CPUSet]) -> None:
    topo, state, reserved = case
    obj = nrt_object(("n", "u"), topo, state, reserved=reserved)
    zones = obj["zones"]
    names = [z["name"] for z in zones]
    assert len(names) == len(set(names))
    ids = [int(name.removeprefix("node-")) for name in names]
    for zone, a in zip(zones, ids, strict=True):
        assert zone["type"] == "Node"
        # Costs are the distance table, row for row, over the published zones.
        assert {c["name"]: c["value"] for c in zone["costs"]} == {
            f"node-{b}": topo.distance(a, b) for b in ids}
        for res in zone.get("resources", []):
            for field in ("capacity", "allocatable", "available"):
                assert QUANTITY.fullmatch(res[field]), (res["name"], field, res[field])
            assert 0 <= int(res["available"]) <= int(res["allocatable"]) <= int(res["capacity"])
        if topo.node(a).memory_only:
            assert "cpu" not in resources(zone)
    for zone_a, a in zip(zones, ids, strict=True):
        for zone_b, b in zip(zones, ids, strict=True):
            cost_ab = next(c["value"] for c in zone_a["costs"] if c["name"] == f"node-{b}")
            cost_ba = next(c["value"] for c in zone_b["costs"] if c["name"] == f"node-{a}")
            assert cost_ab == cost_ba
    available = sum(int(resources(z)["cpu"][2]) for z in zones if "cpu" in resources(z))
    assert available == len(topo.cpus - reserved - state.allocated())


# ---- GPUs in the daemon's NRT --------------------------------------------------------------------

def gpu(index: int, numa: int, *, address: str, mig: bool = False) -> GPU:
    """A hand-built H100 at `address` on NUMA node `numa` (-1: unknown)."""
    return GPU(index=index, uuid=f"GPU-{index:08x}-0000-0000-0000-000000000000",
               name="NVIDIA H100 80GB HBM3", product="NVIDIA-H100-80GB-HBM3", memory_bytes=80 * GiB,
               pci_address=address, pci_device_id=0x2330, numa_node=numa, local_cpus=EMPTY, minor=index,
               compute_capability=(9, 0), mig_capable=True, mig_mode_current=mig, mig_mode_pending=mig)


def test_daemon_nrt_reports_gpus_per_zone_less_those_held() -> None:
    from agent.kube.publish.nrt_build import build_nrt

    gpus = (gpu(0, 0, address="0000:18:00.0"), gpu(1, 1, address="0000:3b:00.0"),
            gpu(2, 1, address="0000:86:00.0"), gpu(3, -1, address="0000:af:00.0"),
            gpu(4, 0, address="0000:db:00.0", mig=True))
    held_by_address = dataclasses.replace(allocation("a", [4]), gpus=("0000:86:00.0",))
    held_by_uuid = dataclasses.replace(allocation("b", [0]), gpus=(gpus[0].uuid,))
    state = State(allocations=(held_by_address, held_by_uuid))
    zones = zones_by_name(build_nrt(("worker-1", "u-1"), TWO_SOCKETS_AND_CXL, state, (), gpus))
    # Whole GPUs not in MIG mode, by zone; a MIG-mode GPU offers its instances (none given), never
    # itself; a GPU of unknown locality is in no zone.
    assert resources(zones["node-0"])["nvidia.com/gpu"] == ("1", "1", "0")
    assert resources(zones["node-1"])["nvidia.com/gpu"] == ("2", "2", "1")
    assert "nvidia.com/gpu" not in resources(zones["node-2"])
    assert resources(zones["node-1"])["cpu"] == ("4", "4", "3")  # CPUs still from the same state

    without = zones_by_name(build_nrt(("worker-1", "u-1"), TWO_SOCKETS_AND_CXL, state, ()))
    assert all(not k.startswith("nvidia.com/") for z in without.values() for k in resources(z))


def test_the_first_nrt_keeps_the_reserved_cpus_before_the_state_records_them() -> None:
    """A fresh node's first NRT is published before the engine's first commit writes the state file:
    the agent's --reserved-cpus (`reserved`) are kept out all the same (a simulated node's first NRT
    offered its reserved CPU under load: tests/controlplane/test_cluster.py)."""
    from agent.kube.publish.nrt_build import build_nrt
    from agent.topology.cpuset import CPUSet

    first = CPUSet([min(TWO_SOCKETS_AND_CXL.numa_nodes[0].cpus)])
    unrecorded = build_nrt(("w", "u"), TWO_SOCKETS_AND_CXL, State(), (), reserved=first)
    recorded = build_nrt(("w", "u"), TWO_SOCKETS_AND_CXL, State(reserved=first), ())
    assert unrecorded == recorded
    assert unrecorded != build_nrt(("w", "u"), TWO_SOCKETS_AND_CXL, State(), ())  # it is kept out


# ---- the pod fingerprint -------------------------------------------------------------------------

# XXH64 digests the hand-written hash the fingerprint used before the `xxhash` package computed, for
# the seeds the fingerprint uses (0, and a namespace's own digest: XXH64(b"production") =
# 0xA8E3005D8AC64337) and two more, over every length class of the algorithm: empty, under 4, under
# 32, exactly 32, one past, several stripes with a tail, and long inputs.  The empty, b"a" and b"abc"
# digests at seed 0 are the xxHash reference's documented results.
_SEEDS = (0, 1, 0xA8E3005D8AC64337, (1 << 64) - 1)
XXH64_DIGESTS = [
    (b"", (0xEF46DB3751D8E999, 0xD5AFBA1336A3BE4B, 0x67EC611060B40E7C, 0x298F4C84B24F5380)),
    (b"a", (0xD24EC4F1A98C6E5B, 0xDEC2BC81C3CD46C6, 0xFF39DE8F65328934, 0x60C43759873ECE62)),
    (b"abc", (0x44BC2CF5AD770999, 0xBEA9CA8199328908, 0xC22C11B9FBBE6DA3, 0x28306E589CC02176)),
    (b"kube-system", (0x819DF5659FD65BFF, 0x340007CAA2480AAC, 0x1F3720CF1AE84239, 0x8ED44A77D3A3E876)),
    (bytes(range(32)), (0xCBF59C5116FF32B4, 0xD74E6766CE9DBA94, 0xE0C2161D5EACDCA5, 0x35220DFDB7D4D7C9)),
    (bytes(range(33)), (0x0C535D1ACAFB8EAD, 0xA371825F4210FE99, 0xFD06031A32095165, 0x5677D5193D356C20)),
    (bytes(range(64)), (0xF7C67301DB6713F0, 0x3CE5BDF7575926C0, 0x8256097EC5971D8F, 0x79E8B8230306E25C)),
    (bytes(range(100)), (0x6AC1E58032166597, 0x3D19A3A2098A7023, 0x3CC76A37494A7111, 0x09A991A091C9F6D7)),
    (bytes(range(256)) * 4,
     (0x6F3914F18FE4DF57, 0x3BD9FD41C5EC08C9, 0xCA76E39028DDB531, 0x610C4DCE21EE28E3)),
    (b"x" * 4097, (0xA4233FAC2072729D, 0x7777AD97D4212471, 0xABF00B54C85A597D, 0x2CF95E5967BE07C4)),
]


@pytest.mark.parametrize(("data", "digests"), XXH64_DIGESTS, ids=[f"{len(d)}B" for d, _ in XXH64_DIGESTS])
def test_xxh64_digests_are_those_the_fingerprint_always_had(data: bytes, digests: tuple[int, ...]) -> None:
    assert tuple(xxhash.xxh64_intdigest(data, seed) for seed in _SEEDS) == digests
    assert xxhash.xxh64_intdigest(b"production") == _SEEDS[2]


# Compatibility vectors from k8stopologyawareschedwg/podfingerprint testdata (compat-tiny-3pods-1ns,
# compat-small-10pods-3ns): (namespace, name) pairs and the signature that library computes.
PFP_VECTORS = [
    ([("production", "jaeger-dpgjk"), ("production", "nginx-rt684"), ("production", "envoy-g9m22")],
     "pfp0v001607b76a0e9d3aeb4"),
    ([("analytics", "controller-69dkj"), ("kube-public", "subscriber-tq6v7"),
      ("kube-public", "transformer-hfbng"), ("kube-public", "validator-c6pn5"),
      ("kube-system", "proxy-wszrd"),
      ("middleware", "processor-jkrl4"), ("network", "gateway-vsll5"), ("network", "importer-kzdfr"),
      ("network", "importer-q5vt9"), ("staging", "prometheus-bwgbn")],
     "pfp0v001567144e4a561bb5a"),
]


@pytest.mark.parametrize(("pods", "signature"), PFP_VECTORS)
def test_fingerprint_matches_the_podfingerprint_library(pods: list[tuple[str, str]], signature: str) -> None:
    assert pod_set_fingerprint(pods) == signature


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.from_regex(r"[a-z][a-z0-9-]{0,20}", fullmatch=True),
                          st.from_regex(r"[a-z][a-z0-9-]{0,40}", fullmatch=True)), unique=True, max_size=20),
       st.randoms())
def test_fingerprint_ignores_order_and_sees_membership(pods: list[tuple[str, str]], rnd: Any) -> None:
    shuffled = list(pods)
    rnd.shuffle(shuffled)
    sign = pod_set_fingerprint(pods)
    assert re.fullmatch(r"pfp0v001[0-9a-f]{16}", sign)
    assert pod_set_fingerprint(shuffled) == sign
    assert pod_set_fingerprint([*pods, ("extra-ns", "extra-pod")]) != sign


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "b"]),
                          st.from_regex(r"[a-z][a-z0-9-]{0,12}", fullmatch=True)),
                unique=True, min_size=1, max_size=16), st.data())
def test_counted_set_names_exactly_the_set_a_fingerprint_is_of(pods: list[tuple[str, str]],
                                                               data: Any) -> None:
    """Of `pods` (what the controller sees pinned-eligible) and a few toggles (its own pods there), an
    agent may count some toggles less (it lags) and some more (it leads the status the controller
    saw): `counted_set` names exactly the set it counted; a pod outside both matches no flip."""
    toggles = data.draw(st.lists(st.sampled_from([*pods, ("c", "new-0"), ("c", "new-1")]), unique=True,
                                 max_size=6))
    flipped = data.draw(st.lists(st.sampled_from(toggles), unique=True) if toggles else st.just([]))
    counted = set(pods).symmetric_difference(flipped)
    assert counted_set(pods, pod_set_fingerprint(counted), toggles) == frozenset(counted)
    assert counted_set(pods, pod_set_fingerprint([*counted, ("d", "unseen")]), toggles) is None


def test_counted_set_tries_at_most_its_bound() -> None:
    """Past MAX_SUSPECT_SETS flips it gives up (None) rather than hash without end."""
    pods = [("ns", f"p{i}") for i in range(40)]
    assert counted_set(pods, pod_set_fingerprint(pods[:37]), pods[37:]) == frozenset(pods[:37])
    assert counted_set(pods, pod_set_fingerprint(pods[:30]), pods[30:]) is None  # 10 flips: too many


# ---- the publisher against the API server --------------------------------------------------------

def install_crd(api: Any, path: Path, timeout_s: float = 60.0) -> None:
    """Create the CRD in `path` (kept when it already exists) and wait until it is Established."""
    from kubernetes import client as k8s
    from kubernetes.client.exceptions import ApiException

    doc = yaml.safe_load(path.read_text())
    ext = k8s.ApiextensionsV1Api(api)
    try:
        ext.create_custom_resource_definition(k8s.V1CustomResourceDefinition.from_dict(doc))
    except ApiException as exc:
        if exc.status != 409:
            raise
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        crd = ext.read_custom_resource_definition(doc["metadata"]["name"])
        if any(c.type == "Established" and c.status == "True" for c in (crd.status.conditions or [])):
            return
        time.sleep(0.2)
    pytest.fail(f"CRD {doc['metadata']['name']} not Established after {timeout_s:.0f} s")


@pytest.fixture(scope="module")
def nrt_api(control_plane: ControlPlane) -> Iterator[Any]:
    """An admin ApiClient with the NodeResourceTopology CRD installed."""
    with control_plane.client() as api:
        install_crd(api, NRT_CRD)
        yield api


@pytest.fixture
def node(nrt_api: Any) -> Iterator[dict[str, Any]]:
    """A fresh Node object (as a dict), deleted afterwards."""
    from kubernetes import client as k8s

    core = k8s.CoreV1Api(nrt_api)
    name = f"nrt-{uuid.uuid4().hex[:8]}"
    created = core.create_node(k8s.V1Node(metadata=k8s.V1ObjectMeta(name=name)))
    yield {"metadata": {"name": name, "uid": created.metadata.uid}}
    core.delete_node(name)


def get_nrt(api: Any, name: str) -> dict[str, Any]:
    from kubernetes import client as k8s

    out: dict[str, Any] = k8s.CustomObjectsApi(api).get_cluster_custom_object(
        nrt.GROUP, nrt.VERSION, nrt.PLURAL, name)
    return out


def test_publish_creates_the_object_as_built(nrt_api: Any, node: dict[str, Any]) -> None:
    name = node["metadata"]["name"]
    fingerprint = pod_set_fingerprint([("default", "a"), ("default", "b")])
    obj = nrt_object(node, TWO_SOCKETS_AND_CXL, State(), reserved=CPUSet([0]),
                     gpu_capacity={0: {"nvidia.com/gpu": (1, 1), "nvidia.com/mig-1g.18gb": (7, 5)}},
                     topology_manager_policy="single-numa-node", topology_manager_scope="container",
                     pods_fingerprint=fingerprint)
    pub = NRTPublisher(nrt_api, name)
    assert pub.publish(obj) is True
    live = get_nrt(nrt_api, name)
    for key in ("zones", "attributes", "topologyPolicies"):
        assert live[key] == obj[key], key
    assert live["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": name, "uid": node["metadata"]["uid"]}]
    zone0 = zones_by_name(live)["node-0"]
    assert resources(zone0)["cpu"] == ("4", "3", "3")
    assert resources(zone0)["nvidia.com/mig-1g.18gb"] == ("7", "7", "5")
    assert attributes(live)["nodeTopologyPodsFingerprint"] == fingerprint
    managers = {(m["manager"], m["operation"]) for m in live["metadata"]["managedFields"]}
    assert managers == {("topolet", "Apply")}


def test_publish_writes_only_on_change(nrt_api: Any, node: dict[str, Any]) -> None:
    name = node["metadata"]["name"]
    pub = NRTPublisher(nrt_api, name)
    obj = nrt_object(node, TWO_SOCKETS_AND_CXL, State())
    assert pub.publish(obj)
    version = get_nrt(nrt_api, name)["metadata"]["resourceVersion"]
    rebuilt = nrt_object(node, TWO_SOCKETS_AND_CXL, State())  # equal, not the same dict
    assert pub.publish(rebuilt) is False
    assert pub.publish(rebuilt) is False
    assert pub.writes == 1
    assert get_nrt(nrt_api, name)["metadata"]["resourceVersion"] == version

    # An allocation lands: available drops on the next publish, and only then is there a write.
    state = State(allocations=(allocation("pod-a", [1, 2]),), generation=1)
    assert pub.publish(nrt_object(node, TWO_SOCKETS_AND_CXL, state)) is True
    assert pub.writes == 2
    live = get_nrt(nrt_api, name)
    assert live["metadata"]["resourceVersion"] != version
    assert resources(zones_by_name(live)["node-0"])["cpu"] == ("4", "4", "2")
    assert resources(zones_by_name(live)["node-1"])["cpu"] == ("4", "4", "4")


def test_publish_restores_a_deleted_or_edited_object(nrt_api: Any, node: dict[str, Any]) -> None:
    from kubernetes import client as k8s

    name = node["metadata"]["name"]
    now = [0.0]
    pub = NRTPublisher(nrt_api, name, verify_seconds=30.0, clock=lambda: now[0])
    obj = nrt_object(node, TWO_SOCKETS_AND_CXL, State())
    assert pub.publish(obj)
    objects = k8s.CustomObjectsApi(nrt_api)
    objects.delete_cluster_custom_object(nrt.GROUP, nrt.VERSION, nrt.PLURAL, name)
    now[0] = 10.0
    assert pub.publish(obj) is False  # not yet time to look
    now[0] = 31.0
    assert pub.publish(obj) is True  # looked, found it gone, applied again
    assert get_nrt(nrt_api, name)["zones"] == obj["zones"]

    # Someone else rewrites our zones: the next check puts ours back.
    objects.patch_cluster_custom_object(nrt.GROUP, nrt.VERSION, nrt.PLURAL, name,
                                        {"zones": [{"name": "node-0", "type": "Node"}]},
                                        _content_type="application/merge-patch+json")
    now[0] = 62.0
    assert pub.publish(obj) is True
    assert get_nrt(nrt_api, name)["zones"] == obj["zones"]
    # Untouched since: a check finds nothing to do.
    now[0] = 100.0
    assert pub.publish(obj) is False
    assert pub.writes == 3


def test_invalidate_applies_again(nrt_api: Any, node: dict[str, Any]) -> None:
    pub = NRTPublisher(nrt_api, node["metadata"]["name"])
    obj = nrt_object(node, TWO_SOCKETS_AND_CXL, State())
    assert pub.publish(obj) and not pub.publish(obj)
    pub.invalidate()
    assert pub.publish(obj) is True


def test_publish_refuses_another_nodes_object(nrt_api: Any) -> None:
    pub = NRTPublisher(nrt_api, "this-node")
    with pytest.raises(ConfigError):
        pub.publish(nrt_object(("other-node", "u"), TWO_SOCKETS_AND_CXL, State()))


def test_api_outage_fails_cleanly_and_the_next_publish_catches_up(
        control_plane: ControlPlane, nrt_api: Any, node: dict[str, Any]) -> None:
    name = node["metadata"]["name"]
    pub = NRTPublisher(nrt_api, name)
    assert pub.publish(nrt_object(node, TWO_SOCKETS_AND_CXL, State()))
    changed = nrt_object(node, TWO_SOCKETS_AND_CXL, State(allocations=(allocation("x", [4, 5]),)))
    control_plane.stop_apiserver()
    try:
        with pytest.raises(KubeAPIError) as err:
            pub.publish(changed)
        assert err.value.status is None
        assert pub.failures == 1 and pub.writes == 1
    finally:
        control_plane.start_apiserver()
    assert pub.publish(changed) is True
    assert resources(zones_by_name(get_nrt(nrt_api, name))["node-1"])["cpu"] == ("4", "4", "2")
    assert pub.publish(changed) is False


def test_missing_crd_is_an_api_error(nrt_api: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # A resource the server does not serve answers 404: an error for the caller, not a crash.
    monkeypatch.setattr(kube_nrt, "PLURAL", "noderesourcetopologiesnotserved")
    with pytest.raises(KubeAPIError) as err:
        NRTPublisher(nrt_api, "n").publish(nrt_object(("n", "u"), TWO_SOCKETS_AND_CXL, State()))
    assert err.value.status == 404


def test_kubeconfig_client_publishes(control_plane: ControlPlane, nrt_api: Any, node: dict[str, Any]) -> None:
    api = load_api_client(str(control_plane.kubeconfig))
    try:
        assert NRTPublisher(api, node["metadata"]["name"]).publish(
            nrt_object(node, TWO_SOCKETS_AND_CXL, State()))
    finally:
        api.close()


# ---- client configuration ------------------------------------------------------------------------

def test_node_name_from_flag_or_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODE_NAME", "from-env")
    assert node_name("from-flag") == "from-flag"
    assert node_name(None) == "from-env"
    monkeypatch.delenv("NODE_NAME")
    with pytest.raises(ConfigError, match="NODE_NAME"):
        node_name(None)
    with pytest.raises(ConfigError):
        node_name("Bad_Name")


def test_agent_namespace_sources(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    ns_file = tmp_path / "namespace"
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    assert agent_namespace(None, str(ns_file)) == "topolet-system"
    ns_file.write_text("from-file\n")
    assert agent_namespace(None, str(ns_file)) == "from-file"
    monkeypatch.setenv("POD_NAMESPACE", "from-env")
    assert agent_namespace(None, str(ns_file)) == "from-env"
    assert agent_namespace("given", str(ns_file)) == "given"
    with pytest.raises(ConfigError):
        agent_namespace("not.a.namespace")


def test_missing_kubeconfig_and_no_cluster_are_config_errors(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_api_client(str(tmp_path / "absent"))
    (tmp_path / "garbage").write_text("{}")
    with pytest.raises(ConfigError):
        load_api_client(str(tmp_path / "garbage"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(ConfigError, match="in-cluster"):
        load_api_client(None)


@pytest.mark.parametrize(("argv", "scope", "legacy"), [
    ([], "container", "None"),  # the kubelet's default scope
    (["--numa-scope", "container"], "container", "None"),
    (["--numa-scope", "pod"], "pod", "None"),
])
def test_the_agents_numa_scope_flag_is_the_published_scope(argv: list[str], scope: str,
                                                           legacy: str) -> None:
    """`topolet agent --numa-scope` reaches the NRT the publisher writes (`topologyManagerScope`)."""
    from agent.cli.compose import agent_config
    from agent.cli.parser import build_parser
    from agent.kube.publish.nrt_build import Snapshot
    from agent.kube.publish.publisher import Publisher

    config = agent_config(build_parser().parse_args(["agent", *argv])).publisher
    # Only what the NRT's body reads (no API client: nothing is sent).
    publisher = object.__new__(Publisher)
    publisher.config, publisher.gpus, publisher._node_ref = config, (), ("worker-1", "u-1")
    obj = publisher._nrt_object(Snapshot(TWO_SOCKETS_AND_CXL, State(), ()))
    assert attributes(obj)["topologyManagerScope"] == scope
    assert obj["topologyPolicies"] == [legacy]


def test_an_unknown_numa_scope_is_refused_by_the_cli() -> None:
    from agent.cli.parser import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["agent", "--numa-scope", "node"])
