"""The node side's NUMA policy table: one `AllocPolicy` row per policy the allocator accepts.

`ALLOC_POLICIES` maps each of `agent.api.policies.ALLOC_NUMA_POLICIES` to its row, as the kubelet CPU
manager has one `Policy` per name: the layout that takes its CPUs (`layouts.packed` with the node
count it allows, or `layouts.spread`), whether it is confined to its preferred NUMA nodes, whether its
GPUs must share one node with its CPUs (`devices`), and how the pod scope keeps one of its containers
inside the pod's nodes (`scope.within`).  Adding a policy is one row here and its name in
`agent.api.policies`.  Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from functools import partial
from types import MappingProxyType

from agent.alloc.index import TopologyIndex
from agent.alloc.layouts import packed, spread
from agent.alloc.pool import Pool, fewest
from agent.alloc.request import Request
from agent.api.policies import NumaPolicy
from agent.errors import AllocationError
from agent.topology.cpuset import CPUSet
from agent.topology.model import Topology


@dataclass(frozen=True, slots=True)
class AllocPolicy:
    """What one NUMA policy asks of the allocator.

    layout: the CPUs (a mask) for a request from the allowed NUMA positions of a pool;
    strict: answers stay inside `Request.preferred_numa` (else they only prefer it), and a GPU node
    set must hold the request's CPUs too; one_node: GPUs and CPUs from one NUMA node or a refusal;
    in_pod: the request of one container kept inside its pod's NUMA nodes (the pod scope).
    """

    layout: Callable[[Pool, Request, list[int]], int]
    strict: bool
    one_node: bool
    in_pod: Callable[[Topology, Request, frozenset[int]], Request]


def _one_node(pool: Pool, request: Request, allowed: list[int], k: int) -> None:
    """One NUMA node or a refusal."""
    if k > 1:
        where = " among the preferred NUMA nodes" if request.preferred_numa is not None else ""
        raise AllocationError(
            f"{request.numa_policy}: no NUMA node{where} has {request.cpus} free "
            f"{'whole-core CPUs' if pool.full_cores else 'CPUs'} ({pool.describe()})")


def _as_few_as_idle(pool: Pool, request: Request, allowed: list[int], k: int) -> None:
    """No more nodes than an idle machine (less the reserved CPUs) would need: the kubelet topology
    manager's "preferred" hint."""
    n = request.cpus
    k_cap = fewest(_capacity(pool.ix, request, allowed), n)
    if k > k_cap:
        raise AllocationError(
            f"{request.numa_policy}: {n} CPUs fit in {k_cap} NUMA node(s) of this machine but would now "
            f"span {k} ({pool.describe()})")


def _capacity(ix: TopologyIndex, request: Request, allowed: list[int]) -> list[int]:
    """What each allowed NUMA node could hold for this request on an idle machine (less reserved)."""
    reserved = request.reserved.mask
    if request.smt != "full-cores":
        return [(ix.numa_masks[i] & ~reserved).bit_count() for i in allowed]
    out = []
    for i in allowed:
        total = 0
        for c in ix.numa_cells[i]:
            for j in ix.cell_cores[c]:
                if not ix.core_masks[j] & reserved:
                    total += ix.core_sizes[j]
        out.append(total)
    return out


def _prefer_pod_nodes(topology: Topology, request: Request, affinity: frozenset[int]) -> Request:
    """The pod's nodes preferred (a strict policy is thereby confined to them)."""
    return replace(request, preferred_numa=affinity)


def _confine_to_pod_nodes(topology: Topology, request: Request, affinity: frozenset[int]) -> Request:
    """The pod's hint was judged already: inside it the container takes the fewest nodes that hold it
    now (as the kubelet's CPU manager does inside a pod hint), every CPU outside held back."""
    outside = CPUSet(c for n in topology.numa_nodes if n.id not in affinity for c in n.cpus)
    return replace(request, numa_policy=NumaPolicy.BEST_EFFORT.value, preferred_numa=affinity,
                   reserved=request.reserved | outside)


ALLOC_POLICIES: Mapping[str, AllocPolicy] = MappingProxyType({
    NumaPolicy.SINGLE_NUMA_NODE: AllocPolicy(partial(packed, limit=_one_node), strict=True, one_node=True,
                                             in_pod=_prefer_pod_nodes),
    NumaPolicy.RESTRICTED: AllocPolicy(partial(packed, limit=_as_few_as_idle), strict=True, one_node=False,
                                       in_pod=_confine_to_pod_nodes),
    NumaPolicy.BEST_EFFORT: AllocPolicy(packed, strict=False, one_node=False, in_pod=_prefer_pod_nodes),
    NumaPolicy.SPREAD: AllocPolicy(spread, strict=False, one_node=False, in_pod=_prefer_pod_nodes),
})
