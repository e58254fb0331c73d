"""Ordered cpuset changes across many cgroups: the desired assignment, the shared pool, drift repair.

`apply_assignment(layout, cpus, mems=None, remove=())` narrows deepest first, removes, widens
shallowest first, then settles, so every write is one the kernel accepts; no cgroup is ever written
an empty set on the way.  On v2 a set overlapping a sibling partition root is refused before any
write.  Also `shared_pool`, `apply_with_shared_pool`, `find_drift`, `repair_drift`.
The passes and why: agent/enforce/README.md, "Write ordering".
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from agent.enforce.cgroup import (
    CgroupLayout,
    clean_path,
    depth_of,
    exists,
    list_children,
    parent_of,
    read_cpus,
    read_mems,
    read_partition,
    read_procs,
    remove_cgroup,
    write_set,
)
from agent.errors import EnforcementError
from agent.topology.cpuset import EMPTY, CPUSet

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CgroupWrite:
    """One write `apply_assignment` made, in the order it made it."""

    path: str  # relative cgroup path
    key: str  # "cpus" | "mems"
    value: CPUSet


@dataclass(frozen=True, slots=True)
class Drift:
    """Managed cgroups whose live sets differ from the desired ones, and those that are gone."""

    changed: tuple[str, ...]
    missing: tuple[str, ...]


class _Plan:
    """Live and target values of one cpuset file ("cpus" or "mems") across the managed cgroups."""

    def __init__(self, layout: CgroupLayout, key: str, targets: dict[str, CPUSet]) -> None:
        self.layout = layout
        self.key = key
        self.targets = targets
        self.live: dict[str, CPUSet] = {}
        self.kids: dict[str, list[str]] = {}
        self.partitions: dict[str, list[str]] = {}  # v2: parent -> its children that are partition roots
        # v1 binds a child to its parent's set; v2 intersects instead of refusing.
        self.nested = layout.version == 1

    def read(self, rel: str, *, effective: bool = False) -> CPUSet:
        reader = read_cpus if self.key == "cpus" else read_mems
        return reader(self.layout, rel, effective=effective)

    def live_of(self, rel: str) -> CPUSet:
        if rel not in self.live:
            self.live[rel] = self.read(rel)
        return self.live[rel]

    def children(self, rel: str) -> list[str]:
        if rel not in self.kids:
            self.kids[rel] = list_children(self.layout, rel) if self.nested else []
        return self.kids[rel]

    def held_by_children(self, rel: str) -> CPUSet:
        return EMPTY.union(*(self.live_of(c) for c in self.children(rel)))

    def held_as_partition(self, rel: str) -> CPUSet:
        """The cpus a valid v2 partition root holds: its own, taken out of its parent's effective set."""
        if self.layout.version == 1 or not exists(self.layout, rel):
            return EMPTY
        held = self.live_of(rel)  # first: a cgroup without the cpuset files fails here, by name
        return held if read_partition(self.layout, rel) in ("root", "isolated") else EMPTY

    def partition_children(self, rel: str) -> list[str]:
        """The children of `rel` that are valid v2 partition roots (each holds its cpus exclusively)."""
        if rel not in self.partitions:
            found = []
            for child in list_children(self.layout, rel):
                try:
                    if read_partition(self.layout, child) in ("root", "isolated"):
                        found.append(child)
                except EnforcementError:
                    continue  # no cpuset files (or gone): not a partition
            self.partitions[rel] = found
        return self.partitions[rel]

    def validate(self, removing: set[str]) -> None:
        """Refuse a target the kernel could never hold, before anything is written."""
        for rel, new in self.targets.items():
            if not new:
                raise EnforcementError(f"refusing to write an empty {self.key} set", self.layout.abspath(rel))
            up = parent_of(rel)
            bound = self.targets[up] if up in self.targets else self.read(up, effective=True)
            if self.key == "cpus" and up not in self.targets:
                bound |= self.held_as_partition(rel)
            if self.key == "cpus" and self.layout.version == 2:
                for other in self.partition_children(up):
                    held = self.targets.get(other) or self.live_of(other)
                    if other != rel and other not in removing and not new.isdisjoint(held):
                        raise EnforcementError(
                            f"cpus {new & held} belong to the partition root {other}; writing them "
                            "here would invalidate it", self.layout.abspath(rel),
                        )
            if not new <= bound:
                raise EnforcementError(
                    f"{self.key} {new} not within the parent's {bound}", self.layout.abspath(rel)
                )
            for child in self.children(rel):
                if child in self.targets or child in removing:
                    continue
                held = self.live_of(child)
                if not held <= new:
                    raise EnforcementError(
                        f"unmanaged child holds {self.key} {held} outside the new {new}",
                        self.layout.abspath(child),
                    )

    def forget(self, removed: set[str]) -> None:
        for rel in list(self.kids):
            self.kids[rel] = [c for c in self.kids[rel] if c not in removed]

    def _set(self, rel: str, value: CPUSet, writes: list[CgroupWrite]) -> None:
        if value == self.live_of(rel):
            return
        write_set(self.layout, rel, self.key, value)
        self.live[rel] = value
        writes.append(CgroupWrite(rel, self.key, value))

    def narrow(self, order: list[str], writes: list[CgroupWrite]) -> None:
        for rel in order:
            value = (self.live_of(rel) & self.targets[rel]) | self.held_by_children(rel)
            if value:
                self._set(rel, value, writes)

    def widen(self, order: list[str], writes: list[CgroupWrite]) -> None:
        for rel in order:
            self._set(rel, self.targets[rel] | self.held_by_children(rel), writes)

    def settle(self, order: list[str], writes: list[CgroupWrite]) -> None:
        for rel in order:
            self._set(rel, self.targets[rel], writes)


