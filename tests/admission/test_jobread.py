"""agent.admission.jobs.jobread: what a pass reads of a Job and its slots, read again only when a version
moves."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from agent.admission.gangs.job import ADMISSION_ANNOTATION, GATE, QUEUE_LABEL
from agent.admission.gangs.record import AdmissionRecord, SlotPlacement
from agent.admission.gangs.shape import SHAPE_CHARS, job_shape
from agent.admission.gangs.slots import assign_slots
from agent.admission.jobs.jobread import JobReader, distrust

SLOTS = {0: SlotPlacement("n1", 0), 1: SlotPlacement("n2", 1)}
RECORD = AdmissionRecord("admitted", "d1", "2026-12-02T10:00:00Z", SLOTS)


def _job(rv: str = "5", *, record: str | None = RECORD.encode(), queue: str | None = "q",
         suspended: bool = False, done: bool = False, indexed: bool = True) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "j", "namespace": "ns", "uid": "u1", "resourceVersion": rv,
                            "labels": {QUEUE_LABEL: queue} if queue else {},
                            "annotations": {ADMISSION_ANNOTATION: record} if record is not None else {}}
    status = {"conditions": [{"type": "Complete", "status": "True"}]} if done else {}
    spec = {"suspend": suspended, "completionMode": "Indexed" if indexed else "NonIndexed",
            "template": {"spec": {"containers": [CONTAINER]}}}
    return {"metadata": meta, "spec": spec, "status": status}


CONTAINER = {"name": "c", "resources": {"requests": {"cpu": "2"}, "limits": {"cpu": "2"}}}
JOB_LABELS = {"batch.kubernetes.io/controller-uid": "u1", "batch.kubernetes.io/job-name": "j"}


def _pod(name: str, index: int, rv: str = "1") -> dict[str, Any]:
    """A gated pod the Job controller made for `_job()`."""
    return {"metadata": {"name": name, "namespace": "ns", "uid": name, "resourceVersion": rv,
                         "creationTimestamp": f"2026-12-02T10:00:0{index}Z", "labels": dict(JOB_LABELS),
                         "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "j",
                                              "uid": "u1", "controller": True}],
                         "annotations": {"batch.kubernetes.io/job-completion-index": str(index)}},
            "spec": {"schedulingGates": [{"name": GATE}], "containers": [CONTAINER]},
            "status": {"phase": "Pending"}}


READS = [
    # (what, job, expected (queue, has record, bad record?, suspended, finished, indexed))
    ("an admitted, running Indexed Job", _job(), ("q", True, False, False, False, True)),
    ("a pending Job: suspended, no record", _job(record=None, suspended=True),
     ("q", False, False, True, False, True)),
    ("a finished Job", _job(done=True), ("q", True, False, False, True, True)),
    ("no queue label", _job(queue=None), (None, True, False, False, False, True)),
    ("a malformed record names why", _job(record="{not json"), ("q", False, True, False, False, True)),
    ("a non-indexed Job", _job(indexed=False), ("q", True, False, False, False, False)),
]


@pytest.mark.parametrize(("what", "job", "want"), READS, ids=[r[0] for r in READS])
def test_read(what: str, job: dict[str, Any], want: tuple[Any, ...]) -> None:
    r = JobReader().read(job)
    got = (r.queue, r.record is not None, r.bad_record is not None, r.suspended, r.finished, r.indexed)
    assert got == want
    assert (r.uid, r.key) == ("u1", "ns/j")
    if r.bad_record is not None:
        assert ADMISSION_ANNOTATION in r.bad_record
    if r.record is not None:
        assert r.record == RECORD


def test_read_again_only_when_the_version_moves() -> None:
    reader = JobReader()
    first = reader.read(_job("5"))
    assert reader.read(_job("5")) is first  # same version: not read again
    moved = _job("6", done=True)
    assert reader.read(moved).finished and not first.finished
    # No resourceVersion: read every time, never memoised.
    bare = _job("5")
    del bare["metadata"]["resourceVersion"]
    assert reader.read(bare) is not reader.read(copy.deepcopy(bare))


def test_slots_match_assign_slots_and_follow_pod_versions() -> None:
    reader = JobReader()
    read = reader.read(_job())
    pods = [_pod("b", 1), _pod("a", 0)]
    got = reader.slots(read, pods)
    want = assign_slots(SLOTS, pods, True)
    assert dict(got.held) == dict(want.held) == {"a": 0, "b": 1}
    assert reader.slots(read, list(reversed(pods))) is got  # same pod versions, any order
    # Pod a pinned (a new version): its slot is now held, nothing left to place for it.
    pinned = _pod("a", 0, rv="2")
    pinned["spec"] = {"nodeSelector": {"kubernetes.io/hostname": "n1"}, "containers": [CONTAINER]}
    pinned["metadata"]["annotations"]["topolet.io/numa-zone"] = "0"
    again = reader.slots(read, [pods[0], pinned])
    assert again is not got
    assert [p["metadata"]["name"] for p, _ in again.place] == ["b"]
    assert dict(again.held) == {"a": 0, "b": 1}
    # A pod gone: worked out again.
    assert dict(reader.slots(read, [pinned]).held) == {"a": 0}


def test_retain_forgets_gone_jobs() -> None:
    reader = JobReader()
    first = reader.read(_job())
    reader.retain({"u1"})
    assert reader.read(_job()) is first
    reader.retain(set())
    assert reader.read(_job()) is not first


def _shaped(job: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """`job` with pod resources, carrying a record written for it as it is (its shape), then `changes`
    made to its spec after the record was written."""
    job = copy.deepcopy(job)
    job["spec"].update(parallelism=2, completions=2, template={"spec": {"containers": [
        {"name": "c", "resources": {"requests": {"cpu": "4"}, "limits": {"cpu": "4"}}}]}})
    record = AdmissionRecord("admitted", "d1", "2026-12-02T10:00:00Z", SLOTS, shape=job_shape(job))
    job["metadata"]["annotations"][ADMISSION_ANNOTATION] = record.encode()
    job["spec"].update(changes)
    return job


def _other_uid(job: dict[str, Any]) -> dict[str, Any]:
    job = copy.deepcopy(job)
    job["metadata"]["uid"] = "u2"
    return job


TRUST = [
    # (what, job, distrusted?)
    ("written for this Job as it is", _shaped(_job()), False),
    ("no shape: not written by the controller", _job(), True),
    ("the Job scaled since (parallelism 2 -> 8)", _shaped(_job(), parallelism=8), True),
    ("more completions since", _shaped(_job(), completions=9), True),
    ("other pod resources since", _shaped(_job(), template={"spec": {"containers": [
        {"name": "c", "resources": {"requests": {"cpu": "40"}, "limits": {"cpu": "40"}}}]}}), True),
    ("copied onto another Job", _other_uid(_shaped(_job())), True),
    ("the decision's own template writes change nothing", _shaped(_job(), template={
        "metadata": {"annotations": {"topolet.io/placements": "n1:0,n2:1"}},
        "spec": {"schedulingGates": [{"name": GATE}], "nodeSelector": {"kubernetes.io/hostname": "n1"},
                 "containers": [{"name": "c", "resources": {"requests": {"cpu": "4"},
                                                            "limits": {"cpu": "4"}}}]}}), False),
    ("a rejected record admits nothing: never distrusted",
     _job(record=AdmissionRecord("rejected", "d1", "t", reason="no").encode()), False),
]


@pytest.mark.parametrize(("what", "job", "distrusted"), TRUST, ids=[t[0] for t in TRUST])
def test_only_a_record_written_for_the_job_as_it_is_is_trusted(what: str, job: dict[str, Any],
                                                               distrusted: bool) -> None:
    read = JobReader().read(job)
    assert read.record is not None and read.bad_record is None
    assert (read.distrusted is not None) is distrusted, read.distrusted
    assert (distrust(job, read.record) is not None) is distrusted


def test_the_shape_survives_the_record_encoding() -> None:
    job = _shaped(_job())
    read = JobReader().read(job)
    assert read.record is not None and read.record.shape == job_shape(job)
    assert len(read.record.shape) == SHAPE_CHARS
