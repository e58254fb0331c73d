"""The pod scope's pure parts (`agent.alloc.scope`): the pod's NUMA nodes from its whole request, and a
container kept inside them; table rows on a synthetic 2-node machine (4 single-thread cores per node)."""

from __future__ import annotations

import pytest

from agent.alloc.exclusive import allocate
from agent.alloc.request import Request
from agent.alloc.scope import pod_affinity, within
from agent.alloc.synthetic import synthetic_topology
from agent.errors import AllocationError
from agent.topology.cpuset import CPUSet

TOPO = synthetic_topology(2, 1, 1, 4, 1)  # node 0: CPUs 0-3, node 1: CPUs 4-7
ALL = CPUSet(range(8))

# (free CPUs, the pod's whole request, its NUMA nodes or None for a refusal)
AFFINITY: list[tuple[CPUSet, Request, frozenset[int] | None]] = [
    (ALL, Request(4, "single-numa-node"), frozenset({0})),
    (ALL - CPUSet({0}), Request(4, "single-numa-node"), frozenset({1})),  # node 0 has 3 left
    (ALL - CPUSet({0, 4}), Request(4, "single-numa-node"), None),  # no node holds the pod
    (ALL, Request(6, "single-numa-node"), None),  # the pod is bigger than a node
    (ALL, Request(6, "restricted"), frozenset({0, 1})),  # an idle node needs two as well
    (ALL - CPUSet({0}), Request(4, "restricted"), frozenset({1})),
    (ALL - CPUSet({0, 4}), Request(4, "restricted"), None),  # an idle node would take one
    (ALL - CPUSet({0, 4}), Request(4, "best-effort"), frozenset({0, 1})),
    (ALL, Request(2, "single-numa-node", preferred_numa=frozenset({1})), frozenset({1})),  # its GPUs' node
]


@pytest.mark.parametrize(("free", "whole", "nodes"), AFFINITY)
def test_the_pods_nodes_are_where_its_whole_request_fits_now(free: CPUSet, whole: Request,
                                                              nodes: frozenset[int] | None) -> None:
    if nodes is None:
        with pytest.raises(AllocationError):
            pod_affinity(TOPO, free, whole)
    else:
        assert pod_affinity(TOPO, free, whole) == nodes


# (free CPUs, the container's request, the pod's nodes, the NUMA nodes of its CPUs or None: refused)
WITHIN: list[tuple[CPUSet, Request, frozenset[int], frozenset[int] | None]] = [
    # node 0 is the tighter fit, but the pod is on node 1
    (ALL - CPUSet({0, 1}), Request(2, "single-numa-node"), frozenset({1}), frozenset({1})),
    (ALL - CPUSet({4, 5, 6}), Request(2, "single-numa-node"), frozenset({1}), None),
    # restricted: the pod's hint was judged; inside it a container may span the pod's nodes ...
    (ALL - CPUSet({0, 4, 5}), Request(4, "restricted"), frozenset({0, 1}), frozenset({0, 1})),
    # ... but never leaves them
    (ALL - CPUSet({4, 5}), Request(3, "restricted"), frozenset({1}), None),
    (ALL - CPUSet({4}), Request(3, "restricted"), frozenset({1}), frozenset({1})),
    # best-effort prefers the pod's node among answers of as few nodes
    (ALL - CPUSet({0, 1}), Request(2, "best-effort"), frozenset({1}), frozenset({1})),
    (ALL - CPUSet({4, 5, 6}), Request(2, "best-effort"), frozenset({1}), frozenset({0})),
]


@pytest.mark.parametrize(("free", "request_", "affinity", "nodes"), WITHIN)
def test_a_container_stays_inside_its_pods_nodes(free: CPUSet, request_: Request, affinity: frozenset[int],
                                                 nodes: frozenset[int] | None) -> None:
    inside = within(TOPO, request_, affinity)
    if nodes is None:
        with pytest.raises(AllocationError):
            allocate(TOPO, free, inside)
    else:
        cpus = allocate(TOPO, free, inside)
        assert len(cpus) == request_.cpus
        assert frozenset(TOPO.numa_of(c) for c in cpus) == nodes
