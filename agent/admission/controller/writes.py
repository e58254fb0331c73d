"""The write path of a decision pass: Job and pod patches as the leader, and the Events about each Job.

`JobWrites(kube, jobs, pods, metrics, identity, leader, changed, clock)`: `.admit`, `.reject`,
`.requeue`, `.requeue_lost`, `.unpin`, `.place`, `.holds`, `.wait`, `.invalid`, `.submit`, `.drain`,
`.reap`, `.check_leader()`; `WRITERS`, `CRASH_ENV`, `CRASH_STEPS`, `crash_point(step)`.  Only the
leader writes, checked before every write; each patch carries its resourceVersion, and a 409 on a
still-undecided Job is retried with the fresh one.
Pools, retries and Events: agent/admission/controller/README.md, "Writes".
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from agent.admission.cluster.store import Reflector
from agent.admission.engine.model import Placement
from agent.admission.gangs.record import AdmissionRecord, SlotPlacement, admitted_record
from agent.admission.gangs.shape import job_shape
from agent.admission.jobs.jobread import JobRead
from agent.admission.jobs.patches import (
    MERGE_PATCH,
    decision_patch,
    job_started,
    lost_patch,
    pod_patch,
    reject_patch,
    requeue_patch,
    restart_patch,
    still_undecided,
    unpin_patch,
)
from agent.admission.report.events import ObjectEvents, ToldReasons, timestamp
from agent.admission.report.metrics import AdmissionMetrics
from agent.api.objects import metadata_of, namespaced_name, object_key
from agent.errors import KubeAPIError
from agent.kubeapi.client import KubeClient, resource_path
from agent.kubeapi.leader import LeaderElector, NotLeader

log = logging.getLogger(__name__)

CRASH_ENV = "TOPOLET_CONTROLLER_CRASH_AT"
CRASH_STEPS = ("after-decision", "after-unsuspend", "after-pod-patch")
# API writes in flight at once during a pass (Job patches), and pod patches apart: each waits ~0.1 s
# on a busy API server, so this many keep up with Jobs created at a few hundred per second.
WRITERS = 32
CONFLICT_RETRIES = 3  # a Job write re-read and retried this often on 409 before the next pass


def crash_point(step: str) -> None:
    """SIGKILL this process at `step` when the kill tests ask for it (env TOPOLET_CONTROLLER_CRASH_AT)."""
    if os.environ.get(CRASH_ENV) == step:
        log.warning("%s=%s: killing myself", CRASH_ENV, step)
        os.kill(os.getpid(), signal.SIGKILL)


class JobWrites:
    """The write pools, the writes and the Events of the Job route (see README.md beside this module)."""

    def __init__(self, kube: KubeClient, jobs: Reflector, pods: Reflector, metrics: AdmissionMetrics,
                 identity: str, leader: LeaderElector | None, changed: threading.Event,
                 clock: Callable[[], float] = time.time) -> None:
        self.kube = kube
        self.jobs = jobs
        self.pods = pods
        self.metrics = metrics
        self.leader = leader
        self.changed = changed
        self.clock = clock
        self.events = ObjectEvents(kube, identity, on_drop=metrics.events_dropped.inc)
        # Said once per state, so Events are not repeated every pass: Job uid -> last waiting reason,
        # and (uid, resourceVersion) of Jobs already told they are malformed.
        self._waiting = ToldReasons()
        self._invalid: set[tuple[str, str]] = set()
        self._pool = ThreadPoolExecutor(WRITERS, thread_name_prefix="admission-write")
        # Pod patches run on their own pool and outlive the pass that sent them, so the next pass
        # (new Jobs admitted, newly made pods) overlaps them; `_placing` keeps a pod from being sent
        # twice meanwhile.  Their failures surface at the start of the next pass (`reap`).
        self._pod_pool = ThreadPoolExecutor(WRITERS, thread_name_prefix="admission-pods")
        self._pod_writes: list[Future[Any]] = []
        self._placing: set[str] = set()
        self._placing_lock = threading.Lock()
        self._writes: list[Future[Any]] = []  # this pass's writes in flight (drained before it ends)
        self.written = 0  # writes submitted this pass (logged)
        self.conflicts = 0  # writes refused with 409 since the start (logged; under _placing_lock)

    def shutdown(self) -> None:
        """Wait for the writes in flight; take no more."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._pod_pool.shutdown(wait=True, cancel_futures=True)

    def leading(self) -> bool:
        return self.leader is None or self.leader.is_leader

    def check_leader(self) -> None:
        if not self.leading():
            raise NotLeader()

    # -- the pools ----------------------------------------------------------------------------------

    def submit(self, work: Callable[..., Any], *args: Any) -> Future[Any]:
        """Run `work(*args)` on the write pool; the pass waits for it before it ends."""
        future = self._pool.submit(work, *args)
        self._writes.append(future)
        self.written += 1
        return future

    def drain(self) -> None:
        """Wait for every write of this pass; re-raise the first failure (NotLeader included)."""
        writes, self._writes = self._writes, []
        first: BaseException | None = None
        for future in writes:
            exc = future.exception()
            if exc is not None and first is None:
                first = exc
        if first is not None:
            raise first

    def reap(self) -> None:
        """Forget finished pod patches; re-raise the first failure among them (NotLeader included)."""
        done = [f for f in self._pod_writes if f.done()]
        self._pod_writes = [f for f in self._pod_writes if not f.done()]
        for future in done:
            exc = future.exception()
            if exc is not None:
                raise exc

    # -- one write ----------------------------------------------------------------------------------

    def patch(self, store: Reflector, path: str, body: Mapping[str, Any], what: str,
               again: Callable[[dict[str, Any]], Mapping[str, Any] | None] | None = None,
               ) -> dict[str, Any] | None:
        """A merge patch as the leader; the response goes into the store.  None on a vanished object
        (404) or a conflict (409): the next pass sees the newer state and decides again.

        With `again`, a conflict re-reads the object (into the store) and asks `again(fresh)` for the
        body to send now, up to CONFLICT_RETRIES times; None from it means the write no longer
        applies (someone else decided)."""
        for attempt in range(CONFLICT_RETRIES + 1):
            self.check_leader()
            try:
                out = self.kube.patch(path, body, MERGE_PATCH, what=what)
            except KubeAPIError as exc:
                if exc.status not in (404, 409):
                    raise
                if exc.status == 409:
                    self.metrics.write_conflicts.inc()
                    with self._placing_lock:
                        self.conflicts += 1
                if exc.status == 409 and again is not None and attempt < CONFLICT_RETRIES:
                    fresh = self._reread(store, path, what)
                    retry = again(fresh) if fresh is not None else None
                    if retry is not None:
                        body = retry
                        continue
                    return None
                log.info("%s: %s (retried on the next pass)", what, exc)
                self.changed.set()
                return None
            store.put(out)
            return out
        return None

    def _reread(self, store: Reflector, path: str, what: str) -> dict[str, Any] | None:
        """The object at `path` now (also put into the store); None when it is gone."""
        try:
            fresh = self.kube.get(path, what=f"re-read to {what}")
        except KubeAPIError as exc:
            if exc.status == 404:
                return None
            raise
        if not isinstance(fresh, dict):
            return None
        store.put(fresh)
        return fresh

    # -- the Job writes -----------------------------------------------------------------------------

    def admit(self, job: dict[str, Any], placement: Placement) -> bool:
        pods = sorted(placement.pods, key=lambda p: (p.pod_set, p.index))
        record = admitted_record(placement, uuid.uuid4().hex, timestamp(self.clock()), job_shape(job))
        out = self.patch(self.jobs, _job_path(job), decision_patch(job, record),
                          f"record the admission of Job {namespaced_name(job)}",
                          again=lambda fresh: _still_pending(job, fresh, decision_patch, record))
        if out is None:
            return False
        # The decision, the gate and the unsuspend are one write, so both steps fall after it.
        crash_point("after-decision")
        crash_point("after-unsuspend")
        self.metrics.decisions.labels(result="admitted").inc()
        self._waiting.forget(str(metadata_of(job).get("uid")))
        nodes = sorted({p.node for p in pods})
        self.events.record(out, "Normal", "Admitted",
                           f"{len(pods)} pods placed on {len(nodes)} nodes ({', '.join(nodes[:8])}"
                           f"{', ...' if len(nodes) > 8 else ''}); decision {record.decision}")
        return True

    def requeue(self, job: dict[str, Any], why: str) -> bool:
        """Remove an admission record not trusted (`why`) from a suspended Job, which is then decided
        again like any queued Job; a Warning Event says so."""
        out = self.patch(self.jobs, _job_path(job), requeue_patch(job),
                          f"remove the untrusted admission record of Job {namespaced_name(job)}")
        if out is None:
            return False
        self.events.record(out, "Warning", "UntrustedAdmissionRecord",
                           f"{why}: the record was removed and the Job is queued again")
        return True

    def requeue_lost(self, job: dict[str, Any], gone: list[str]) -> bool:
        """Suspend an admitted Job whose pods cannot be placed, its record naming nodes that are gone,
        and remove the record (`lost_patch`); a Warning Event says so."""
        out = self.patch(self.jobs, _job_path(job), lost_patch(job),
                          f"queue Job {namespaced_name(job)} again (its node is gone)")
        if out is None:
            return False
        self.events.record(out, "Warning", "NodeGone",
                           f"node {', '.join(gone[:8])} of its admission is gone before its pods were "
                           "bound: the Job is suspended and queued again")
        return True

    def unpin(self, job: dict[str, Any], nodes: frozenset[str]) -> bool:
        """Make a Job queued again (after `requeue_lost`) decidable: clear its start time, then remove
        what our earlier decision left in its template (one write a pass)."""
        if job_started(job):
            out = self.patch(self.jobs, _job_path(job) + "/status", restart_patch(job),
                              f"clear the start time of Job {namespaced_name(job)}")
        else:
            body = unpin_patch(job, nodes)
            out = None if body is None else self.patch(
                self.jobs, _job_path(job), body, f"restore the template of Job {namespaced_name(job)}")
        return out is not None

    def reject(self, job: dict[str, Any], reason: str) -> bool:
        record = AdmissionRecord("rejected", uuid.uuid4().hex, timestamp(self.clock()), reason=reason)
        out = self.patch(self.jobs, _job_path(job), reject_patch(job, record),
                          f"record the rejection of Job {namespaced_name(job)}",
                          again=lambda fresh: _still_pending(job, fresh, reject_patch, record))
        if out is None:
            return False
        self.metrics.decisions.labels(result="rejected").inc()
        self.events.record(out, "Warning", "Rejected", f"can never fit this cluster: {reason}")
        return True

    def holds(self, job: dict[str, Any], read: JobRead) -> bool:
        """Whether the admitted Job `read` holds its slots: its record is trusted and it was not
        suspended again since (its admitting write unsuspended it).  Neither kind is unsuspended here:
        one with a record not trusted is queued again while suspended, else only told why its pods are
        not placed; one suspended after its admission stays so, its slots released."""
        if read.distrusted is not None and read.suspended:
            self.check_leader()
            self.submit(self.requeue, job, read.distrusted)
        elif read.distrusted is not None:
            self.invalid(job, "UntrustedAdmissionRecord", f"{read.distrusted}: its pods are not placed")
        elif read.suspended:
            self.invalid(job, "SuspendedAfterAdmission",
                         "suspended after its admission: it stays suspended and its slots are released; "
                         "delete and re-create it to queue it again")
        return read.distrusted is None and not read.suspended

    # -- pod placement ------------------------------------------------------------------------------

    def place(self, pod: Mapping[str, Any], slot: int, place: SlotPlacement) -> None:
        """Pin the gated `pod` to its `slot` on the pod pool, unless its patch is still in flight."""
        uid = str(metadata_of(pod).get("uid"))
        with self._placing_lock:
            if uid in self._placing:
                return  # its patch is still in flight
            self._placing.add(uid)
        self.check_leader()
        self._pod_writes.append(self._pod_pool.submit(self._place_pod, pod, slot, place))
        self.written += 1

    def _place_pod(self, pod: Mapping[str, Any], slot: int, place: SlotPlacement) -> None:
        meta = metadata_of(pod)
        try:
            out = self.patch(self.pods, resource_path("", "v1", "pods", str(meta.get("name")),
                                                       namespace=str(meta.get("namespace"))),
                              pod_patch(pod, place.node, place.zone_value()),
                              f"place pod {object_key(pod)} (slot {slot}) on {place.node}")
        finally:
            with self._placing_lock:
                self._placing.discard(str(meta.get("uid")))
        if out is not None:
            self.metrics.pods_patched.inc()
            crash_point("after-pod-patch")

    # -- Events -------------------------------------------------------------------------------------

    def wait(self, job: dict[str, Any], reason: str, involved: tuple[str, str] | None = None) -> None:
        """Count a "not now" decision; a Waiting Event when its reason is not the one last told
        (on a Job, or the kind `involved` names)."""
        self.metrics.decisions.labels(result="waiting").inc()
        uid = str(metadata_of(job).get("uid"))
        if not self._waiting.changed(uid, reason):
            return
        self.check_leader()
        self.events.record(job, "Normal", "Waiting", reason, involved=involved)

    def invalid(self, job: Mapping[str, Any], reason: str, message: str,
                involved: tuple[str, str] | None = None) -> None:
        """A Warning Event once per Job version (or version of the kind `involved` names); the object
        itself is left as it is."""
        meta = metadata_of(job)
        key = (str(meta.get("uid")), str(meta.get("resourceVersion")))
        if key in self._invalid:
            return
        self._invalid.add(key)
        kind = involved[1] if involved else "Job"
        log.warning("%s %s: %s: %s", kind, namespaced_name(job), reason, message)
        self.metrics.decisions.labels(result="error").inc()
        self.metrics.invalid_objects.labels(kind=kind).inc()
        self.check_leader()
        self.events.record(job, "Warning", reason, message, involved=involved)

    def retain(self, uids: set[str]) -> None:
        """Forget what was said about Jobs not among `uids`, so the memory stays bounded by the queue."""
        self._waiting.retain(uids)
        self._invalid = {key for key in self._invalid if key[0] in uids}


def _job_path(job: Mapping[str, Any]) -> str:
    meta = metadata_of(job)
    return resource_path("batch", "v1", "jobs", str(meta.get("name")), namespace=str(meta.get("namespace")))


def _still_pending(job: Mapping[str, Any], fresh: Mapping[str, Any],
                   patch: Callable[[Mapping[str, Any], AdmissionRecord], dict[str, Any]],
                   record: AdmissionRecord) -> dict[str, Any] | None:
    """`patch(fresh, record)` when the re-read Job is still the one decided on; else None."""
    return patch(fresh, record) if still_undecided(job, fresh) else None
