"""The allocation state's values: who holds what (`Owner`, `Allocation`) and the whole record (`State`).

Each value checks itself when built and raises StateError: clean ids and cgroup paths, no CPU in two
allocations or reserved, no GPU in two allocations.  `State` (`.get`, `.allocated()`,
`.held_gpus()`, `.with_allocation(a)`, `.without(id)`), `ALLOCATION_ID` (an allocation id's pattern,
also its cgroup's name), `printable(text)` (safe to show on a terminal).  Where the state is kept:
`state_file` (crash-safe file, lock, commit-first), `state_codec` (its bytes), `state_live`.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass

from agent.enforce.cgroup import clean_path
from agent.enforce.procfs import start_time
from agent.errors import EnforcementError, StateError
from agent.topology.cpuset import EMPTY, CPUSet

# An allocation id, which also names its workload cgroup.
ALLOCATION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@:+-]{0,254}")
# A held GPU: its PCI address ("0000:18:00.0") or UUID ("GPU-8f6b...", "MIG-...").
_GPU_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")


@dataclass(frozen=True, slots=True)
class Owner:
    """Who holds an allocation: a process (pid + start time, so a recycled pid is told apart) or a
    pod's container; all None when unknown (an allocation rebuilt from an empty cgroup)."""

    pid: int | None = None
    start_time: int | None = None  # clock ticks since boot, /proc/PID/stat field 22
    pod_uid: str | None = None
    container: str | None = None

    def __post_init__(self) -> None:
        if self.pid is not None and (isinstance(self.pid, bool) or self.pid <= 0):
            raise StateError(f"invalid owner pid {self.pid!r}")
        if self.start_time is not None and (self.pid is None or self.start_time < 0):
            raise StateError(f"invalid owner start time {self.start_time!r}")
        for text in (self.pod_uid, self.container):
            if text is not None and not text:
                raise StateError("empty owner pod UID or container")

    @classmethod
    def of_process(cls, pid: int) -> Owner:
        """The owner record of live process `pid`."""
        ticks = start_time(pid)
        if ticks is None:
            raise StateError(f"no process {pid}")
        return cls(pid=pid, start_time=ticks)

    def process_alive(self, proc: str = "/proc") -> bool:
        """Whether the owning process still runs: the same pid with the same start time."""
        return self.pid is not None and self.start_time is not None and (
            start_time(self.pid, proc) == self.start_time
        )


@dataclass(frozen=True, slots=True)
class Allocation:
    """One exclusive allocation: its CPUs and memory nodes, the cgroup that holds them, its owner."""

    id: str
    cpus: CPUSet
    mems: CPUSet  # empty: memory not bound
    cgroup: str  # relative to the cpuset controller root
    owner: Owner
    policy: str  # what produced it, e.g. "single-numa-node"; "rebuilt" after a rebuild
    created_at: float  # seconds since the epoch
    gpus: tuple[str, ...] = ()  # whole GPUs held with the CPUs: PCI addresses or UUIDs
    # The NUMA nodes the pod scope confines its pod's containers to (`agent.alloc.scope`), recorded
    # so a restarted agent confines the pod's later containers alike; empty under container scope.
    affinity: CPUSet = EMPTY

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not ALLOCATION_ID.fullmatch(self.id):
            raise StateError(f"invalid allocation id {self.id!r}")
        if not isinstance(self.gpus, tuple) or not all(
                isinstance(g, str) and _GPU_RE.fullmatch(g) for g in self.gpus):
            raise StateError(f"allocation {self.id}: invalid GPU list {self.gpus!r}")
        if len(set(self.gpus)) != len(self.gpus):
            raise StateError(f"allocation {self.id} names a GPU twice")
        if not self.cpus:
            raise StateError(f"allocation {self.id} has no CPUs")
        try:
            clean = clean_path(self.cgroup)
        except EnforcementError as exc:
            raise StateError(f"allocation {self.id}: {exc}") from exc
        if not clean or clean != self.cgroup:
            raise StateError(f"allocation {self.id}: cgroup path {self.cgroup!r} is not clean")
        if not self.policy:
            raise StateError(f"allocation {self.id} has no policy")
        if not math.isfinite(self.created_at) or self.created_at < 0:
            raise StateError(f"allocation {self.id}: invalid created_at")


@dataclass(frozen=True, slots=True)
class State:
    """Every allocation (sorted by id), the reserved CPUs and a generation bumped on every commit.

    Construction validates: ids and cgroups are unique, no CPU is in two allocations or reserved,
    no GPU is in two allocations.
    """

    allocations: tuple[Allocation, ...] = ()
    reserved: CPUSet = EMPTY
    generation: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.generation, bool) or self.generation < 0:
            raise StateError(f"invalid generation {self.generation!r}")
        ordered = tuple(sorted(self.allocations, key=lambda a: a.id))
        object.__setattr__(self, "allocations", ordered)
        taken = self.reserved
        ids: set[str] = set()
        cgroups: set[str] = set()
        gpus: set[str] = set()
        for a in ordered:
            if a.id in ids:
                raise StateError(f"allocation id {a.id} appears twice")
            if a.cgroup in cgroups:
                raise StateError(f"cgroup {a.cgroup} holds two allocations")
            if not a.cpus.isdisjoint(taken):
                raise StateError(f"allocation {a.id}: CPUs {a.cpus & taken} are reserved or allocated twice")
            if not gpus.isdisjoint(a.gpus):
                twice = sorted(gpus.intersection(a.gpus))
                raise StateError(f"allocation {a.id}: GPUs {twice} are allocated twice")
            gpus.update(a.gpus)
            ids.add(a.id)
            cgroups.add(a.cgroup)
            taken |= a.cpus

    def get(self, alloc_id: str) -> Allocation | None:
        """The allocation named `alloc_id`, or None."""
        return next((a for a in self.allocations if a.id == alloc_id), None)

    def allocated(self) -> CPUSet:
        """Every CPU held by an allocation."""
        return EMPTY.union(*(a.cpus for a in self.allocations))

    def held_gpus(self) -> frozenset[str]:
        """Every GPU (PCI address or UUID) held by an allocation."""
        return frozenset(g for a in self.allocations for g in a.gpus)

    def with_allocation(self, alloc: Allocation) -> State:
        """This state plus `alloc` (replacing one with the same id); raises StateError on conflict."""
        rest = tuple(a for a in self.allocations if a.id != alloc.id)
        return dataclasses.replace(self, allocations=(*rest, alloc))

    def without(self, alloc_id: str) -> State:
        """This state less allocation `alloc_id` (unchanged if absent)."""
        return dataclasses.replace(
            self, allocations=tuple(a for a in self.allocations if a.id != alloc_id)
        )


def printable(text: str) -> str:
    """`text` with every non-printable character escaped (`\\x1b`), safe to show on a terminal."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)
