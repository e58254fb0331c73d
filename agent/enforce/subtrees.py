"""Writing a cgroup and everything below it to one set, in one ordered step.

A pod's cgroup narrowed (or widened) with its containers below it: `subtree_targets` says what each
cgroup of the subtree gets (a child keeps what it holds of the new set, or gets it all when it holds
none; on v2 a child with empty files inherits and is left alone), `write_subtrees` writes them through
`apply_assignment`, the one ordered writer, looking again when a container appears meanwhile.

Public API: `subtree_targets(layout, rel, cpus, mems)`, `subtrees_targets(layout, targets)`,
`write_subtrees(layout, targets)`, `Targets`.
"""

from __future__ import annotations

from agent.enforce.apply import CgroupWrite, apply_assignment
from agent.enforce.cgroup import CgroupLayout, exists, list_children, read_cpus, read_mems
from agent.errors import EnforcementError
from agent.topology.cpuset import EMPTY, CPUSet

_ATTEMPTS = 3  # a container made while a subtree is written changes it under the write: look again

Targets = tuple[dict[str, CPUSet], dict[str, CPUSet]]


def subtree_targets(layout: CgroupLayout, rel: str, cpus: CPUSet, mems: CPUSet = EMPTY) -> Targets:
    """The cpus (and, when `mems` is given, mems) to write to cgroup `rel` and below so it holds `cpus`:
    `rel` gets them; a cgroup below keeps what it holds of them, or gets them all when it holds
    none.  On v2 a cgroup below with empty files inherits and is left alone."""
    want_cpus = {rel: cpus}
    want_mems = {rel: mems} if mems else {}
    stack = list_children(layout, rel)
    while stack:
        child = stack.pop()
        stack.extend(list_children(layout, child))
        for key, value, want in (("cpus", cpus, want_cpus), ("mems", mems, want_mems)):
            if not value:
                continue
            try:
                live = read_cpus(layout, child) if key == "cpus" else read_mems(layout, child)
            except EnforcementError:
                if exists(layout, child) and layout.version == 1:
                    raise
                continue  # gone meanwhile, or a v2 cgroup without the cpuset files
            if layout.version == 2 and not live:
                continue
            want[child] = (live & value) or value
    return want_cpus, want_mems


def subtrees_targets(layout: CgroupLayout, targets: list[tuple[str, CPUSet, CPUSet]]) -> Targets:
    """`subtree_targets` of each `(cgroup, cpus, mems)`, merged (a later one wins a cgroup named twice)."""
    cpus: dict[str, CPUSet] = {}
    mems: dict[str, CPUSet] = {}
    for rel, c, m in targets:
        got_cpus, got_mems = subtree_targets(layout, rel, c, m)
        cpus.update(got_cpus)
        mems.update(got_mems)
    return cpus, mems


def write_subtrees(layout: CgroupLayout, targets: list[tuple[str, CPUSet, CPUSet]]) -> list[CgroupWrite]:
    """Bring each `(cgroup, cpus, mems)` and its subtree to its set in one ordered step
    (`subtree_targets`, `apply_assignment`); returns the writes made."""
    for attempt in range(_ATTEMPTS):
        cpus, mems = subtrees_targets(layout, targets)
        try:
            return apply_assignment(layout, cpus, mems or None)
        except EnforcementError:
            if attempt == _ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")
