"""The pod cache of the enforcer thread and what it means for the pinning engine.

`PodPinner` turns pod plans (`agent.api.podplan`) into engine calls — exclusive CPUs for containers
that ask, the shared pool for the rest, state first and cgroups after — and never calls the API.
Every route builds a container's request in one place, `_allocate`, under the node's Topology
Manager scope.  Every public method holds the re-entrant `lock`, so the NRI thread and the enforcer
thread use the pod cache and the engine one at a time.  Counting, the pod-cgroup route's `ahead`
and the NRI route's `created` hand-over: README.md, "The pinner".
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from agent.alloc.scope import DEFAULT_SCOPE
from agent.api.podplan import REASON_INVALID, ContainerPlan, PodPlan, PodWarning
from agent.enforce import CgroupDriver, container_cgroup_path, exists
from agent.enforce.state import Allocation, Owner, State
from agent.errors import AllocationError, EnforcementError, TopoletError
from agent.kube.pods.node_cgroups import NodeCgroups, find_own, is_planned, planned_cgroup
from agent.kube.pods.numa_scope import scoped_request
from agent.kube.pods.warnings import WarningLimiter
from agent.kube.pods.watch import Changed, Gone, PodChange, Synced
from agent.metrics.registry import ALLOCATED, ERROR, INVALID, Metrics
from agent.pinning.engine import PinningEngine
from agent.pinning.refusal import AllocationRefused
from agent.topology.cpuset import CPUSet

log = logging.getLogger("topolet.kube")

REASON_ALLOCATION_FAILED = "AllocationFailed"


def alloc_id(pod_uid: str, container: str) -> str:
    """The state file id of a pod container's allocation (uids and container names hold no ".")."""
    return f"pod-{pod_uid}.{container}"