def _clean_targets(values: Mapping[str, CPUSet]) -> dict[str, CPUSet]:
    out: dict[str, CPUSet] = {}
    for rel, value in values.items():
        key = clean_path(rel)
        if not key:
            raise EnforcementError("refusing to write the hierarchy root's cpuset", rel)
        if key in out:
            raise EnforcementError("cgroup named twice", rel)
        out[key] = value
    return out


def apply_assignment(
    layout: CgroupLayout,
    cpus: Mapping[str, CPUSet],
    mems: Mapping[str, CPUSet] | None = None,
    *,
    remove: Iterable[str] = (),
) -> list[CgroupWrite]:
    """Bring each cgroup in `cpus` (and `mems`) to its set, ordering writes so the kernel accepts them.

    Cgroups in `remove` (without processes) are removed after the narrowing pass and before
    any widening, so released CPUs reach the shared pool only once their old owner is gone.  Returns
    the writes made, in order.  Raises EnforcementError (nothing written) for an inconsistent target:
    an empty set, a set outside its parent's, an unmanaged child outside its new parent set, a
    cgroup to remove that still has processes.
    """
    removing = {clean_path(r) for r in remove}
    plans = [_Plan(layout, "cpus", _clean_targets(cpus))]
    if mems:
        plans.append(_Plan(layout, "mems", _clean_targets(mems)))
    for plan in plans:
        both = removing & plan.targets.keys()
        if both:
            raise EnforcementError("cgroup both set and removed", ", ".join(sorted(both)))
        plan.validate(removing)
    for rel in removing:
        if exists(layout, rel) and (
            read_procs(layout, rel) or set(list_children(layout, rel)) - removing
        ):
            raise EnforcementError("cgroup to remove still has processes or children", layout.abspath(rel))

    writes: list[CgroupWrite] = []
    for plan in plans:
        plan.narrow(_deepest_first(plan.targets), writes)
    removed = set()
    for rel in _deepest_first(removing):
        if remove_cgroup(layout, rel):
            removed.add(rel)
    for plan in plans:
        plan.forget(removed)
        plan.widen(_deepest_first(plan.targets)[::-1], writes)
    for plan in plans:
        plan.settle(_deepest_first(plan.targets), writes)
    return writes


def _deepest_first(paths: Iterable[str]) -> list[str]:
    return sorted(paths, key=lambda p: (-depth_of(p), p))


