"""The admission controller's zone (`topolet.io/numa-zone`): read from the pod, honoured by the pinner.

The pinner rows run a real `PodPinner` over a `RecordingEngine` (no cgroups) on the 64-CPU, 4-NUMA
dump tests/data/hwloc/dumps/64fake-4n2s2ca2c2t, so they need neither root nor a cluster.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agent.api.podplan import PodPlan, PodWarning, plan_pod
from agent.enforce.state_file import StateFile
from agent.kube.pods.pinner import PodPinner
from agent.kube.pods.watch import Changed
from agent.metrics.registry import Metrics
from agent.pinning.recording import RecordingEngine
from agent.topology.discover import discover
from tests.kube.test_pods import g, pod

DUMP = "64fake-4n2s2ca2c2t"
ZONE = "topolet.io/numa-zone"


# (annotations, CPUs given, zone read, NUMA policy, warning reasons)
PARSE: list[tuple[dict[str, Any], int, int | None, str, tuple[str, ...]]] = [
    ({ZONE: "1"}, 4, 1, "single-numa-node", ()),
    ({ZONE: "0"}, 4, 0, "single-numa-node", ()),
    ({ZONE: "1023"}, 4, 1023, "single-numa-node", ()),
    ({ZONE: "2", "topolet.io/numa-policy": "best-effort"}, 4, 2, "single-numa-node", ()),
    ({}, 4, None, "best-effort", ()),
    ({ZONE: "1024"}, 0, None, "best-effort", ("InvalidAnnotation",)),
    ({ZONE: "-1"}, 0, None, "best-effort", ("InvalidAnnotation",)),
    ({ZONE: "01"}, 0, None, "best-effort", ("InvalidAnnotation",)),
    ({ZONE: "node-1"}, 0, None, "best-effort", ("InvalidAnnotation",)),
    ({ZONE: " 1"}, 0, None, "best-effort", ("InvalidAnnotation",)),
    ({ZONE: ""}, 0, None, "best-effort", ("InvalidAnnotation",)),
    ({ZONE: 1}, 0, None, "best-effort", ("InvalidAnnotation",)),
]


@pytest.mark.parametrize(("notes", "cpus", "zone", "policy", "reasons"), PARSE)
def test_zone_annotation_is_read_or_refused(notes: dict[str, Any], cpus: int, zone: int | None,
                                            policy: str, reasons: tuple[str, ...]) -> None:
    plan = plan_pod(pod([g(cpu="4")], qos="Guaranteed", annotations=notes))
    (c,) = plan.containers
    assert (c.cpus, c.numa_zone, c.numa_policy) == (cpus, zone, policy)
    assert tuple(w.reason for w in plan.warnings) == reasons


PLACED = "topolet.io/placements"
INDEX = "batch.kubernetes.io/job-completion-index"

# (annotations, the pod's node, CPUs given, zone read, warning reasons): the one-node route's slots
PLACEMENTS: list[tuple[dict[str, Any], str | None, int, int | None, tuple[str, ...]]] = [
    ({PLACED: "n1:0,n1:3,n1:", INDEX: "1"}, "n1", 4, 3, ()),
    ({PLACED: "n1:0,n1:3,n1:", INDEX: "0"}, "n1", 4, 0, ()),
    ({PLACED: "n1:0,n1:3,n1:", INDEX: "2"}, "n1", 4, None, ()),  # a slot with no zone
    ({PLACED: "n1:0,n1:3", INDEX: "1", ZONE: "2"}, "n1", 4, 2, ()),  # the pod's own zone wins
    ({PLACED: "n1:0,n1:3", INDEX: "2"}, "n1", 0, None, ("InvalidAnnotation",)),  # past the list
    ({PLACED: "n1:0,n1:3"}, "n1", 0, None, ("InvalidAnnotation",)),  # no completion index
    ({PLACED: "n1:0,n1:3", INDEX: "x"}, "n1", 0, None, ("InvalidAnnotation",)),
    ({PLACED: "n1:0,n2:3", INDEX: "1"}, "n1", 0, None, ("InvalidAnnotation",)),  # another node's slot
    ({PLACED: "n1:0,n1:3", INDEX: "1"}, None, 0, None, ("InvalidAnnotation",)),  # not bound
    ({PLACED: "n1:0,n1:01", INDEX: "1"}, "n1", 0, None, ("InvalidAnnotation",)),
    ({PLACED: "n1:0,n1:1024", INDEX: "1"}, "n1", 0, None, ("InvalidAnnotation",)),
    ({PLACED: "n1:0,n1", INDEX: "1"}, "n1", 0, None, ("InvalidAnnotation",)),
    ({PLACED: "n1:0,:1", INDEX: "1"}, "n1", 0, None, ("InvalidAnnotation",)),
    ({PLACED: ["n1:0"], INDEX: "0"}, "n1", 0, None, ("InvalidAnnotation",)),
]


@pytest.mark.parametrize(("notes", "node", "cpus", "zone", "reasons"), PLACEMENTS)
def test_placements_give_the_zone_of_the_pods_index_on_its_node(
        notes: dict[str, Any], node: str | None, cpus: int, zone: int | None,
        reasons: tuple[str, ...]) -> None:
    obj = pod([g(cpu="4")], qos="Guaranteed", annotations=notes)
    if node is not None:
        obj["spec"]["nodeName"] = node
    plan = plan_pod(obj)
    (c,) = plan.containers
    assert (c.cpus, c.numa_zone) == (cpus, zone)
    assert c.numa_policy == ("single-numa-node" if zone is not None else "best-effort")
    assert tuple(w.reason for w in plan.warnings) == reasons


def test_zone_means_nothing_for_a_shared_container() -> None:
    (c,) = plan_pod(pod([g(cpu="500m")], qos="Guaranteed", annotations={ZONE: "1"})).containers
    assert (c.cpus, c.numa_zone) == (0, None)


class Recorder:
    def __init__(self) -> None:
        self.warnings: list[tuple[str, PodWarning]] = []

    def __call__(self, plan: PodPlan, w: PodWarning) -> None:
        self.warnings.append((plan.name, w))


def pinner(dump_root: Any, tmp: Path) -> tuple[PodPinner, Recorder]:
    topo = discover(str(dump_root(DUMP)))
    engine = RecordingEngine(topo, StateFile(str(tmp / "state")))
    warned = Recorder()
    return PodPinner(engine, Metrics(), warned, enforce=False), warned


def numa_of(p: PodPinner, uid: str) -> set[int]:
    (a,) = [a for a in p.engine.state_file.load().allocations if a.owner.pod_uid == uid]
    return {p.engine.topology.numa_of(cpu) for cpu in a.cpus}


def zoned(uid: str, zone: str, cpus: str = "4") -> PodPlan:
    obj = pod([g(cpu=cpus)], qos="Guaranteed", annotations={ZONE: zone})
    obj["metadata"].update(uid=uid, name=uid)
    return plan_pod(obj)


# (zone, CPUs): the pod is pinned in that zone; node-<N> has 16 CPUs on the dump.
@pytest.mark.parametrize(("zone", "cpus"), [("0", "4"), ("1", "4"), ("2", "16"), ("3", "1")])
def test_zone_pins_inside_that_numa_node(dump_root: Any, tmp_path: Path, zone: str, cpus: str) -> None:
    p, warned = pinner(dump_root, tmp_path)
    p.handle(Changed(zoned("a", zone, cpus)))
    assert numa_of(p, "a") == {int(zone)}
    assert not warned.warnings


# (zone, CPUs): the zone cannot hold the pod: an AllocationFailed Event, no allocation.
@pytest.mark.parametrize(("zone", "cpus"), [("4", "2"), ("63", "1"), ("1", "17")])
def test_a_zone_that_cannot_hold_the_pod_gives_an_event_and_the_pool(dump_root: Any, tmp_path: Path,
                                                                      zone: str, cpus: str) -> None:
    p, warned = pinner(dump_root, tmp_path)
    p.handle(Changed(zoned("a", zone, cpus)))
    assert not p.engine.state_file.load(missing_ok=True).allocations
    assert [(name, w.reason) for name, w in warned.warnings] == [("a", "AllocationFailed")]
    assert "a" in p.unsatisfied  # tried again when CPUs are freed


def test_a_full_zone_refuses_while_others_are_free(dump_root: Any, tmp_path: Path) -> None:
    p, warned = pinner(dump_root, tmp_path)
    p.handle(Changed(zoned("a", "1", "12")))
    p.handle(Changed(zoned("b", "1", "8")))  # 4 left in node 1; nodes 0, 2, 3 are empty
    assert numa_of(p, "a") == {1}
    assert [(name, w.reason) for name, w in warned.warnings] == [("b", "AllocationFailed")]
    p.forget("a")
    p.retry()
    assert numa_of(p, "b") == {1}
