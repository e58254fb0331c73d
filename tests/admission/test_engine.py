"""The placement engine's behaviours, one row each, on small clusters whose answers can be reasoned out."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest

from agent.admission.engine.model import (
    NODE_POLICY,
    ClusterView,
    Gang,
    Node,
    NodeSelectorRequirement,
    Placement,
    PodSet,
    Refusal,
    Resources,
    Taint,
    Toleration,
    Zone,
)
from agent.admission.engine.place import commit, place

GI = 1 << 30
NIC = "example.com/nic"
FPGA = "example.com/fpga"


def node(name: str, zones: Sequence[tuple[int, int]] = (), *, mem: int = 64,
         labels: dict[str, str] | None = None, taints: tuple[Taint, ...] = (), unschedulable: bool = False,
         free_pods: int = 110,
         zone_gpus: Sequence[int] = (), gpu_free: tuple[int, ...] = (), cpus: int | None = None,
         l3: int = 0, tm: str = "none", zone_devices: Sequence[dict[str, int]] = (),
         node_devices: dict[str, int] | None = None) -> Node:
    """A node whose zones are (free CPUs, capacity CPUs) with `mem` GiB each; totals add up; `tm`: its
    kubelet's Topology Manager policy; `zone_devices`: device plugin resources per zone, and
    `node_devices` those no zone lists."""
    zs = tuple(Zone(numa=i, cpu_milli=f * 1000, cpu_capacity_milli=c * 1000, memory=mem * GI,
                    gpus=zone_gpus[i] if i < len(zone_gpus) else 0, l3_cpus=l3,
                    devices=zone_devices[i] if i < len(zone_devices) else {})
               for i, (f, c) in enumerate(zones))
    gpus = sum(zone_gpus) if zone_gpus else sum(1 for g in gpu_free if g == 1000)
    total = cpus if cpus is not None else sum(f for f, _ in zones)
    devices = dict(node_devices or {})
    for d in zone_devices:
        for k, v in d.items():
            devices[k] = devices.get(k, 0) + v
    free = Resources(cpu_milli=total * 1000, memory=mem * GI * max(1, len(zones)), gpus=gpus,
                     devices=devices)
    return Node(name=name, labels=labels or {}, taints=taints, unschedulable=unschedulable, free=free,
                capacity=free, zones=zs, gpu_free_milli=gpu_free, free_pods=free_pods, topology_policy=tm)


def pods(name: str, count: int, cpus: float = 0, *, mem: int = 1, policy: str = "single-numa-node",
         **kw: object) -> PodSet:
    extra = {k: v for k, v in kw.items() if k in ("gpus", "gpu_milli", "hugepages", "mig", "devices")}
    rest = {k: v for k, v in kw.items() if k not in extra}
    return PodSet(name=name, count=count, requests=Resources(cpu_milli=int(cpus * 1000), memory=mem * GI,
                                                             **extra),  # type: ignore[arg-type]
                  numa_policy=policy, **rest)  # type: ignore[arg-type]


def where(result: Placement | Refusal) -> list[tuple[str, str, int | None]]:
    """(pod set, node, zone) of every pod, sorted: pods of one set are interchangeable."""
    assert isinstance(result, Placement), result
    return sorted((p.pod_set, p.node, p.zone) for p in result.pods)


@dataclass(frozen=True)
class Row:
    name: str
    nodes: tuple[Node, ...]
    sets: tuple[PodSet, ...]
    placed: list[tuple[str, int, str, int | None]] | None = None  # None: a refusal is expected
    refusal: tuple[str, str] | None = None  # (kind, text the reason contains)
    empty: tuple[Node, ...] = field(default=())


ROWS = [
    Row("tightest zone that holds the pod",
        (node("a", [(16, 16), (10, 16)]), node("b", [(9, 16)])),
        (pods("w", 1, 8),), placed=[("w", 0, "b", 0)]),
    Row("a whole zone is kept whole when a part-used one holds the pod",
        (node("a", [(16, 16), (12, 16)]),),
        (pods("w", 1, 4),), placed=[("w", 0, "a", 1)]),
    Row("three 8-CPU pods on zones 8+8 and 8: greedy does not strand",
        (node("a", [(8, 8), (8, 8)]), node("b", [(8, 8)])),
        (pods("w", 3, 8),), placed=[("w", 0, "a", 0), ("w", 1, "a", 1), ("w", 2, "b", 0)]),
    Row("backtracking: the first choice would strand the memory-hungry pod",
        (node("n1", [(8, 8)], mem=16), node("n2", [(8, 8)], mem=4)),
        (pods("cpu", 1, 8, mem=1), pods("mem", 1, 4, mem=8)),
        placed=[("cpu", 0, "n2", 0), ("mem", 0, "n1", 0)]),
    Row("each placed pod reduces what the next one sees",
        (node("a", [(12, 16)]), node("b", [(12, 16)])),
        (pods("w", 2, 8),), placed=[("w", 0, "a", 0), ("w", 1, "b", 0)]),
    Row("a gang goes on one node when that breaks no more whole zones than spreading it",
        (node("a", [(12, 16)]), node("b", [(16, 16)])),
        (pods("w", 2, 8),), placed=[("w", 0, "b", 0), ("w", 1, "b", 0)]),
    Row("but not when one node would break a whole zone that spreading keeps",
        (node("a", [(12, 16)]), node("b", [(8, 16)]), node("c", [(8, 8), (16, 16)])),
        (pods("w", 2, 8),), placed=[("w", 0, "b", 0), ("w", 1, "c", 0)]),
    Row("not now: the binding constraint names the largest free zone",
        (node("n1", [(8, 16), (8, 16)]), node("n3", [(12, 16), (4, 16)])),
        (pods("workers", 1, 16),),
        refusal=("not-now", 'pod set "workers": pod needs 16 CPUs in one NUMA zone; largest free zone has 12 '
                            "CPUs (node n3)")),
    Row("never: no zone of the empty cluster is that large",
        (node("a", [(16, 16), (16, 16)]),), (pods("w", 1, 32),),
        refusal=("never", "largest free zone has 16 CPUs (node a)")),
    Row("all or nothing: two of three pods fit, none is placed",
        (node("a", [(8, 8)]), node("b", [(8, 8)])), (pods("w", 3, 8),),
        refusal=("not-now", '"w" (pod 3 of 3)'), empty=(node("a", [(16, 16)]), node("b", [(16, 16)]))),
    Row("NoSchedule taint not tolerated: the node is skipped",
        (node("a", [(8, 8)], taints=(Taint("gpu", "yes", "NoSchedule"),)), node("b", [(16, 16)])),
        (pods("w", 1, 8),), placed=[("w", 0, "b", 0)]),
    Row("NoSchedule taint tolerated by Exists",
        (node("a", [(8, 8)], taints=(Taint("gpu", "yes", "NoSchedule"),)), node("b", [(16, 16)])),
        (pods("w", 1, 8, tolerations=(Toleration(key="gpu", operator="Exists"),)),),
        placed=[("w", 0, "a", 0)]),
    Row("NoExecute taint tolerated by value and effect",
        (node("a", [(8, 8)], taints=(Taint("k", "v", "NoExecute"),)), node("b", [(16, 16)])),
        (pods("w", 1, 8, tolerations=(Toleration(key="k", value="v", effect="NoExecute"),)),),
        placed=[("w", 0, "a", 0)]),
    Row("PreferNoSchedule only ranks the node lower",
        (node("a", [(8, 8)], taints=(Taint("soft", "", "PreferNoSchedule"),)), node("b", [(16, 16)])),
        (pods("w", 1, 8),), placed=[("w", 0, "b", 0)]),
    Row("PreferNoSchedule node still used when nothing else fits",
        (node("a", [(8, 8)], taints=(Taint("soft", "", "PreferNoSchedule"),)), node("b", [(4, 4)])),
        (pods("w", 1, 8),), placed=[("w", 0, "a", 0)]),
    Row("every taint left untolerated: refusal counts why",
        (node("a", [(8, 8)], taints=(Taint("x"),)), node("b", [(8, 8)], unschedulable=True)),
        (pods("w", 1, 8),), refusal=("not-now", "unschedulable: 1, untolerated taint: 1")),
    Row("nodeSelector",
        (node("a", [(8, 8)], labels={"pool": "cpu"}), node("b", [(16, 16)], labels={"pool": "gpu"})),
        (pods("w", 1, 8, node_selector={"pool": "gpu"}),), placed=[("w", 0, "b", 0)]),
    Row("required affinity: OR of terms, AND inside a term",
        (node("a", [(8, 8)], labels={"zone": "x", "gen": "3"}),
         node("b", [(8, 8)], labels={"zone": "y", "gen": "5"}),
         node("c", [(8, 8)], labels={"zone": "z"})),
        (pods("w", 2, 8, required_affinity=(
            (NodeSelectorRequirement("zone", "In", ("x", "q")), NodeSelectorRequirement("gen", "Lt", ("4",))),
            (NodeSelectorRequirement("gen", "Gt", ("4",)), NodeSelectorRequirement("zone", "NotIn", ("x",))),
        )),), placed=[("w", 0, "a", 0), ("w", 1, "b", 0)]),
    Row("required affinity Exists / DoesNotExist",
        (node("a", [(8, 8)], labels={"gen": "3"}), node("b", [(8, 8)])),
        (pods("x", 1, 8, required_affinity=((NodeSelectorRequirement("gen", "DoesNotExist"),),)),
         pods("y", 1, 8, required_affinity=((NodeSelectorRequirement("gen", "Exists"),),))),
        placed=[("x", 0, "b", 0), ("y", 0, "a", 0)]),
    Row("no free pod slot on the tightest node",
        (node("a", [(8, 8)], free_pods=0), node("b", [(16, 16)])),
        (pods("w", 1, 8),), placed=[("w", 0, "b", 0)]),
    Row("a node without zones takes best-effort pods only",
        (node("plain", cpus=32),), (pods("be", 1, 8, policy="best-effort"),),
        placed=[("be", 0, "plain", None)]),
    Row("a node without zones refuses single-numa-node",
        (node("plain", cpus=32),), (pods("w", 1, 8),),
        refusal=("never", "no NUMA zones (no NodeResourceTopology): 1")),
    Row("none policy: node totals, even across zones",
        (node("a", [(4, 8), (4, 8)]),), (pods("n", 1, 8, policy="none"),), placed=[("n", 0, "a", None)]),
    Row("restricted fitting one zone pins like single-numa-node",
        (node("a", [(6, 8), (4, 8)]),), (pods("r", 1, 4, policy="restricted"),), placed=[("r", 0, "a", 1)]),
    Row("restricted needing two zones on an empty node: zone None",
        (node("a", [(8, 8), (8, 8)]),), (pods("r", 1, 12, policy="restricted"),),
        placed=[("r", 0, "a", None)]),
    Row("restricted refused when free CPUs are split over more zones than an empty node needs",
        (node("a", [(4, 8), (4, 8)]),), (pods("r", 1, 6, policy="restricted"),),
        refusal=("not-now", "fewest NUMA zones an empty node needs")),
    Row("whole GPUs come from the pod's zone",
        (node("g", [(8, 8), (8, 8)], zone_gpus=[0, 2]),), (pods("t", 1, 4, gpus=2),),
        placed=[("t", 0, "g", 1)]),
    Row("zone memory bounds single-numa-node",
        (node("a", [(8, 8)], mem=4), node("b", [(16, 16)], mem=32)), (pods("w", 1, 8, mem=16),),
        placed=[("w", 0, "b", 0)]),
    Row("colocation: both pods in the one rack that holds them",
        (node("r1a", [(8, 8)], labels={"rack": "r1"}), node("r1b", [(4, 4)], labels={"rack": "r1"}),
         node("r2a", [(8, 8)], labels={"rack": "r2"}), node("r2b", [(8, 8)], labels={"rack": "r2"})),
        (pods("w", 2, 8, colocate_label="rack"),), placed=[("w", 0, "r2a", 0), ("w", 1, "r2b", 0)]),
    Row("colocation refused when no rack holds the gang",
        (node("r1a", [(8, 8)], labels={"rack": "r1"}), node("r2a", [(8, 8)], labels={"rack": "r2"})),
        (pods("w", 2, 8, colocate_label="rack"),), refusal=("never", "no rack domain holds the whole gang")),
    Row("node totals bound a pod whose zone has room",
        (node("a", [(8, 8), (8, 8)], cpus=4),), (pods("w", 1, 8),),
        refusal=("never", "pod needs 8 CPUs on one node; most free on a node is 4 CPUs (node a)")),
    # A pod set without a NUMA policy of its own (NODE_POLICY) is placed on each node as that node's
    # kubelet Topology Manager would admit it.
    Row("node policy: every node single-numa-node, the tightest zone as for the policy itself",
        (node("a", [(16, 16), (10, 16)], tm="single-numa-node"), node("b", [(9, 16)], tm="single-numa-node")),
        (pods("g", 1, 8, policy=NODE_POLICY),), placed=[("g", 0, "b", 0)]),
    Row("node policy: every node none, node totals across zones",
        (node("a", [(4, 8), (4, 8)]),), (pods("g", 1, 8, policy=NODE_POLICY),), placed=[("g", 0, "a", None)]),
    Row("node policy: a single-numa-node node whose zones are split is skipped for a none node",
        (node("s", [(4, 8), (4, 8)], tm="single-numa-node"), node("n", [(4, 8), (4, 8)])),
        (pods("g", 1, 6, policy=NODE_POLICY),), placed=[("g", 0, "n", None)]),
    Row("node policy: one gang, each pod by its node's rule",
        (node("s", [(6, 8), (4, 8)], tm="single-numa-node"), node("n", [(4, 8), (4, 8)])),
        (pods("g", 2, 6, policy=NODE_POLICY),), placed=[("g", 0, "n", None), ("g", 1, "s", 0)]),
    Row("node policy: a none node never relaxes a single-numa-node one",
        (node("s", [(4, 8), (4, 8)], tm="single-numa-node"), node("n", [(2, 8), (2, 8)])),
        (pods("g", 1, 6, policy=NODE_POLICY),),
        refusal=("not-now", "pod needs 6 CPUs in one NUMA zone; largest free zone has 4 CPUs (node s)")),
    Row("node policy: restricted on a restricted node, none beside it",
        (node("r", [(6, 8), (2, 8)], tm="restricted"), node("n", [(3, 8), (3, 8)])),
        (pods("g", 2, 5, policy=NODE_POLICY),), placed=[("g", 0, "n", None), ("g", 1, "r", 0)]),
    Row("node policy: a node without an NRT counts as none",
        (node("plain", cpus=32), node("s", [(4, 8)], tm="single-numa-node")),
        (pods("g", 1, 8, policy=NODE_POLICY),), placed=[("g", 0, "plain", None)]),
    Row("a pod's own policy wins over its node's",
        (node("s", [(4, 8), (4, 8)], tm="single-numa-node"),), (pods("g", 1, 6, policy="none"),),
        placed=[("g", 0, "s", None)]),
    # Device plugin resources (NICs, HCAs...) the zones list go with the pod's CPUs and GPUs.
    Row("a GPU pod's NIC: the zone holding both, not the tighter one without a NIC",
        (node("a", [(6, 8), (8, 8)], zone_gpus=[1, 1], zone_devices=[{NIC: 0}, {NIC: 1}]),),
        (pods("g", 1, 2, gpus=1, devices={NIC: 1}),), placed=[("g", 0, "a", 1)]),
    Row("a CPU pod's NIC picks the zone as a GPU would",
        (node("a", [(4, 8), (8, 8)], zone_devices=[{}, {NIC: 2}]), node("b", [(3, 8)])),
        (pods("n", 1, 2, devices={NIC: 1}),), placed=[("n", 0, "a", 1)]),
    Row("one NIC per zone: two pods take one zone each though CPUs fit one",
        (node("a", [(8, 8), (8, 8)], zone_devices=[{NIC: 1}, {NIC: 1}]),),
        (pods("n", 2, 2, devices={NIC: 1}),), placed=[("n", 0, "a", 0), ("n", 1, "a", 1)]),
    Row("no zone holds two NICs and the CPUs",
        (node("a", [(8, 8), (8, 8)], zone_devices=[{NIC: 1}, {NIC: 1}]),),
        (pods("n", 1, 2, devices={NIC: 2}),),
        refusal=("never", "no node holds the pod's CPU, memory and devices together in one NUMA zone")),
    Row("restricted: the fewest zones the CPUs need must hold the devices too",
        (node("a", [(8, 8), (8, 8)], zone_devices=[{NIC: 1}, {NIC: 2}]),),
        (pods("n", 1, 2, devices={NIC: 2}, policy="restricted"),), placed=[("n", 0, "a", 1)]),
    Row("a device no zone lists counts at node level",
        (node("a", [(8, 8), (6, 8)], zone_devices=[{NIC: 1}, {NIC: 0}], node_devices={FPGA: 1}),),
        (pods("f", 1, 2, devices={FPGA: 1}),), placed=[("f", 0, "a", 1)]),
    Row("node-level devices run out on the node",
        (node("a", [(8, 8)], node_devices={FPGA: 1}),), (pods("f", 2, 2, devices={FPGA: 1}),),
        refusal=("never", "pod needs 1 example.com/fpga on one node; most free on a node is 0")),
    Row("a node without the device is no place for the pod",
        (node("a", [(8, 8)]), node("b", [(8, 8)], zone_devices=[{NIC: 1}])),
        (pods("n", 1, 2, devices={NIC: 1}, policy="none"),), placed=[("n", 0, "b", None)]),
    Row("not CPU-aligned (Burstable): its NIC from a zone, its CPU from the node's shared pool",
        (node("a", [(0, 8), (0, 8)], cpus=16, zone_devices=[{NIC: 0}, {NIC: 1}]),),
        (pods("b", 1, 4, devices={NIC: 1}, cpu_aligned=False),), placed=[("b", 0, "a", 1)]),
    Row("not CPU-aligned: GPU and NIC in one zone still",
        (node("a", [(0, 8), (0, 8)], cpus=16, zone_gpus=[1, 1], zone_devices=[{NIC: 0}, {NIC: 1}]),),
        (pods("b", 1, 1, gpus=1, devices={NIC: 1}, cpu_aligned=False),), placed=[("b", 0, "a", 1)]),
    Row("not CPU-aligned: no zone with both its GPU and its NIC",
        (node("a", [(0, 8), (0, 8)], cpus=16, zone_gpus=[1, 0], zone_devices=[{NIC: 0}, {NIC: 1}]),),
        (pods("b", 1, 1, gpus=1, devices={NIC: 1}, cpu_aligned=False),),
        refusal=("never", "in one NUMA zone")),
    Row("not CPU-aligned, by the node's policy: a none node takes it on totals",
        (node("a", [(0, 8), (0, 8)], cpus=16, zone_devices=[{NIC: 0}, {NIC: 1}]),),
        (pods("b", 1, 4, devices={NIC: 1}, cpu_aligned=False, policy=NODE_POLICY),),
        placed=[("b", 0, "a", None)]),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_place(row: Row) -> None:
    empty = row.empty or tuple(_emptied(n) for n in row.nodes)
    result = place(ClusterView(nodes=row.nodes, empty=empty), Gang("ns/g", row.sets))
    if row.placed is not None:
        assert where(result) == sorted((s, n, z) for s, _, n, z in row.placed)
    else:
        assert isinstance(result, Refusal), result
        assert row.refusal is not None
        kind, text = row.refusal
        assert result.kind == kind, result
        assert text in result.reason, result.reason


def _emptied(n: Node) -> Node:
    zones = tuple(Zone(numa=z.numa, cpu_milli=z.cpu_capacity_milli, cpu_capacity_milli=z.cpu_capacity_milli,
                       memory=z.memory, gpus=z.gpus, l3_cpus=z.l3_cpus, devices=z.devices) for z in n.zones)
    return Node(name=n.name, labels=n.labels, taints=n.taints, free=n.capacity, capacity=n.capacity,
                zones=zones, gpu_free_milli=tuple(1000 for _ in n.gpu_free_milli), free_pods=110,
                topology_policy=n.topology_policy)


def test_without_empty_view_a_refusal_is_never_never() -> None:
    result = place(ClusterView(nodes=(node("a", [(16, 16)]),)), Gang("g", (pods("w", 1, 32),)))
    assert isinstance(result, Refusal) and result.kind == "not-now"


def test_shared_gpu_best_fit_without_a_mix() -> None:
    view = ClusterView(nodes=(node("g", [(8, 8)], gpu_free=(1000, 300, 600)),))
    result = place(view, Gang("g", (pods("s", 1, 1, gpu_milli=500),)))
    assert isinstance(result, Placement) and result.pods[0].gpu_index == 2


def test_shared_gpu_with_a_mix_follows_the_fragmentation_score() -> None:
    fragmentation = pytest.importorskip("agent.admission.engine.fragmentation")
    mix = ((Resources(cpu_milli=1000, gpu_milli=500), 0.5), (Resources(cpu_milli=1000, gpus=1), 0.5))
    nodes = (node("g1", [(8, 8)], gpu_free=(1000, 500)), node("g2", [(8, 8)], gpu_free=(1000, 1000)))
    req = Resources(cpu_milli=1000, memory=GI, gpu_milli=500)
    result = place(ClusterView(nodes=nodes, gpu_mix=mix), Gang("g", (pods("s", 1, 1, gpu_milli=500),)))
    assert isinstance(result, Placement)
    scores = {n.name: fragmentation.gpu_choice(n, req, mix) for n in nodes}
    best = min(scores, key=lambda k: (scores[k][0], k))
    assert (result.pods[0].node, result.pods[0].gpu_index) == (best, scores[best][1])


def test_gpu_scores_equal_but_for_float_noise_tie_and_the_cpu_rules_decide() -> None:
    fragmentation = pytest.importorskip("agent.admission.engine.fragmentation")
    # 200-shares and whole GPUs at popularities 0.7, 0.2 and 0.3 (two whole-GPU types), whose sums
    # are not exact in binary: a 100-share lowers either node's fragment by exactly 50 on paper,
    # (800, 800, 1000) 800 -> 750 and (300, 1000) 150 -> 100, but the floats differ in the last bits
    whole = Resources(cpu_milli=1000, memory=GI, gpus=1)
    mix = ((Resources(cpu_milli=1000, memory=GI, gpu_milli=200), 0.7), (whole, 0.2), (whole, 0.3))
    nodes = (node("a-roomy", [(8, 8)], gpu_free=(800, 800, 1000)),
             node("b-busy", [(4, 4)], gpu_free=(300, 1000)))
    req = Resources(cpu_milli=1000, memory=GI, gpu_milli=100)
    raw = [fragmentation.gpu_choice(n, req, mix)[0] for n in nodes]
    assert raw[0] != raw[1] and abs(raw[0] - raw[1]) < 1e-9
    # so the tie goes to the node left with less free CPU (best fit), not to the noise
    result = place(ClusterView(nodes=nodes, gpu_mix=mix), Gang("g", (pods("s", 1, 1, gpu_milli=100),)))
    assert isinstance(result, Placement) and result.pods[0].node == "b-busy"


def test_place_is_deterministic_and_commit_counts_the_pods() -> None:
    view = ClusterView(nodes=(node("a", [(8, 16), (16, 16)]), node("b", [(12, 16)])))
    gang = Gang("g", (pods("w", 2, 8),))
    first = place(view, gang)
    assert first == place(view, gang)
    after = commit(view, gang, first)  # type: ignore[arg-type]
    zone_cpus = sum(z.cpu_milli for n in view.nodes for z in n.zones)
    assert sum(z.cpu_milli for n in after.nodes for z in n.zones) == zone_cpus - 16_000
    assert sum(n.free.cpu_milli for n in after.nodes) == sum(n.free.cpu_milli for n in view.nodes) - 16_000
    assert place(view, gang) == first  # the old view still answers the same
    assert where(place(after, gang)) != where(first)


def test_commit_takes_devices_from_the_zones_and_the_node() -> None:
    # restricted across both zones: the NICs come from both, the node-level FPGA from the node
    a = node("a", [(8, 8), (8, 8)], zone_devices=[{NIC: 1}, {NIC: 1}], node_devices={FPGA: 2})
    view = ClusterView(nodes=(a,), empty=(_emptied(a),))
    gang = Gang("ns/g", (pods("r", 1, 12, devices={NIC: 2, FPGA: 1}, policy="restricted"),))
    result = place(view, gang)
    assert where(result) == [("r", "a", None)]
    assert isinstance(result, Placement)
    after = commit(view, gang, result).nodes[0]
    assert [dict(z.devices) for z in after.zones] == [{NIC: 0}, {NIC: 0}]
    assert dict(after.free.devices) == {NIC: 0, FPGA: 1}
    assert sum(z.cpu_milli for z in after.zones) == 4000


def test_commit_of_a_pod_not_cpu_aligned_leaves_the_zones_cpus() -> None:
    a = node("a", [(2, 8), (2, 8)], cpus=16, zone_devices=[{NIC: 1}, {NIC: 1}])
    view = ClusterView(nodes=(a,), empty=(_emptied(a),))
    gang = Gang("ns/g", (pods("b", 2, 4, devices={NIC: 1}, cpu_aligned=False),))
    result = place(view, gang)
    assert where(result) == [("b", "a", 0), ("b", "a", 1)]
    assert isinstance(result, Placement)
    after = commit(view, gang, result).nodes[0]
    assert [(z.cpu_milli, dict(z.devices)) for z in after.zones] == [(2000, {NIC: 0}), (2000, {NIC: 0})]
    assert after.free.cpu_milli == 8000


def test_invalid_gang_is_never() -> None:
    result = place(ClusterView(nodes=(node("a", [(8, 8)]),)), Gang("g", (pods("w", 0, 1),)))
    assert isinstance(result, Refusal) and result.kind == "never"


# ---- less fragmented than best fit ----------------------------------------------------------------

def best_fit(view: ClusterView, gang: Gang) -> list[tuple[int, int]] | None:
    """The reference: each pod on the tightest node (by node totals) with a zone that holds it."""
    free = {i: [z.cpu_milli for z in n.zones] for i, n in enumerate(view.nodes)}
    out = []
    for ps in gang.pod_sets:
        for _ in range(ps.count):
            want = ps.requests.cpu_milli
            fits = [(sum(zs), i) for i, zs in free.items() if any(z >= want for z in zs)]
            if not fits:
                return None
            _, i = min(fits)
            p = next(k for k, z in enumerate(free[i]) if z >= want)
            free[i][p] -= want
            out.append((i, p))
    return out


def apply_best_fit(view: ClusterView, where: list[tuple[int, int]], want: int) -> ClusterView:
    nodes = list(view.nodes)
    for i, p in where:
        n = nodes[i]
        zones = tuple(Zone(z.numa, z.cpu_milli - want if k == p else z.cpu_milli, z.cpu_capacity_milli,
                           z.memory) for k, z in enumerate(n.zones))
        nodes[i] = Node(n.name, free=Resources(cpu_milli=n.free.cpu_milli - want, memory=n.free.memory),
                        capacity=n.capacity, zones=zones)
    return ClusterView(nodes=tuple(nodes))


def whole_zones(view: ClusterView) -> int:
    return sum(1 for n in view.nodes for z in n.zones if z.cpu_milli == z.cpu_capacity_milli)


def stream(seed: int) -> tuple[list[Node], list[Gang]]:
    """24 partly used nodes of 6-16-CPU zones, and gangs asking 80% of their free CPUs in all."""
    rng = random.Random(seed)
    nodes = []
    for i in range(24):
        zones, cap = rng.choice([(2, 8), (4, 8), (2, 16), (4, 6)])
        nodes.append(node(f"n{i:02d}", [(rng.choice([cap, cap, cap // 2, cap - 1, cap - 3]), cap)
                                        for _ in range(zones)], mem=256))
    total = sum(z.cpu_milli for n in nodes for z in n.zones) // 1000
    gangs: list[Gang] = []
    asked = 0
    while asked < 0.8 * total:
        count, cpus = rng.choice([(2, 1), (2, 1), (4, 2), (8, 3), (2, 4), (1, 6), (2, 8)])
        asked += count * cpus
        gangs.append(Gang(f"g{len(gangs)}", (pods("w", count, cpus),)))
    return nodes, gangs


def test_cpu_scoring_admits_as_many_and_keeps_more_whole_zones_than_best_fit() -> None:
    whole = [0, 0]
    for seed in range(1, 13):
        nodes, gangs = stream(seed)
        ours = ref = ClusterView(nodes=tuple(nodes))
        admitted = [0, 0]
        for gang in gangs:
            result = place(ours, gang)
            if isinstance(result, Placement):
                ours = commit(ours, gang, result)
                admitted[0] += 1
            found = best_fit(ref, gang)
            if found is not None:
                ref = apply_best_fit(ref, found, gang.pod_sets[0].requests.cpu_milli)
                admitted[1] += 1
        assert admitted[0] >= admitted[1], (seed, admitted)
        whole[0] += whole_zones(ours)
        whole[1] += whole_zones(ref)
    assert whole[0] > whole[1], whole


# ---- properties over random clusters --------------------------------------------------------------

def random_case(rng: random.Random) -> tuple[ClusterView, Gang]:
    nodes = []
    for i in range(rng.randint(1, 6)):
        zones = [(rng.randint(0, c), c) for c in [rng.choice([4, 8, 16])] * rng.randint(1, 4)]
        nodes.append(node(f"n{i}", zones, mem=rng.choice([2, 8, 64]), free_pods=rng.randint(0, 6),
                          labels={"rack": rng.choice(["a", "b"])},
                          tm=rng.choice(["single-numa-node", "restricted", "none"])))
    sets = tuple(pods(f"s{k}", rng.randint(1, 4), rng.randint(1, 8), mem=rng.choice([1, 4]),
                      policy=rng.choice(["single-numa-node", "single-numa-node", "restricted", "none",
                                         NODE_POLICY]),
                      colocate_label=rng.choice([None, None, "rack"]))
                 for k in range(rng.randint(1, 3)))
    return ClusterView(nodes=tuple(nodes)), Gang("g", sets)


@pytest.mark.parametrize("seed", range(300))
def test_placements_never_overcommit_and_are_deterministic(seed: int) -> None:
    view, gang = random_case(random.Random(seed))
    result = place(view, gang)
    assert result == place(view, gang)
    if isinstance(result, Refusal):
        assert result.kind == "not-now" and result.reason
        return
    sets = {ps.name: ps for ps in gang.pod_sets}
    assert sorted((p.pod_set, p.index) for p in result.pods) == sorted(
        (ps.name, k) for ps in gang.pod_sets for k in range(ps.count))
    by_node = {n.name: n for n in view.nodes}
    cpu: dict[str, int] = {}
    count: dict[str, int] = {}
    zone_cpu: dict[tuple[str, int], int] = {}
    racks: dict[str, set[str]] = {}
    for p in result.pods:
        ps = sets[p.pod_set]
        cpu[p.node] = cpu.get(p.node, 0) + ps.requests.cpu_milli
        count[p.node] = count.get(p.node, 0) + 1
        if ps.policy_on(by_node[p.node]) == "single-numa-node":
            assert p.zone is not None
        if p.zone is not None:
            zone_cpu[(p.node, p.zone)] = zone_cpu.get((p.node, p.zone), 0) + ps.requests.cpu_milli
        if ps.colocate_label:
            racks.setdefault(ps.colocate_label, set()).add(by_node[p.node].labels["rack"])
    for name, used in cpu.items():
        assert used <= by_node[name].free.cpu_milli
        assert count[name] <= by_node[name].free_pods
    for (name, numa), used in zone_cpu.items():
        assert used <= next(z.cpu_milli for z in by_node[name].zones if z.numa == numa)
    assert all(len(values) == 1 for values in racks.values())
    after = commit(view, gang, result)
    assert all(z.cpu_milli >= 0 for n in after.nodes for z in n.zones)
    assert all(n.free.cpu_milli >= 0 and n.free_pods >= 0 for n in after.nodes)


def random_device_case(rng: random.Random) -> tuple[ClusterView, Gang]:
    nodes = []
    for i in range(rng.randint(1, 5)):
        zones = [(rng.randint(0, 8), 8) for _ in range(rng.randint(1, 3))]
        nics = [{NIC: rng.randint(0, 2)} for _ in zones] if rng.random() < 0.8 else []
        nodes.append(node(f"n{i}", zones, cpus=rng.choice([None, 24]), zone_devices=nics,
                          zone_gpus=[rng.randint(0, 1) for _ in zones],
                          node_devices={FPGA: rng.randint(0, 2)},
                          tm=rng.choice(["single-numa-node", "restricted", "none"])))
    sets = tuple(pods(f"s{k}", rng.randint(1, 3), rng.randint(0, 4),
                      devices={k: v for k, v in ((NIC, rng.randint(0, 2)), (FPGA, rng.randint(0, 1))) if v},
                      gpus=rng.choice([0, 0, 1]), cpu_aligned=rng.random() < 0.6,
                      policy=rng.choice(["single-numa-node", "restricted", "none", NODE_POLICY]))
                 for k in range(rng.randint(1, 3)))
    return ClusterView(nodes=tuple(nodes)), Gang("g", sets)


@pytest.mark.parametrize("seed", range(200))
def test_devices_never_overcommit_zones_or_nodes(seed: int) -> None:
    view, gang = random_device_case(random.Random(seed))
    result = place(view, gang)
    assert result == place(view, gang)
    if isinstance(result, Refusal):
        return
    sets = {ps.name: ps for ps in gang.pod_sets}
    by_node = {n.name: n for n in view.nodes}
    node_use: dict[tuple[str, str], int] = {}
    zone_use: dict[tuple[str, int, str], int] = {}
    for p in result.pods:
        ps = sets[p.pod_set]
        for k, v in ps.requests.devices.items():
            node_use[(p.node, k)] = node_use.get((p.node, k), 0) + v
            zoned = any(k in z.devices for z in by_node[p.node].zones)
            if p.zone is not None and zoned:
                zone_use[(p.node, p.zone, k)] = zone_use.get((p.node, p.zone, k), 0) + v
    for (name, k), used in node_use.items():
        assert used <= by_node[name].free.devices.get(k, 0)
    for (name, numa, k), used in zone_use.items():
        assert used <= next(z.devices.get(k, 0) for z in by_node[name].zones if z.numa == numa)
    after = commit(view, gang, result)
    assert all(v >= 0 for n in after.nodes for z in n.zones for v in z.devices.values())
    assert all(v >= 0 for n in after.nodes for v in n.free.devices.values())
