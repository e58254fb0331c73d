"""The Topology Manager scope on the agent: `agent.kube.pods.numa_scope.scoped_request` (pure, table rows)
and the `PodPinner` that every route allocates through, under `--numa-scope container|pod`.

The pinner rows run a real `PodPinner` over a `RecordingEngine` (no cgroups) on the 64-CPU, 4-NUMA
dump tests/data/hwloc/dumps/64fake-4n2s2ca2c2t (16 CPUs per node), as tests/kube/test_numa_zone.py does.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection
from pathlib import Path
from typing import Any

import pytest

from agent.alloc.request import Request
from agent.alloc.synthetic import synthetic_topology
from agent.api.placements import parse_numa_zone
from agent.api.podplan import PodPlan, plan_pod
from agent.enforce.state import Allocation, Owner
from agent.enforce.state_file import StateFile
from agent.kube.pods.numa_scope import scoped_request
from agent.kube.pods.pinner import PodPinner
from agent.kube.pods.watch import Changed
from agent.metrics.registry import Metrics
from agent.pinning.recording import RecordingEngine
from agent.topology.cpuset import CPUSet
from agent.topology.discover import discover
from tests.kube.test_numa_zone import Recorder
from tests.kube.test_pods import g, pod

DUMP = "64fake-4n2s2ca2c2t"
SINGLE = {"topolet.io/numa-policy": "single-numa-node"}
TOPO = synthetic_topology(2, 1, 1, 4, 1)  # node 0: CPUs 0-3, node 1: CPUs 4-7


def ids(obj: dict[str, Any]) -> dict[str, Any]:
    """`obj` with a container ID of each container's own (its cgroup in the state)."""
    for cs in obj["status"]["containerStatuses"]:
        cs["containerID"] = "containerd://" + hashlib.sha256(cs["name"].encode()).hexdigest()
    return obj


def two(a: str, b: str, notes: dict[str, Any] | None = None, running: tuple[str, ...] = ("a", "b"),
        uid: str = "u-1") -> PodPlan:
    obj = pod([g("a", cpu=a), g("b", cpu=b)], qos="Guaranteed", annotations=notes or SINGLE,
              running=running)
    obj["metadata"].update(uid=uid, name=uid)
    return plan_pod(ids(obj))


def held(container: str, cpus: set[int], affinity: Collection[int] = (), uid: str = "u-1") -> Allocation:
    return Allocation(f"pod-{uid}.{container}", CPUSet(cpus), CPUSet(), f"kubepods/{uid}/{container}",
                      Owner(pod_uid=uid, container=container), "single-numa-node/any", 0.0,
                      affinity=CPUSet(affinity))


# (scope, pod, its container, near, pod_near, allocations held,
#  the container's preferred nodes, the pod's whole CPUs or None (no pod scope), recorded affinity)
ROWS: list[tuple[str, PodPlan, str, frozenset[int] | None, frozenset[int] | None, list[Allocation],
                 frozenset[int] | None, int | None, frozenset[int] | None]] = [
    # container scope: the container's own request, whatever the pod holds
    ("container", two("2", "3"), "a", None, None, [], None, None, None),
    ("container", two("2", "3"), "b", frozenset({1}), frozenset({0, 1}), [held("a", {0, 1}, {0})],
     frozenset({1}), None, None),
    # pod scope, the first container: the pod's nodes are chosen from its whole request ...
    ("pod", two("2", "3"), "a", None, None, [], None, 5, None),
    # ... near the GPUs of all its containers
    ("pod", two("2", "3"), "a", frozenset({1}), frozenset({0, 1}), [], frozenset({1}), 5, None),
    # ... counting the containers that do not run yet (the kubelet's pod hint counts the spec)
    ("pod", two("2", "3", running=("a",)), "a", None, None, [], None, 5, None),
    # a later container: the nodes another container of the pod recorded
    ("pod", two("2", "3"), "b", None, None, [held("a", {4, 5}, {1})], None, 5, frozenset({1})),
    # its own allocation (a resize) or another pod's say nothing
    ("pod", two("2", "3"), "b", None, None, [held("b", {4, 5}, {1}), held("a", {0}, {0}, uid="u-2")],
     None, 5, None),
    # recorded before the pod scope ran: the nodes of the CPUs held stand for the pod's
    ("pod", two("2", "3"), "b", None, None, [held("a", {0, 1})], None, 5, frozenset({0})),
    # the controller split the pod (a zone per container): each in its own, under either scope
    ("pod", two("2", "3", notes={"topolet.io/numa-zone": "0,1"}), "b", frozenset({1}), None,
     [held("a", {0, 1}, {0})], frozenset({1}), None, None),
]


