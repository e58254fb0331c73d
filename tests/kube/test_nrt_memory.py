"""Per-zone memory and hugepages accounted per pod in the NRT (agent.kube.publish.nrt_build.zone_memory_held
and nrt_object's `memory_held`): tables over a hand-made machine, no cluster."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from agent.api.podplan import plan_pod
from agent.enforce.state import Allocation, Owner, State
from agent.errors import ConfigError
from agent.kube.publish.nrt import nrt_object
from agent.kube.publish.nrt_build import build_nrt, zone_memory_held
from agent.topology.cpuset import EMPTY, CPUSet
from tests.kube.test_nrt import TWO_SOCKETS_AND_CXL, machine, resources, zones_by_name
from tests.kube.test_pods import g, pod

GiB, MiB = 1 << 30, 1 << 20

# Three CPU nodes (0-3, 4-7, 8-11), 16 GiB each, node 1 with a 2 MiB pool of 1 GiB.
THREE = machine([([0, 1, 2, 3], 16 * GiB, []), ([4, 5, 6, 7], 16 * GiB, [(2 * MiB, 512)]),
                 ([8, 9, 10, 11], 16 * GiB, [])])


def bound(alloc_id: str, cpus: Sequence[int], mems: Sequence[int] | None = None) -> Allocation:
    """An allocation; `mems` None: bound to its CPUs' nodes on THREE, () = not bound."""
    if mems is None:
        mems = sorted({c // 4 for c in cpus})
    return Allocation(alloc_id, CPUSet(cpus), CPUSet(mems) if mems else EMPTY, f"kubepods/{alloc_id}",
                      Owner(pod_uid=f"uid-{alloc_id}", container="c"), "single-numa-node/any", 0.0)


# (allocations, {allocation id: requests}, {numa: {resource: bytes held}})
ROWS: list[tuple[str, tuple[Allocation, ...], dict[str, tuple[tuple[str, int], ...]],
                 dict[int, dict[str, int]]]] = [
    ("one zone", (bound("a", [0, 1]),), {"a": (("memory", 4 * GiB),)}, {0: {"memory": 4 * GiB}}),
    ("not bound: nothing held", (bound("a", [0, 1], ()),), {"a": (("memory", 4 * GiB),)}, {}),
    ("no requests known", (bound("a", [0, 1]),), {}, {}),
    ("two pods on one zone add up", (bound("a", [0]), bound("b", [1])),
     {"a": (("memory", GiB),), "b": (("memory", 2 * GiB),)}, {0: {"memory": 3 * GiB}}),
    ("hugepages on their zone", (bound("a", [4, 5]),),
     {"a": (("hugepages-2Mi", 256 * MiB), ("memory", GiB))},
     {1: {"hugepages-2Mi": 256 * MiB, "memory": GiB}}),
    ("split by CPUs: 3 on node 0, 1 on node 1", (bound("a", [1, 2, 3, 4]),),
     {"a": (("memory", 4 * GiB),)}, {0: {"memory": 3 * GiB}, 1: {"memory": GiB}}),
    ("even split, remainder to the lowest id", (bound("a", [2, 3, 4, 5]),),
     {"a": (("memory", 3),)}, {0: {"memory": 2}, 1: {"memory": 1}}),
    ("uneven split, remainder to the zone with most CPUs", (bound("a", [3, 4, 5]),),
     {"a": (("memory", 4),)}, {0: {"memory": 1}, 1: {"memory": 3}}),
    ("three zones", (bound("a", [3, 7, 11]),), {"a": (("memory", 3 * GiB),)},
     {0: {"memory": GiB}, 1: {"memory": GiB}, 2: {"memory": GiB}}),
    ("mems without the CPUs' nodes: even split", (bound("a", [0], [1, 2]),), {"a": (("memory", 2 * GiB),)},
     {1: {"memory": GiB}, 2: {"memory": GiB}}),
]


@pytest.mark.parametrize(("allocs", "requests", "want"), [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_zone_memory_held(allocs: tuple[Allocation, ...], requests: dict[str, tuple[tuple[str, int], ...]],
                          want: dict[int, dict[str, int]]) -> None:
    held = zone_memory_held(THREE, State(allocs), requests)
    assert held == want
    for a in allocs:  # nothing is lost or invented by the split
        for res, amount in requests.get(a.id, ()):
            if a.mems:
                assert sum(z.get(res, 0) for z in held.values()) >= amount


def test_available_memory_and_hugepages_less_what_bound_pods_hold() -> None:
    state = State((bound("a", [4, 5]), bound("b", [0], ())))
    obj = build_nrt(("n", "u"), THREE, state, (), memory={
        "a": (("hugepages-2Mi", 256 * MiB), ("memory", 2 * GiB)), "b": (("memory", 8 * GiB),)})
    zones = zones_by_name(obj)
    assert resources(zones["node-1"]) == {
        "cpu": ("4", "4", "2"),
        "memory": (str(16 * GiB), str(15 * GiB), str(13 * GiB)),
        "hugepages-2Mi": (str(GiB), str(GiB), str(768 * MiB)),
    }
    # b is not memory-bound: its 8 GiB are charged to no zone.
    assert resources(zones["node-0"])["memory"] == (str(16 * GiB),) * 3


def test_more_held_than_the_zone_has_reads_zero_not_negative() -> None:
    obj = nrt_object(("n", "u"), TWO_SOCKETS_AND_CXL, State(), memory_held={1: {"memory": 100 * GiB}})
    assert resources(zones_by_name(obj)["node-1"])["memory"] == (str(64 * GiB), str(64 * GiB), "0")


def test_negative_amounts_are_refused() -> None:
    with pytest.raises(ConfigError):
        nrt_object(("n", "u"), TWO_SOCKETS_AND_CXL, State(), memory_held={0: {"memory": -1}})


@pytest.mark.parametrize(("resources_", "want"), [
    ({"cpu": "2", "memory": "1Gi"}, (("memory", GiB),)),
    ({"cpu": "2", "memory": "1Gi", "hugepages-1Gi": "2Gi"}, (("hugepages-1Gi", 2 * GiB), ("memory", GiB))),
    ({"cpu": "2", "memory": "1500M"}, (("memory", 1_500_000_000),)),
    ({"cpu": "2", "memory": "0.5"}, (("memory", 1),)),  # a fraction of a byte rounds up
    ({"cpu": "2"}, ()),
    ({"cpu": "2", "memory": "lots"}, ()),
])
def test_pod_memory_requests_are_read(resources_: dict[str, str], want: tuple[tuple[str, int], ...]) -> None:
    spec = {"name": "c", "resources": {"requests": dict(resources_), "limits": dict(resources_)}}
    (c,) = plan_pod(pod([spec], qos="Guaranteed")).containers
    assert c.memory == want
    assert plan_pod(pod([g()])).containers[0].memory == (("memory", GiB),)
