"""The Topology Manager scope in the admission engine: each node's `topologyManagerScope` read from its
NRT (`agent.admission.cluster.view.node_scope`), the container scope's safe split of a pod over zones
(`agent.admission.engine.scope.split`, pure) and `place`/`commit` under both scopes, one row each."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from agent.admission.cluster.view import BadObject, node_scope
from agent.admission.engine.model import NODE_POLICY, ClusterView, Gang, Placement, PodPlacement, Refusal
from agent.admission.engine.place import commit, place
from agent.admission.engine.scope import MAX_CONTAINERS, split
from agent.admission.gangs.job import HOSTNAME_LABEL, NUMA_ZONE_ANNOTATION, JobSpecError, container_cpus
from agent.admission.gangs.record import AdmissionRecord, SlotPlacement, decode_record, placements_value
from agent.admission.gangs.slots import pod_target
from agent.admission.jobs.patches import one_node_template, pod_patch
from agent.admission.kueue.workloads import NOT_INDEXED, pod_set_updates
from tests.admission.test_engine import node, pods

# (zones' free CPU, containers' CPU, the zone each goes to or None: no split)
SPLITS: list[tuple[list[int], list[int], tuple[int, ...] | None]] = [
    ([8000, 8000], [6000, 6000], (0, 1)),  # each fits a zone, their sum none
    ([16000, 16000], [10000, 10000], (0, 1)),
    ([8000, 8000], [4000, 4000, 4000], (0, 0, 1)),  # largest first, each in the tightest zone
    ([8000, 6000], [6000, 4000, 2000], (1, 0, 0)),
    ([8000, 8000], [6000, 0, 6000], (0, 0, 1)),  # a container without exclusive CPUs goes anywhere
    ([8000], [2000], (0,)),
    ([8000, 8000], [10000, 2000], None),  # one fits no zone
    ([4000, 4000, 4000], [3000, 3000, 3000, 3000], None),  # three fit, the fourth finds no zone
    ([8000, 8000], [1000] * (MAX_CONTAINERS + 1), None),  # more than a pod's zone list holds
    ([], [1000, 1000], None),
]


@pytest.mark.parametrize(("zones", "containers", "where"), SPLITS)
def test_split(zones: list[int], containers: list[int], where: tuple[int, ...] | None) -> None:
    assert split(zones, containers) == where


def scoped(name: str, scope: str, zones: list[tuple[int, int]], **kw: Any) -> Any:
    return replace(node(name, zones, **kw), topology_scope=scope)


def two(name: str = "p", count: int = 1, a: int = 6, b: int = 6, **kw: Any) -> Any:
    return replace(pods(name, count, a + b, **kw), containers=(a * 1000, b * 1000))


# (nodes, the pod set, (node, zone, containers' zones) of each pod or None: refused)
PLACE: list[tuple[str, list[Any], Any, list[tuple[str, int | None, tuple[int, ...]]] | None]] = [
    ("container scope: each container fits a zone, their sum none: split, a zone per container",
     [scoped("a", "container", [(8, 16), (8, 16)])], two(), [("a", None, (0, 1))]),
    ("pod scope: the pod's sum must fit one zone",
     [scoped("a", "pod", [(8, 16), (8, 16)])], two(), None),
    ("container scope, a zone holds it whole: that zone, as under the pod scope",
     [scoped("a", "container", [(8, 16), (14, 16)])], two(), [("a", 1, ())]),
    ("pod scope, a zone holds it whole",
     [scoped("a", "pod", [(8, 16), (14, 16)])], two(), [("a", 1, ())]),
    ("a pod scope node is passed over for a container scope one",
     [scoped("a", "pod", [(8, 16), (8, 16)]), scoped("b", "container", [(8, 16), (8, 16)])], two(),
     [("b", None, (0, 1))]),
    ("the largest container first, each in the tightest zone",
     [scoped("a", "container", [(8, 16), (6, 16)])],
     replace(pods("p", 1, 12), containers=(6000, 4000, 2000)), [("a", None, (1, 0, 0))]),
    ("containers that fit no zone between them",
     [scoped("a", "container", [(4, 16), (4, 16), (4, 16)])],
     replace(pods("p", 1, 12), containers=(3000, 3000, 3000, 3000)), None),
    ("a pod with devices is never split",
     [scoped("a", "container", [(8, 16), (8, 16)], zone_gpus=[2, 2])], two(gpus=2), None),
    ("one container: nothing to split",
     [scoped("a", "container", [(8, 16), (8, 16)])], pods("p", 1, 12), None),
    ("a pod without a policy of its own on a single-numa-node node of the container scope",
     [scoped("a", "container", [(8, 16), (8, 16)], tm="single-numa-node")], two(policy=NODE_POLICY),
     [("a", None, (0, 1))]),
    ("two such pods over two nodes",
     [scoped("a", "container", [(8, 16), (8, 16)]), scoped("b", "container", [(8, 16), (8, 16)])],
     two(count=2), [("a", None, (0, 1)), ("b", None, (0, 1))]),
]


@pytest.mark.parametrize(("what", "nodes", "pod_set", "placed"), PLACE, ids=[r[0] for r in PLACE])
def test_place_by_each_nodes_scope(what: str, nodes: list[Any], pod_set: Any,
                                   placed: list[tuple[str, int | None, tuple[int, ...]]] | None) -> None:
    result = place(ClusterView(tuple(nodes)), Gang("ns/g", (pod_set,)))
    if placed is None:
        assert isinstance(result, Refusal), result
    else:
        assert isinstance(result, Placement), result
        assert sorted((p.node, p.zone, p.zones) for p in result.pods) == placed


# (nodes, the pod set, a piece of the refusal's text): under the container scope the binding constraint
# is a container's zone, not the pod's.
REFUSALS: list[tuple[str, list[Any], Any, str]] = [
    ("pod scope: the pod's sum against a zone",
     [scoped("a", "pod", [(8, 16), (8, 16)])], two(),
     "pod needs 12 CPUs in one NUMA zone; largest free zone has 8 CPUs (node a)"),
    ("container scope: the largest container against a zone",
     [scoped("a", "container", [(6, 16), (6, 16)])], two(a=8, b=2),
     "a container needs 8 CPUs in one NUMA zone; largest free zone has 6 CPUs (node a)"),
    ("container scope: each container fits a zone, not all of them together",
     [scoped("a", "container", [(4, 16), (4, 16), (4, 16)])],
     replace(pods("p", 1, 12), containers=(3000, 3000, 3000, 3000)),
     "no node holds the pod's CPU, memory and devices together in one NUMA zone, nor container by container"),
    ("a node of each scope: no zone-level figure fits both",
     [scoped("a", "pod", [(6, 16), (6, 16)]), scoped("b", "container", [(5, 16), (5, 16), (5, 16)])], two(),
     "no node holds the pod's CPU, memory and devices together in one NUMA zone, nor container by container"),
]


@pytest.mark.parametrize(("what", "nodes", "pod_set", "text"), REFUSALS, ids=[r[0] for r in REFUSALS])
def test_refusal_names_the_scopes_constraint(what: str, nodes: list[Any], pod_set: Any, text: str) -> None:
    result = place(ClusterView(tuple(nodes)), Gang("ns/g", (pod_set,)))
    assert isinstance(result, Refusal), result
    assert text in result.reason, result.reason


def test_commit_counts_a_split_pod_in_its_containers_zones() -> None:
    view = ClusterView((scoped("a", "container", [(8, 16), (8, 16)]),))
    gang = Gang("ns/g", (two(a=6, b=4),))
    result = place(view, gang)
    assert isinstance(result, Placement)
    assert [(p.zone, p.zones) for p in result.pods] == [(None, (0, 1))]
    after = commit(view, gang, result)
    (n,) = after.nodes
    assert [z.cpu_milli for z in n.zones] == [2000, 4000]
    assert n.topology_scope == "container"  # the node keeps its scope
    assert isinstance(place(after, gang), Refusal)  # a second one fits no more
    # commit counts a placement as recorded: each container in its zone
    swapped = commit(view, gang, Placement("ns/g", (replace(result.pods[0], zones=(1, 0)),)))
    assert [z.cpu_milli for z in swapped.nodes[0].zones] == [4000, 2000]


# (NRT, the node's scope or None: a bad object)
SCOPES: list[tuple[dict[str, Any] | None, str | None]] = [
    (None, "container"),  # no NRT: the kubelet's default
    ({}, "container"),
    ({"attributes": [{"name": "topologyManagerScope", "value": "pod"}]}, "pod"),
    ({"attributes": [{"name": "topologyManagerScope", "value": "container"}]}, "container"),
    ({"attributes": [{"name": "topologyManagerPolicy", "value": "single-numa-node"}]}, "container"),
    ({"attributes": [{"name": "topologyManagerScope", "value": "Pod"}]}, None),
    ({"attributes": [{"name": "topologyManagerScope", "value": "node"}]}, None),
    ({"attributes": [{"name": "topologyManagerScope", "value": ["pod"]}]}, None),
    ({"attributes": [{"name": "topologyManagerScope"}]}, None),
    # Older publishers fill only the deprecated list; the attribute wins where both are given.
    ({"topologyPolicies": ["SingleNUMANodePodLevel"]}, "pod"),
    ({"topologyPolicies": ["RestrictedPodLevel"]}, "pod"),
    ({"topologyPolicies": ["BestEffortContainerLevel"]}, "container"),
    ({"topologyPolicies": ["None"]}, "container"),
    ({"topologyPolicies": ["Bogus"]}, "container"),
    ({"topologyPolicies": "SingleNUMANodePodLevel"}, "container"),  # not a list
    ({"topologyPolicies": ["SingleNUMANodePodLevel"],
      "attributes": [{"name": "topologyManagerScope", "value": "container"}]}, "container"),
]


@pytest.mark.parametrize(("nrt", "want"), SCOPES)
def test_node_scope(nrt: dict[str, Any] | None, want: str | None) -> None:
    if want is None:
        with pytest.raises(BadObject):
            node_scope(nrt)
    else:
        assert node_scope(nrt) == want


def _container(cpu: str) -> dict[str, Any]:
    return {"name": f"c{cpu}", "resources": {"requests": {"cpu": cpu, "memory": "1Gi"}}}


@pytest.mark.parametrize(("containers", "want"), [
    ([_container("2")], ()),  # one container: both scopes align it alike
    ([_container("2"), _container("500m")], (2000, 500)),
    ([_container("2"), {"name": "x"}, _container("1")], (2000, 0, 1000)),
])
def test_container_cpus(containers: list[dict[str, Any]], want: tuple[int, ...]) -> None:
    assert container_cpus({"containers": containers}) == want


# ---- a split pod's zones on their way to the node's agent ------------------------------------------

SPLIT_SLOT = SlotPlacement("n1", None, (0, 1))


def test_the_record_keeps_each_containers_zone_and_reads_older_records() -> None:
    record = AdmissionRecord("admitted", "d", "t", {0: SPLIT_SLOT, 1: SlotPlacement("n1", 1),
                                                     2: SlotPlacement("n2")})
    text = record.encode()
    assert '"0":{"node":"n1","zones":[0,1]}' in text
    assert '"1":{"node":"n1","zone":1}' in text  # as before: older readers read it alike
    assert decode_record(text) == record
    assert SPLIT_SLOT.zone_value() == "0,1"
    assert SlotPlacement("n1", 3).zone_value() == "3" and SlotPlacement("n1").zone_value() is None


@pytest.mark.parametrize("slot", [
    {"node": "n1", "zones": [0]},  # one zone is a zone, not a split
    {"node": "n1", "zones": []},
    {"node": "n1", "zones": [0, "1"]},
    {"node": "n1", "zones": [0, 1024]},
    {"node": "n1", "zones": [0, True]},
    {"node": "n1", "zones": "0,1"},
    {"node": "n1", "zones": [0, 1], "zone": 0},  # both
    {"node": "n1", "zones": list(range(65))},
    {"node": "n1", "zones": [[0], [1]]},
])
def test_a_records_containers_zones_are_read_strictly(slot: dict[str, Any]) -> None:
    text = json.dumps({"version": 1, "result": "admitted", "decision": "d", "time": "t",
                       "placement": {"0": slot}})
    with pytest.raises(JobSpecError):
        decode_record(text)


def test_a_split_slot_reaches_its_pod_by_the_zone_annotation() -> None:
    one = AdmissionRecord("admitted", "d", "t", {0: SPLIT_SLOT, 1: SPLIT_SLOT})
    template = one_node_template(one, {}, indexed=True)
    assert template is not None
    assert template["metadata"]["annotations"] == {NUMA_ZONE_ANNOTATION: "0,1"}
    # Slots that differ cannot go in the placements format: the pods are gated and patched one by one.
    two_ways = AdmissionRecord("admitted", "d", "t", {0: SPLIT_SLOT, 1: SlotPlacement("n1", 1)})
    assert placements_value(two_ways, indexed=True) is None
    assert one_node_template(two_ways, {}, indexed=True) is None
    patch = pod_patch({"metadata": {"resourceVersion": "1"}, "spec": {}}, "n1", SPLIT_SLOT.zone_value())
    assert patch["metadata"]["annotations"] == {NUMA_ZONE_ANNOTATION: "0,1"}
    # ... and the pod then names its slot
    pod = {"metadata": {"annotations": {NUMA_ZONE_ANNOTATION: "0,1"}},
           "spec": {"nodeSelector": {HOSTNAME_LABEL: "n1"}}}
    assert pod_target(pod) == SPLIT_SLOT


def test_the_kueue_route_splits_only_a_pod_set_of_one_pod() -> None:
    ps = two()
    placement = Placement("ns/w", (PodPlacement("p", 0, "n1", None, zones=(0, 1)),))
    (update,) = pod_set_updates(Gang("ns/w", (ps,)), placement, lambda _: NOT_INDEXED)
    assert update["annotations"] == {NUMA_ZONE_ANNOTATION: "0,1"}


def test_a_colocated_gang_may_be_split_in_its_domain() -> None:
    rack = {"topology.kubernetes.io/rack": "r1"}
    nodes = (scoped("a", "container", [(8, 16), (8, 16)], labels=rack),)
    ps = replace(two(), colocate_label="topology.kubernetes.io/rack")
    result = place(ClusterView(nodes), Gang("ns/g", (ps,)))
    assert isinstance(result, Placement), result
    assert [(p.node, p.zones) for p in result.pods] == [("a", (0, 1))]
