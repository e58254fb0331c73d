"""topolet's own cgroups under the cpuset root: which exist, which run on the pool, which are idle.

Cgroup shape (under the cpuset controller): `topolet/` holds every allowed CPU; `topolet/<id>` is an
exclusive allocation; `topolet/shared` and its children hold shared workloads on the pool (every
allowed CPU less the exclusive ones, reserved CPUs included).  These are the reads and removals over
that tree; the engine (`agent.pinning.engine`) makes them under its state lock, in its order.
"""

from __future__ import annotations

from collections.abc import Iterable

from agent.enforce import CgroupLayout, create_cgroup, exists, list_children, read_procs, remove_cgroup
from agent.enforce.state import Allocation, State
from agent.topology.cpuset import CPUSet


def _idle(layout: CgroupLayout, rel: str) -> bool:
    """No process and no child cgroup left in `rel`."""
    return not read_procs(layout, rel) and not list_children(layout, rel)


def allocation_in_use(layout: CgroupLayout | None, alloc: Allocation, proc: str = "/proc") -> bool:
    """An allocation is in use while it is a pod's, its owner runs, or a process is still in its
    cgroup (`layout` None: no cgroups to look at)."""
    if alloc.owner.pod_uid is not None:
        return True  # pods are released by the pod watch, not by process liveness
    if alloc.owner.process_alive(proc):
        return True
    return layout is not None and exists(layout, alloc.cgroup) and bool(read_procs(layout, alloc.cgroup))


def make_parents(layout: CgroupLayout, allowed: CPUSet, mems: CPUSet) -> list[str]:
    """Create `topolet/` (on `allowed` and `mems`) and `topolet/shared` where missing; the ones created."""
    created = []
    if not exists(layout, layout.parent):
        created.append(create_cgroup(layout, layout.parent, allowed, mems))
    if not exists(layout, layout.shared_path):
        created.append(create_cgroup(layout, layout.shared_path))
    return created


def remove_idle_parents(layout: CgroupLayout, ours: set[str]) -> list[str]:
    """Remove `topolet/shared`, then `topolet/`, where in `ours` and idle; the ones removed."""
    removed: list[str] = []
    for rel in (layout.shared_path, layout.parent):
        if rel in ours and exists(layout, rel) and _idle(layout, rel):
            remove_cgroup(layout, rel)
            removed.append(rel)
    return removed


def pool_cgroups(layout: CgroupLayout, others: Iterable[str]) -> list[str]:
    """The cgroups on the shared pool: `topolet/shared`, its children, then those of `others` that
    exist (sorted), each once."""
    shared = layout.shared_path
    own = [shared, *list_children(layout, shared)] if exists(layout, shared) else []
    found = [rel for rel in sorted(others) if exists(layout, rel)]
    return list(dict.fromkeys(own + found))


def orphans(layout: CgroupLayout, named: set[str], going: Iterable[str] = ()) -> list[str]:
    """Idle workload cgroups under `topolet/` that no allocation names (`named`) and that are not
    removed already (`going`)."""
    if not exists(layout, layout.parent):
        return []
    skip = {layout.shared_path, *named, *going}
    return [rel for rel in list_children(layout, layout.parent) if rel not in skip and _idle(layout, rel)]


def remove_idle_shared(layout: CgroupLayout) -> None:
    """Remove the idle children of `topolet/shared` (shared workloads that are gone)."""
    if exists(layout, layout.shared_path):
        for rel in list_children(layout, layout.shared_path):
            if _idle(layout, rel):
                remove_cgroup(layout, rel)


def drift_targets(layout: CgroupLayout, allowed: CPUSet, state: State, pool: CPUSet,
                  shared: Iterable[str]) -> dict[str, CPUSet]:
    """The CPUs every cgroup of the tree should hold under `state`: `topolet/` every allowed CPU, the
    pool cgroups (`shared`) the pool, each existing allocation's cgroup its CPUs.  A workload cgroup
    no allocation names but whose processes still run (one a rebuild dropped, say) is shared work:
    it gets the pool, never CPUs another allocation holds."""
    want = {layout.parent: allowed}
    want.update({rel: pool for rel in shared})
    named = {a.cgroup for a in state.allocations}
    for rel in list_children(layout, layout.parent):
        if rel != layout.shared_path and rel not in named:
            want[rel] = pool
    want.update({a.cgroup: a.cpus for a in state.allocations if exists(layout, a.cgroup)})
    return want
