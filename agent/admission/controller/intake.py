"""What a decision pass takes in of each queued Job, one object at a time: one that cannot be read
costs only itself.

`JobIntake(reader, writes, metrics, queues)`: `.sort(jobs, priorities, nodes, limit_defaults) ->
Sorted(admitted, pending, by_key)`, `.unreadable(job, exc)`, `.requests_of(job, limit_defaults)`,
`.report_pods(pods)`, `.report_refused(refused, pods)`.  A Job refused a queue, or one whose pods
could not be told from others', is told in an Event and enters no queue.
Counting and Events: agent/admission/controller/README.md, "Intake".
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agent.admission.cluster.view import BadObject, read_pod_requests
from agent.admission.controller.writes import JobWrites
from agent.admission.engine.model import Resources
from agent.admission.gangs.job import JobSpecError, gang_from_job, gang_requests
from agent.admission.gangs.jobset import JOBSET, controlled_by
from agent.admission.gangs.limitrange import NO_DEFAULTS, ContainerDefaults
from agent.admission.gangs.record import AdmissionRecord
from agent.admission.gangs.slots import JobOwner, unlabelled_job
from agent.admission.jobs.jobread import JobRead, JobReader
from agent.admission.jobs.patches import job_started, unpin_patch
from agent.admission.jobs.queues import Pending, QueueConfig, queue_refusal
from agent.admission.report.events import POD
from agent.admission.report.metrics import AdmissionMetrics
from agent.api.objects import as_dict, metadata_of, object_key
from agent.kubeapi.leader import NotLeader

log = logging.getLogger(__name__)

Admitted = tuple[dict[str, Any], JobRead, AdmissionRecord]


@dataclass
class Sorted:
    """A pass's queued Jobs: admitted ones holding slots, gangs to decide, and those by gang key."""

    admitted: list[Admitted] = field(default_factory=list)
    pending: list[Pending] = field(default_factory=list)
    by_key: dict[str, dict[str, Any]] = field(default_factory=dict)


