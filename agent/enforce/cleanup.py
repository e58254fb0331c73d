"""Removing what topolet made on a node (uninstall): its cgroup tree and its state folder's files.

`remove_cgroup_tree(layout)` removes every cgroup at and below `layout.parent`, deepest first, moving
each one's tasks to the cgroup the tree hangs from (workloads keep running); nothing outside the tree
is touched.  `remove_state_files(folder)` removes topolet's files, never the folder itself.
Both are idempotent.  Details: agent/enforce/README.md, "Uninstall".
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from agent.enforce.cgroup import (
    CgroupLayout,
    exists,
    list_children,
    parent_of,
    read_cpus,
    read_procs,
    remove_cgroup,
)
from agent.enforce.state_file import CORRUPT_PREFIX, LOCK_NAME, STATE_NAME, StateFile
from agent.errors import EnforcementError
from agent.topology.cpuset import CPUSet
from agent.topology.native import set_affinity

LOCK_TIMEOUT_SECONDS = 10.0
# Other files topolet keeps in the state folder: `agent.standalone.journal.JOURNAL_NAME` and
# `agent.gpu.planfile.FILENAME` (named here, not imported: neither module belongs below enforce).
OTHER_STATE_FILES = ("events.jsonl", "mig-plan.json")


@dataclass(frozen=True, slots=True)
class CgroupCleanup:
    """What `remove_cgroup_tree` did: the cgroups removed (deepest first) and the tasks it moved."""

    removed: tuple[str, ...]
    moved: int
    to: str  # the cgroup the tasks went to ("" is the hierarchy root)


def _tree(layout: CgroupLayout, rel: str) -> list[str]:
    """`rel` and every cgroup below it, each after all of its children."""
    order: list[str] = []
    for child in list_children(layout, rel):
        order.extend(_tree(layout, child))
    order.append(rel)
    return order


def _widen(pid: int, cpus: CPUSet, proc: str) -> None:
    """Give every thread of `pid` the affinity `cpus` (a thread or process gone meanwhile is skipped)."""
    try:
        tids = [int(t) for t in os.listdir(os.path.join(proc, str(pid), "task"))]
    except FileNotFoundError:
        return
    for tid in tids:
        try:
            set_affinity(tid, cpus)
        except EnforcementError:
            if os.path.exists(os.path.join(proc, str(pid), "task", str(tid))):
                raise


def remove_cgroup_tree(layout: CgroupLayout, proc: str = "/proc") -> CgroupCleanup:
    """Remove `layout.parent` and its subtree, moving their tasks to the parent's parent first."""
    target = parent_of(layout.parent)
    if not exists(layout, layout.parent):
        return CgroupCleanup((), 0, target)
    removed: list[str] = []
    moved: list[int] = []
    for rel in _tree(layout, layout.parent):
        moved.extend(read_procs(layout, rel) if exists(layout, rel) else ())
        try:
            if remove_cgroup(layout, rel, move_procs_to=target):
                removed.append(rel)
        except (EnforcementError, OSError) as exc:
            # On cgroup v2 a non-root cgroup that hands cpuset to its children takes no tasks.
            where, path = layout.abspath(target), layout.abspath(rel)
            named = isinstance(exc, EnforcementError) and exc.path == path  # not twice in one line
            raise EnforcementError(f"cannot remove {rel} (its tasks to {where}): {exc}",
                                   None if named else path) from exc
    if moved:
        cpus = read_cpus(layout, target, effective=True)
        for pid in moved:
            _widen(pid, cpus, proc)
    return CgroupCleanup(tuple(removed), len(moved), target)


def _is_state_file(name: str) -> bool:
    """Whether `name` in the state folder is one topolet writes (a record, a kept copy, a temp file)."""
    own = (STATE_NAME, *OTHER_STATE_FILES)
    if name in own or name.startswith(CORRUPT_PREFIX):
        return True
    # Atomic writes go through `.<name>.<pid>[.<token>].tmp` beside the file they replace.
    return name.endswith(".tmp") and any(name.startswith(f".{n}.") for n in own)


def remove_state_files(folder: str) -> list[str]:
    """Remove topolet's files in `folder` (never the folder, nor anything else in it); the paths removed."""
    if not os.path.isdir(folder):
        return []
    removed: list[str] = []
    lock = os.path.join(folder, LOCK_NAME)
    had_lock = os.path.lexists(lock)  # else taking the lock below makes it, and it is not counted
    # Hold the lock while the state goes: a `topolet exec` starting now waits, then starts afresh.
    with StateFile(folder).lock(timeout=LOCK_TIMEOUT_SECONDS):
        for name in sorted(os.listdir(folder)):
            if _is_state_file(name):
                path = os.path.join(folder, name)
                try:
                    os.unlink(path)
                    removed.append(path)
                except FileNotFoundError:
                    pass
        try:
            os.unlink(lock)  # flock holds the open file, not the name
            if had_lock:
                removed.append(lock)
        except FileNotFoundError:
            pass
    return removed
