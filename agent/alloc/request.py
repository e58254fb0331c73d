"""`Request`: what an exclusive CPU allocation asks for, validated on construction."""

from __future__ import annotations

from dataclasses import dataclass, field

from agent.api.policies import ALLOC_NUMA_POLICIES, DEFAULT_SMT, SMT_POLICIES, NumaPolicy
from agent.errors import AllocationError
from agent.topology.cpuset import EMPTY, CPUSet


@dataclass(frozen=True, slots=True)
class Request:
    """An exclusive CPU request: how many CPUs, under which NUMA and SMT policy.

    numa_policy (one of ALLOC_NUMA_POLICIES, each a row of `agent.alloc.policies`):
      single-numa-node  one NUMA node or a refusal;
      restricted        the fewest nodes that hold it now, refused when an idle machine (less the
                        reserved CPUs) would need fewer (kubelet topology manager's "preferred" hint);
      best-effort       the fewest nodes that hold it now, however many that is;
      spread            even shares over the fewest nodes that can each take an equal share
                        (kubelet's distribute-cpus-across-numa), in whole cores under full-cores.
    smt: full-cores never splits a core (the count must be a multiple of threads per core); any may.
    preferred_numa: the nodes to favour (the pod's GPUs); single-numa-node and restricted must stay
    inside them, best-effort and spread prefer them among answers of equal NUMA count.
    reserved: CPUs never handed out, whatever the free set says.
    """

    cpus: int
    numa_policy: str = NumaPolicy.BEST_EFFORT.value
    smt: str = DEFAULT_SMT
    preferred_numa: frozenset[int] | None = None
    reserved: CPUSet = field(default=EMPTY)

    def __post_init__(self) -> None:
        # bool is an int subclass; `cpus=True` is a caller bug, not a request for one CPU.
        if not isinstance(self.cpus, int) or isinstance(self.cpus, bool) or self.cpus < 0:
            raise AllocationError(f"cpus must be a non-negative integer, got {self.cpus!r}")
        if self.numa_policy not in ALLOC_NUMA_POLICIES:
            raise AllocationError(
                f"unknown numa_policy {self.numa_policy!r}; expected one of {', '.join(ALLOC_NUMA_POLICIES)}")
        if self.smt not in SMT_POLICIES:
            raise AllocationError(f"unknown smt {self.smt!r}; expected one of {', '.join(SMT_POLICIES)}")
        if self.preferred_numa is not None and not self.preferred_numa:
            raise AllocationError("preferred_numa is empty; give at least one NUMA node or leave it unset")
