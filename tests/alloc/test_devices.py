"""`choose_gpus` / `allocate_with_gpus`: behaviour tables and hypothesis properties.

Machines are synthetic (`agent.alloc.synthetic`): "2x4" is two sockets of one NUMA node each, four
two-thread cores per node (node 0 = CPUs 0-3,8-11; node 1 = 4-7,12-15); "4x2" is four NUMA nodes
(two per socket, distance 12 inside a socket, 32 across) of two two-thread cores.  GPUs are
described by their NUMA nodes, one entry per GPU, indexed and bus-ordered as listed.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from agent.alloc.devices import allocate_with_gpus, choose_gpus
from agent.alloc.exclusive import allocate
from agent.alloc.request import Request
from agent.alloc.synthetic import synthetic_topology
from agent.api.policies import ALLOC_NUMA_POLICIES
from agent.errors import AllocationError
from agent.gpu.model import GPU
from agent.topology.cpuset import CPUSet
from agent.topology.model import Topology
from tests.conftest import examples


@cache
def machine(shape: str) -> Topology:
    return {"2x4": synthetic_topology(2, 1, 1, 4, 2), "4x2": synthetic_topology(2, 2, 1, 2, 2)}[shape]


def make_gpus(nodes: tuple[int, ...]) -> tuple[GPU, ...]:
    """GPU i on NUMA node nodes[i], at bus 0x10 + i; UUIDs "GPU-i"."""
    return tuple(GPU(i, f"GPU-{i}", "NVIDIA H100 80GB HBM3", "NVIDIA-H100-80GB-HBM3", 80 << 30,
                     f"0000:{0x10 + i:02x}:00.0", 0x2330, n, CPUSet(), i, (9, 0), True, None, None)
                 for i, n in enumerate(nodes))


HGX = (0, 0, 0, 0, 1, 1, 1, 1)


def addr(i: int) -> str:
    return f"0000:{0x10 + i:02x}:00.0"


@dataclass(frozen=True)
class Row:
    name: str
    count: int
    want: tuple[int, ...] | str  # GPU indices, or a phrase the AllocationError must hold
    numa: frozenset[int] | None = None  # the expected preferred NUMA nodes
    gpus: tuple[int, ...] = HGX
    held: tuple[int, ...] = ()
    cpus: int = 2
    policy: str = "best-effort"
    smt: str = "any"
    free: str | None = None  # cpulist; None = every CPU
    shape: str = "2x4"


ROWS = [
    Row("one GPU: lowest node, lowest bus", 1, (0,), frozenset({0})),
    Row("a node's worth", 4, (0, 1, 2, 3), frozenset({0})),
    Row("node 0 short by one: node 1 whole", 4, (4, 5, 6, 7), frozenset({1}), held=(0,)),
    Row("best fit: the node left with 3 free, not the one with 4", 3, (1, 2, 3), frozenset({0}),
        held=(0,)),
    Row("best fit across nodes", 2, (4, 5), frozenset({1}), held=(0, 1, 2, 6, 7)),
    Row("two nodes when no one node holds them", 4, (1, 2, 3, 5), frozenset({0, 1}), held=(0, 4)),
    Row("single-numa-node refuses to span", 4, "no NUMA node holds 4 free GPU", held=(0, 4),
        policy="single-numa-node"),
    Row("CPUs only on node 1: its GPU", 1, (4,), frozenset({1}), free="4-7,12-15"),
    Row("CPUs only on node 1: GPUs where they fit, single-numa-node", 2, (4, 5), frozenset({1}),
        free="4-7,12-15", policy="single-numa-node"),
    Row("single-numa-node: GPUs on 0, CPUs on 1 only", 4, "and 2 free CPU", held=(4,),
        free="4-7,12-15", policy="single-numa-node"),
    Row("best-effort: one GPU node beats aligned CPUs", 4, (0, 1, 2, 3), frozenset({0}), held=(4,),
        free="4-7,12-15"),
    Row("restricted: the fewest nodes whose CPUs fit", 4, (0, 1, 2, 3), frozenset({0, 1}), held=(4,),
        free="4-7,12-15", policy="restricted"),
    Row("restricted: no CPUs anywhere near", 1, "restricted: no NUMA nodes", cpus=4, free="0-1",
        policy="restricted"),
    Row("full cores only on node 1", 1, (4,), frozenset({1}), cpus=4, smt="full-cores", free="0-3,4-7,12-15"),
    Row("any thread: node 0 has 4", 1, (0,), frozenset({0}), cpus=4, free="0-3,4-7,12-15"),
    Row("all held", 1, "0 of 8 free", held=tuple(range(8))),
    Row("more than the node has", 9, "8 of 8 free"),
    Row("no GPUs at all", 1, "has no GPUs", gpus=()),
    Row("zero GPUs is no choice", 0, ()),
    Row("no GPU has a known node: any free ones", 2, (1, 2), gpus=(-1, -1, -1), held=(0,),
        policy="single-numa-node"),
    Row("known ones first, then unknown place", 2, (3, 4), frozenset({0}), gpus=(0, 0, 0, 0, -1, -1),
        held=(0, 1, 2)),
    Row("unknown place never serves single-numa-node", 2, "of unknown place", gpus=(0, 0, 0, 0, -1, -1),
        held=(0, 1, 2), policy="single-numa-node"),
    Row("a GPU on a node without CPUs has no known place", 1, (1,), frozenset({1}), gpus=(7, 1)),
    Row("nearest pair of nodes", 4, (0, 1, 2, 3), frozenset({0, 1}), gpus=(0, 0, 1, 1, 2, 2, 3, 3),
        shape="4x2"),
    Row("nearest pair (one socket), not the lowest ids", 4, (2, 3, 4, 5), frozenset({2, 3}),
        gpus=(0, 0, 2, 2, 3, 3), shape="4x2"),
    Row("best fit before distance", 4, (0, 1, 2, 5), frozenset({0, 2}), gpus=(0, 0, 0, 1, 1, 2),
        shape="4x2"),
    Row("held by UUID counts as held", 1, (1,), frozenset({0}), held=(-1,)),
]


def run(row: Row) -> tuple[CPUSet, tuple[int, ...], frozenset[int] | None]:
    topo = machine(row.shape)
    gpus = make_gpus(row.gpus)
    held = {addr(i) for i in row.held if i >= 0} | ({"GPU-0"} if -1 in row.held else set())
    free = CPUSet.parse(row.free) if row.free is not None else topo.cpus
    cpus, chosen = allocate_with_gpus(topo, free, Request(row.cpus, row.policy, row.smt), gpus, held,
                                      row.count)
    return cpus, tuple(g.index for g in chosen.gpus), chosen.numa_nodes


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_table(row: Row) -> None:
    if isinstance(row.want, str):
        with pytest.raises(AllocationError, match=row.want):
            run(row)
        return
    cpus, got, numa = run(row)
    assert got == row.want
    assert numa == row.numa
    topo = machine(row.shape)
    if numa is not None and row.policy in ("single-numa-node", "restricted"):
        assert {topo.numa_of(c) for c in cpus} <= numa  # the CPUs sit with the GPUs
    if numa is not None and row.policy == "best-effort" and len(numa) == 1 and row.free is None:
        assert {topo.numa_of(c) for c in cpus} == set(numa)


def test_cpus_follow_the_gpus_node() -> None:
    topo = machine("2x4")
    cpus, chosen = allocate_with_gpus(topo, topo.cpus, Request(2), make_gpus(HGX), {addr(0), addr(1),
                                      addr(2), addr(3)}, 1)
    assert chosen.numa_nodes == frozenset({1})
    assert {topo.numa_of(c) for c in cpus} == {1}  # without GPUs the allocator would start on node 0
    assert {topo.numa_of(c) for c in allocate(topo, topo.cpus, Request(2))} == {0}


@pytest.mark.parametrize("count", [-1, True, 1.0])
def test_bad_counts(count: object) -> None:
    topo = machine("2x4")
    with pytest.raises(AllocationError):
        choose_gpus(topo, topo.cpus, Request(1), make_gpus(HGX), (), count)  # type: ignore[arg-type]


# --- properties ---------------------------------------------------------------------------------

_layouts = st.lists(st.sampled_from([-1, 0, 1, 2, 3]), min_size=0, max_size=10).map(tuple)


@settings(max_examples=examples(150), deadline=None)
@given(layout=_layouts, held_bits=st.integers(0, 1023), count=st.integers(0, 11),
       policy=st.sampled_from(ALLOC_NUMA_POLICIES), smt=st.sampled_from(["any", "full-cores"]),
       cpus=st.sampled_from([0, 1, 2, 4]), free_bits=st.integers(0, 0xFFFF),
       shape=st.sampled_from(["2x4", "4x2"]))
def test_properties(layout: tuple[int, ...], held_bits: int, count: int, policy: str, smt: str, cpus: int,
                    free_bits: int, shape: str) -> None:
    topo = machine(shape)
    gpus = make_gpus(layout)
    held = {g.pci_address for g in gpus if held_bits >> g.index & 1}
    free = CPUSet.from_mask(free_bits) & topo.cpus
    request = Request(cpus, policy, smt)
    try:
        chosen = choose_gpus(topo, free, request, gpus, held, count)
    except AllocationError:
        event("refused")
        return
    event("chosen")
    again = choose_gpus(topo, free, request, gpus, frozenset(held), count)
    assert again == chosen  # deterministic (and blind to the container type of `held`)
    addresses = [g.pci_address for g in chosen.gpus]
    assert len(addresses) == count == len(set(addresses))  # exactly N, never one twice
    assert not set(addresses) & held  # never a held one
    assert set(chosen.gpus) <= set(gpus)
    assert addresses == sorted(addresses)
    cpu_nodes = {n.id for n in topo.numa_nodes}
    if chosen.numa_nodes is not None:
        placed = {g.numa_node for g in chosen.gpus if g.numa_node in cpu_nodes}
        assert placed <= chosen.numa_nodes
    if policy == "single-numa-node" and any(g.numa_node in cpu_nodes for g in gpus) and count:
        assert chosen.numa_nodes is not None and len(chosen.numa_nodes) == 1
        assert {g.numa_node for g in chosen.gpus} == set(chosen.numa_nodes)
        # ... and the CPUs fit on that node: the allocator, confined there, succeeds.
        got = allocate(topo, free, Request(cpus, policy, smt, chosen.numa_nodes))
        assert {topo.numa_of(c) for c in got} <= chosen.numa_nodes
