"""Waiting gangs decided again only when the view grew (agent/admission/engine/waiting.py): `grew` row by
row, and `Waiting` handing out a refusal only while it holds."""

from __future__ import annotations

from dataclasses import replace

import pytest

from agent.admission.engine.model import (
    ClusterView,
    Gang,
    Node,
    PodSet,
    Refusal,
    Resources,
    Taint,
    Zone,
)
from agent.admission.engine.place import place
from agent.admission.engine.waiting import Waiting, grew

ZONES = (Zone(0, cpu_milli=4000, cpu_capacity_milli=16000, memory=8 << 30),
         Zone(1, cpu_milli=2000, cpu_capacity_milli=16000, memory=8 << 30))
NODE = Node("n1", labels={"rack": "a"}, free=Resources(cpu_milli=6000, memory=16 << 30),
            capacity=Resources(cpu_milli=32000, memory=64 << 30), zones=ZONES, gpu_free_milli=(500, 0),
            free_pods=10, topology_policy="single-numa-node")
OTHER = replace(NODE, name="n2")
BEFORE = ClusterView(nodes=(NODE, OTHER))


def zone0(**changes: int) -> tuple[Zone, ...]:
    return (replace(ZONES[0], **changes), ZONES[1])


ROWS = [
    ("the same view", (NODE, OTHER), False),
    ("a node gone", (NODE,), False),
    ("less free on a node", (replace(NODE, free=Resources(cpu_milli=2000, memory=16 << 30)), OTHER), False),
    ("less free in a zone", (replace(NODE, zones=zone0(cpu_milli=1000)), OTHER), False),
    ("a GPU share taken", (replace(NODE, gpu_free_milli=(250, 0)), OTHER), False),
    ("a new node", (NODE, OTHER, replace(NODE, name="n3")), True),
    ("more CPU on a node", (replace(NODE, free=Resources(cpu_milli=7000, memory=16 << 30)), OTHER), True),
    ("more hugepages on a node",
     (replace(NODE, free=Resources(cpu_milli=6000, memory=16 << 30, hugepages={"hugepages-1Gi": 1})), OTHER),
     True),
    ("more CPU in a zone", (replace(NODE, zones=zone0(cpu_milli=5000)), OTHER), True),
    ("more memory in a zone", (replace(NODE, zones=zone0(memory=9 << 30)), OTHER), True),
    ("a GPU share freed", (replace(NODE, gpu_free_milli=(500, 250)), OTHER), True),
    ("room for another pod", (replace(NODE, free_pods=11), OTHER), True),
    ("a label changed", (replace(NODE, labels={"rack": "b"}), OTHER), True),
    ("a taint gone", (replace(NODE, taints=()), replace(OTHER, taints=(Taint("k"),))), True),
    ("cordoned", (replace(NODE, unschedulable=True), OTHER), True),  # not the same node: decided again
    ("another Topology Manager policy", (replace(NODE, topology_policy="restricted"), OTHER), True),
]


@pytest.mark.parametrize(("after", "expected"), [(a, e) for _, a, e in ROWS], ids=[n for n, _, _ in ROWS])
def test_grew(after: tuple[Node, ...], expected: bool) -> None:
    assert grew(BEFORE, ClusterView(nodes=after)) is expected


def test_a_first_view_always_grew() -> None:
    assert grew(None, BEFORE) is True


def gang(key: str = "ns/g", cpu: int = 3000, count: int = 2) -> Gang:
    return Gang(key, (PodSet("w", count, Resources(cpu_milli=cpu, memory=1 << 30),
                             numa_policy="single-numa-node"),))


def test_a_refusal_is_handed_out_again_only_while_the_view_has_not_grown() -> None:
    waiting = Waiting()
    big = gang(cpu=5000, count=1)  # 5 CPUs in one zone: no zone has them
    assert waiting.begin(BEFORE) is True
    assert waiting.answer(big) is None
    refused = place(BEFORE, big)
    assert isinstance(refused, Refusal) and refused.kind == "not-now"
    waiting.remember(big, refused)
    waiting.end(BEFORE)

    smaller = ClusterView(nodes=(replace(NODE, zones=zone0(cpu_milli=3000)), OTHER))
    assert waiting.begin(smaller) is False
    assert waiting.answer(big) is refused and waiting.reused == 1
    assert waiting.answer(replace(big, priority=5)) is None  # its object changed: another gang
    waiting.end(smaller)

    larger = ClusterView(nodes=(replace(NODE, zones=zone0(cpu_milli=16000)), OTHER))
    assert waiting.begin(larger) is True
    assert waiting.answer(big) is None  # decided again, and now it fits
    assert not isinstance(place(larger, big), Refusal)


def test_only_not_now_is_kept_and_gangs_not_asked_are_forgotten() -> None:
    waiting = Waiting()
    waiting.begin(BEFORE)
    a, b = gang("ns/a"), gang("ns/b")
    waiting.answer(a)
    waiting.answer(b)
    waiting.remember(a, Refusal("ns/a", "not-now", "busy"))
    waiting.remember(b, Refusal("ns/b", "never", "too big"))
    waiting.end(BEFORE)
    waiting.begin(BEFORE)
    assert waiting.answer(b) is None  # "never" is written once, not remembered
    waiting.end(BEFORE)  # a was not asked this pass (admitted, deleted, gone from the queue)
    waiting.begin(BEFORE)
    assert waiting.answer(a) is None
