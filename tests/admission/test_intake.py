"""agent.admission.controller.intake: which queued Jobs enter a pass's queues, as a table.  A Job naming
a queue the operator did not configure, or one not open to its namespace, gets one Warning Event and
nothing else: it is never a pending gang (so it never reaches `admission_pass`) and never a write."""

from __future__ import annotations

from typing import Any

import pytest

from agent.admission.controller.intake import JobIntake
from agent.admission.gangs.job import QUEUE_LABEL
from agent.admission.jobs.jobread import JobReader
from agent.admission.jobs.queues import parse_queues
from agent.admission.report.metrics import AdmissionMetrics


class _Writes:
    """Stands in for JobWrites: records what the intake says and would write."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []  # (Job name, reason, message)
        self.submitted: list[str] = []

    def invalid(self, job: dict[str, Any], reason: str, message: str) -> None:
        self.events.append((job["metadata"]["name"], reason, message))

    def check_leader(self) -> None:
        pass

    def submit(self, fn: Any, job: dict[str, Any], *args: Any) -> None:
        self.submitted.append(job["metadata"]["name"])

    def holds(self, job: dict[str, Any], read: Any) -> bool:
        return True


def _job(namespace: str, name: str, queue: str, *, suspended: bool = True) -> dict[str, Any]:
    res = {"cpu": "1", "memory": "1Gi"}
    container = {"name": "c", "image": "pause", "resources": {"requests": res, "limits": res}}
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": namespace, "uid": f"{namespace}-{name}",
                         "resourceVersion": "1", "creationTimestamp": "2026-12-02T10:00:00Z",
                         "labels": {QUEUE_LABEL: queue}},
            "spec": {"parallelism": 1, "completions": 1, "suspend": suspended,
                     "template": {"spec": {"restartPolicy": "Never", "containers": [container]}}}}


CASES = [
    # (what, --queue flags, Jobs, pending gang keys, [(Job, Event reason)])
    ("the built-in queue takes every namespace", [],
     [_job("team-a", "a", "default"), _job("team-b", "b", "default")], ["team-a/a", "team-b/b"], []),
    ("with no --queue, any other name is refused", [],
     [_job("team-a", "a", "q")], [], [("a", "UnknownQueue")]),
    ("another namespace's Job stays out of a queue open to team-a only",
     ["research=StrictFIFO:team-a"],
     [_job("team-b", "head", "research"), _job("team-a", "gang", "research")], ["team-a/gang"],
     [("head", "QueueNotAllowed")]),
    ("random queue names enter nothing",
     ["research=StrictFIFO"], [_job("x", f"j{i}", f"rand-{i}") for i in range(3)], [],
     [(f"j{i}", "UnknownQueue") for i in range(3)]),
    # The queue is said first: a refused Job that is not suspended is not also told NotSuspended.
    ("an unsuspended Job in a queue it may not use", ["research=StrictFIFO:team-a"],
     [_job("team-b", "run", "research", suspended=False)], [], [("run", "QueueNotAllowed")]),
]


@pytest.mark.parametrize(("what", "flags", "jobs", "pending", "told"), CASES, ids=[c[0] for c in CASES])
def test_which_jobs_enter_the_queues(what: str, flags: list[str], jobs: list[dict[str, Any]],
                                     pending: list[str], told: list[tuple[str, str]]) -> None:
    writes = _Writes()
    intake = JobIntake(JobReader(), writes, AdmissionMetrics(), parse_queues(flags))  # type: ignore[arg-type]
    out = intake.sort(jobs, ({}, 0), frozenset())
    assert [p.gang.key for p in out.pending] == pending
    assert sorted(out.by_key) == sorted(pending)
    assert [(name, reason) for name, reason, _ in writes.events] == told
    assert writes.submitted == []
    for name, _, message in writes.events:
        job = next(j for j in jobs if j["metadata"]["name"] == name)
        assert repr(job["metadata"]["labels"][QUEUE_LABEL]) in message
        assert job["metadata"]["namespace"] in message
