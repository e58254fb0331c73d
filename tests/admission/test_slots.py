"""agent.admission.gangs.slots: only the pods the Job controller made for an admitted Job, from its
admitted template, hold or take its slots (issue 34, finding 2), on both routes; as tables."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given

from agent.admission.controller.intake import JobIntake
from agent.admission.engine.model import Placement, PodPlacement
from agent.admission.gangs.job import GATE, HOSTNAME_LABEL
from agent.admission.gangs.record import PLACEMENTS_ANNOTATION, SlotPlacement
from agent.admission.gangs.slots import (
    CONTROLLER_UID_LABEL,
    JOB_NAME_LABEL,
    JobOwner,
    claim_pods,
    job_owner,
    job_slots,
    pod_asks,
    unlabelled_job,
)
from agent.admission.jobs.jobread import JobReader
from agent.admission.jobs.queues import parse_queues
from agent.admission.kueue.holds import PODSET_LABEL, Holds
from agent.admission.kueue.workloads import (
    BY_COMPLETION_INDEX,
    gang_from_workload,
    pod_set_updates,
    ready_state,
)
from agent.admission.report.metrics import AdmissionMetrics
from tests.admission.test_hostile import JSON, RESOURCES

REQ = {"cpu": "12", "memory": "64Mi"}
INDEXED = BY_COMPLETION_INDEX  # the rule of an Indexed Job's pod sets


def container(res: dict[str, str] | None = None, name: str = "c") -> dict[str, Any]:
    res = res or REQ
    return {"name": name, "image": "pause", "resources": {"requests": dict(res), "limits": dict(res)}}


def job(*, uid: str = "job-uid", name: str = "gang", containers: list[dict[str, Any]] | None = None,
        **spec: Any) -> dict[str, Any]:
    """An admitted Job as the API server keeps it: the generated selector's labels in its template."""
    labels = {CONTROLLER_UID_LABEL: uid, JOB_NAME_LABEL: name, "controller-uid": uid, "job-name": name}
    return {"metadata": {"name": name, "namespace": "team", "uid": uid},
            "spec": {"parallelism": 2, **spec,
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"containers": containers or [container()]}}}}


def made(j: dict[str, Any], name: str, *, created: int = 5) -> dict[str, Any]:
    """A gated pod as the Job controller makes it for `j`: the template's labels and spec, its owner
    reference."""
    meta = j["metadata"]
    template = copy.deepcopy(j["spec"]["template"])
    spec = template["spec"]
    spec["schedulingGates"] = [{"name": GATE}]
    return {"metadata": {"name": name, "namespace": meta["namespace"], "uid": name, "resourceVersion": "1",
                         "creationTimestamp": f"2026-12-02T10:00:{created:02d}Z",
                         "labels": template["metadata"]["labels"],
                         "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": meta["name"],
                                              "uid": meta["uid"], "controller": True,
                                              "blockOwnerDeletion": True}]},
            "spec": spec, "status": {"phase": "Pending"}}


def ref(pod: dict[str, Any]) -> dict[str, Any]:
    return pod["metadata"]["ownerReferences"][0]  # type: ignore[no-any-return]


def labels(pod: dict[str, Any]) -> dict[str, str]:
    return pod["metadata"]["labels"]  # type: ignore[no-any-return]


