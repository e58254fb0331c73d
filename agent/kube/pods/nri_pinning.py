"""The NRI route's answers: a container's exclusive CPUs in force before it runs.

`NRIPinning` is the `agent.nri.plugin.Handler` registered on the runtime's socket.  It decides with
the pod watch's rules and pins through its `PodPinner` (one engine, one state file, one allocation
id per container).  A refusal gives the container the shared pool; an internal error fails
CreateContainer only for a container asking for exclusive CPUs.  Every call holds
`PodPinner.lock` with a deadline of `LOCK_SECONDS`, inside NRI's 2 s timeout (README.md).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from agent.api.podplan import ContainerPlan, PodPlan
from agent.enforce.state import State
from agent.errors import TopoletError
from agent.kube.pods.nri_pods import KubeletContainer, cached_decision, kubelet_container, plan_from_nri
from agent.kube.pods.pinner import PodPinner
from agent.nri import api_pb2
from agent.nri.plugin import Handler, cpuset_adjustment, cpuset_update, event_mask
from agent.topology.cpuset import CPUSet

log = logging.getLogger("topolet.kube.nri")

LOCK_SECONDS = 1.0  # the longest a request waits for the enforcer thread (NRI's timeout is 2 s)
_LIVE = (api_pb2.CONTAINER_CREATED, api_pb2.CONTAINER_RUNNING, api_pb2.CONTAINER_PAUSED)


class PinnerBusy(TopoletError):
    """The pod cache stayed busy past the request's deadline."""


