"""What a decision pass takes in of each queued Job, one object at a time: one that cannot be read
costs only itself.

Public API:

- `JobIntake(reader, writes, metrics)`:
  - `.sort(jobs, priorities, nodes) -> Sorted`: each queued Job into the admitted ones that hold
    their slots, or a pending gang (one queued again after its node was gone, `nodes` being the
    Nodes there are, first has its start time and our template fields cleared: `JobWrites.unpin`),
    or a Warning Event saying why it is neither (`writes.invalid`, which counts
    `topolet_admission_invalid_objects_total{kind="Job"}` once per Job version).
    Whatever a Job holds, an error reading it (one no reader names too) skips that Job alone.
  - `.unreadable(job, exc)`: the same for a Job a later step of the pass failed on.
  - `.requests_of(job)`: one pod's requests of an admitted Job, for the ledger (none, and an
    Event, when its template cannot be read).
  - `.report_pods(pods)`: the bound pods whose requests cannot be read (each costs only itself in the
    view): counted once per version (`{kind="Pod"}`) and told in an Event on their Job.
- `Sorted(admitted, pending, by_key)`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agent.admission.controller.writes import JobWrites
from agent.admission.engine.model import Resources
from agent.admission.gangs.job import JobSpecError, gang_from_job, gang_requests
from agent.admission.gangs.record import AdmissionRecord
from agent.admission.jobs.jobread import JobRead, JobReader
from agent.admission.jobs.patches import job_started, unpin_patch
from agent.admission.jobs.queues import Pending
from agent.admission.report.metrics import AdmissionMetrics
from agent.kube.leader import NotLeader
from agent.kube.objects import as_dict, as_list, metadata_of, object_key

log = logging.getLogger(__name__)

Admitted = tuple[dict[str, Any], JobRead, AdmissionRecord]


@dataclass
class Sorted:
    """A pass's queued Jobs: admitted ones holding slots, gangs to decide, and those by gang key."""

    admitted: list[Admitted] = field(default_factory=list)
    pending: list[Pending] = field(default_factory=list)
    by_key: dict[str, dict[str, Any]] = field(default_factory=dict)


class JobIntake:
    """Reads each Job of a pass in isolation (see the module docstring)."""

    def __init__(self, reader: JobReader, writes: JobWrites, metrics: AdmissionMetrics) -> None:
        self.reader = reader
        self.writes = writes
        self.metrics = metrics
        self._told_pods: set[tuple[str, str]] = set()  # unreadable pod versions already counted

    def sort(self, jobs: Iterable[dict[str, Any]], priorities: tuple[Mapping[str, int], int],
             nodes: frozenset[str]) -> Sorted:
        out = Sorted()
        for job in jobs:
            try:
                self._sort_one(job, priorities, nodes, out)
            except Exception as exc:  # noqa: BLE001 - whatever a tenant wrote, the pass goes on
                self.unreadable(job, exc)
        return out

    def _sort_one(self, job: dict[str, Any], priorities: tuple[Mapping[str, int], int],
                  nodes: frozenset[str], out: Sorted) -> None:
        read = self.reader.read(job)
        if read.queue is None:
            return
        if read.bad_record is not None:
            self.writes.invalid(job, "InvalidAdmissionRecord", read.bad_record)
            return
        if read.record is not None:
            if read.record.result == "admitted" and not read.finished and self.writes.holds(job, read):
                out.admitted.append((job, read, read.record))
            return
        if read.suspended and (job_started(job) or unpin_patch(job, nodes) is not None):
            # Queued again after its node was gone: made decidable first, one write a pass, once the
            # Job controller has removed its pods (the API server refuses the template change before).
            if not as_dict(job.get("status")).get("active"):
                self.writes.check_leader()
                self.writes.submit(self.writes.unpin, job, nodes)
            return
        if not read.suspended:
            self.writes.invalid(job, "NotSuspended",
                                "a queued Job must be created with spec.suspend: true; left alone")
            return
        try:
            gang = gang_from_job(job, priorities[0], default_priority=priorities[1])
        except JobSpecError as exc:
            self.writes.invalid(job, "InvalidJob", str(exc))
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

    def requests_of(self, job: Mapping[str, Any]) -> Callable[[], Resources]:
        """One pod's requests of an admitted Job, read when the ledger first takes its decision."""
        def requests() -> Resources:
            try:
                return gang_requests(job)
            except JobSpecError as exc:
                self.unreadable(job, exc)
                return Resources()
        return requests

    def report_pods(self, pods: Iterable[Mapping[str, Any]]) -> None:
        """Count each version of a bound pod whose requests cannot be read once, and tell its Job in an
        Event when it has one (the controller's policy lets it post Events about Jobs only)."""
        told = set()
        for pod in pods:
            meta = metadata_of(pod)
            key = (str(meta.get("uid")), str(meta.get("resourceVersion")))
            told.add(key)
            if key in self._told_pods:
                continue
            self.metrics.invalid_objects.labels(kind="Pod").inc()
            log.warning("pod %s: its requests cannot be read; counted as requesting nothing",
                        object_key(pod))
            owner = next((as_dict(r) for r in as_list(meta.get("ownerReferences"))
                          if as_dict(r).get("kind") == "Job"), None)
            if owner is not None:
                job = {"metadata": {"namespace": meta.get("namespace"), "name": owner.get("name"),
                                    "uid": owner.get("uid")}}
                self.writes.events.record(job, "Warning", "InvalidPod",
                                          f"pod {meta.get('name')}: its resource requests cannot be read")
        self._told_pods = told
