"""The node-local pinning engine: allocate, release, reap and reconcile exclusive CPUs on this node.

It joins the three layers in their one direction: `topology` (what the node has) → `alloc` (which
CPUs) → `enforce` (state first, then cgroups, the tree `agent.pinning.tree` describes).  Every public
method runs under the state lock, so concurrent `topolet exec` processes and the agent never hand out
a CPU twice.  `allocate` raises `AllocationRefused` (`agent.pinning.refusal`) when the node cannot or
may not satisfy a request, and other typed errors when writing the state or the cgroups failed.
`on_release(alloc_id)` hears of every allocation whose record it removes (released, released for a
pod, or reaped), once.  `usage()` reads only the state file and may run on any thread (a scrape's).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass

from agent.alloc.devices import allocate_with_gpus
from agent.alloc.request import Request
from agent.alloc.scope import PodScope, pod_affinity, within
from agent.enforce import (
    CgroupLayout,
    apply_assignment,
    apply_with_shared_pool,
    create_cgroup,
    exists,
    move_pid,
    read_cpuset,
    read_procs,
    remove_cgroup,
    repair_drift,
    shared_pool,
)
from agent.enforce.state import Allocation, Owner, State
from agent.enforce.state_file import StateFile
from agent.enforce.state_live import check_live, rebuild_from_cgroups
from agent.errors import AllocationError, EnforcementError
from agent.gpu.model import GPU
from agent.pinning.refusal import CAPACITY, AllocationRefused, refusal_reason, shortfall
from agent.pinning.tree import (
    allocation_in_use,
    drift_targets,
    make_parents,
    orphans,
    pool_cgroups,
    remove_idle_parents,
    remove_idle_shared,
)
from agent.pinning.usage import NodeUsage, usage_of
from agent.topology.cpuset import EMPTY, CPUSet
from agent.topology.model import Topology

log = logging.getLogger(__name__)

LOCK_TIMEOUT_SECONDS = 30.0
VANISHED_ATTEMPTS = 3  # an ordered step taken again when a cgroup it names vanished meanwhile
# The standalone agent's and `topolet exec`'s reservation without --reserved-cpus: CPU 0 stays with
# the system (interrupts, housekeeping, shared work), as the DaemonSet's --reserved-cpus=0 keeps it.
DEFAULT_RESERVED = CPUSet([0])

OuterTargets = tuple[dict[str, CPUSet], dict[str, CPUSet]]
"""(cpus, mems) of cgroups outside the engine's own that move with the pool (see `PinningEngine.outer`)."""


@dataclass(frozen=True, slots=True)
class ReconcileResult:
    released: tuple[str, ...]  # allocations whose processes were gone
    collected: tuple[str, ...]  # workload cgroups nobody owned, removed
    drift_repaired: int


