"""What a decision pass reads of each queued Job and of its pods, each object version read once.

Pure: no I/O.  `JobReader()`: `.read(job, limit_defaults) -> JobRead`, `.slots(read, pods)`,
`.retain(uids)`, memoised by object versions; `distrust(job, record)`, `gone_nodes(...)`.
The rule: the controller trusts only a record whose shape is the Job's as it is now; a record it
does not trust never unsuspends, places or counts anything.
agent/admission/jobs/README.md, "Reading Jobs once".
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agent.admission.gangs.job import (
    ADMISSION_ANNOTATION,
    JobSpecError,
    job_finished,
    job_indexed,
    job_queue,
    job_suspended,
)
from agent.admission.gangs.limitrange import NO_DEFAULTS, ContainerDefaults
from agent.admission.gangs.record import AdmissionRecord, decode_record, record_of
from agent.admission.gangs.shape import job_shape
from agent.admission.gangs.slots import JobOwner, SlotAssignment, job_owner, job_slots
from agent.api.objects import as_dict, metadata_of, namespaced_name


@dataclass(frozen=True, slots=True)
class JobRead:
    """One Job version as a pass reads it.  `record` is None with `bad_record` set when the Job's
    admission record is malformed (the message says why), and None alone when it has none;
    `distrusted` says why an admitted record is not trusted (`distrust`), None when it is."""

    uid: str
    key: str
    queue: str | None
    record: AdmissionRecord | None
    bad_record: str | None
    suspended: bool
    finished: bool
    indexed: bool
    distrusted: str | None = None
    owner: JobOwner | None = None  # with a record: the pods that may hold its slots
    limit_defaults: ContainerDefaults = NO_DEFAULTS  # its namespace's LimitRanges', as read with


def distrust(job: Mapping[str, Any], record: AdmissionRecord) -> str | None:
    """Why the admitted `record` is not this controller's decision for `job` as it is now; None when
    it is (a rejected record admits nothing, so it is never distrusted)."""
    if record.result != "admitted":
        return None
    if not record.shape:
        return "its admission record carries no shape: it was not written by this controller"
    if record.shape != job_shape(job):
        return ("its admission record was written for another Job or another shape of this one "
                "(parallelism, completions or pod resources changed since)")
    return None


def _version(obj: Mapping[str, Any]) -> tuple[str, str] | None:
    meta = metadata_of(obj)
    rv = meta.get("resourceVersion")
    return (str(meta.get("uid")), rv) if isinstance(rv, str) and rv else None


def gone_nodes(job: Mapping[str, Any], record: AdmissionRecord, nodes: Collection[str],
               pods: Iterable[Mapping[str, Any]]) -> list[str]:
    """The nodes of the admitted `job`'s `record` that are not among `nodes` (their Node objects are
    gone), while none of its `pods` is bound and none ever ran (no ready, succeeded or failed pod in
    its status); empty otherwise (a Job that ran is the Job controller's to finish)."""
    status = as_dict(job.get("status"))
    if any(status.get(k) for k in ("ready", "succeeded", "failed")) or any(
            as_dict(p.get("spec")).get("nodeName") for p in pods):
        return []
    return sorted({p.node for p in record.slots.values()} - set(nodes))


class JobReader:
    """`read` and `slots` with their memos (see README.md beside this module); one per controller."""

    def __init__(self) -> None:
        # uid -> (resourceVersion, read, record text); the read holds the defaults it was read with.
        self._jobs: dict[str, tuple[str, JobRead, object]] = {}
        self._records: dict[str, AdmissionRecord] = {}  # annotation text -> decoded record
        # Job uid -> (its decision, its pods' (uid, resourceVersion) sorted, the assignment).
        self._slots: dict[str, tuple[Any, SlotAssignment]] = {}

    def read(self, job: Mapping[str, Any], limit_defaults: ContainerDefaults = NO_DEFAULTS) -> JobRead:
        """What the pass reads of `job` in a namespace whose LimitRanges fill in `limit_defaults`
        (memoised by version and defaults)."""
        version = _version(job)
        if version is not None:
            hit = self._jobs.get(version[0])
            if hit is not None and hit[0] == version[1] and hit[1].limit_defaults == limit_defaults:
                return hit[1]
        text = as_dict(metadata_of(job).get("annotations")).get(ADMISSION_ANNOTATION)
        try:
            record, bad = self._record_of(job, text), None
        except JobSpecError as exc:
            record, bad = None, str(exc)
        read = JobRead(uid=str(metadata_of(job).get("uid")), key=namespaced_name(job),
                       queue=job_queue(job), record=record, bad_record=bad,
                       suspended=job_suspended(job), finished=job_finished(job),
                       indexed=job_indexed(job),
                       distrusted=distrust(job, record) if record is not None else None,
                       owner=job_owner(job, limit_defaults) if record is not None else None,
                       limit_defaults=limit_defaults)
        if version is not None:
            self._jobs[version[0]] = (version[1], read, text)
        return read

    def slots(self, read: JobRead, pods: Sequence[Mapping[str, Any]]) -> SlotAssignment:
        """`job_slots` of the admitted Job `read` over the `pods` that name it (memoised by the
        decision, the Job's owner and the pods' versions: the same pod versions get the same slots)."""
        assert read.record is not None and read.owner is not None
        versions = [v for v in map(_version, pods) if v is not None]
        key = ((read.record.decision, read.owner, tuple(sorted(versions))) if len(versions) == len(pods)
               else None)
        hit = self._slots.get(read.uid)
        if key is not None and hit is not None and hit[0] == key:
            return hit[1]
        assignment = job_slots(read.owner, read.record.slots, pods, read.indexed)
        if key is not None:
            self._slots[read.uid] = (key, assignment)
        return assignment

    def retain(self, uids: Iterable[str]) -> None:
        """Forget the Jobs not among `uids` (gone from the store), and records no kept Job holds."""
        live = set(uids)
        self._jobs = {uid: v for uid, v in self._jobs.items() if uid in live}
        self._slots = {uid: v for uid, v in self._slots.items() if uid in live}
        texts = {text for _, _, text in self._jobs.values()}
        self._records = {t: r for t, r in self._records.items() if t in texts}

    def _record_of(self, job: Mapping[str, Any], text: object) -> AdmissionRecord | None:
        """`record_of(job)`, decoded once per annotation text (`text`, the Job's)."""
        if not isinstance(text, str):
            return record_of(job)
        record = self._records.get(text)
        if record is None:
            record = decode_record(text)
            self._records[text] = record
        return record
