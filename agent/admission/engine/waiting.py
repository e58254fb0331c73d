"""Waiting gangs are decided again only when the cluster could take more than when they were refused.

Pure: no I/O.  `grew(before, after) -> bool`; `Waiting` (`.begin(view)`, `.answer(gang)`,
`.remember(gang, refusal)`, `.end(view)`).

A gang refused "not now" on a view does not fit a view with no more free anywhere: every node it
could use is one it could use before, with no more free in it, its zones or its GPUs.  So a pass
whose view did not grow since the last pass ended (`grew`) hands each waiting gang the refusal it
got then, unchanged, instead of searching again: with hundreds of gangs waiting, a pass costs the
view and a lookup per gang, and a gang that fits (new, or one whose own object changed: another
`Gang`) is decided at once.  The view grows on a release (a gang finished, a ledger entry timed
out), a new or changed node, or an NRT that shows more free; then every waiting gang is decided
again.  A remembered refusal's reason names the figures of the view it was decided on, which had at
least as much free as now.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from agent.admission.engine.model import ClusterView, Gang, Node, Refusal, Resources, Zone


def _more_of(a: Mapping[str, int], b: Mapping[str, int]) -> bool:
    return any(v > b.get(k, 0) for k, v in a.items())


def _more(a: Resources, b: Resources) -> bool:
    """Whether `a` has more of anything than `b`."""
    return (a.cpu_milli > b.cpu_milli or a.memory > b.memory or a.gpus > b.gpus or a.gpu_milli > b.gpu_milli
            or _more_of(a.hugepages, b.hugepages) or _more_of(a.mig, b.mig) or _more_of(a.devices, b.devices))


def _zone_more(a: Zone, b: Zone) -> bool:
    return (a.numa != b.numa or a.cpu_capacity_milli != b.cpu_capacity_milli or a.l3_cpus != b.l3_cpus
            or a.cpu_milli > b.cpu_milli or a.memory > b.memory or a.gpus > b.gpus
            or _more_of(a.hugepages, b.hugepages) or _more_of(a.mig, b.mig) or _more_of(a.devices, b.devices))


def _node_grew(a: Node, b: Node) -> bool:
    """Whether node `a` (now) could take something `b` (before) could not."""
    if (a.labels != b.labels or a.taints != b.taints or a.unschedulable != b.unschedulable
            or a.capacity != b.capacity or a.gpu_model != b.gpu_model
            or a.topology_policy != b.topology_policy or a.topology_scope != b.topology_scope
            or len(a.zones) != len(b.zones)
            or len(a.gpu_free_milli) != len(b.gpu_free_milli)):
        return True  # not the same node in what it accepts: decide again
    return (a.free_pods > b.free_pods or _more(a.free, b.free)
            or any(x > y for x, y in zip(a.gpu_free_milli, b.gpu_free_milli, strict=True))
            or any(_zone_more(x, y) for x, y in zip(a.zones, b.zones, strict=True)))


def grew(before: ClusterView | None, after: ClusterView) -> bool:
    """Whether `after` could take something `before` could not: a node new or changed in what it
    accepts, or more free on one (its totals, a zone, a GPU, its pod count).  Nodes gone never grow it."""
    if before is None:
        return True
    if before.gpu_mix != after.gpu_mix or before.gpu_mix_models != after.gpu_mix_models:
        return True
    old = {n.name: n for n in before.nodes}
    for node in after.nodes:
        was = old.get(node.name)
        if was is None or (node is not was and node != was and _node_grew(node, was)):
            return True
    return False


@dataclass
class Waiting:
    """The "not now" refusals of the gangs still waiting, valid while the view has not grown."""

    _refused: dict[str, tuple[Gang, Refusal]] = field(default_factory=dict)
    _asked: set[str] = field(default_factory=set)
    _last: ClusterView | None = None
    reused: int = 0  # refusals handed out again (for tests and the pass's log line)

    def begin(self, view: ClusterView) -> bool:
        """A pass starts on `view`: forget every refusal when it grew since the last pass ended;
        whether it grew."""
        self._asked = set()
        if grew(self._last, view):
            self._refused.clear()
            return True
        return False

    def answer(self, gang: Gang) -> Refusal | None:
        """The refusal `gang` (this very gang) got on a view at least as free as now, else None."""
        self._asked.add(gang.key)
        hit = self._refused.get(gang.key)
        if hit is None or hit[0] != gang:
            return None
        self.reused += 1
        return hit[1]

    def remember(self, gang: Gang, refusal: Refusal) -> None:
        """Keep a "not now" refusal (another kind, or a placement, forgets the gang)."""
        if refusal.kind == "not-now":
            self._refused[gang.key] = (gang, refusal)
        else:
            self._refused.pop(gang.key, None)

    def forget(self, gang: Gang) -> None:
        self._refused.pop(gang.key, None)

    def end(self, view: ClusterView) -> None:
        """The pass ended on `view` (after its own commits): the next one compares with it; gangs not
        asked about this pass (admitted, deleted, gone from the queue) are forgotten."""
        self._last = view
        for key in [k for k in self._refused if k not in self._asked]:
            del self._refused[key]