def shared_pool(allowed: CPUSet, reserved: CPUSet, exclusive: Iterable[CPUSet]) -> CPUSet:
    """The CPUs shared workloads run on: `allowed` less every exclusive allocation.

    Reserved CPUs are never handed out exclusively, so they stay in the pool (kubelet's rule).
    Raises EnforcementError if allocations overlap, leave `allowed`, touch `reserved`, or leave
    the pool empty.
    """
    taken = EMPTY
    for cpus in exclusive:
        if not cpus <= allowed:
            raise EnforcementError(f"exclusive CPUs {cpus - allowed} are not allowed on this node")
        if not cpus.isdisjoint(reserved):
            raise EnforcementError(f"exclusive CPUs {cpus & reserved} are reserved")
        if not cpus.isdisjoint(taken):
            raise EnforcementError(f"CPUs {cpus & taken} are in two exclusive allocations")
        taken |= cpus
    pool = allowed - taken
    if not pool:
        raise EnforcementError("the shared pool would be empty")
    return pool


def apply_with_shared_pool(
    layout: CgroupLayout,
    *,
    allowed: CPUSet,
    reserved: CPUSet,
    exclusive: Mapping[str, CPUSet],
    shared: Iterable[str],
    mems: Mapping[str, CPUSet] | None = None,
    remove: Iterable[str] = (),
    absent: Iterable[CPUSet] = (),
    around: Mapping[str, CPUSet] | None = None,
) -> list[CgroupWrite]:
    """Apply every exclusive allocation and give every `shared` cgroup the pool, in one ordered step.

    `exclusive` must name all exclusive cgroups that exist, and `absent` the CPUs of allocations whose
    cgroup does not exist (yet): the pool is what they all leave.  Granting narrows the shared cgroups
    before the exclusive one widens, releasing (via `remove`) drops the old owner before the shared
    cgroups widen.  `around` gives other cgroups their sets in the same step (the kubelet's QoS and
    pod cgroups above the containers, which must widen before them); `shared` and `exclusive` win a
    cgroup named there too.
    """
    pool = shared_pool(allowed, reserved, [*exclusive.values(), *absent])
    pooled = {clean_path(p): pool for p in shared}
    for rel in exclusive:
        if clean_path(rel) in pooled:
            raise EnforcementError("cgroup is both shared and exclusive", rel)
    desired = {clean_path(p): c for p, c in (around or {}).items()}
    desired.update(pooled)
    desired.update({clean_path(p): c for p, c in exclusive.items()})
    return apply_assignment(layout, desired, mems, remove=remove)


def find_drift(
    layout: CgroupLayout, cpus: Mapping[str, CPUSet], mems: Mapping[str, CPUSet] | None = None
) -> Drift:
    """Managed cgroups whose live `cpuset.cpus` (or `cpuset.mems`) differs from the desired one."""
    want_cpus = _clean_targets(cpus)
    want_mems = _clean_targets(mems or {})
    changed: list[str] = []
    missing: list[str] = []
    for rel in sorted(want_cpus.keys() | want_mems.keys()):
        try:
            if (rel in want_cpus and read_cpus(layout, rel) != want_cpus[rel]) or (
                rel in want_mems and read_mems(layout, rel) != want_mems[rel]
            ):
                changed.append(rel)
        except EnforcementError:
            if exists(layout, rel):
                raise
            missing.append(rel)
    return Drift(tuple(changed), tuple(missing))


def repair_drift(
    layout: CgroupLayout, cpus: Mapping[str, CPUSet], mems: Mapping[str, CPUSet] | None = None,
    *, new: Collection[str] = (),
) -> int:
    """Rewrite every managed cgroup whose live sets drifted; return how many had drifted.

    Cgroups that no longer exist are logged and skipped (their processes are gone with them).  `new`
    names cgroups the caller has just created: they get their sets too, but a set never written yet
    is not drift, so they are neither counted nor logged as such.
    """
    drift = find_drift(layout, cpus, mems)
    if drift.missing:
        log.warning("managed cgroups are gone: %s", ", ".join(drift.missing))
    if not drift.changed:
        return 0
    fresh = {clean_path(p) for p in new}
    drifted = [rel for rel in drift.changed if rel not in fresh]
    gone = set(drift.missing)
    apply_assignment(
        layout,
        {p: c for p, c in cpus.items() if clean_path(p) not in gone},
        {p: m for p, m in (mems or {}).items() if clean_path(p) not in gone},
    )
    if drifted:
        log.info("repaired cpuset drift in %d cgroups: %s", len(drifted), ", ".join(drifted))
    return len(drifted)