def forged(change: Callable[[dict[str, Any]], Any]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A pod made for the Job, then changed by `change` (what a tenant writes)."""
    def build(j: dict[str, Any]) -> dict[str, Any]:
        pod = made(j, "forged", created=0)  # the oldest: the first to get a free slot
        change(pod)
        return pod
    return build


def _cpu(pod: dict[str, Any], cpu: str) -> None:
    res = {**REQ, "cpu": cpu}
    pod["spec"]["containers"][0]["resources"] = {"requests": res, "limits": dict(res)}


# (what, the pod as built from the Job, why it gets no slot (a part of the refusal), None: it is the Job's)
OWNERSHIP: list[tuple[str, Callable[[dict[str, Any]], dict[str, Any]], str | None]] = [
    ("made by the Job controller", forged(lambda p: None), None),
    ("the overhead its RuntimeClass adds is not the template's to carry",
     forged(lambda p: p["spec"].update(overhead={"cpu": "250m"})), None),
    ("requests written as limits only (the API server defaults them)",
     forged(lambda p: p["spec"]["containers"][0]["resources"].pop("requests")), None),
    ("kind Jobx (the finding)", forged(lambda p: ref(p).update(kind="Jobx")), "kind 'Jobx'"),
    ("kind Job, another apiVersion", forged(lambda p: ref(p).update(apiVersion="batch/v2")),
     "apiVersion 'batch/v2'"),
    ("kind Job, no apiVersion", forged(lambda p: ref(p).pop("apiVersion")), "apiVersion none"),
    ("the Job's uid under another Job's name", forged(lambda p: ref(p).update(name="other")), "name 'other'"),
    ("another Job's uid", forged(lambda p: ref(p).update(uid="other-uid")), "not the Job controller's"),
    ("the owner reference is not the controller's", forged(lambda p: ref(p).update(controller=False)),
     "no controller owner reference"),
    ("no owner reference", forged(lambda p: p["metadata"].pop("ownerReferences")), "no controller owner"),
    ("a controller reference of another before the Job's",
     forged(lambda p: p["metadata"]["ownerReferences"].insert(
         0, {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "rs", "controller": True})),
     "kind 'ReplicaSet'"),
    ("the Job's labels missing", forged(lambda p: p["metadata"].pop("labels")), CONTROLLER_UID_LABEL),
    ("the controller-uid label of another Job",
     forged(lambda p: labels(p).update({CONTROLLER_UID_LABEL: "x"})), CONTROLLER_UID_LABEL),
    ("the job-name label missing (the selector's kept)", forged(lambda p: labels(p).pop(JOB_NAME_LABEL)),
     JOB_NAME_LABEL),
    ("16 CPUs where the template says 12", forged(lambda p: _cpu(p, "16")),
     "cpu 16 where its template asks 12"),
    ("fewer CPUs than the template", forged(lambda p: _cpu(p, "500m")), "cpu 0.5 where its template asks 12"),
    ("a GPU the template does not ask", forged(
        lambda p: p["spec"]["containers"][0]["resources"]["limits"].update({"nvidia.com/gpu": "1"})),
     "nvidia.com/gpu 1 where its template asks 0"),
    ("another container beside the template's", forged(
        lambda p: p["spec"]["containers"].append(container({"cpu": "1"}, "side"))), "cpu 13"),
    ("a sidecar", forged(lambda p: p["spec"].update(initContainers=[
        {**container({"cpu": "4"}, "side"), "restartPolicy": "Always"}])), "cpu 16"),
    ("another RuntimeClass", forged(lambda p: p["spec"].update(runtimeClassName="fat")), "runtimeClassName"),
    ("requests that cannot be read", forged(lambda p: _cpu(p, "lots")), "cannot be read"),
    ("in another namespace", forged(lambda p: p["metadata"].update(namespace="other")), "another namespace"),
]


@pytest.mark.parametrize(("what", "build", "why"), OWNERSHIP, ids=[o[0] for o in OWNERSHIP])
def test_only_the_job_controllers_pods_hold_slots(
        what: str, build: Callable[[dict[str, Any]], dict[str, Any]], why: str | None) -> None:
    j = job()
    pod, real = build(j), [made(j, "real-0", created=1), made(j, "real-1", created=2)]
    refusal = job_owner(j).refusal(pod)
    if why is None:
        assert refusal is None
        return
    assert refusal is not None and why in refusal
    slots = {0: SlotPlacement("n1", 0), 1: SlotPlacement("n1", 1)}
    got = job_slots(job_owner(j), slots, [pod, *real], indexed=False)
    # The forged pod is the oldest, yet the Job's own pods get both slots, and it is told why not.
    assert dict(got.held) == {"real-0": 0, "real-1": 1}
    assert [(p["metadata"]["name"], s) for p, s in got.place] == [("real-0", 0), ("real-1", 1)]
    assert got.refused == ((pod, refusal),)


def test_a_pinned_pod_that_is_not_the_jobs_holds_no_slot() -> None:
    """A forged pod pinned to slot 0's (node, zone) (by an older controller, say) holds nothing: the
    Job's gated pod takes slot 0."""
    j = job()
    pod = made(j, "forged", created=0)
    _cpu(pod, "16")
    pod["spec"] = {**pod["spec"], "schedulingGates": None, "nodeSelector": {HOSTNAME_LABEL: "n1"}}
    pod["metadata"]["annotations"] = {"topolet.io/numa-zone": "0"}
    got = job_slots(job_owner(j), {0: SlotPlacement("n1", 0)}, [pod, made(j, "real")], indexed=False)
    assert dict(got.held) == {"real": 0} and [p["metadata"]["name"] for p, _ in got.refused] == ["forged"]


def test_pods_that_would_hold_nothing_either_way_are_not_named() -> None:
    """Only a live pod that is gated or pinned would have held a slot: the rest are not told of."""
    j = job()
    ungated = made(j, "ungated")
    ungated["spec"]["schedulingGates"] = None
    done = made(j, "done")
    done["status"]["phase"] = "Succeeded"
    for pod in (ungated, done):
        ref(pod)["kind"] = "Jobx"
    claimed = claim_pods(job_owner(j), [ungated, done, made(j, "mine")])
    assert [p["metadata"]["name"] for p in claimed.pods] == ["mine"] and claimed.refused == ()


def test_a_template_that_cannot_be_read_gives_no_pod_a_slot() -> None:
    j = job(containers=[container({"cpu": "lots"})])
    owner = job_owner(j)
    assert isinstance(owner.asks, str)
    refusal = owner.refusal(made(j, "p"))
    assert refusal is not None and "template cannot be read" in refusal


def test_what_a_pod_asks() -> None:
    """Requests as the scheduler counts them, less the overhead; each container's CPUs; the RuntimeClass."""
    spec = {"containers": [container({"cpu": "2"}), container({"cpu": "3"}, "b")],
            "initContainers": [container({"cpu": "8"}, "init")], "overhead": {"cpu": "1"},
            "runtimeClassName": "kata"}
    asks = pod_asks(spec)
    assert dict(asks.requests)["cpu"] == 8 and asks.cpus == (2000, 3000) and asks.runtime_class == "kata"
    assert pod_asks({**spec, "overhead": {}}) == asks
    # The same total split otherwise between the containers is another pod for the container scope.
    other = pod_asks({**spec, "containers": [container({"cpu": "3"}), container({"cpu": "2"}, "b")]})
    assert other != asks
    j = job(containers=spec["containers"])
    pod = made(j, "p")
    pod["spec"]["containers"] = [container({"cpu": "3"}), container({"cpu": "2"}, "b")]
    refusal = job_owner(j).refusal(pod)
    assert refusal is not None and "containers' CPUs 3000m, 2000m" in refusal


@pytest.mark.parametrize(("spec", "template_labels", "refused"), [
    ({}, {}, False),  # a generated selector: the API server adds the labels (none in this test Job)
    ({"manualSelector": False}, {}, False),
    ({"manualSelector": True}, {CONTROLLER_UID_LABEL: "job-uid", JOB_NAME_LABEL: "gang"}, False),
    ({"manualSelector": True}, {"app": "mine"}, True),
    ({"manualSelector": True}, {CONTROLLER_UID_LABEL: "job-uid"}, True),
])
def test_a_manual_selector_without_the_job_controllers_labels_is_refused_before_admission(
        spec: dict[str, Any], template_labels: dict[str, str], refused: bool) -> None:
    j = job(**spec)
    j["spec"]["template"]["metadata"]["labels"] = template_labels
    why = unlabelled_job(j)
    assert (why is not None) == refused
    if why is not None:
        assert "manual selector" in why


@given(JSON, RESOURCES, JSON, JSON)
def test_the_ownership_check_over_hostile_pods_never_raises(
        anything: Any, requests: dict[str, Any], overhead: Any, runtime: Any) -> None:
    j = job()
    pod = made(j, "p")
    pod["spec"]["containers"][0]["resources"] = {"requests": requests, "limits": anything}
    pod["spec"]["overhead"] = overhead
    pod["spec"]["runtimeClassName"] = runtime
    pod["spec"]["initContainers"] = anything
    job_owner(j).refusal(pod)
    ref(pod)["name"] = anything
    pod["metadata"]["labels"] = anything
    pod["spec"] = anything
    assert job_owner(j).refusal(pod) is not None


# -- the Job route's reader and the intake's Events ------------------------------------------------


def test_the_job_route_reads_slots_for_the_jobs_pods_only() -> None:
    from agent.admission.gangs.job import ADMISSION_ANNOTATION
    from agent.admission.gangs.record import AdmissionRecord
    from agent.admission.gangs.shape import job_shape

    j = job()
    j["metadata"].update(resourceVersion="3", labels={"topolet.io/queue": "default"})
    slots = {0: SlotPlacement("n1", 0), 1: SlotPlacement("n1", 1)}
    record = AdmissionRecord("admitted", "d", "2026-12-02T10:00:00Z", slots, shape=job_shape(j))
    j["metadata"]["annotations"] = {ADMISSION_ANNOTATION: record.encode()}
    reader = JobReader()
    read = reader.read(j)
    assert read.owner == job_owner(j) and read.distrusted is None
    jobx = made(j, "jobx", created=0)
    ref(jobx)["kind"] = "Jobx"
    _cpu(jobx, "16")
    got = reader.slots(read, [jobx, made(j, "a", created=1), made(j, "b", created=2)])
    assert dict(got.held) == {"a": 0, "b": 1} and [p["metadata"]["name"] for p, _ in got.refused] == ["jobx"]


class _Events:
    def __init__(self) -> None:
        self.sent: list[tuple[dict[str, Any], str, str, str]] = []

    def record(self, obj: dict[str, Any], kind: str, reason: str, message: str) -> None:
        self.sent.append((obj, kind, reason, message))


class _Writes:
    """Stands in for JobWrites: the Events the intake sends."""

    def __init__(self) -> None:
        self.events = _Events()
        self.told: list[tuple[str, str, str]] = []  # (Job name, reason, message) through `invalid`

    def invalid(self, job: dict[str, Any], reason: str, message: str) -> None:
        self.told.append((job["metadata"]["name"], reason, message))


def test_the_intake_refuses_a_manual_selector_job_whose_pods_could_not_be_told_apart() -> None:
    jobs = []
    for name, manual, template_labels in (("generated", None, {}), ("manual", True, {"app": "mine"}),
                                          ("manual-labelled", True, None)):
        j = job(name=name, uid=f"uid-{name}", **({"manualSelector": manual} if manual else {}))
        j["metadata"].update(resourceVersion="1", labels={"topolet.io/queue": "default"},
                             creationTimestamp="2026-12-02T10:00:00Z")
        j["spec"]["suspend"] = True
        if template_labels is not None:
            j["spec"]["template"]["metadata"]["labels"] = template_labels
        jobs.append(j)
    writes = _Writes()
    intake = JobIntake(JobReader(), writes, AdmissionMetrics(), parse_queues([]))  # type: ignore[arg-type]
    out = intake.sort(jobs, ({}, 0), frozenset())
    assert [p.gang.key for p in out.pending] == ["team/generated", "team/manual-labelled"]
    ((name, reason, message),) = writes.told
    assert (name, reason) == ("manual", "InvalidJob") and CONTROLLER_UID_LABEL in message


def test_a_refused_pod_is_told_once_on_its_job_while_it_is_there() -> None:
    j = job()
    pod = made(j, "forged")
    _cpu(pod, "16")
    owner = job_owner(j)
    why = owner.refusal(pod)
    assert why is not None
    writes = _Writes()
    metrics = AdmissionMetrics()
    intake = JobIntake(JobReader(), writes, metrics, {})  # type: ignore[arg-type]
    for _ in range(3):
        intake.report_refused([(owner, pod, why)], [pod])
    ((obj, kind, reason, message),) = writes.events.sent
    assert obj["metadata"] == {"namespace": "team", "name": "gang", "uid": "job-uid"}
    assert (kind, reason) == ("Warning", "ForeignPod") and message == f"pod forged gets no slot: {why}"
    assert metrics.registry.get_sample_value("topolet_admission_invalid_objects_total", {"kind": "Pod"}) == 1
    intake.report_refused([], [])  # the pod is gone: forgotten, so a new pod of that uid is told again
    intake.report_refused([(owner, pod, why)], [pod])
    assert len(writes.events.sent) == 2


# -- the Kueue route: a Ready Workload's Job's pods --------------------------------------------------


def ready_workload(owner: dict[str, Any] | None = None) -> dict[str, Any]:
    """A Workload of Job `gang` (two 12-CPU pods, pod set main) Ready with both on n1, zones 0 and 1."""
    j = job()
    wl = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
          "metadata": {"name": "job-gang", "namespace": "team", "uid": "wl-uid", "resourceVersion": "9",
                       "ownerReferences": [owner or {"apiVersion": "batch/v1", "kind": "Job", "name": "gang",
                                                     "uid": "job-uid", "controller": True}]},
          "spec": {"queueName": "lq", "podSets": [{"name": "main", "count": 2, "template": {
              "metadata": {"annotations": {"topolet.io/numa-policy": "single-numa-node"}},
              "spec": copy.deepcopy(j["spec"]["template"]["spec"])}}]},
          "status": {"conditions": [{"type": "QuotaReserved", "status": "True"}],
                     "admission": {"clusterQueue": "cq",
                                   "podSetAssignments": [{"name": "main", "flavors": {"cpu": "default"}}]}}}
    gang = gang_from_workload(wl, {})
    placement = Placement(gang.key, (PodPlacement("main", 0, "n1", 0), PodPlacement("main", 1, "n1", 1)))
    state = ready_state("fit", gang, placement, pod_set_updates(gang, placement, lambda _: INDEXED),
                        "2026-12-02T10:00:00Z")
    wl["status"]["admissionChecks"] = [state]
    return wl


