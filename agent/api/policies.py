"""NUMA policy and Topology Manager names, one spelling for the whole tree.

Public API:
- `NumaPolicy` (a StrEnum: `SINGLE_NUMA_NODE`, `RESTRICTED`, `BEST_EFFORT`, `NONE`, `SPREAD`) and the
  tuples of values each reader accepts: `ANNOTATION_NUMA_POLICIES` (`topolet.io/numa-policy`),
  `ALLOC_NUMA_POLICIES` (the allocator's, with `spread`), `POD_SET_NUMA_POLICIES` (the admission
  engine's, the kubelet's names with `none`), `TOPOLOGY_MANAGER_POLICIES` (kubelet's
  `topologyManagerPolicy`, in kubelet's order); `DEFAULT_NUMA_POLICY`.
- `Scope` (`CONTAINER`, `POD`) and `TOPOLOGY_MANAGER_SCOPES` (kubelet's `topologyManagerScope`).
- `SMT_POLICIES` (`topolet.io/smt` and the allocator: `full-cores`, `any`) and `DEFAULT_SMT`.
"""

from __future__ import annotations

from enum import StrEnum


class NumaPolicy(StrEnum):
    """A NUMA policy's name (the kubelet Topology Manager's, and topolet's `spread`)."""

    SINGLE_NUMA_NODE = "single-numa-node"
    RESTRICTED = "restricted"
    BEST_EFFORT = "best-effort"
    NONE = "none"
    SPREAD = "spread"


class Scope(StrEnum):
    """A Topology Manager scope's name."""

    CONTAINER = "container"
    POD = "pod"


_S, _R, _B = NumaPolicy.SINGLE_NUMA_NODE.value, NumaPolicy.RESTRICTED.value, NumaPolicy.BEST_EFFORT.value
ANNOTATION_NUMA_POLICIES: tuple[str, ...] = (_S, _R, _B)
ALLOC_NUMA_POLICIES: tuple[str, ...] = (_S, _R, _B, NumaPolicy.SPREAD.value)
POD_SET_NUMA_POLICIES: tuple[str, ...] = (_S, _R, _B, NumaPolicy.NONE.value)
TOPOLOGY_MANAGER_POLICIES: tuple[str, ...] = (NumaPolicy.NONE.value, _B, _R, _S)
TOPOLOGY_MANAGER_SCOPES: tuple[str, ...] = (Scope.CONTAINER.value, Scope.POD.value)
DEFAULT_NUMA_POLICY = _B
SMT_POLICIES: tuple[str, ...] = ("full-cores", "any")
DEFAULT_SMT = "any"
