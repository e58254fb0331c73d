"""A gang of identical pods refused by count, without a search (agent/admission/engine/counting.py): the
count is exact (the search places exactly as many), the refusal says the first pod without room, and
a gang of hundreds of pods that is one short is refused at once."""

from __future__ import annotations

import random
import time
from dataclasses import replace

import pytest

from agent.admission.engine.candidates import Work
from agent.admission.engine.counting import countable, room
from agent.admission.engine.model import (
    ClusterView,
    Gang,
    Node,
    Placement,
    PodSet,
    Refusal,
    Resources,
    Taint,
    Zone,
)
from agent.admission.engine.place import place
from agent.admission.engine.viewindex import index_of

GI = 1 << 30


def node(name: str, zones: list[tuple[int, int]], *, cpu: int | None = None, pods: int = 110,
         policy: str = "single-numa-node", taints: tuple[Taint, ...] = ()) -> Node:
    """A node whose zones have (free CPUs, free GiB); its totals the zones' sum unless `cpu` says."""
    zs = tuple(Zone(k, c * 1000, 16000, m * GI) for k, (c, m) in enumerate(zones))
    free = Resources(cpu_milli=(cpu if cpu is not None else sum(c for c, _ in zones)) * 1000,
                     memory=sum(m for _, m in zones) * GI)
    return Node(name, free=free, capacity=Resources(cpu_milli=64000, memory=256 * GI), zones=zs,
                free_pods=pods, topology_policy=policy, taints=taints)


def empty_of(n: Node) -> Node:
    return replace(n, free=n.capacity, free_pods=110,
                   zones=tuple(replace(z, cpu_milli=z.cpu_capacity_milli, memory=64 * GI) for z in n.zones))


def view(*nodes: Node) -> ClusterView:
    return ClusterView(nodes=tuple(nodes), empty=tuple(empty_of(n) for n in nodes))


def gang(count: int, cpus: int, gib: int = 1, policy: str = "single-numa-node") -> Gang:
    return Gang("ns/g", (PodSet("w", count, Resources(cpu_milli=cpus * 1000, memory=gib * GI),
                                numa_policy=policy),))


def most_placed(v: ClusterView, cpus: int, gib: int, policy: str) -> int:
    """The most pods of the kind the search places, by trying every count."""
    best = 0
    for count in range(1, 200):
        if isinstance(place(replace(v, empty=()), _searched(gang(count, cpus, gib, policy))), Placement):
            best = count
        else:
            break
    return best


def _searched(g: Gang) -> Gang:
    """The same pods as two pod sets: not `countable`, so `place` searches."""
    (ps,) = g.pod_sets
    if ps.count == 1:
        return g
    return replace(g, pod_sets=(replace(ps, count=ps.count - 1), replace(ps, name="w2", count=1)))


@pytest.mark.parametrize("seed", range(12))
def test_the_count_is_what_the_search_places(seed: int) -> None:
    rng = random.Random(seed)
    nodes = [node(f"n{i}", [(rng.randint(0, 16), rng.randint(0, 64)) for _ in range(rng.choice((1, 2, 4)))],
                  cpu=rng.choice((None, rng.randint(0, 40))), pods=rng.randint(0, 12),
                  policy=rng.choice(("single-numa-node", "none")))
             for i in range(rng.randint(1, 4))]
    v = view(*nodes)
    cpus, gib = rng.randint(1, 8), rng.randint(1, 16)
    policy = rng.choice(("single-numa-node", "none"))
    counted = countable(gang(2, cpus, gib, policy))
    assert counted is not None
    assert room(Work(index_of(v, v.nodes), (), ()), counted) == most_placed(v, cpus, gib, policy)


def test_one_short_is_refused_at_once_naming_the_first_pod_without_room() -> None:
    nodes = [node(f"n{i}", [(8, 32)] * 4) for i in range(50)]  # 4 zones of 8 CPUs: 200 pods of 8
    v = view(*nodes)
    started = time.perf_counter()
    refused = place(v, gang(201, 8))
    elapsed = time.perf_counter() - started
    assert isinstance(refused, Refusal) and refused.kind == "not-now", refused
    assert refused.reason == ('pod set "w" (pod 201 of 201): pod needs 8 CPUs in one NUMA zone; the free '
                              "zones hold 200 pods of 8 CPUs and 1Gi")
    assert elapsed < 1.0  # a bound on a search of 200 pods, not a benchmark
    assert isinstance(place(v, gang(200, 8)), Placement)


def test_a_gang_the_empty_cluster_cannot_take_either_is_never() -> None:
    v = view(node("n0", [(8, 32)] * 2))
    refused = place(v, gang(9, 8))  # the empty node holds 2 zones of 16: 4 pods of 8
    assert isinstance(refused, Refusal) and refused.kind == "never", refused
    assert refused.reason.endswith("even on the empty cluster")


def test_what_is_not_counted() -> None:
    """Several pod sets, devices, a colocation label, several containers: the search decides."""
    g = gang(3, 2)
    (ps,) = g.pod_sets
    assert countable(g) is ps
    for other in (replace(g, pod_sets=(ps, replace(ps, name="x"))),
                  replace(g, pod_sets=(replace(ps, requests=replace(ps.requests, gpus=1)),)),
                  replace(g, pod_sets=(replace(ps, colocate_label="rack"),)),
                  replace(g, pod_sets=(replace(ps, containers=(1000, 1000)),))):
        assert countable(other) is None


def test_a_taint_keeps_a_node_out_of_the_count() -> None:
    tainted = node("n1", [(8, 32)] * 4, taints=(Taint("dedicated", "x"),))
    v = view(node("n0", [(8, 32)] * 2), tainted)
    counted = countable(gang(3, 8))
    assert counted is not None and room(Work(index_of(v, v.nodes), (), ()), counted) == 2


@pytest.mark.parametrize(("enough", "counted_to"),
                         [(None, 200), (1, 4), (4, 4), (5, 8), (200, 200), (500, 200)])
def test_counting_stops_once_it_has_enough(enough: int | None, counted_to: int) -> None:
    """A gang that fits is told so after the first nodes that hold it: at 65,000 nodes a full count on
    every decision was 0.7 s a gang (bench/admission.py --nodes 65000)."""
    nodes = [node(f"n{i}", [(8, 32)] * 4) for i in range(50)]  # 4 pods of 8 CPUs a node
    v = view(*nodes)
    counted = countable(gang(3, 8))
    assert counted is not None
    assert room(Work(index_of(v, v.nodes), (), ()), counted, enough) == counted_to