@pytest.mark.parametrize(("scope", "plan", "name", "near", "pod_near", "allocs", "preferred", "whole",
                          "affinity"), ROWS)
def test_scoped_request(scope: str, plan: PodPlan, name: str, near: frozenset[int] | None,
                        pod_near: frozenset[int] | None, allocs: list[Allocation],
                        preferred: frozenset[int] | None, whole: int | None,
                        affinity: frozenset[int] | None) -> None:
    c = next(c for c in (*plan.containers, *plan.waiting) if c.name == name)
    request, scoped = scoped_request(scope, TOPO, plan, c, near, pod_near, allocs)
    assert request == Request(c.cpus, "single-numa-node", "any", preferred)
    if whole is None:
        assert scoped is None
    else:
        assert scoped is not None
        assert (scoped.whole.cpus, scoped.whole.numa_policy, scoped.affinity) == (whole, "single-numa-node",
                                                                                   affinity)
        assert scoped.whole.preferred_numa == pod_near


def test_a_zoned_pod_is_chosen_in_its_zone() -> None:
    obj = pod([g("a", cpu="2"), g("b", cpu="3")], qos="Guaranteed", annotations={"topolet.io/numa-zone": "1"})
    plan = plan_pod(obj)
    _, scoped = scoped_request("pod", TOPO, plan, plan.containers[0], frozenset({1}), frozenset({0}), [])
    assert scoped is not None and scoped.whole.preferred_numa == frozenset({1})


def pinner(dump_root: Any, tmp: Path, scope: str) -> tuple[PodPinner, Recorder]:
    engine = RecordingEngine(discover(str(dump_root(DUMP))), StateFile(str(tmp / "state")))
    warned = Recorder()
    return PodPinner(engine, Metrics(), warned, enforce=False, numa_scope=scope), warned


def nodes(p: PodPinner, uid: str) -> dict[str, set[int]]:
    return {str(a.owner.container): {p.engine.topology.numa_of(c) for c in a.cpus}
            for a in p.engine.state_file.load().allocations if a.owner.pod_uid == uid}


def one(uid: str, cpus: str) -> PodPlan:
    obj = pod([g("x", cpu=cpus)], qos="Guaranteed", annotations=SINGLE)
    obj["metadata"].update(uid=uid, name=uid)
    return plan_pod(ids(obj))


# (scope, the NUMA nodes of containers a and b of 6 CPUs each, after an 8-CPU pod took half of node 0)
@pytest.mark.parametrize(("scope", "where"), [
    ("container", {"a": {0}, "b": {1}}),  # each container by itself: a fills node 0's tight 8
    ("pod", {"a": {1}, "b": {1}}),  # the pod's 12 CPUs as a whole: node 1
])
def test_scope_decides_whether_a_pods_containers_share_a_node(dump_root: Any, tmp_path: Path, scope: str,
                                                               where: dict[str, set[int]]) -> None:
    p, warned = pinner(dump_root, tmp_path, scope)
    p.handle(Changed(one("ab", "8")))
    assert nodes(p, "ab") == {"x": {0}}
    p.handle(Changed(two("6", "6", uid="cd")))
    assert nodes(p, "cd") == where
    assert not warned.warnings


