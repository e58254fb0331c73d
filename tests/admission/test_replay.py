"""The node must agree: every single-numa-node placement replays through the agent's own allocator.

Nodes are real machines (hwloc dumps read by `agent.topology.discover`), partly filled by the agent's
allocator, published with `agent.kube.publish.nrt.nrt_object` and read back by `build_view`.  Random gangs
are placed one after another (each committed to the view); then, node by node, every pod placed
there is pinned with `agent.alloc.allocate(..., Request(numa_policy="single-numa-node",
preferred_numa={zone}))` — what the agent does with the `topolet.io/numa-zone` annotation — in
placement order, in reverse and shuffled, and must land in the zone the engine counted on.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agent.admission.cluster.ledger import Ledger
from agent.admission.cluster.view import build_view
from agent.admission.engine.model import Gang, Placement, PodSet, Resources
from agent.admission.engine.place import commit, place
from agent.alloc.exclusive import allocate
from agent.alloc.request import Request
from agent.enforce.state import Allocation, Owner, State
from agent.errors import AllocationError
from agent.kube.publish.nrt import nrt_object
from agent.topology.cpuset import EMPTY, CPUSet
from agent.topology.model import Topology

DUMPS = ("64fake-4n2s2ca2c2t", "40intel64-4n10c+pci-conflicts", "16amd64-4n4c-cgroup-distance-merge")
NODES_PER_DUMP = 4
GANGS = 80


@pytest.fixture(scope="module")
def machines(dump_root: Callable[[str], Path]) -> list[tuple[str, Topology]]:
    from agent.topology.discover import discover

    return [(name, discover(str(dump_root(name)))) for name in DUMPS]


def fill(topo: Topology, rng: random.Random, tag: str) -> State:
    """Up to half the CPUs held by allocations of mixed policies, as a busy node has them."""
    free = topo.cpus
    allocations = []
    for k in range(rng.randint(0, 6)):
        n = rng.randint(1, max(1, len(topo.cpus) // 8))
        policy = rng.choice(["single-numa-node", "best-effort"])
        try:
            got = allocate(topo, free, Request(cpus=n, numa_policy=policy))
        except AllocationError:
            continue
        if len(topo.cpus) - len(free - got) > len(topo.cpus) // 2:
            break
        aid = f"{tag}-{k}"
        allocations.append(Allocation(id=aid, cpus=got, mems=EMPTY, cgroup=f"topolet/{aid}",
                                      owner=Owner(pod_uid=f"uid-{aid}", container="main"), policy=policy,
                                      created_at=0.0))
        free = free - got
    return State(allocations=tuple(allocations))


def node_obj(name: str, topo: Topology) -> dict[str, Any]:
    return {"metadata": {"name": name, "uid": f"uid-{name}"},
            "status": {"allocatable": {"cpu": str(len(topo.cpus)), "memory": "1Ti", "pods": "110"}}}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_every_single_numa_placement_pins_in_its_zone(machines: list[tuple[str, Topology]],
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
                                   topology_manager_policy="single-numa-node"))
    view, left_out = build_view(nodes, nrts, [], Ledger(), 0.0)
    assert left_out == {}
    largest = max(len(n.cpus) for _, t in machines for n in t.numa_nodes)

    pinned: dict[str, list[tuple[int, int]]] = {}  # node -> (CPUs, zone) in placement order
    placed = 0
    for g in range(GANGS):
        sets = tuple(PodSet(name=f"s{k}", count=rng.randint(1, 4),
                            requests=Resources(cpu_milli=rng.randint(1, largest // 2) * 1000, memory=1 << 30),
                            numa_policy="single-numa-node")
                     for k in range(rng.randint(1, 2)))
        gang = Gang(f"ns/g{g}", sets)
        result = place(view, gang)
        if not isinstance(result, Placement):
            continue
        placed += 1
        view = commit(view, gang, result)
        sizes = {ps.name: ps.requests.cpu_milli // 1000 for ps in sets}
        for p in result.pods:
            assert p.zone is not None
            pinned.setdefault(p.node, []).append((sizes[p.pod_set], p.zone))
    assert placed >= 10  # the stream must exercise the engine until the cluster is full, not just be refused

    for name, pods in pinned.items():
        topo = topo_of[name]
        zone_cpus = {n.id: n.cpus for n in topo.numa_nodes}
        shuffled = list(pods)
        rng.shuffle(shuffled)
        for order in (pods, pods[::-1], shuffled):
            free = free_of[name]
            for cpus, zone in order:
                got = allocate(topo, free, Request(cpus=cpus, numa_policy="single-numa-node",
                                                   preferred_numa=frozenset({zone})))
                assert got <= zone_cpus[zone], (name, cpus, zone, got)
                free = free - got