class PinningEngine:
    """Exclusive CPU allocations on one node, recorded in a state file and enforced with cpusets."""

    # Class defaults too, for a subclass whose constructor does not run this one's.
    defer_rebuild = False
    keep_recorded_reserved = False
    _unsaved = False
    on_release: Callable[[str], None] | None = None
    # The kubelet's cgroups above the containers (the pod-cgroup route's QoS folders and pod cgroups):
    # given the state being applied, a context yielding their targets, held while they are written in
    # the engine's own ordered step, so one write widens folder, pod and container in that order (v1
    # refuses a container wider than its pod).  None: the engine writes only its own cgroups.
    outer: Callable[[State], AbstractContextManager[OuterTargets]] | None = None

    def __init__(self, topology: Topology, layout: CgroupLayout, state_file: StateFile,
                 reserved: CPUSet = EMPTY, proc: str = "/proc", gpus: tuple[GPU, ...] = (),
                 *, defer_rebuild: bool = False, on_release: Callable[[str], None] | None = None,
                 keep_recorded_reserved: bool = False) -> None:
        """`keep_recorded_reserved`: the reservation the state file records stands (the agent's, for
        a `topolet exec` given no --reserved-cpus); `reserved` then applies only to a new state."""
        self.topology = topology
        self.keep_recorded_reserved = keep_recorded_reserved
        self.on_release = on_release  # told the id of each allocation whose record this engine removed
        # A one-shot command (`topolet exec`) writes a rebuilt state only with its own commit, so
        # one that fails leaves a missing or corrupt file as it found it.
        self.defer_rebuild = defer_rebuild
        self._unsaved = False  # the state in hand is a rebuild not yet written
        self.gpus = gpus  # the node's whole GPUs, discovered once at startup; free = these less held
        self.layout = layout
        self.state_file = state_file
        self.reserved = reserved & topology.cpus
        self.proc = proc
        root_cpus, root_mems = read_cpuset(layout, "")
        self.allowed = topology.cpus & root_cpus
        self.all_mems = root_mems
        # Cgroups outside `topolet/shared` that also run on the pool: in Kubernetes mode, every
        # non-exclusive container cgroup of this node's pods (the pod watch keeps it current).
        self.extra_shared: frozenset[str] = frozenset()
        self.created_parents: set[str] = set()  # the parents this engine made (see remove_unused_parents)

    # -- locking and loading -------------------------------------------------------------------

    @contextmanager
    def locked(self) -> Iterator[State]:
        """Hold the state lock; yield the current state (rebuilt from cgroups if missing or corrupt)."""
        with self.state_file.lock(timeout=LOCK_TIMEOUT_SECONDS):
            rebuilt: list[State] = []

            def rebuild() -> State:
                rebuilt.append(rebuild_from_cgroups(self.layout, self.reserved))
                return rebuilt[-1]

            state = self.state_file.load_or_rebuild(rebuild, check=self.check_live,
                                                    commit=not self.defer_rebuild)
            self._unsaved = bool(rebuilt) and self.defer_rebuild
            keep = not rebuilt and self.keep_recorded_reserved
            if not keep and state.reserved != self.reserved and self.reserved.isdisjoint(state.allocated()):
                state = self.state_file.commit(State(state.allocations, self.reserved, state.generation))
                self._unsaved = False
            yield state

    def check_live(self, state: State) -> None:
        """Raise StateError when this node contradicts `state` (see `agent.enforce.state_live.check_live`)."""
        check_live(state, cpus=self.topology.cpus | self.topology.offline,
                   mems=CPUSet(n.id for n in self.topology.numa_nodes), parent=self.layout.parent)

    def _ensure_parents(self) -> list[str]:
        """Create `topolet/` and `topolet/shared` where missing; the ones created."""
        created = make_parents(self.layout, self.allowed, self.all_mems)
        self.created_parents.update(created)
        return created

    def remove_unused_parents(self) -> list[str]:
        """Remove the `topolet/shared` and `topolet/` this engine created, when no allocation is recorded
        and no process or cgroup is left in them (an agent that found no work leaves none behind);
        the ones removed."""
        with self.state_file.lock(timeout=LOCK_TIMEOUT_SECONDS):
            if self.state_file.load(missing_ok=True).allocations:
                return []
            return remove_idle_parents(self.layout, self.created_parents)

    def _shared_cgroups(self, extra: tuple[str, ...] = ()) -> list[str]:
        return pool_cgroups(self.layout, self.extra_shared.union(extra))

    def _apply(self, state: State, remove: tuple[str, ...] = (), shared: tuple[str, ...] = ()) -> None:
        """Bring every managed cgroup to `state` in one ordered step (pool narrowed before grants)."""
        self._ensure_parents()
        for attempt in range(VANISHED_ATTEMPTS):
            exclusive = {a.cgroup: a.cpus for a in state.allocations if exists(self.layout, a.cgroup)}
            mems = {a.cgroup: a.mems for a in state.allocations if a.mems and a.cgroup in exclusive}
            pool = [rel for rel in self._shared_cgroups(shared) if rel not in exclusive]
            # A container the runtime is about to create (the NRI route) holds its CPUs already.
            absent = [a.cpus for a in state.allocations if a.cgroup not in exclusive]
            try:
                with self._outer_targets(state) as (around, around_mems):
                    apply_with_shared_pool(self.layout, allowed=self.allowed, reserved=state.reserved,
                                           exclusive=exclusive, shared=pool,
                                           mems={**around_mems, **mems} or None,
                                           remove=remove, absent=absent, around=around)
                return
            except EnforcementError as exc:
                # A cgroup the kubelet or runtime removed while this step ran (a pod going): the
                # targets are taken again without it; every write is to an absolute set, so the
                # writes already made stand.
                if attempt == VANISHED_ATTEMPTS - 1 or not isinstance(exc.__cause__, FileNotFoundError):
                    raise

    def _outer_targets(self, state: State) -> AbstractContextManager[OuterTargets]:
        return nullcontext(({}, {})) if self.outer is None else self.outer(state)

    def _alive(self, alloc: Allocation) -> bool:
        return allocation_in_use(self.layout, alloc, self.proc)

    # -- the operations ------------------------------------------------------------------------

    def allocate(self, alloc_id: str, request: Request, owner: Owner, *, memory_binding: bool = False,
                 policy: str | None = None, gpus: int = 0, cgroup: str | None = None,
                 pod: PodScope | None = None) -> Allocation:
        """Choose, record and enforce an exclusive allocation; the caller then moves its process in.

        `cgroup` names an existing cgroup someone else made (a kubelet container's) to pin instead
        of a new `topolet/<id>`; topolet then never creates or removes it.

        With `gpus`, that many whole GPUs are chosen first and the CPUs prefer (under a strict NUMA
        policy: must lie on) the GPUs' NUMA nodes; both are recorded in the one state commit.

        With `pod` (the pod scope, `agent.alloc.scope`), the CPUs stay inside the pod's NUMA nodes:
        its recorded affinity, else the nodes its whole request takes now, chosen under this lock
        (refused as the pod's when the pod cannot be placed); the allocation records them.
        """
        with self.locked() as state:
            if self._unsaved:
                # Nothing is written before this allocation's own commit: dead allocations are left
                # out of it, and their cgroups are collected by the next reconcile.
                state = State(tuple(a for a in state.allocations if self._alive(a)), state.reserved,
                              state.generation)
            else:
                state = self._reap(state)[0]
            if state.get(alloc_id) is not None:
                raise AllocationError(f"allocation {alloc_id} already exists")
            free = self.allowed - state.reserved - state.allocated()
            request = Request(request.cpus, request.numa_policy, request.smt, request.preferred_numa,
                              request.reserved | state.reserved)
            affinity = EMPTY
            if pod is not None:
                nodes = pod.affinity if pod.affinity is not None else self._pod_affinity(
                    free, dataclasses.replace(pod.whole, reserved=pod.whole.reserved | state.reserved), state)
                affinity = CPUSet(nodes)
                request = within(self.topology, request, nodes)
            try:
                cpus, chosen = allocate_with_gpus(self.topology, free, request, self.gpus,
                                                  state.held_gpus(), gpus)
            except AllocationError as exc:
                short = self._short_of(request, state) if len(free - request.reserved) < request.cpus else ""
                raise AllocationRefused(f"{exc}; {short}" if short else str(exc),
                                        self._refusal_reason(free, request, state, gpus)) from exc
            try:
                shared_pool(self.allowed, state.reserved, [a.cpus for a in state.allocations] + [cpus])
            except EnforcementError as exc:
                short = self._short_of(request, state)
                raise AllocationRefused(f"requested {request.cpus} exclusive CPUs, but {short or exc}",
                                        CAPACITY) from exc
            mems = CPUSet(self.topology.numa_of(c) for c in cpus) & self.all_mems if memory_binding else EMPTY
            alloc = Allocation(alloc_id, cpus, mems, cgroup or self.layout.workload_path(alloc_id), owner,
                               policy or f"{request.numa_policy}/{request.smt}", time.time(),
                               chosen.addresses, affinity)
            before = state
            state = self.state_file.commit(state.with_allocation(alloc))  # the record comes first
            created = False
            try:
                self._ensure_parents()
                if cgroup is None:
                    create_cgroup(self.layout, alloc.cgroup)
                    created = True
                self._apply(state)
            except EnforcementError:
                self._roll_back(state, before, alloc, created)
                raise
            return alloc

    def _pod_affinity(self, free: CPUSet, whole: Request, state: State) -> frozenset[int]:
        """The NUMA nodes a pod's whole exclusive request takes now (the pod scope's first container)."""
        try:
            return pod_affinity(self.topology, free, whole)
        except AllocationError as exc:
            raise AllocationRefused(f"pod scope: the pod's {whole.cpus} exclusive CPUs: {exc}",
                                    self._refusal_reason(free, whole, state, 0)) from exc

    def _short_of(self, request: Request, state: State) -> str:
        return shortfall(request, state, self.allowed, self.topology.cpus, self.layout.root)

    def _refusal_reason(self, free: CPUSet, request: Request, state: State, gpus: int) -> str:
        return refusal_reason(free, request, state, gpus, self.gpus)

    def _released(self, alloc_ids: Iterable[str]) -> None:
        if self.on_release is not None:
            for alloc_id in alloc_ids:
                self.on_release(alloc_id)

    def _roll_back(self, state: State, before: State, alloc: Allocation, created: bool) -> None:
        """Undo an allocation whose cgroups could not be written: the record first, then the cgroups."""
        self.state_file.commit(dataclasses.replace(before, generation=state.generation))
        try:
            if created and exists(self.layout, alloc.cgroup) and not read_procs(self.layout, alloc.cgroup):
                remove_cgroup(self.layout, alloc.cgroup)
            self._apply(before)
        except EnforcementError as exc:  # the record is right again; drift repair finishes the cgroups
            log.warning("rolling back %s: %s", alloc.id, exc)

    def release_container(self, alloc_id: str) -> bool:
        """Free a pod container's allocation; its cgroup (the kubelet's) is kept and, while it still
        exists, given the shared pool.  Returns False when there was no such allocation."""
        with self.locked() as state:
            alloc = state.get(alloc_id)
            if alloc is None:
                return False
            state = self.state_file.commit(state.without(alloc_id))
            self._released((alloc_id,))
            self._apply(state, shared=(alloc.cgroup,))
            return True

    def rebind(self, alloc_id: str, cgroup: str) -> Allocation:
        """Point an allocation at another existing cgroup (a restarted container), keeping its CPUs."""
        with self.locked() as state:
            alloc = state.get(alloc_id)
            if alloc is None:
                raise AllocationError(f"no allocation {alloc_id}")
            moved = dataclasses.replace(alloc, cgroup=cgroup)
            state = self.state_file.commit(state.with_allocation(moved))
            self._apply(state, shared=(alloc.cgroup,) if alloc.cgroup != cgroup else ())
            return moved

    def pool_of(self, state: State) -> CPUSet:
        """The shared pool under `state`: every allowed CPU no allocation holds (reserved ones included)."""
        return shared_pool(self.allowed, state.reserved, [a.cpus for a in state.allocations])

    def join_pool(self, rel: str) -> bool:
        """Give one existing cgroup (a kubelet container's) the shared pool; True if it was written."""
        with self.locked() as state, self._outer_targets(state) as (around, around_mems):
            pool = self.pool_of(state)
            if read_cpuset(self.layout, rel)[0] == pool:
                return False
            apply_assignment(self.layout, {**around, rel: pool}, around_mems or None)
            return True

    def join(self, alloc: Allocation, pid: int) -> None:
        """Move `pid` into the allocation's cgroup."""
        move_pid(self.layout, alloc.cgroup, pid)

    def join_shared(self, name: str, pid: int) -> str:
        """Run `pid` on the shared pool in its own cgroup under `topolet/shared`; returns the cgroup."""
        with self.locked() as state:
            self._ensure_parents()
            rel = self.layout.workload_path(name, shared=True)
            create_cgroup(self.layout, rel)
            self._apply(state)
            move_pid(self.layout, rel, pid)
            if self._unsaved:  # it worked: now the rebuilt state may replace the corrupt one
                self.state_file.commit(state)
                self._unsaved = False
            return rel

    def release(self, alloc_id: str, *, leaving_pid: int | None = None, return_to: str = "") -> bool:
        """Free an allocation whose processes are gone (moving `leaving_pid` back to `return_to` first).

        Returns False and keeps the allocation while other processes still run in its cgroup.
        """
        with self.locked() as state:
            alloc = state.get(alloc_id)
            if alloc is None:
                return False
            if leaving_pid is not None and exists(self.layout, alloc.cgroup):
                if leaving_pid in read_procs(self.layout, alloc.cgroup):
                    move_pid(self.layout, return_to, leaving_pid)
            if exists(self.layout, alloc.cgroup) and read_procs(self.layout, alloc.cgroup):
                log.info("allocation %s outlives its owner: processes remain in %s", alloc_id, alloc.cgroup)
                return False
            state = self.state_file.commit(state.without(alloc_id))
            self._released((alloc_id,))
            self._apply(state, remove=(alloc.cgroup,) if exists(self.layout, alloc.cgroup) else ())
            return True

    def leave_shared(self, rel: str, pid: int, *, return_to: str = "") -> None:
        """Move `pid` back to `return_to` and remove its shared cgroup once empty."""
        with self.locked():
            if exists(self.layout, rel):
                if pid in read_procs(self.layout, rel):
                    move_pid(self.layout, return_to, pid)
                if not read_procs(self.layout, rel):
                    remove_cgroup(self.layout, rel)

    def _reap(self, state: State) -> tuple[State, tuple[str, ...], tuple[str, ...]]:
        """Release allocations whose processes are gone and remove cgroups nobody owns."""
        dead = [a for a in state.allocations if not self._alive(a)]
        removals: list[str] = []
        if dead:
            state = self.state_file.commit(State(
                tuple(a for a in state.allocations if a not in dead), state.reserved, state.generation))
            self._released(a.id for a in dead)
            removals = [a.cgroup for a in dead if exists(self.layout, a.cgroup)]
        found = orphans(self.layout, {a.cgroup for a in state.allocations}, removals)
        if dead or found:
            self._apply(state, remove=tuple(removals + found))
        remove_idle_shared(self.layout)
        for a in dead:
            log.info("released %s (%s): its processes are gone", a.id, a.cpus)
        return state, tuple(a.id for a in dead), tuple(found)

    def reconcile(self) -> ReconcileResult:
        """Release dead allocations, collect orphans, and repair any cpuset someone else rewrote."""
        with self.locked() as state:
            state, released, collected = self._reap(state)
            created = self._ensure_parents()
            for a in state.allocations:
                # A pod container's cgroup is the kubelet's: gone means the container is gone.
                if not exists(self.layout, a.cgroup) and a.owner.pod_uid is None:
                    created.append(create_cgroup(self.layout, a.cgroup))
            if created:
                log.info("created cpuset cgroups %s under %s", ", ".join(created), self.layout.root)
            pool = shared_pool(self.allowed, state.reserved, [a.cpus for a in state.allocations])
            want = drift_targets(self.layout, self.allowed, state, pool, self._shared_cgroups())
            mems = {a.cgroup: a.mems for a in state.allocations if a.mems}
            # A cgroup created in this pass gets its sets without counting as drift: drift is a set
            # someone changed after we wrote it.
            repaired = repair_drift(self.layout, want, mems or None, new=created)
            return ReconcileResult(released, collected, repaired)

    def usage(self, state: State | None = None) -> list[NodeUsage]:
        """CPUs per CPU-bearing NUMA node: total, reserved, exclusive, shared."""
        if state is None:
            state = self.state_file.load(missing_ok=True)
        return usage_of(self.topology, self.allowed, state)


def unique_id(prefix: str, pid: int | None = None) -> str:
    """An allocation id unlikely to repeat: prefix, pid and a monotonic nanosecond stamp."""
    return f"{prefix}-{pid if pid is not None else os.getpid()}-{time.monotonic_ns() % 10**12}"

