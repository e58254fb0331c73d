"""A state held against the live machine: refused when it contradicts it, rebuilt from its cgroups.

A checksum proves the state file is whole, not that it is true: `check_live` holds a loaded state
against the machine (its CPUs and memory nodes, topolet's and the kubelet's cgroup trees, init never
an owner), and `agent.enforce.state_file.StateFile.load_or_rebuild` treats a state that fails like a
corrupt one.  `rebuild_from_cgroups` is what replaces it: the allocations read back from topolet's
live cgroup tree.

Public API: `check_live(state, *, cpus, mems=None, parent)`, `rebuild_from_cgroups(layout,
reserved=EMPTY) -> State`, `REBUILT_POLICY` (the policy of a rebuilt allocation).
"""

from __future__ import annotations

import logging
import os
import re

from agent.enforce.cgroup import CgroupLayout, exists, list_children, read_cpuset, read_procs
from agent.enforce.procfs import parent_pid, start_time
from agent.enforce.state import ALLOCATION_ID, Allocation, Owner, State, printable
from agent.errors import EnforcementError, StateError
from agent.topology.cpuset import EMPTY, CPUSet

log = logging.getLogger("agent.enforce.state")

REBUILT_POLICY = "rebuilt"
# A component of the kubelet's pod tree: `kubepods` (cgroupfs), `kubepods.slice`, or a systemd
# slice that nests it under a kubelet --cgroup-root (`kubelet-kubepods-burstable.slice`).
_KUBEPODS_RE = re.compile(r"(?:[^/]*-)?kubepods(?:-[^/]*)?(?:\.slice)?")


def check_live(state: State, *, cpus: CPUSet, mems: CPUSet | None = None, parent: str) -> None:
    """Raise StateError when the live machine contradicts `state`.

    `cpus` are the machine's possible CPUs and `mems` (None: not checked) its memory nodes; every
    cgroup must lie under topolet's `parent` or in the kubelet's `kubepods` tree; and no allocation
    may name pid 1 as its owner (init never exits, so its allocation would never be freed).
    """
    if not state.reserved <= cpus:
        raise StateError(f"reserved CPUs {state.reserved - cpus} are not on this machine")
    for a in state.allocations:
        if not a.cpus <= cpus:
            raise StateError(f"allocation {a.id}: CPUs {a.cpus - cpus} are not on this machine")
        if mems is not None and not a.mems <= mems:
            raise StateError(f"allocation {a.id}: memory nodes {a.mems - mems} are not on this machine")
        if not (a.cgroup.startswith(parent + "/") or any(map(_KUBEPODS_RE.fullmatch, a.cgroup.split("/")))):
            raise StateError(f"allocation {a.id}: cgroup {printable(a.cgroup)} is neither under "
                             f"{parent}/ nor the kubelet's kubepods")
        if a.owner.pid == 1:
            raise StateError(f"allocation {a.id}: pid 1 cannot own an allocation")


def _owner_of(procs: list[int]) -> Owner:
    # The workload's first process is the one whose parent is outside the cgroup.
    inside = set(procs)
    roots = [p for p in procs if parent_pid(p) not in inside]
    for pid in roots or procs:
        ticks = start_time(pid)
        if ticks is not None:
            return Owner(pid=pid, start_time=ticks)
    return Owner()


def rebuild_from_cgroups(layout: CgroupLayout, reserved: CPUSet = EMPTY) -> State:
    """A state read from the live topolet cgroup tree: each workload cgroup under `layout.parent`
    (not the shared one) with its cpus, mems and first process becomes an allocation.

    CPUs that are reserved or already claimed by an earlier cgroup (by creation time, then name)
    are left out of a later one, which is dropped if nothing remains, so the result never
    double-assigns a CPU; each loss is logged.
    """
    if not exists(layout, layout.parent):
        return State(reserved=reserved)
    found: list[tuple[float, str, str, CPUSet, CPUSet, list[int]]] = []
    for rel in list_children(layout, layout.parent):
        name = rel.rsplit("/", 1)[-1]
        if rel == layout.shared_path:
            continue
        if not ALLOCATION_ID.fullmatch(name):
            log.warning("rebuild: skipping cgroup %s: not a workload name", rel)
            continue
        try:
            cpus, mems = read_cpuset(layout, rel)
            procs = read_procs(layout, rel)
            created = os.stat(layout.abspath(rel)).st_mtime
        except (EnforcementError, FileNotFoundError) as exc:
            log.warning("rebuild: skipping cgroup %s: %s", rel, exc)
            continue
        if not cpus:
            continue  # never given CPUs: nothing was allocated to it
        found.append((created, name, rel, cpus, mems, procs))
    taken = reserved
    allocations: list[Allocation] = []
    for created, name, rel, cpus, mems, procs in sorted(found, key=lambda f: (f[0], f[1])):
        kept = cpus - taken
        if kept != cpus:
            log.error("rebuild: cgroup %s holds CPUs %s reserved or held by another", rel, cpus & taken)
        if not kept:
            continue
        taken |= kept
        allocations.append(
            Allocation(name, kept, mems, rel, _owner_of(procs), REBUILT_POLICY, max(created, 0.0))
        )
    return State(tuple(allocations), reserved)
