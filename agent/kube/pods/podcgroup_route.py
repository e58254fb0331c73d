"""The pod-cgroup route: pod cgroups hold their pods' exclusive CPUs before any container exists.

`PodCgroupRoute` makes the pinner (with `ahead` on) the policy of
`agent.enforce.podcgroups.PodCgroupWatcher`: a pinned pod's cgroup gets its allocations' union,
every other pod and the Burstable and BestEffort folders the pool.  The watcher's thread reads only
`PodCpusets` snapshots the enforcer thread makes; lock order: pinner, state file, watcher.
`start()` only after the pinner has the first list.  Ordering and threads: README.md.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field

from agent.api.podplan import PodPlan
from agent.api.qos import QOSClass
from agent.enforce.cgroup import exists
from agent.enforce.kubepods import CgroupDriver
from agent.enforce.podcgroups import PodCgroupWatcher, PodCpuset
from agent.enforce.state import State
from agent.enforce.subtrees import subtrees_targets
from agent.errors import EnforcementError
from agent.kube.pods.pinner import PodPinner
from agent.pinning.engine import OuterTargets
from agent.topology.cpuset import EMPTY, CPUSet

log = logging.getLogger("topolet.kube.podcgroups")


@dataclass(frozen=True, slots=True)
class PodCpusets:
    """The policy at one moment: each pinned pod's cgroup set, and the shared pool."""

    pods: Mapping[str, PodCpuset] = field(default_factory=dict)
    pool: CPUSet = EMPTY
    # Pods whose containers differ: container name → its allocation's set (the others: the pool).
    containers: Mapping[str, Mapping[str, PodCpuset]] = field(default_factory=dict)


def pod_cpusets(state: State, plans: Mapping[str, PodPlan], pool: CPUSet) -> PodCpusets:
    """What each pod's cgroup holds under `state` (pure; see the module docstring)."""
    held: dict[str, list[tuple[str, CPUSet, CPUSet]]] = {}
    for a in state.allocations:
        if a.owner.pod_uid is not None and a.owner.container is not None:
            held.setdefault(a.owner.pod_uid, []).append((a.owner.container, a.cpus, a.mems))
    pods: dict[str, PodCpuset] = {}
    containers: dict[str, dict[str, PodCpuset]] = {}
    for uid, allocs in held.items():
        cpus = EMPTY.union(*(c for _, c, _ in allocs))
        plan = plans.get(uid)
        names = {n for n, _, _ in allocs}
        others = plan is not None and any(c.name not in names and c.name not in plan.exited
                                          for c in (*plan.containers, *plan.waiting))
        bound = all(m for _, _, m in allocs) and not others
        mems = EMPTY.union(*(m for _, _, m in allocs)) if bound else EMPTY
        pods[uid] = (cpus | pool if others else cpus, mems)
        if others:
            containers[uid] = {n: (c, m) for n, c, m in allocs}
    return PodCpusets(pods, pool, containers)


class PodCgroupRoute:
    """The pod-cgroup route of one agent: its watcher, the policy snapshot it reads, the engine's hook."""

    def __init__(self, pinner: PodPinner, *, bundles: str = "") -> None:
        self.pinner = pinner
        self.bundles = bundles  # the runtime's bundle folder (agent.enforce.bundles); "" : pods only
        self.engine = pinner.engine
        pinner.ahead = True
        self.policy = PodCpusets()
        self.watcher: PodCgroupWatcher | None = None

    # -- what the watcher asks, on its thread ---------------------------------------------------

    def pod_cpuset(self, uid: str) -> PodCpuset | None:
        return self.policy.pods.get(uid)

    def shared_pool(self) -> CPUSet:
        return self.policy.pool

    def container_cpuset(self, uid: str, name: str) -> PodCpuset | None:
        mine = self.policy.containers.get(uid)
        if mine is None:
            return None
        return mine.get(name) or (self.policy.pool, EMPTY)

    # -- the enforcer's side --------------------------------------------------------------------

    def start(self) -> None:
        """Take the policy from the state and the pinner, watch the kubelet's QoS folders (writing
        what is there) and hook the engine's ordered writes; a watch that cannot start is logged and
        the pod watch pins alone."""
        driver = self.pinner.driver or CgroupDriver.CGROUPFS  # no kubepods yet: the kubelet's default
        watcher = PodCgroupWatcher(self.engine.layout, driver, self.pod_cpuset, self.shared_pool,
                                   container_cpuset=self.container_cpuset, bundles=self.bundles)
        with self.pinner.lock:
            self.policy = self._snapshot(self.pinner.state())
        try:
            watcher.start()
        except EnforcementError as exc:
            log.error("pod-cgroup route: cannot watch the kubelet's cgroups (%s); pods are pinned once "
                      "their containers run", exc)
            return
        self.watcher = watcher
        self.engine.outer = self._outer
        log.info("pod-cgroup route: watching %s (%s driver) for pod cgroups; %d pods there now",
                 watcher.folders[QOSClass.GUARANTEED], driver, len(watcher.pods()))

    def stop(self) -> None:
        """Stop watching; cgroups keep what was written."""
        self.engine.outer = None
        if self.watcher is not None:
            self.watcher.stop()
            self.watcher = None

    def sync(self) -> None:
        """Bring the policy to the state and the pod cache now, and write the pods it changed (and
        the shared folders when the pool moved)."""
        watcher = self.watcher
        if watcher is None:
            return
        with self.pinner.lock, watcher.lock:
            before = self.policy
            self.policy = after = self._snapshot(self.pinner.state())
            moved = after.pool != before.pool
            try:
                if moved:  # the folders and every pod in them
                    watcher.keep_shared()
                for uid, pod in watcher.pods().items():
                    answer_moved = after.pods.get(uid) != before.pods.get(uid)
                    if (pod.qos is QOSClass.GUARANTEED and moved) or answer_moved:
                        watcher.write_pod(uid)
            except EnforcementError as exc:  # the watcher rewrites what drifts; the next sync again
                log.warning("pod cgroups: %s", exc)

    # -- the engine's ordered step ----------------------------------------------------------------

    @contextmanager
    def _outer(self, state: State) -> Iterator[OuterTargets]:
        """The QoS folders' and pod cgroups' targets under `state` (the policy taken from it), the
        watcher held until the engine has written them (`PinningEngine.outer`)."""
        watcher = self.watcher
        if watcher is None:
            yield {}, {}
            return
        with watcher.lock:  # the caller holds the pinner's lock (every engine call does)
            self.policy = self._snapshot(state)
            targets = watcher.shared_targets()
            for uid, pod in watcher.pods().items():
                if pod.qos is QOSClass.GUARANTEED:
                    targets.append((pod.path, *(self.pod_cpuset(uid) or (self.policy.pool, EMPTY))))
            # A pod cgroup the kubelet removed before the watch told us (a pod going) has nothing to
            # write: without this, its write would fail the whole step, and with it the pod change.
            layout = self.engine.layout
            yield subtrees_targets(layout, [t for t in targets if exists(layout, t[0])])

    def _snapshot(self, state: State) -> PodCpusets:
        return pod_cpusets(state, dict(self.pinner.pods), self.pinner.pool(state))