class PodPinner:
    """The pod cache and what it means for the engine; every method runs on the enforcer thread."""

    def __init__(self, engine: PinningEngine, metrics: Metrics,
                 warn: Callable[[PodPlan, PodWarning], None],
                 gpu_numa: Callable[[PodPlan, ContainerPlan], frozenset[int] | None] | None = None,
                 *, enforce: bool = True, warnings: WarningLimiter | None = None,
                 numa_scope: str = DEFAULT_SCOPE, cgroups: NodeCgroups | None = None) -> None:
        """`cgroups`: the node's cgroups as read at start (else read here, under the engine's root)."""
        self.engine = engine
        self.numa_scope = numa_scope  # the Topology Manager scope pods are aligned by (numa_scope)
        self.lock = threading.RLock()  # the pod cache and the engine, one thread at a time
        # Allocation id → cgroup of containers the NRI route pinned that the watch does not list running yet.
        self.created: dict[str, str] = {}
        # False (`--enforcement off`): no container cgroup is looked for; a running container (its
        # status carries a container ID) is named by the cgroup the kubelet would give it.
        self.enforce = enforce
        # True on the pod-cgroup route: exclusive containers are pinned before they run (docstring).
        self.ahead = False
        self.metrics = metrics
        self.warn = warn
        self.gpu_numa = gpu_numa  # the NUMA nodes of a container's GPUs (kubelet's pod-resources), if known
        self.pods: dict[str, PodPlan] = {}
        self.shared: dict[tuple[str, str], str] = {}  # (uid, container) → cgroup on the pool
        self.pending: set[str] = set()  # uids with a running container whose cgroup is not found yet
        self.unsatisfied: set[str] = set()  # uids with a container refused exclusive CPUs (retry later)
        # (uid, container) → the reason its refusal was counted for: a retry refused alike is not
        # counted again, so the refusal count follows requests, not the retry rate.
        self.refusals: dict[tuple[str, str], str] = {}
        self.warnings = warnings if warnings is not None else WarningLimiter()
        found = cgroups if cgroups is not None else NodeCgroups.read(engine.layout)
        self.driver: CgroupDriver | None = found.driver
        self._at_namespace_root = found.at_namespace_root
        self._own: str | None = None  # the agent's own container cgroup, once found (_own_cgroup)
        self._not_own: set[str] = set()  # cgroups looked at that do not hold the agent

    # -- cgroups ---------------------------------------------------------------------------------

    def cgroup_of(self, plan: PodPlan, c: ContainerPlan) -> str | None:
        """The container's cgroup (relative to the cpuset root) if it exists; None if not (yet).

        Without enforcement it is the cgroupfs driver's path, existing or not: a container counts
        as started once the pod status gives it an ID, and that path is only its name in the state.
        """
        drivers = [self.driver] if self.driver else [CgroupDriver.CGROUPFS, CgroupDriver.SYSTEMD]
        for driver in drivers:
            try:
                rel = container_cgroup_path(plan.uid, plan.qos, c.container_id, None, driver)
            except EnforcementError as exc:
                self._warn_once(plan, PodWarning("UnsupportedContainer", f"container {c.name}: {exc}"))
                return None
            if not self.enforce:  # nothing exists to look for: the first candidate names it
                return rel
            if exists(self.engine.layout, rel):
                self.driver = driver
                return rel
        return None

    # -- changes ---------------------------------------------------------------------------------

    def handle(self, change: PodChange) -> None:
        """Apply one change from the pod watch."""
        with self.lock:
            if isinstance(change, Synced):
                for uid in set(self.pods) - set(change.plans):
                    self._forget(uid)
                # Allocations of pods the API no longer lists (deleted while we were away) go too; not
                # those the NRI route made for containers of pods bound after that list.
                for a in self._state().allocations:
                    if a.owner.pod_uid is not None and a.owner.pod_uid not in change.plans \
                            and a.id not in self.created:
                        self._release(a.id)
                for plan in change.plans.values():
                    self.apply(plan)
            elif isinstance(change, Changed):
                self.apply(change.plan)
            elif isinstance(change, Gone):
                self._forget(change.uid)

    def _state(self) -> State:
        return self.engine.state_file.load(missing_ok=True)

    def state(self) -> State:
        """The allocation state now (read from the state file)."""
        return self._state()

    def pool(self, state: State) -> CPUSet:
        """The shared pool under `state`: every allowed CPU no allocation holds (reserved ones included)."""
        return self.engine.pool_of(state)

    def _warn_once(self, plan: PodPlan, w: PodWarning) -> None:
        if self.warnings.admit(plan.uid, w.reason, w.message):
            log.warning("pod %s/%s: %s: %s", plan.namespace, plan.name, w.reason, w.message)
            self.warn(plan, w)

    def offer_held_warnings(self) -> None:
        """Offer again the warnings of pods the rate limit held back, as their plans say now."""
        with self.lock:
            for uid in sorted(self.warnings.take_held()):
                plan = self.pods.get(uid)
                if plan is not None:
                    for w in plan.warnings:
                        self._warn_once(plan, w)

    def _release(self, aid: str) -> None:
        self.created.pop(aid, None)
        if self.engine.release_container(aid):  # counted by the engine's on_release
            log.info("released %s", aid)
            # Freed CPUs may now satisfy a container that was refused them.
            self.pending |= self.unsatisfied

    def _set_shared(self) -> None:
        shared = frozenset(self.shared.values())
        own = self._own_cgroup(shared)
        self.engine.extra_shared = shared - {own} if own is not None else shared

    def _own_cgroup(self, candidates: frozenset[str]) -> str | None:
        """The agent's own container cgroup among `candidates`, when the kernel refuses it our writes
        (at the root of its cgroup v2 namespace: `agent.kube.pods.node_cgroups.find_own`); found once."""
        if self._own is not None:
            return self._own if self._own in candidates else None
        if self.engine.layout.version != 2 or not self._at_namespace_root:
            return None
        self._not_own &= candidates  # bounded by the pods of now, not of the agent's lifetime
        self._own = find_own(self.engine.layout, candidates, self._not_own)
        return self._own

    def forget(self, uid: str) -> None:
        """A pod the API says is gone: free its CPUs, drop its containers from the pool set."""
        with self.lock:
            self._forget(uid)

    def _forget(self, uid: str) -> None:
        self.pods.pop(uid, None)
        self.pending.discard(uid)
        self.unsatisfied.discard(uid)
        self.warnings.forget(uid)
        for key in [k for k in self.shared if k[0] == uid]:
            del self.shared[key]
        for key in [k for k in self.refusals if k[0] == uid]:
            del self.refusals[key]
        self._set_shared()
        for a in self._state().allocations:
            if a.owner.pod_uid == uid:
                self._release(a.id)

    def apply(self, plan: PodPlan, *, force: bool = False) -> None:
        """Bring the engine to `plan`: unchanged containers are left alone (no write, no state commit)."""
        with self.lock:
            self._apply_plan(plan, force)

    def _ahead_of_watch(self, plan: PodPlan, a: Allocation, running: dict[str, ContainerPlan]) -> bool:
        """Whether `a` is the NRI route's pin of a container this plan does not list running yet."""
        if self.created.get(a.id) != a.cgroup:
            return False
        c = running.get(a.owner.container or "")
        return c is None or self.cgroup_of(plan, c) != a.cgroup

    def _apply_plan(self, plan: PodPlan, force: bool) -> None:
        if not force and self.pods.get(plan.uid) == plan and plan.uid not in self.pending:
            return
        self.pods[plan.uid] = plan
        self.pending.discard(plan.uid)
        self.unsatisfied.discard(plan.uid)
        for w in plan.warnings:
            self._warn_once(plan, w)
        self._count_invalid(plan)
        running = {c.name: c for c in plan.containers}
        # On the pod-cgroup route a container about to start that asks for exclusive CPUs holds them
        # already; one that exited holds nothing.
        planned = {c.name: c for c in plan.waiting if c.exclusive and c.name not in plan.exited} \
            if self.ahead and self.enforce else {}
        mine = {a.owner.container: a for a in self._state().allocations if a.owner.pod_uid == plan.uid}
        # Containers the NRI route pinned ahead of the pod status are the route's until the status
        # lists them running: neither released nor moved to the older container a stale status names.
        ahead = {name for name, a in mine.items() if self._ahead_of_watch(plan, a, running)}
        # Stopped containers and ones that turned shared (or changed size) give their CPUs back first.
        for name, a in list(mine.items()):
            if name in ahead:
                continue
            c = running.get(name or "") or planned.get(name or "")
            if c is None or len(a.cpus) != c.cpus:
                self._release(a.id)
                del mine[name]
        for key in [k for k in self.shared if k[0] == plan.uid and k[1] not in running]:
            del self.shared[key]
        paths: dict[str, str] = {}
        for c in plan.containers:
            if c.name in ahead:
                continue
            rel = self.cgroup_of(plan, c)
            if rel is None:
                self.pending.add(plan.uid)
                self.shared.pop((plan.uid, c.name), None)
                continue
            paths[c.name] = rel
            if c.exclusive:
                self.shared.pop((plan.uid, c.name), None)
            else:
                self.shared[(plan.uid, c.name)] = rel
        self._set_shared()
        for c in plan.containers:
            rel = paths.get(c.name)
            if rel is None:
                continue
            if not c.exclusive:
                self._join_pool(rel)
                continue
            held = mine.get(c.name)
            if held is None:
                self._allocate(plan, c, rel)
            elif held.cgroup == rel:
                self.created.pop(held.id, None)  # the watch has caught up with the NRI route
            else:
                self.created.pop(held.id, None)
                self.engine.rebind(held.id, rel)  # a restarted container keeps its CPUs, as with kubelet
                log.info("%s moved to %s container %s", held.id,
                         "started" if is_planned(held.cgroup) else "restarted", rel)
        for c in planned.values():
            if c.name not in mine and c.name not in running:
                self._allocate(plan, c, planned_cgroup(plan, c.name, self.driver))

    def _count_invalid(self, plan: PodPlan) -> None:
        """A pod whose topolet annotations are invalid is refused pinning: counted once while they are."""
        key = (plan.uid, "")  # the pod's own entry (no container is named "")
        if not any(w.reason == REASON_INVALID for w in plan.warnings):
            self.refusals.pop(key, None)
        elif key not in self.refusals:
            self.refusals[key] = INVALID
            self.metrics.refused(INVALID)

    def _join_pool(self, rel: str) -> None:
        if self.enforce and not exists(self.engine.layout, rel):
            return  # not created yet: the NRI route gives it the pool as its runtime creates it
        try:
            if self.engine.join_pool(rel):
                self.metrics.pool_writes.inc()
        except EnforcementError as exc:
            log.warning("shared container %s: %s", rel, exc)

    def _allocate(self, plan: PodPlan, c: ContainerPlan, rel: str, *,
                  fail: bool = False) -> Allocation | None:
        """Pin `c` (state first, then cgroups); None when refused or (unless `fail`) on an error."""
        started = time.perf_counter()
        aid = alloc_id(plan.uid, c.name)
        if c.numa_zone is not None:  # the admission controller's zone decides, GPUs included
            near: frozenset[int] | None = frozenset((c.numa_zone,))
        else:
            near = self.gpu_numa(plan, c) if self.gpu_numa is not None else None
        pod_near = self._pod_near(plan, c, near)
        held = [a for a in self._state().allocations if a.owner.pod_uid == plan.uid]
        try:
            request, pod = scoped_request(self.numa_scope, self.engine.topology, plan, c, near, pod_near,
                                          held)
        except AllocationError as exc:
            self._refuse(plan, c, rel, INVALID, exc)
            return None
        try:
            a = self.engine.allocate(
                aid, request, Owner(pod_uid=plan.uid, container=c.name),
                memory_binding=c.memory_binding, policy=f"{c.numa_policy}/{c.smt}", cgroup=rel, pod=pod)
        except AllocationRefused as exc:  # no room, or the policy cannot be met
            self._refuse(plan, c, rel, exc.reason, exc)
            return None
        except TopoletError as exc:  # the state or the cgroup could not be written
            self.metrics.allocations.labels(result=ERROR).inc()
            if fail:
                raise
            self._refuse(plan, c, rel, None, exc)
            return None
        self.refusals.pop((plan.uid, c.name), None)
        self.metrics.allocations.labels(result=ALLOCATED).inc()
        self.metrics.pin_latency.observe(time.perf_counter() - started)
        log.info("pod %s/%s container %s: CPUs %s (%s%s)", plan.namespace, plan.name, c.name, a.cpus,
                 a.policy, f", zone {c.numa_zone}" if c.numa_zone is not None
                 else f", devices on NUMA {sorted(near)}" if near else "")
        return a

    def _pod_near(self, plan: PodPlan, c: ContainerPlan,
                  near: frozenset[int] | None) -> frozenset[int] | None:
        """The NUMA nodes the whole pod should prefer under the pod scope: those of every exclusive
        container's GPUs (`near` for `c`); None without any, or under the container scope."""
        if self.numa_scope != "pod" or self.gpu_numa is None or c.numa_zone is not None:
            return near
        found: set[int] = set(near or ())
        for other in (*plan.containers, *plan.waiting):
            if other.exclusive and other.name != c.name:
                found |= self.gpu_numa(plan, other) or frozenset()
        return frozenset(found) or None

    def _refuse(self, plan: PodPlan, c: ContainerPlan, rel: str, reason: str | None,
                exc: TopoletError) -> None:
        """The container stays on the shared pool and is tried again; `reason`: a refusal, counted
        once until the container is pinned or refused for another reason (None: an error)."""
        if reason is not None and self.refusals.get((plan.uid, c.name)) != reason:
            self.refusals[(plan.uid, c.name)] = reason
            self.metrics.refused(reason)
        self.unsatisfied.add(plan.uid)
        self._warn_once(plan, PodWarning(REASON_ALLOCATION_FAILED,
                                         f"container {c.name}: {c.cpus} exclusive CPUs: {exc}"))
        self.shared[(plan.uid, c.name)] = rel
        self._set_shared()
        self._join_pool(rel)

    def retry(self, *, refused: bool = True) -> None:
        """Look again for cgroups that were missing and (with `refused`) CPUs for refused containers."""
        with self.lock:
            for uid in sorted(self.pending | self.unsatisfied if refused else self.pending):
                plan = self.pods.get(uid)
                if plan is None:
                    self.pending.discard(uid)
                    self.unsatisfied.discard(uid)
                    continue
                self._apply_plan(plan, True)

    # -- the NRI route (agent.kube.pods.nri_pinning), on the plugin's thread ---------------------------

    def pin_container(self, plan: PodPlan, c: ContainerPlan, rel: str) -> Allocation | None:
        """Bring one container the runtime creates (or has) to `c`: its allocation (kept when it holds
        the right number of CPUs, moved to `rel` from an older container of the same name), or None
        for the shared pool (refused: counted and warned as the watch path does, retried when CPUs
        free up).  A state or cgroup write that fails raises (TopoletError)."""
        with self.lock:
            for w in plan.warnings:  # told once per pod, whichever route reads the pod first
                self._warn_once(plan, w)
            self._count_invalid(plan)
            aid = alloc_id(plan.uid, c.name)
            held = self._state().get(aid)
            if held is not None and len(held.cpus) != c.cpus:
                self._release(aid)
                held = None
            if not c.exclusive:
                self.shared[(plan.uid, c.name)] = rel
                self._set_shared()
                return None
            self.shared.pop((plan.uid, c.name), None)
            self._set_shared()
            # One the watch made before the container existed is the answer as it stands: committed
            # already, so the answer writes nothing; the watch moves it to `rel` once the status lists
            # the container running.
            if held is not None and held.cgroup != rel and not is_planned(held.cgroup):
                held = self.engine.rebind(aid, rel)
                log.info("%s moved to restarted container %s", aid, rel)
            elif held is None:
                held = self._allocate(plan, c, rel, fail=True)
            if held is not None:
                self.created[aid] = rel
            return held

    def holding(self, state: State, uid: str, name: str, rel: str) -> Allocation | None:
        """What the container `name` of pod `uid` at cgroup `rel` holds in `state`: its allocation, or
        the one the watch made for it before it existed (a planned cgroup, moved to `rel` once the
        status lists the container running)."""
        a = state.get(alloc_id(uid, name))
        return a if a is not None and (a.cgroup == rel or is_planned(a.cgroup)) else None

    def release_container(self, uid: str, name: str, rel: str) -> bool:
        """The runtime stopped or removed the container at `rel`: free its CPUs if its allocation is
        still this container's (idempotent with the watch path's release); True if freed."""
        with self.lock:
            if self.shared.get((uid, name)) == rel:
                del self.shared[(uid, name)]
                self._set_shared()
            aid = alloc_id(uid, name)
            held = self.holding(self._state(), uid, name, rel)
            if held is None:
                return False
            self._release(aid)
            return True

