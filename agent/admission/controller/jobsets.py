"""The native route for JobSets and TrainJobs: one labelled `topolet.io/queue`, created suspended, is a gang.

`JobSetRoute(kube, changed, metrics, writes, queues)`: `.reflectors` (JobSets and the queued
TrainJobs, list+watch; a cluster that serves neither has none), `.collect(pods_of, priorities,
limit_defaults) -> JobSetPass` (the admitted ones' ledger entries and pod slots, their gated pods sent
to their slots, the pending ones as gangs), `.admit(obj, placement)`, `.reject(obj, reason)`.
A JobSet is queued on itself; a TrainJob on itself, shaped by the JobSet Kubeflow Trainer makes for it
(`FRONTS`).  Either is admitted whole, in one write (record, templates or runtime patch, unsuspend);
its pods are placed by rank (`agent.admission.gangs.jobset`); it is released when it finishes, is
suspended again or is deleted.  One object that cannot be read costs only itself.
agent/admission/jobs/README.md, "JobSets and TrainJobs".
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agent.admission.cluster.capacity import Admitted as Held
from agent.admission.cluster.store import Reflector
from agent.admission.controller.writes import JobWrites, crash_point
from agent.admission.engine.model import Placement, Resources
from agent.admission.gangs.job import (
    ADMISSION_ANNOTATION,
    QUEUE_LABEL,
    JobSpecError,
    gang_requests,
    job_queue,
    job_suspended,
)
from agent.admission.gangs.jobset import (
    JOBSET,
    JOBSET_GROUP,
    JOBSET_PLURAL,
    JOBSET_VERSION,
    TRAINJOB,
    TRAINJOB_GROUP,
    TRAINJOB_PLURAL,
    TRAINJOB_VERSION,
    block_record,
    controller_uid,
    gang_from_jobset,
    jobset_finished,
    jobset_owner,
    jobset_queued_key,
    jobset_shape,
    jobset_slots,
    part_key,
    trainjob_finished,
    trainjob_key,
)
from agent.admission.gangs.limitrange import NO_DEFAULTS, ContainerDefaults
from agent.admission.gangs.record import AdmissionRecord, admitted_record, record_of
from agent.admission.jobs.jobset_patches import (
    jobset_decision_patch,
    jobset_still_undecided,
    trainjob_decision_patch,
    trainjob_placement_patch,
    trainjob_still_undecided,
)
from agent.admission.jobs.patches import reject_patch, requeue_patch
from agent.admission.jobs.queues import Pending, QueueConfig, queue_refusal
from agent.admission.report.events import timestamp
from agent.admission.report.metrics import AdmissionMetrics
from agent.api.objects import as_dict, metadata_of, namespaced_name, object_key
from agent.kubeapi.client import KubeClient, resource_path
from agent.kubeapi.leader import NotLeader

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Front:
    """A kind queued on this route: the object that carries the queue label, the record and
    `spec.suspend`, and how it is keyed, finished and admitted (its JobSet gives the gang's shape)."""

    kind: tuple[str, str]  # (apiVersion, kind): its Events' involved object
    resource: tuple[str, str, str]  # group, version, plural
    key: Callable[[Mapping[str, Any]], str]
    finished: Callable[[Mapping[str, Any]], bool]
    decision: Callable[[Mapping[str, Any], Mapping[str, Any], AdmissionRecord], dict[str, Any]]
    undecided: Callable[[Mapping[str, Any], Mapping[str, Any]], bool]
    # A write before the decision's, on the still suspended object (a TrainJob's runtime patch).
    prepare: Callable[[Mapping[str, Any], Mapping[str, Any], AdmissionRecord], dict[str, Any]] | None = None

    @property
    def name(self) -> str:
        return self.kind[1]

    def path(self, obj: Mapping[str, Any]) -> str:
        meta = metadata_of(obj)
        return resource_path(*self.resource, str(meta.get("name")), namespace=str(meta.get("namespace")))


JOBSET_FRONT = Front(JOBSET, (JOBSET_GROUP, JOBSET_VERSION, JOBSET_PLURAL), jobset_queued_key,
                     jobset_finished, lambda js, _body, record: jobset_decision_patch(js, record),
                     jobset_still_undecided)
TRAINJOB_FRONT = Front(TRAINJOB, (TRAINJOB_GROUP, TRAINJOB_VERSION, TRAINJOB_PLURAL), trainjob_key,
                       trainjob_finished, trainjob_decision_patch, trainjob_still_undecided,
                       trainjob_placement_patch)
FRONTS = (JOBSET_FRONT, TRAINJOB_FRONT)


@dataclass
class JobSetPass:
    """What a pass takes in of the queued JobSets and TrainJobs: ledger entries of the admitted ones (one
    per replicated Job), their pods' slots (pod uid -> (entry key, slot)), the pending gangs and their
    objects by gang key, and every uid seen (what was said about the others is forgotten)."""

    held: list[Held] = field(default_factory=list)
    pod_slots: dict[str, tuple[str, str]] = field(default_factory=dict)
    pending: list[Pending] = field(default_factory=list)
    by_key: dict[str, dict[str, Any]] = field(default_factory=dict)
    uids: set[str] = field(default_factory=set)


class JobSetRoute:
    """The queued JobSets and TrainJobs of a decision pass (see the module docstring)."""

    def __init__(self, kube: KubeClient, changed: threading.Event, metrics: AdmissionMetrics,
                 writes: JobWrites, queues: Mapping[str, QueueConfig]) -> None:
        self.writes = writes
        self.metrics = metrics
        self.queues = queues
        # Every JobSet: a queued one is a gang, and a TrainJob's is its shape (Trainer copies no label).
        self.jobsets = Reflector(kube, resource_path(JOBSET_GROUP, JOBSET_VERSION, JOBSET_PLURAL), "JobSets",
                                 changed, matters=_change_matters,
                                 on_invalid=metrics.invalid_objects.labels(kind="JobSet").inc)
        self.trainjobs = Reflector(kube, resource_path(TRAINJOB_GROUP, TRAINJOB_VERSION, TRAINJOB_PLURAL),
                                   "queued TrainJobs", changed, {"labelSelector": QUEUE_LABEL},
                                   matters=_change_matters,
                                   on_invalid=metrics.invalid_objects.labels(kind="TrainJob").inc)
        self.reflectors: tuple[Reflector, ...] = (self.jobsets, self.trainjobs)
        self._decided: dict[str, tuple[Front, dict[str, Any]]] = {}  # gang key -> (front, its JobSet)
        self._told_refused: set[tuple[str, str]] = set()  # (pod uid, why) told, while the pod is there

    # -- a pass -------------------------------------------------------------------------------------

    def collect(self, pods_of: Callable[[tuple[str, str]], Sequence[Mapping[str, Any]]],
                priorities: tuple[Mapping[str, int], int],
                limit_defaults: Mapping[str, ContainerDefaults]) -> JobSetPass:
        """`pods_of((namespace, JobSet uid))`: the pods labelled with that JobSet (`jobset_keys`)."""
        out = JobSetPass()
        jobsets = sorted(self.jobsets.snapshot(), key=object_key)
        of_trainjob = {uid: js for js in jobsets if (uid := controller_uid(js, TRAINJOB)) is not None}
        queued: list[tuple[Front, dict[str, Any], dict[str, Any] | None]] = [
            (JOBSET_FRONT, js, js) for js in jobsets if job_queue(js) is not None]
        queued += [(TRAINJOB_FRONT, tj, of_trainjob.get(str(metadata_of(tj).get("uid"))))
                   for tj in sorted(self.trainjobs.snapshot(), key=object_key)]
        self._decided = {}
        refused: set[tuple[str, str]] = set()
        for front, obj, js in queued:
            meta = metadata_of(obj)
            out.uids.add(str(meta.get("uid")))
            ns = str(meta.get("namespace"))
            try:
                if front is JOBSET_FRONT and controller_uid(obj, TRAINJOB) is not None:
                    self.writes.invalid(obj, "InvalidJobSet", "it is the JobSet of a TrainJob: queue the "
                                        "TrainJob (topolet.io/queue on it), not its JobSet", involved=JOBSET)
                    continue
                mine: list[Mapping[str, Any]] = []
                if js is not None:
                    mine += pods_of((ns, str(metadata_of(js).get("uid"))))
                self._one(front, obj, js, mine, priorities, limit_defaults.get(ns, NO_DEFAULTS), out,
                          refused)
            except NotLeader:
                raise
            except Exception as exc:  # noqa: BLE001 - whatever a tenant wrote, the pass goes on
                log.error("%s %s skipped: %s", front.name, object_key(obj), exc,
                          exc_info=not isinstance(exc, JobSpecError))
                self.writes.invalid(obj, f"Invalid{front.name}",
                                    f"cannot be read: {str(exc)[:200] or type(exc).__name__}",
                                    involved=front.kind)
        self._told_refused &= refused
        return out

    def _one(self, front: Front, obj: dict[str, Any], js: dict[str, Any] | None,
             pods: list[Mapping[str, Any]], priorities: tuple[Mapping[str, int], int],
             defaults: ContainerDefaults, out: JobSetPass, refused: set[tuple[str, str]]) -> None:
        queue = job_queue(obj)
        if queue is None:
            return
        try:
            record = record_of(obj)
        except JobSpecError as exc:
            self.writes.invalid(obj, "InvalidAdmissionRecord", str(exc), involved=front.kind)
            return
        if record is not None:
            if (record.result == "admitted" and not front.finished(obj) and js is not None
                    and not jobset_finished(js) and self._holds(front, obj, js, record)):
                self._hold(front, obj, js, record, pods, defaults, out, refused)
            return
        refused_queue = queue_refusal(self.queues, queue, str(metadata_of(obj).get("namespace")))
        if refused_queue is not None:
            self.writes.invalid(obj, refused_queue.reason, refused_queue.message, involved=front.kind)
            return
        if not job_suspended(obj):
            self.writes.invalid(obj, "NotSuspended", f"a queued {front.name} must be created with "
                                "spec.suspend: true; left alone", involved=front.kind)
            return
        if js is None:  # a TrainJob whose JobSet Trainer has not made yet: its shape comes with it
            return
        try:
            gang = gang_from_jobset(js, priorities[0], default_priority=priorities[1],
                                    limit_defaults=defaults, key=front.key(obj))
        except JobSpecError as exc:
            self.writes.invalid(obj, f"Invalid{front.name}", str(exc), involved=front.kind)
            return
        out.by_key[gang.key] = obj
        self._decided[gang.key] = (front, js)
        meta = metadata_of(obj)
        out.pending.append(Pending(gang, queue, str(meta.get("creationTimestamp") or ""),
                                   str(meta.get("name"))))

    def _holds(self, front: Front, obj: dict[str, Any], js: Mapping[str, Any],
               record: AdmissionRecord) -> bool:
        """Whether the admitted object holds its slots: its record is ours for it as it is now, and it
        was not suspended again since (as `JobWrites.holds` for a Job)."""
        distrusted = None
        if record.shape != jobset_shape(js):
            distrusted = (f"its admission record was not written for this {front.name} as it is now "
                          "(another one, or replicas or pod resources changed since)")
        suspended = job_suspended(obj)
        if distrusted is not None and suspended:
            self.writes.check_leader()
            self.writes.submit(self._requeue, front, obj, distrusted)
        elif distrusted is not None:
            self.writes.invalid(obj, "UntrustedAdmissionRecord", f"{distrusted}: its pods are not placed",
                                involved=front.kind)
        elif suspended:
            self.writes.invalid(obj, "SuspendedAfterAdmission",
                                "suspended after its admission: it stays suspended and its slots are "
                                "released; delete and re-create it to queue it again", involved=front.kind)
        return distrusted is None and not suspended

    def _hold(self, front: Front, obj: dict[str, Any], js: dict[str, Any], record: AdmissionRecord,
              pods: list[Mapping[str, Any]], defaults: ContainerDefaults, out: JobSetPass,
              refused: set[tuple[str, str]]) -> None:
        """The admitted object's ledger entries, its pods' slots, and its gated pods sent to theirs."""
        owner = jobset_owner(js, defaults)
        key = front.key(obj)
        for name, (base, rjob, _) in owner.parts.items():
            out.held.append((part_key(key, name), block_record(record, base, rjob.count),
                             _requests(self, front, obj, rjob.job, defaults)))
        assignment = jobset_slots(owner, record.slots, pods)
        for pod, slot in assignment.place:
            self.writes.place(pod, slot, record.slots[slot])
        starts = sorted((base, name) for name, (base, _, _) in owner.parts.items())
        for uid, slot in assignment.held.items():
            base, name = max((b, n) for b, n in starts if b <= slot)
            out.pod_slots[uid] = (part_key(key, name), str(slot - base))
        for pod, why in assignment.refused:
            told = (str(metadata_of(pod).get("uid")), why)
            refused.add(told)
            if told in self._told_refused:
                continue
            self._told_refused.add(told)
            self.metrics.invalid_objects.labels(kind="Pod").inc()
            log.warning("pod %s gets no slot of %s %s: %s", object_key(pod), front.name, object_key(obj), why)
            self.writes.events.record(obj, "Warning", "ForeignPod",
                                      f"pod {str(metadata_of(pod).get('name'))[:253]} gets no slot: {why}",
                                      involved=front.kind)

    # -- writes -------------------------------------------------------------------------------------

    def admit(self, obj: dict[str, Any], placement: Placement) -> bool:
        front, js = self._decided[placement.gang]
        record = admitted_record(placement, uuid.uuid4().hex, timestamp(self.writes.clock()),
                                 jobset_shape(js))
        what = f"record the admission of {front.name} {namespaced_name(obj)}"
        prepare = front.prepare
        if prepare is not None:
            prepared = self.writes.patch(self._store(front), front.path(obj), prepare(obj, js, record),
                                         f"place the pods of {front.name} {namespaced_name(obj)}",
                                         again=lambda fresh: (prepare(fresh, js, record)
                                                              if front.undecided(obj, fresh) else None))
            if prepared is None:
                return False
            obj = prepared
        out = self.writes.patch(self._store(front), front.path(obj), front.decision(obj, js, record), what,
                                again=lambda fresh: (front.decision(fresh, js, record)
                                                     if front.undecided(obj, fresh) else None))
        if out is None:
            return False
        crash_point("after-decision")
        self.metrics.decisions.labels(result="admitted").inc()
        nodes = sorted({p.node for p in placement.pods})
        self.writes.events.record(out, "Normal", "Admitted",
                                  f"{len(placement.pods)} pods placed on {len(nodes)} nodes "
                                  f"({', '.join(nodes[:8])}{', ...' if len(nodes) > 8 else ''}); "
                                  f"decision {record.decision}", involved=front.kind)
        return True

    def reject(self, obj: dict[str, Any], reason: str) -> bool:
        front = next((f for f in FRONTS if f.key(obj) in self._decided), JOBSET_FRONT)
        record = AdmissionRecord("rejected", uuid.uuid4().hex, timestamp(self.writes.clock()), reason=reason)
        out = self.writes.patch(self._store(front), front.path(obj), reject_patch(obj, record),
                                f"record the rejection of {front.name} {namespaced_name(obj)}",
                                again=lambda fresh: (reject_patch(fresh, record)
                                                     if front.undecided(obj, fresh) else None))
        if out is None:
            return False
        self.metrics.decisions.labels(result="rejected").inc()
        self.writes.events.record(out, "Warning", "Rejected", f"can never fit this cluster: {reason}",
                                  involved=front.kind)
        return True

    def _requeue(self, front: Front, obj: dict[str, Any], why: str) -> bool:
        out = self.writes.patch(self._store(front), front.path(obj), requeue_patch(obj),
                                f"remove the untrusted admission record of {front.name} "
                                f"{namespaced_name(obj)}")
        if out is None:
            return False
        self.writes.events.record(out, "Warning", "UntrustedAdmissionRecord",
                                  f"{why}: the record was removed and the {front.name} is queued again",
                                  involved=front.kind)
        return True

    def _store(self, front: Front) -> Reflector:
        return self.jobsets if front is JOBSET_FRONT else self.trainjobs


def _requests(route: JobSetRoute, front: Front, obj: Mapping[str, Any], job: Mapping[str, Any],
              defaults: ContainerDefaults) -> Callable[[], Resources]:
    """One pod's requests of a replicated Job, read when the ledger first takes the decision."""
    def requests() -> Resources:
        try:
            return gang_requests(job, defaults)
        except JobSpecError as exc:
            route.writes.invalid(obj, f"Invalid{front.name}", str(exc), involved=front.kind)
            return Resources()
    return requests


def _change_matters(kind: str, obj: Mapping[str, Any]) -> bool:
    """Whether a JobSet's or TrainJob's watch event calls for a pass: new, gone, suspended, finished, or
    queued and undecided.  The status updates of a running one (most events) change nothing a pass reads."""
    if kind in ("ADDED", "DELETED") or job_suspended(obj) or jobset_finished(obj) or trainjob_finished(obj):
        return True
    notes = as_dict(metadata_of(obj).get("annotations"))
    return job_queue(obj) is not None and ADMISSION_ANNOTATION not in notes