def kueue_pod(name: str, index: int, created: int) -> dict[str, Any]:
    """A pod of Job `gang` as the placement policy pinned it by its completion index."""
    pod = made(job(), name, created=created)
    pod["spec"] = {**pod["spec"], "schedulingGates": None, "nodeSelector": {HOSTNAME_LABEL: "n1"}}
    labels(pod)[PODSET_LABEL] = "main"
    pod["metadata"]["annotations"] = {"batch.kubernetes.io/job-completion-index": str(index),
                                      PLACEMENTS_ANNOTATION: "n1:0,n1:1"}
    return pod


def test_the_kueue_route_counts_slots_for_the_workloads_jobs_pods_only() -> None:
    forged = kueue_pod("forged", 0, created=0)
    ref(forged)["kind"] = "Jobx"
    _cpu(forged, "16")
    pods = [forged, kueue_pod("p0", 0, created=1), kueue_pod("p1", 1, created=2)]
    entries, slots, refused = Holds().of(ready_workload(), "fit", pods, True)
    assert len(entries) == 1
    assert slots == {"p0": ("workload:team/job-gang/main", "0"), "p1": ("workload:team/job-gang/main", "1")}
    ((owner, pod, why),) = refused
    assert (owner.namespace, owner.name, owner.uid) == ("team", "gang", "job-uid")
    assert pod is forged and "kind 'Jobx'" in why
    # The Kueue route compares with the Workload's pod set template: 16 CPUs are not its 12.
    fat = kueue_pod("fat", 0, created=0)
    _cpu(fat, "16")
    _, slots, refused = Holds().of(ready_workload(), "fit", [fat], True)
    assert slots == {} and "cpu 16 where its template asks 12" in refused[0][2]


@pytest.mark.parametrize("owner", [
    {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "name": "gang", "uid": "job-uid",
     "controller": True},
    {"apiVersion": "batch/v1", "kind": "Job", "name": "gang", "uid": "job-uid", "controller": False},
])
def test_no_pod_holds_a_slot_of_a_workload_no_job_controls(owner: dict[str, Any]) -> None:
    entries, slots, refused = Holds().of(ready_workload(owner), "fit", [kueue_pod("p0", 0, created=1)], True)
    assert len(entries) == 1 and slots == {} and refused == []


def test_owner_refusal_is_a_value() -> None:
    """JobOwner is hashable and compares by value: the Job route's memo keys on it."""
    assert job_owner(job()) == job_owner(job()) and hash(job_owner(job())) == hash(job_owner(job()))
    assert job_owner(job()) != job_owner(job(containers=[container({"cpu": "16"})]))
    assert isinstance(job_owner(job()), JobOwner)
