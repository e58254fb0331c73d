"""The allocator's behaviours, one row each, on small synthetic machines whose answers can be reasoned out."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from agent.alloc.exclusive import allocate
from agent.alloc.request import Request
from agent.alloc.synthetic import synthetic_topology
from agent.errors import AllocationError
from agent.topology.cpuset import CPUSet
from agent.topology.model import Topology

# 2 sockets, one NUMA node each, 2 L3 groups of 2 cores x 2 threads; core c is CPUs {c, c+8}.
# node 0: L3 {0,1,8,9} and {2,3,10,11}; node 1: L3 {4,5,12,13} and {6,7,14,15}.
TWO = synthetic_topology(2, 1, 2, 2, 2)
# 2 sockets, two NUMA nodes each, one L3 of 2 cores x 2 threads per node:
# node 0 {0,1,8,9}, node 1 {2,3,10,11} (socket 0); node 2 {4,5,12,13}, node 3 {6,7,14,15} (socket 1).
FOUR = synthetic_topology(2, 2, 1, 2, 2)


def cs(text: str) -> CPUSet:
    return CPUSet.parse(text)


def per_numa(topo: Topology, cpus: CPUSet) -> dict[int, int]:
    counts: dict[int, int] = {}
    for c in cpus:
        counts[topo.numa_of(c)] = counts.get(topo.numa_of(c), 0) + 1
    return counts


def split_cores(topo: Topology, cpus: CPUSet) -> int:
    return sum(1 for core in topo.cores if core.cpus & cpus and not core.cpus <= cpus)


Check = Callable[[Topology, CPUSet], bool]


def exactly(text: str) -> Check:
    return lambda _t, got: got == cs(text)


def within(text: str) -> Check:
    return lambda _t, got: got <= cs(text)


def numa_counts(*counts: int) -> Check:
    return lambda t, got: sorted(per_numa(t, got).values()) == sorted(counts)


def on_nodes(*ids: int) -> Check:
    return lambda t, got: set(per_numa(t, got)) == set(ids)


def one_node(t: Topology, got: CPUSet) -> bool:
    return len(per_numa(t, got)) == 1


def no_split(t: Topology, got: CPUSet) -> bool:
    return split_cores(t, got) == 0


@dataclass
class Row:
    id: str
    topo: Topology
    free: str
    request: dict[str, Any]
    checks: tuple[Check, ...] = ()
    error: tuple[str, ...] = field(default=())  # substrings the AllocationError must contain


ROWS = [
    # single-numa-node
    Row("single-numa-node refuses to span", TWO, "0-15", {"cpus": 10, "numa_policy": "single-numa-node"},
        error=("single-numa-node", "no NUMA node has 10 free", "0=8, 1=8")),
    Row("single-numa-node fits in one node", TWO, "0-15", {"cpus": 6, "numa_policy": "single-numa-node"},
        checks=(one_node, no_split)),
    Row("single-numa-node picks the node that holds it", TWO, "0-2,4-7,12-15",
        {"cpus": 4, "numa_policy": "single-numa-node"}, checks=(exactly("4,5,12,13"),)),
    # best-effort
    Row("best-effort spans when it must, filling one node", TWO, "0-15", {"cpus": 10},
        checks=(numa_counts(8, 2), no_split)),
    Row("best-effort uses one node when one holds it", TWO, "0-2,4-7,12-15", {"cpus": 5},
        checks=(within("4-7,12-15"),)),
    # restricted
    Row("restricted refuses a span an idle machine would not need", TWO, "0,1,8,9,4,5,12,13",
        {"cpus": 6, "numa_policy": "restricted"}, error=("restricted", "fit in 1 NUMA node", "span 2")),
    Row("best-effort takes that span", TWO, "0,1,8,9,4,5,12,13", {"cpus": 6}, checks=(numa_counts(4, 2),)),
    Row("restricted spans when no node could ever hold it", TWO, "0-15",
        {"cpus": 12, "numa_policy": "restricted"}, checks=(numa_counts(8, 4),)),
    # spread
    Row("spread balances over the fewest nodes, on one socket", FOUR, "0-15",
        {"cpus": 8, "numa_policy": "spread"}, checks=(numa_counts(4, 4), within("0-3,8-11"))),
    Row("spread keeps shares even when a node is short", FOUR, "0,1,8,9,2,3,10,11,4,6,7,14,15",
        {"cpus": 6, "numa_policy": "spread"}, checks=(numa_counts(3, 3),)),
    Row("spread over three nodes", FOUR, "0-15", {"cpus": 12, "numa_policy": "spread"},
        checks=(numa_counts(4, 4, 4),)),
    Row("spread uneven request differs by one", FOUR, "0-15", {"cpus": 11, "numa_policy": "spread"},
        checks=(numa_counts(4, 4, 3),)),
    Row("spread in whole cores under full-cores", FOUR, "0-15",
        {"cpus": 4, "numa_policy": "spread", "smt": "full-cores"}, checks=(numa_counts(4), no_split)),
    Row("spread with full-cores splits by cores", FOUR, "0-15",
        {"cpus": 12, "numa_policy": "spread", "smt": "full-cores"}, checks=(numa_counts(4, 4, 4), no_split)),
    # smt
    Row("full-cores refuses a count that is not whole cores", TWO, "0-15", {"cpus": 3, "smt": "full-cores"},
        error=("full-cores", "not a multiple of 2")),
    Row("full-cores never takes a lone thread", TWO, "0-7", {"cpus": 2, "smt": "full-cores"},
        error=("not enough free whole-core CPUs", "requested 2, free 0")),
    Row("full-cores skips part-used cores", TWO, "0,1,8,2,10", {"cpus": 4, "smt": "full-cores"},
        checks=(exactly("0,2,8,10"),)),
    Row("any takes lone threads when no core is whole", TWO, "0-7", {"cpus": 2},
        checks=(lambda _t, got: len(got) == 2,)),
    Row("a whole core before two single threads", TWO, "0,1,8", {"cpus": 2}, checks=(exactly("0,8"),)),
    Row("an odd thread comes from a part-used core", TWO, "0,1,8", {"cpus": 1}, checks=(exactly("1"),)),
    Row("three threads: a whole core and a part-used one, in one L3 group", TWO, "0,8,2,10,3", {"cpus": 3},
        checks=(exactly("2,3,10"), lambda t, got: split_cores(t, got) == 1)),
    Row("the rest of a core goes to the tightest part-used core", TWO, "0,1,8,9,2,3,10", {"cpus": 1},
        checks=(exactly("3"),)),
    # L3 groups and best fit
    Row("one L3 group rather than two", TWO, "0-3,8-11", {"cpus": 4}, checks=(exactly("0,1,8,9"),)),
    Row("fewest L3 groups beats the lower ids", TWO, "0,1,8,2,3,10,11", {"cpus": 4},
        checks=(exactly("2,3,10,11"),)),
    Row("best fit: the fuller L3 group that still holds it", TWO, "0,1,8,9,2,10", {"cpus": 2},
        checks=(exactly("2,10"),)),
    Row("best fit: the fuller NUMA node that still holds it", TWO, "2,3,10,11,4-7,12-15", {"cpus": 4},
        checks=(exactly("2,3,10,11"),)),
    Row("fewest sockets: two nodes of one socket", FOUR, "0-15", {"cpus": 8},
        checks=(exactly("0-3,8-11"),)),
    Row("fewest sockets beats the lower ids", FOUR, "0,1,8,9,2,3,10,4,5,12,13,6,7,14,15", {"cpus": 8},
        checks=(on_nodes(2, 3),)),
    # preferred NUMA nodes (where the GPUs are)
    Row("a preferred node wins a tie", TWO, "0-15", {"cpus": 4, "preferred_numa": frozenset({1})},
        checks=(within("4-7,12-15"),)),
    Row("single-numa-node stays inside the preferred nodes", TWO, "0-3,8-11,4,12",
        {"cpus": 4, "numa_policy": "single-numa-node", "preferred_numa": frozenset({1})},
        error=("single-numa-node", "preferred", "0=8, 1=2")),
    Row("single-numa-node inside a preferred node", TWO, "0-15",
        {"cpus": 8, "numa_policy": "single-numa-node", "preferred_numa": frozenset({1})},
        checks=(exactly("4-7,12-15"),)),
    Row("best-effort leaves a preferred node that cannot hold it", TWO, "0-3,8-11,4,12",
        {"cpus": 4, "preferred_numa": frozenset({1})}, checks=(within("0-3,8-11"),)),
    Row("restricted stays inside the preferred nodes", TWO, "0-3,8-11,4,12",
        {"cpus": 4, "numa_policy": "restricted", "preferred_numa": frozenset({1})},
        error=("not enough free CPUs on the preferred NUMA nodes", "requested 4, free 2")),
    Row("a preferred node without CPUs", TWO, "0-15",
        {"cpus": 1, "numa_policy": "single-numa-node", "preferred_numa": frozenset({7})},
        error=("preferred NUMA nodes [7]", "has CPUs")),
    # reserved CPUs
    Row("reserved CPUs are never handed out", TWO, "0-15", {"cpus": 12, "reserved": CPUSet(range(4))},
        checks=(exactly("4-15"),)),
    Row("reserved CPUs do not count as free", TWO, "0-15", {"cpus": 13, "reserved": CPUSet(range(4))},
        error=("not enough free CPUs", "requested 13, free 12")),
    Row("reserved CPUs shrink their node", TWO, "0-15",
        {"cpus": 8, "numa_policy": "single-numa-node", "reserved": CPUSet([0])},
        checks=(exactly("4-7,12-15"),)),
    # edges
    Row("zero CPUs is the empty set", TWO, "0-15", {"cpus": 0}, checks=(exactly(""),)),
    Row("free CPUs the machine does not have are ignored", TWO, "0-15,100", {"cpus": 16},
        checks=(exactly("0-15"),)),
    Row("and never make up a shortfall", TWO, "0-15,100", {"cpus": 17},
        error=("not enough free CPUs", "requested 17, free 16")),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_allocation_row(row: Row) -> None:
    free = cs(row.free)
    request = Request(**row.request)
    if row.error:
        with pytest.raises(AllocationError) as info:
            allocate(row.topo, free, request)
        for part in row.error:
            assert part in str(info.value)
        return
    got = allocate(row.topo, free, request)
    assert len(got) == request.cpus
    assert got <= free - request.reserved
    for check in row.checks:
        assert check(row.topo, got), f"{row.id}: got {got}"


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"cpus": -1}, "non-negative"),
    ({"cpus": True}, "non-negative"),
    ({"cpus": 1, "numa_policy": "packed"}, "unknown numa_policy 'packed'"),
    ({"cpus": 1, "smt": "half"}, "unknown smt 'half'"),
    ({"cpus": 1, "preferred_numa": frozenset()}, "preferred_numa is empty"),
])
def test_bad_request_is_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(AllocationError, match=message):
        Request(**kwargs)
