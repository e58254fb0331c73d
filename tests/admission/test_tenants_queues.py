"""Queues a tenant cannot block or inflate, on the real test cluster (issue 34, findings 5 and 6).

The operator configures the queues (`--queue NAME=MODE[:NS,...]`); a tenant here is the service account
of its own namespace with edit rights on Jobs and pods there (`tests.admission.test_tenants.tenant`),
acting with its real token.  A Job naming a queue it may not use, or one that does not exist, gets a
Warning Event and enters no queue: it can neither hold up the head of another team's StrictFIFO queue
nor make a `topolet_admission_queue_depth` series.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.admission.test_controller import (
    QUEUE,
    all_bound_as_recorded,
    events,
    gang_job,
    get_job,
    job_pods,
    metric,
    record,
    scrape,
    wait_for,
)
from tests.admission.test_tenants import Tenant, tenant
from tests.controlplane.harness import free_port

__all__ = ["tenant"]  # the fixture, imported for the tests below

DEPTH = "topolet_admission_queue_depth"
LAST_PASS = "topolet_admission_last_pass_timestamp_seconds"


@pytest.fixture
def team(tenant: Tenant) -> Iterator[str]:
    """A namespace of the operator's own team, beside the tenant's: the research queue is its alone."""
    name = f"team-{uuid.uuid4().hex[:8]}"
    tenant.api.create("/api/v1/namespaces", {"metadata": {"name": name}})
    yield name
    tenant.api.request("DELETE", f"/api/v1/namespaces/{name}")


def in_queue(job: dict[str, Any], queue: str) -> dict[str, Any]:
    job["metadata"]["labels"][QUEUE] = queue
    return job


def messages(api: Any, ns: str, reason: str) -> dict[str, str]:
    """The controller's Events of `reason` in `ns`: Job name -> message."""
    out = api.list(f"/api/v1/namespaces/{ns}/events", {"fieldSelector": f"reason={reason}"})
    return {e["involvedObject"]["name"]: e["message"] for e in out.get("items") or []
            if e.get("reportingComponent") == "topolet.io/controller"}


def depth_series(text: str) -> set[str]:
    """The queues `topolet_admission_queue_depth` has a series for."""
    return {line.split('queue="', 1)[1].split('"', 1)[0] for line in text.splitlines()
            if line.startswith(DEPTH + "{")}


def test_another_namespace_cannot_block_a_strict_queue(tenant: Tenant, team: str) -> None:
    """The finding: with the team's StrictFIFO queue taking Jobs from every namespace, a tenant's gang
    that cannot fit now, put at the head, held the team's 1-CPU gang behind it for as long as it liked.
    Open to the team alone, the queue refuses the tenant's Job (an Event; it stays suspended, in no
    queue) and the team's gang behind it is admitted."""
    t, api = tenant, tenant.api
    t.cluster.start_controller("--listen", "127.0.0.1:0", "--resync-seconds", "2",
                               "--queue", f"research=StrictFIFO:{team}")
    team_jobs = f"/apis/batch/v1/namespaces/{team}/jobs"
    # The team's running gang holds two of the eight zones...
    api.create(team_jobs, in_queue(gang_job("running", 2, t.label), "research"))
    wait_for(lambda: all_bound_as_recorded(api, team, "running", 2), "the team's first gang bound")
    # ...so the tenant's 8 pods of 12 CPUs, one per zone of both nodes, cannot fit now: the head.
    status, body = t.request("POST", "apis/batch/v1/namespaces/{ns}/jobs",
                             in_queue(gang_job("head", 8, t.label), "research"))
    assert status == 201, body
    wait_for(lambda: events(api, t.namespace, "head"), "the controller's word on the tenant's Job")
    # The team's 1-CPU gang, created after it, goes in.
    api.create(team_jobs, in_queue(gang_job("small", 1, t.label, cpu=1), "research"))
    wait_for(lambda: all_bound_as_recorded(api, team, "small", 1), "the team's 1-CPU gang admitted and bound")
    assert "Waiting" not in events(api, team, "small")
    # The tenant's Job is told why, and is left as it was: suspended, no record, no pods.
    assert set(events(api, t.namespace, "head")) == {"QueueNotAllowed"}
    message = messages(api, t.namespace, "QueueNotAllowed")["head"]
    assert "'research'" in message and t.namespace in message, message
    head = get_job(api, t.namespace, "head")
    assert head["spec"]["suspend"] is True and record(api, t.namespace, "head") is None
    assert not job_pods(api, t.namespace, "head")


def test_queue_names_a_tenant_makes_up_leave_no_metric_series(tenant: Tenant) -> None:
    """The finding: every `topolet.io/queue` value a tenant wrote became a queue and a queue-depth series
    for as long as the controller ran.  Now only the configured queues have one, from the start; Jobs
    naming others are refused, each with an Event, and leave nothing behind when deleted."""
    t, api = tenant, tenant.api
    port = free_port()
    t.cluster.start_controller("--listen", f"127.0.0.1:{port}", "--resync-seconds", "2",
                               "--queue", "research=StrictFIFO", "--queue", "batch=BestEffortFIFO")
    names = [f"q-{uuid.uuid4().hex[:12]}" for _ in range(40)]
    for i, queue in enumerate(names):
        status, body = t.request("POST", "apis/batch/v1/namespaces/{ns}/jobs",
                                 in_queue(gang_job(f"junk-{i}", 1, t.label, cpu=1), queue))
        assert status == 201, body
    wait_for(lambda: all(events(api, t.namespace, f"junk-{i}") for i in range(len(names))),
             "the controller's word on every Job", timeout=90)
    status, text = scrape(port)
    assert status == 200
    assert depth_series(text) == {"research", "batch"}, sorted(depth_series(text))
    assert metric(text, f'{DEPTH}{{queue="research"}}') == 0
    told = messages(api, t.namespace, "UnknownQueue")
    assert all(f"'{queue}'" in told[f"junk-{i}"] and t.namespace in told[f"junk-{i}"]
               for i, queue in enumerate(names))
    assert not any(job_pods(api, t.namespace, f"junk-{i}") for i in range(len(names)))
    for i in range(len(names)):
        status, body = t.request("DELETE", f"apis/batch/v1/namespaces/{{ns}}/jobs/junk-{i}")
        assert status == 200, body
    # A pass after the Jobs are gone: still only the configured queues.
    wait_for(lambda: not api.list(f"/apis/batch/v1/namespaces/{t.namespace}/jobs").get("items"), "Jobs gone")
    gone = time.time()
    wait_for(lambda: metric(scrape(port)[1], LAST_PASS) > gone, "a pass after that")
    assert depth_series(scrape(port)[1]) == {"research", "batch"}
