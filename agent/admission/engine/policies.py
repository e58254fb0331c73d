"""The admission side's NUMA policy table: one `EnginePolicy` row per policy a pod set may name.

`ENGINE_POLICIES` maps each of `agent.api.policies.POD_SET_NUMA_POLICIES` to its row, as
scheduler-plugins looks a (policy, scope) up once for its filter: whether its pods are counted against
NUMA zones (a node without zones cannot take them: `filters`, `refusals`), whether a pod takes one zone
whole (the zone scan and one-node shortcut of `candidates` and `search`, the zone checks of
`refusals`), its candidate function (`options`: every way one node takes one pod, through the attempt's
`Attempt` methods; the container scope is its own business) and whether `place.commit` chooses a
multi-zone record's zones again.  `engine_policy(name)` looks a row up.  Adding a policy is one row
here and its name in `agent.api.policies`.  Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Protocol

from agent.admission.engine.choice import Choice
from agent.admission.engine.model import PodSet
from agent.admission.engine.viewindex import NodeState
from agent.api.policies import NumaPolicy

GPUScore = tuple[float, int | None]  # a node's GPU score and the shared GPU it would give (None: whole)


class Attempt(Protocol):
    """What a policy's candidate function asks of one placement attempt (`candidates.Work`): for a pod
    of `ps` on node `i` in state `s`, with its PreferNoSchedule penalty `soft` and GPU score `gpu`."""

    def splits(self, ps: PodSet, i: int) -> bool: ...

    def zone_choices(self, ps: PodSet, i: int, s: NodeState, soft: int, gpu: GPUScore) -> list[Choice]: ...

    def container_scope(self, ps: PodSet, i: int, s: NodeState, soft: int,
                        gpu: GPUScore) -> list[Choice]: ...

    def restricted(self, ps: PodSet, i: int, s: NodeState, soft: int, gpu: GPUScore) -> Choice | None: ...

    def node_choice(self, ps: PodSet, i: int, s: NodeState, soft: int, gpu: GPUScore) -> Choice: ...


Options = Callable[[Attempt, PodSet, int, NodeState, int, GPUScore], list[Choice]]


@dataclass(frozen=True, slots=True)
class EnginePolicy:
    """How the engine places a pod of one NUMA policy.

    zoned: counted against the node's NUMA zones (its CPU and memory too when `cpu_aligned`);
    one_zone: the pod whole in one zone (each container in one where the container scope splits it);
    options: every way one node takes one pod (at most one per zone);
    recount_zones: a placement record without a zone is counted again on the zones `options` chooses.
    """

    zoned: bool
    one_zone: bool
    options: Options
    recount_zones: bool = False


def _one_zone(work: Attempt, ps: PodSet, i: int, s: NodeState, soft: int, gpu: GPUScore) -> list[Choice]:
    """Each zone that holds the pod; on a node that may split it (`Attempt.splits`), one zone that holds
    it whole, else its containers over zones."""
    if work.splits(ps, i):
        return work.container_scope(ps, i, s, soft, gpu)
    return work.zone_choices(ps, i, s, soft, gpu)


def _fewest_zones(work: Attempt, ps: PodSet, i: int, s: NodeState, soft: int,
                  gpu: GPUScore) -> list[Choice]:
    """The fewest zones an empty node would need, tightest first (kubelet's "preferred" hint)."""
    choice = work.restricted(ps, i, s, soft, gpu)
    return [choice] if choice is not None else []


def _node_totals(work: Attempt, ps: PodSet, i: int, s: NodeState, soft: int,
                 gpu: GPUScore) -> list[Choice]:
    """The node's totals, no zone."""
    return [work.node_choice(ps, i, s, soft, gpu)]


_NODE_TOTALS = EnginePolicy(zoned=False, one_zone=False, options=_node_totals)

ENGINE_POLICIES: Mapping[str, EnginePolicy] = MappingProxyType({
    NumaPolicy.SINGLE_NUMA_NODE: EnginePolicy(zoned=True, one_zone=True, options=_one_zone),
    NumaPolicy.RESTRICTED: EnginePolicy(zoned=True, one_zone=False, options=_fewest_zones,
                                        recount_zones=True),
    NumaPolicy.BEST_EFFORT: _NODE_TOTALS,
    NumaPolicy.NONE: _NODE_TOTALS,
})


def engine_policy(name: str) -> EnginePolicy:
    """The row of policy `name`; a name the engine does not know (and `model.NODE_POLICY` before a node
    resolves it, `PodSet.policy_on`) places on node totals, as `none` does."""
    return ENGINE_POLICIES.get(name, _NODE_TOTALS)