@pytest.mark.parametrize(("scope", "pinned"), [("container", {"a", "b"}), ("pod", set())])
def test_a_pod_bigger_than_a_node_is_refused_only_under_the_pod_scope(
        dump_root: Any, tmp_path: Path, scope: str, pinned: set[str]) -> None:
    p, warned = pinner(dump_root, tmp_path, scope)
    p.handle(Changed(two("10", "10", uid="cd")))  # each fits a 16-CPU node, the pod's 20 none
    assert set(nodes(p, "cd")) == pinned
    if not pinned:
        assert {w.reason for _, w in warned.warnings} == {"AllocationFailed"}
        assert all("pod scope" in w.message for _, w in warned.warnings)
        assert "cd" in p.unsatisfied


def test_the_pods_nodes_survive_an_agent_restart(dump_root: Any, tmp_path: Path) -> None:
    p, _ = pinner(dump_root, tmp_path, "pod")
    p.handle(Changed(one("ab", "8")))
    p.handle(Changed(two("6", "6", uid="cd", running=("a",))))  # b has not started yet
    assert nodes(p, "cd") == {"a": {1}}
    (a,) = [a for a in p.engine.state_file.load().allocations if a.owner.container == "a"]
    assert a.affinity == CPUSet({1})  # recorded in the state file
    # A new agent on the same state: b starts; node 0 (8 free) is a tighter fit than node 1 (10 free)
    again, warned = pinner(dump_root, tmp_path, "pod")
    again.handle(Changed(two("6", "6", uid="cd")))
    assert nodes(again, "cd") == {"a": {1}, "b": {1}}
    assert not warned.warnings


def test_a_restarted_agent_under_the_container_scope_places_alone(dump_root: Any, tmp_path: Path) -> None:
    p, _ = pinner(dump_root, tmp_path, "pod")
    p.handle(Changed(one("ab", "8")))
    p.handle(Changed(two("6", "6", uid="cd", running=("a",))))
    again, _ = pinner(dump_root, tmp_path, "container")
    again.handle(Changed(two("6", "6", uid="cd")))
    assert nodes(again, "cd") == {"a": {1}, "b": {0}}


# ---- a pod the admission controller split over zones (container scope): a zone per container ------

ZONE = "topolet.io/numa-zone"


@pytest.mark.parametrize(("value", "read"), [
    ("3", (3, ())),
    ("0,2", (None, (0, 2))),
    ("1,1,0", (None, (1, 1, 0))),
    ("0,", None), (",1", None), ("0,,1", None), ("0, 1", None), ("01,1", None), ("0,1024", None),
    (",".join(["0"] * 65), None), (3, None), (["0", "1"], None), ("", None),
])
def test_parse_numa_zone(value: object, read: tuple[int | None, tuple[int, ...]] | None) -> None:
    assert parse_numa_zone(value) == read


def split_pod(value: str, uid: str = "ef") -> PodPlan:
    return two("6", "6", notes={ZONE: value}, uid=uid)


@pytest.mark.parametrize("scope", ["container", "pod"])
def test_each_container_is_pinned_in_its_own_zone(dump_root: Any, tmp_path: Path, scope: str) -> None:
    plan = split_pod("2,0")
    assert [(c.name, c.numa_zone, c.numa_policy) for c in plan.containers] == [
        ("a", 2, "single-numa-node"), ("b", 0, "single-numa-node")]
    p, warned = pinner(dump_root, tmp_path, scope)  # the controller's zones decide under either
    p.handle(Changed(plan))
    assert nodes(p, "ef") == {"a": {2}, "b": {0}}
    assert not warned.warnings


@pytest.mark.parametrize("value", ["0", "1,2,3", "0,x"])
def test_a_zone_list_that_is_not_one_per_container_is_a_bad_annotation(value: str) -> None:
    plan = split_pod(value)
    if value == "0":  # the pod's zone: both containers there
        assert [c.numa_zone for c in plan.containers] == [0, 0]
        return
    assert [w.reason for w in plan.warnings] == ["InvalidAnnotation"]
    assert all(c.cpus == 0 and c.numa_zone is None for c in plan.containers)  # the shared pool
