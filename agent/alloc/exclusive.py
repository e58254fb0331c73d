"""`allocate`: exclusive, topology-aligned CPUs for one request; a pure function of its inputs.

The request's NUMA policy (its row of `agent.alloc.policies`) says which NUMA nodes it may use and
how it lies over them (`agent.alloc.layouts`: packed into the fewest, or spread); `agent.alloc.pool`
takes the CPUs inside the chosen nodes.  Exhaustive search on small machines finds nothing better
(tests/alloc/test_properties.py).
"""

from __future__ import annotations

from agent.alloc.index import TopologyIndex, index_of
from agent.alloc.policies import ALLOC_POLICIES
from agent.alloc.pool import Pool
from agent.alloc.request import Request
from agent.errors import AllocationError
from agent.topology.cpuset import EMPTY, CPUSet
from agent.topology.model import Topology


def allocate(topology: Topology, free: CPUSet, request: Request) -> CPUSet:
    """Choose `request.cpus` CPUs from `free` (less `request.reserved`) under the request's policies.

    Raises AllocationError naming the constraint that failed and what was free.
    """
    ix = index_of(topology)
    n = request.cpus
    full_cores = request.smt == "full-cores"
    tpc = ix.threads_per_core
    if full_cores and n % tpc:
        raise AllocationError(
            f"smt=full-cores: {n} CPUs is not a multiple of {tpc} threads per core")
    if n == 0:
        return EMPTY
    pool = Pool(ix, free.mask & ~request.reserved.mask & ix.cpus_mask, full_cores)
    policy = ALLOC_POLICIES[request.numa_policy]
    allowed = _allowed_nodes(ix, request, policy.strict)
    unit = "whole-core CPUs" if full_cores else "CPUs"
    total = sum(pool.numa_free[i] for i in allowed)
    if total < n:
        where = " on the preferred NUMA nodes" if len(allowed) < len(ix.numa_ids) else ""
        raise AllocationError(f"{request.numa_policy}: not enough free {unit}{where}: "
                              f"requested {n}, free {total} ({pool.describe()})")
    return CPUSet.from_mask(policy.layout(pool, request, allowed))


def _allowed_nodes(ix: TopologyIndex, request: Request, strict: bool) -> list[int]:
    """NUMA positions the answer may use: the preferred ones under a strict policy, else all."""
    everything = list(range(len(ix.numa_ids)))
    if request.preferred_numa is None or not strict:
        return everything
    inside = [i for i in everything if ix.numa_ids[i] in request.preferred_numa]
    if not inside:
        raise AllocationError(
            f"{request.numa_policy}: none of the preferred NUMA nodes "
            f"{sorted(request.preferred_numa)} has CPUs (NUMA nodes with CPUs: {list(ix.numa_ids)})")
    return inside