class NRIPinning(Handler):
    """The agent's NRI plugin: pins containers as the runtime creates them (module docstring)."""

    def __init__(self, pinner: PodPinner, node: str, *, lock_seconds: float = LOCK_SECONDS,
                 cgroup_root: str = "") -> None:
        self.pinner = pinner
        self.node = node
        self.cgroup_root = cgroup_root  # the agent's cpuset root inside the hierarchy (hierarchy_path)
        self.lock_seconds = lock_seconds
        self.runtime = ""  # "<name> <version>" from Configure
        self.known: dict[str, KubeletContainer] = {}  # runtime container id → live kubelet container

    # -- the runtime's requests ------------------------------------------------------------------

    def configure(self, request: api_pb2.ConfigureRequest) -> int:
        self.runtime = f"{request.runtime_name} {request.runtime_version}".strip()
        return event_mask(api_pb2.CREATE_CONTAINER, api_pb2.UPDATE_CONTAINER, api_pb2.STOP_CONTAINER,
                          api_pb2.REMOVE_CONTAINER)

    def synchronize(self, pods: Sequence[api_pb2.PodSandbox],
                    containers: Sequence[api_pb2.Container]) -> Sequence[api_pb2.ContainerUpdate]:
        started = time.time()
        sandboxes = {p.id: p for p in pods}
        self.known.clear()
        live: list[tuple[str, KubeletContainer, PodPlan, ContainerPlan]] = []
        for ctr in containers:
            pod = sandboxes.get(ctr.pod_sandbox_id)
            live_ctr = pod is not None and ctr.state in _LIVE
            ref = kubelet_container(pod, ctr, self.cgroup_root) if pod is not None and live_ctr else None
            if pod is None or ref is None:
                continue
            self.known[ctr.id] = ref
            live.append((ctr.id, ref, *self._decide(pod, ctr, ref)))
        pinned = 0
        with self._pinning():
            # First free what stopped while the agent was away (the runtime no longer has it)...
            running = {(ref.pod_uid, ref.name) for _, ref, _, _ in live}
            for a in self.pinner.state().allocations:
                uid, name = a.owner.pod_uid, a.owner.container
                if uid and name and (uid, name) not in running and a.created_at < started:
                    self.pinner.release_container(uid, name, a.cgroup)
            # ...then pin what runs.
            for _, ref, plan, c in live:
                try:
                    pinned += self.pinner.pin_container(plan, c, ref.cgroup) is not None
                except TopoletError as exc:  # stays on the pool; the watch path tries again
                    log.error("NRI synchronize: %s/%s container %s: %s", ref.namespace, ref.pod_name,
                              ref.name, exc)
            state = self.pinner.state()
        pool = self.pinner.pool(state)
        log.info("NRI synchronize with %s: %d kubelet containers, %d on exclusive CPUs",
                 self.runtime or "the runtime", len(live), pinned)
        return [self._cpuset_update(cid, ref, state, pool) for cid, ref, _, _ in live]

    def create_container(
        self, pod: api_pb2.PodSandbox, container: api_pb2.Container,
    ) -> tuple[api_pb2.ContainerAdjustment | None, Sequence[api_pb2.ContainerUpdate]]:
        ref = kubelet_container(pod, container, self.cgroup_root)
        if ref is None:
            return None, ()
        self.known[container.id] = ref
        plan, c = self._decide(pod, container, ref)
        try:
            with self._pinning():
                before = self.pinner.pool(self.pinner.state())
                alloc = self.pinner.pin_container(plan, c, ref.cgroup)
                state = self.pinner.state()
        except TopoletError as exc:
            if c.exclusive:
                log.error("NRI: pod %s/%s container %s: not created: %s", ref.namespace, ref.pod_name,
                          ref.name, exc)
                raise  # the runtime fails the container; the kubelet creates it again
            log.warning("NRI: pod %s/%s container %s left unadjusted: %s", ref.namespace, ref.pod_name,
                        ref.name, exc)
            return None, ()
        pool = self.pinner.pool(state)
        if alloc is None:
            adjust = cpuset_adjustment(pool.cpulist())
        else:
            adjust = cpuset_adjustment(alloc.cpus.cpulist(), alloc.mems.cpulist() if alloc.mems else "")
        return adjust, self._pool_updates(state, pool, before, skip=container.id)

    def update_container(self, pod: api_pb2.PodSandbox, container: api_pb2.Container,
                         resources: api_pb2.LinuxResources) -> Sequence[api_pb2.ContainerUpdate]:
        ref = self.known.get(container.id) or kubelet_container(pod, container, self.cgroup_root)
        if ref is None:
            return ()
        state = self.pinner.state()
        return [self._cpuset_update(container.id, ref, state, self.pinner.pool(state), ignore_failure=False)]

    def stop_container(self, pod: api_pb2.PodSandbox,
                       container: api_pb2.Container) -> Sequence[api_pb2.ContainerUpdate]:
        ref = self.known.pop(container.id, None) or kubelet_container(pod, container, self.cgroup_root)
        if ref is None:
            return ()
        try:
            with self._pinning():
                before = self.pinner.pool(self.pinner.state())
                self.pinner.release_container(ref.pod_uid, ref.name, ref.cgroup)
                state = self.pinner.state()
        except TopoletError as exc:  # the watch path releases it once the pod status says it stopped
            log.error("NRI: pod %s/%s container %s: release failed: %s", ref.namespace, ref.pod_name,
                      ref.name, exc)
            return ()
        return self._pool_updates(state, self.pinner.pool(state), before, skip=container.id)

    def remove_container(self, pod: api_pb2.PodSandbox, container: api_pb2.Container | None) -> None:
        if container is None:
            return
        ref = self.known.pop(container.id, None) or kubelet_container(pod, container, self.cgroup_root)
        if ref is None:
            return
        try:
            with self._pinning():
                self.pinner.release_container(ref.pod_uid, ref.name, ref.cgroup)
        except TopoletError as exc:
            log.error("NRI: pod %s/%s container %s: release failed: %s", ref.namespace, ref.pod_name,
                      ref.name, exc)

    def shutdown(self) -> None:
        log.info("NRI: %s is shutting down", self.runtime or "the runtime")

    # -- helpers ----------------------------------------------------------------------------------

    @contextmanager
    def _pinning(self) -> Iterator[None]:
        if not self.pinner.lock.acquire(timeout=self.lock_seconds):
            raise PinnerBusy(f"the pod cache stayed busy for {self.lock_seconds} s")
        try:
            yield
        finally:
            self.pinner.lock.release()

    def _decide(self, pod: api_pb2.PodSandbox, container: api_pb2.Container,
                ref: KubeletContainer) -> tuple[PodPlan, ContainerPlan]:
        """The pod watch's decision for the container: its cached plan's, else one made from NRI.

        The cache is read without the lock: `pods` maps uids to immutable plans, replaced whole,
        and one `dict.get` is atomic.
        """
        plan = self.pinner.pods.get(ref.pod_uid)
        if plan is None:
            return plan_from_nri(pod, container, ref, self.node)
        c = cached_decision(plan, ref)
        if c is None:  # not a regular container of the spec (an init or ephemeral one): the pool
            c = ContainerPlan(ref.name, ref.container_id)
        return plan, c

    def _cpuset_update(self, container_id: str, ref: KubeletContainer, state: State, pool: CPUSet, *,
                       ignore_failure: bool = True) -> api_pb2.ContainerUpdate:
        """The cpuset `container_id` should have now: its allocation's, else the pool."""
        held = self.pinner.holding(state, ref.pod_uid, ref.name, ref.cgroup)
        if held is None:
            update = cpuset_update(container_id, pool.cpulist())
        else:
            mems = held.mems.cpulist() if held.mems else ""
            update = cpuset_update(container_id, held.cpus.cpulist(), mems)
        update.ignore_failure = ignore_failure  # a container may stop meanwhile
        return update

    def _pool_updates(self, state: State, pool: CPUSet, before: CPUSet,
                      skip: str) -> list[api_pb2.ContainerUpdate]:
        """Every other shared container the runtime runs, given `pool` when it differs from `before`."""
        if pool == before:
            return []
        out = []
        for cid, ref in self.known.items():
            if cid != skip and self.pinner.holding(state, ref.pod_uid, ref.name, ref.cgroup) is None:
                update = cpuset_update(cid, pool.cpulist())
                update.ignore_failure = True
                out.append(update)
        return out

