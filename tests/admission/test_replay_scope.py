"""The node must agree under the container scope: every pod the engine places, whole in a zone or
split over zones container by container, is pinned by the agent's own allocator where it was counted.

As tests/admission/test_replay.py: real machines (hwloc dumps) partly filled by the agent's allocator,
published with `nrt_object` (policy single-numa-node, scope container) and read back by `build_view`;
random gangs of pods of two or three containers are placed one after another (each committed).
Node by node, every container is then pinned as the agent pins it with `topolet.io/numa-zone` (the
pod's zone, or its own for a split pod: `agent.api.placements.parse_numa_zone`) — single-numa-node inside
that zone — in placement order, reversed and shuffled across pods, and must land there.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest

from agent.admission.cluster.ledger import Ledger
from agent.admission.cluster.view import build_view
from agent.admission.engine.model import Gang, Placement, PodSet, Resources
from agent.admission.engine.place import commit, place
from agent.alloc.exclusive import allocate
from agent.alloc.request import Request
from agent.kube.publish.nrt import nrt_object
from agent.topology.cpuset import CPUSet
from agent.topology.model import Topology
from tests.admission.test_replay import DUMPS, NODES_PER_DUMP, fill, node_obj

GANGS = 60


@pytest.fixture(scope="module")
def machines(dump_root: Callable[[str], Path]) -> list[tuple[str, Topology]]:
    from agent.topology.discover import discover

    return [(name, discover(str(dump_root(name)))) for name in DUMPS]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_every_split_pod_is_pinned_container_by_container(machines: list[tuple[str, Topology]],
                                                          seed: int) -> None:
    rng = random.Random(seed)
    topo_of: dict[str, Topology] = {}
    free_of: dict[str, CPUSet] = {}
    nodes, nrts = [], []
    for dump, topo in machines:
        for k in range(NODES_PER_DUMP):
            name = f"{dump.split('-')[0]}-{k}"
            state = fill(topo, rng, name)
            topo_of[name], free_of[name] = topo, topo.cpus - state.allocated()
            nodes.append(node_obj(name, topo))
            nrts.append(nrt_object((name, f"uid-{name}"), topo, state,
                                   topology_manager_policy="single-numa-node",
                                   topology_manager_scope="container"))
    view, left_out = build_view(nodes, nrts, [], Ledger(), 0.0)
    assert left_out == {}
    assert {n.topology_scope for n in view.nodes} == {"container"}
    largest = max(len(n.cpus) for _, t in machines for n in t.numa_nodes)

    pinned: dict[str, list[tuple[int, int]]] = {}  # node -> (CPUs, zone) of each container
    split = 0
    for g in range(GANGS):
        containers = tuple(rng.randint(1, max(1, largest * 2 // 3)) * 1000 for _ in range(rng.randint(2, 3)))
        ps = PodSet(name="s", count=rng.randint(1, 2),
                    requests=Resources(cpu_milli=sum(containers), memory=1 << 30),
                    numa_policy="single-numa-node", containers=containers)
        gang = Gang(f"ns/g{g}", (ps,))
        result = place(view, gang)
        if not isinstance(result, Placement):
            continue
        view = commit(view, gang, result)
        for p in result.pods:
            split += bool(p.zones)
            assert p.zone is not None or p.zones
            zones = p.zones or (p.zone or 0,) * len(containers)
            pinned.setdefault(p.node, []).extend(zip((c // 1000 for c in containers), zones, strict=True))
    assert split >= 5  # the stream must exercise splits, not just whole-zone pods

    for name, cs in pinned.items():
        topo = topo_of[name]
        zone_cpus = {n.id: n.cpus for n in topo.numa_nodes}
        shuffled = list(cs)
        rng.shuffle(shuffled)
        for order in (cs, cs[::-1], shuffled):
            free = free_of[name]
            for cpus, zone in order:
                got = allocate(topo, free, Request(cpus=cpus, numa_policy="single-numa-node",
                                                   preferred_numa=frozenset({zone})))
                assert got <= zone_cpus[zone], (name, cpus, zone, got)
                free = free - got
