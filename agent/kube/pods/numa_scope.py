"""One pod container's exclusive CPU request under the node's Topology Manager scope: pure.

`container` scope: the container's own request; `pod` scope (`agent.alloc.scope`): the same, kept
inside the pod's NUMA nodes (those its allocations hold, else chosen from its whole exclusive
request).  Every route builds its request here, through `PodPinner` (README.md, "Topology Manager
scope").
"""

from __future__ import annotations

from collections.abc import Iterable

from agent.alloc.request import Request
from agent.alloc.scope import PodScope
from agent.api.podplan import ContainerPlan, PodPlan
from agent.api.policies import Scope
from agent.enforce.state import Allocation
from agent.topology.model import Topology


def pod_exclusive_cpus(plan: PodPlan) -> int:
    """The exclusive CPUs of every regular container of the pod's spec (running or not)."""
    return sum(c.cpus for c in (*plan.containers, *plan.waiting) if c.exclusive)


def scoped_request(scope: str, topology: Topology, plan: PodPlan, c: ContainerPlan,
                   near: frozenset[int] | None, pod_near: frozenset[int] | None,
                   held: Iterable[Allocation]) -> tuple[Request, PodScope | None]:
    """Container `c`'s request and, under the pod scope, what confines it (see the module docstring).

    `near`: the nodes the container should prefer (its zone, or its GPUs'); `pod_near`: the same for
    the whole pod; `held`: the pod's allocations now.  Raises AllocationError on an invalid request.
    """
    request = Request(c.cpus, c.numa_policy, c.smt, near)
    zones = {x.numa_zone for x in (*plan.containers, *plan.waiting) if x.exclusive}
    if scope != Scope.POD or len(zones) > 1:  # the controller split the pod: each container in its zone
        return request, None
    others = [a for a in held if a.owner.pod_uid == plan.uid and a.owner.container != c.name]
    recorded = next((frozenset(a.affinity) for a in others if a.affinity), None)
    if recorded is None and others:
        recorded = frozenset(topology.numa_of(cpu) for a in others for cpu in a.cpus)
    whole = Request(max(pod_exclusive_cpus(plan), c.cpus), c.numa_policy, c.smt,
                    near if c.numa_zone is not None else pod_near)
    return request, PodScope(whole, recorded)
