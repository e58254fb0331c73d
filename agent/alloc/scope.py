"""The Topology Manager's scope: which NUMA nodes one container of a pod may take, given its pod.

Pure: no I/O.  The kubelet's `topologyManagerScope` names two rules, and topolet follows the one its
node runs (`topolet agent --numa-scope`, published as the NRT's `topologyManagerScope`):

- `container` (the kubelet's default): each container is aligned on its own; two containers of one
  pod may land on different NUMA nodes.  A container's request is its own (`PodScope` None).
- `pod`: the pod is aligned as a whole.  Its NUMA nodes (`affinity`) are chosen once, from the sum
  of its containers' exclusive CPUs under the pod's policy, as the allocator would place that sum now
  (`pod_affinity`); every container then stays inside them (`within`).  The affinity is recorded with
  each of the pod's allocations, so a restarted agent confines the pod's later containers alike.

`within` keeps a container inside its pod's nodes: `single-numa-node` (one node) and `restricted` are
confined there, the pod's own hint having been the one judged (under `restricted` a container may
span the pod's nodes, as the kubelet's CPU manager does inside a pod hint); `best-effort` prefers them.
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
    """`request` kept inside the pod's NUMA nodes `affinity` (see the module docstring), as its
    policy's row of `agent.alloc.policies` says (`in_pod`)."""
    return ALLOC_POLICIES[request.numa_policy].in_pod(topology, request, affinity)