class JobIntake:
    """Reads each Job of a pass in isolation (see README.md beside this module)."""

    def __init__(self, reader: JobReader, writes: JobWrites, metrics: AdmissionMetrics,
                 queues: Mapping[str, QueueConfig]) -> None:
        self.reader = reader
        self.writes = writes
        self.metrics = metrics
        self.queues = queues
        self._told_pods: set[tuple[str, str]] = set()  # unreadable pod versions already counted
        self._warned_pods: set[str] = set()  # uids of the unreadable pods already told in an Event
        self._told_refused: set[tuple[str, str]] = set()  # (pod uid, why) told, while the pod is there

    def sort(self, jobs: Iterable[dict[str, Any]], priorities: tuple[Mapping[str, int], int],
             nodes: frozenset[str], limit_defaults: Mapping[str, ContainerDefaults] | None = None) -> Sorted:
        out = Sorted()
        defaults = limit_defaults or {}
        for job in jobs:
            try:
                self._sort_one(job, priorities, nodes, out,
                               defaults.get(str(metadata_of(job).get("namespace")), NO_DEFAULTS))
            except Exception as exc:  # noqa: BLE001 - whatever a tenant wrote, the pass goes on
                self.unreadable(job, exc)
        return out

    def _sort_one(self, job: dict[str, Any], priorities: tuple[Mapping[str, int], int],
                  nodes: frozenset[str], out: Sorted, limit_defaults: ContainerDefaults) -> None:
        read = self.reader.read(job, limit_defaults)
        if read.queue is None:
            return
        if read.bad_record is not None:
            self.writes.invalid(job, "InvalidAdmissionRecord", read.bad_record)
            return
        if read.record is not None:
            if read.record.result == "admitted" and not read.finished and self.writes.holds(job, read):
                out.admitted.append((job, read, read.record))
            return
        refused = queue_refusal(self.queues, read.queue, str(metadata_of(job).get("namespace")))
        if refused is not None:  # another namespace's Job never blocks or counts in a queue
            self.writes.invalid(job, refused.reason, refused.message)
            return
        if read.suspended and (job_started(job) or unpin_patch(job, nodes) is not None):
            # Queued again after its node was gone: made decidable first, one write a pass, once the
            # Job controller has removed its pods (the API server refuses the template change before).
            if not as_dict(job.get("status")).get("active"):
                self.writes.check_leader()
                self.writes.submit(self.writes.unpin, job, nodes)
            return
        owner = controlled_by(job, JOBSET)
        if owner is not None:  # a JobSet's Job is queued (and admitted) with its JobSet
            self.writes.invalid(job, "InvalidJob",
                                f"it is a Job of JobSet {str(owner.get('name'))[:253]}, which queues its "
                                "Jobs as one gang: "
                                "put topolet.io/queue on the JobSet, not in its Job template")
            return
        if not read.suspended:
            self.writes.invalid(job, "NotSuspended",
                                "a queued Job must be created with spec.suspend: true; left alone")
            return
        try:
            gang = gang_from_job(job, priorities[0], default_priority=priorities[1],
                                 limit_defaults=limit_defaults)
        except JobSpecError as exc:
            self.writes.invalid(job, "InvalidJob", str(exc))
            return
        unlabelled = unlabelled_job(job)
        if unlabelled is not None:
            self.writes.invalid(job, "InvalidJob", unlabelled)
            return
        out.by_key[gang.key] = job
        meta = metadata_of(job)
        out.pending.append(Pending(gang, read.queue, str(meta.get("creationTimestamp") or ""),
                                   str(meta.get("name"))))

    def unreadable(self, job: Mapping[str, Any], exc: Exception) -> None:
        """A Job the pass failed on: logged (with the trace when no reader named the error), a Warning
        Event, skipped.  Losing the lease is no fault of the Job's: it ends the pass."""
        if isinstance(exc, NotLeader):
            raise exc
        log.error("Job %s skipped: %s", object_key(job), exc, exc_info=not isinstance(exc, JobSpecError))
        self.writes.invalid(job, "InvalidJob", f"cannot be read: {str(exc)[:200] or type(exc).__name__}")

    def requests_of(self, job: Mapping[str, Any],
                    limit_defaults: ContainerDefaults = NO_DEFAULTS) -> Callable[[], Resources]:
        """One pod's requests of an admitted Job (its namespace's LimitRanges filling in
        `limit_defaults`), read when the ledger first takes its decision."""
        def requests() -> Resources:
            try:
                return gang_requests(job, limit_defaults)
            except JobSpecError as exc:
                self.unreadable(job, exc)
                return Resources()
        return requests

    def report_pods(self, pods: Iterable[Mapping[str, Any]]) -> None:
        """Count each version of a bound pod whose requests cannot be read once, and tell the pod why
        in a Warning Event, once while its requests stay unreadable."""
        told, warned = set(), set()
        for pod in pods:
            meta = metadata_of(pod)
            key = (str(meta.get("uid")), str(meta.get("resourceVersion")))
            told.add(key)
            warned.add(key[0])
            if key in self._told_pods:
                continue
            self.metrics.invalid_objects.labels(kind="Pod").inc()
            if key[0] in self._warned_pods:
                continue
            try:
                read_pod_requests(pod)
                why = "unreadable"
            except BadObject as exc:
                why = str(exc)
            log.warning("pod %s: its requests cannot be read (%s); counted as requesting nothing",
                        object_key(pod), why)
            self.writes.events.record(pod, "Warning", "InvalidRequests",
                                      f"its resource requests cannot be read: {why}; admission counts "
                                      "the pod as requesting nothing", involved=POD)
        self._told_pods, self._warned_pods = told, warned

    def report_refused(self, refused: Iterable[tuple[JobOwner, Mapping[str, Any], str]],
                       pods: Iterable[Mapping[str, Any]]) -> None:
        """Tell each pod that names an admitted Job but is not one of its pods (see the module
        docstring); what was told is forgotten once the pod is not among `pods`."""
        for owner, pod, why in refused:
            meta = metadata_of(pod)
            key = (str(meta.get("uid")), why)
            if key in self._told_refused:
                continue
            self._told_refused.add(key)
            self.metrics.invalid_objects.labels(kind="Pod").inc()
            log.warning("pod %s gets no slot of Job %s/%s: %s", object_key(pod), owner.namespace,
                        owner.name, why)
            job = {"metadata": {"namespace": owner.namespace, "name": owner.name, "uid": owner.uid}}
            self.writes.events.record(job, "Warning", "ForeignPod",
                                      f"pod {str(meta.get('name'))[:253]} gets no slot: {why}")
        if self._told_refused:
            there = {str(metadata_of(p).get("uid")) for p in pods}
            self._told_refused = {key for key in self._told_refused if key[0] in there}

