"""The Topology Manager's scope: which NUMA nodes one container of a pod may take, given its pod.

Pure: no I/O.  topolet follows the scope its node runs (`topolet agent --numa-scope`): under
`container` (the kubelet's default) each container is aligned on its own (`PodScope` None); under
`pod` the pod's NUMA nodes are chosen once from the sum of its containers' exclusive CPUs
(`pod_affinity`), recorded with its allocations, and every container stays inside them (`within`).
How each policy is confined there: README.md beside this module.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.alloc.exclusive import allocate
from agent.alloc.policies import ALLOC_POLICIES
from agent.alloc.request import Request
from agent.api.policies import Scope
from agent.topology.cpuset import CPUSet
from agent.topology.model import Topology

DEFAULT_SCOPE = Scope.CONTAINER.value  # the kubelet's default topologyManagerScope


@dataclass(frozen=True, slots=True)
class PodScope:
    """The pod scope's word on one container: the pod's NUMA nodes when another container of the pod
    holds them already (`affinity`), else the pod's whole exclusive request to choose them from."""

    whole: Request
    affinity: frozenset[int] | None = None


def pod_affinity(topology: Topology, free: CPUSet, whole: Request) -> frozenset[int]:
    """The NUMA nodes `whole` (the pod's exclusive CPUs) would take from `free` now; raises
    AllocationError when the pod as a whole cannot be placed under its policy."""
    return frozenset(topology.numa_of(c) for c in allocate(topology, free, whole))


def within(topology: Topology, request: Request, affinity: frozenset[int]) -> Request:
    """`request` kept inside the pod's NUMA nodes `affinity` (see README.md beside this module), as its
    policy's row of `agent.alloc.policies` says (`in_pod`)."""
    return ALLOC_POLICIES[request.numa_policy].in_pod(topology, request, affinity)
