"""The native route's JobSets, pure parts as tables: a JobSet read as a gang (agent.admission.gangs.jobset),
its admitting write (agent.admission.jobs.jobset_patches), which pod holds which slot by rank, and a
JobSet's own Jobs kept out of the Job queues.  End to end with the real JobSet controller:
tests/kueue/test_native_training_e2e.py."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest

from agent.admission.controller.intake import JobIntake
from agent.admission.engine.model import Placement, PodPlacement
from agent.admission.gangs.job import ADMISSION_ANNOTATION, GATE, HOSTNAME_LABEL, JobSpecError
from agent.admission.gangs.jobset import (
    JOB_INDEX_LABEL,
    JOBSET_NAME_LABEL,
    JOBSET_UID_LABEL,
    REPLICATED_JOB_LABEL,
    TRAINJOB,
    block_record,
    blocks,
    controller_uid,
    gang_from_jobset,
    jobset_finished,
    jobset_owner,
    jobset_shape,
    jobset_slots,
    pods_of_jobsets,
    replicated_jobs,
    trainjob_finished,
)
from agent.admission.gangs.record import PLACEMENTS_ANNOTATION, SlotPlacement, admitted_record, decode_record
from agent.admission.gangs.slots import CONTROLLER_UID_LABEL, JOB_NAME_LABEL
from agent.admission.jobs.jobread import JobReader
from agent.admission.jobs.jobset_patches import (
    jobset_decision_patch,
    jobset_still_undecided,
    trainjob_decision_patch,
    trainjob_placement_patch,
    trainjob_still_undecided,
)
from agent.admission.jobs.patches import BY_INDEX_LABEL
from agent.admission.jobs.queues import parse_queues
from agent.admission.report.metrics import AdmissionMetrics
from agent.api.names import COMPLETION_INDEX
from agent.api.ranks import RANK_ANNOTATION, parse_rank_rule

REQ = {"cpu": "12", "memory": "64Mi"}


def rjob(name: str, replicas: int = 2, pods: int = 3, req: dict[str, str] | None = None,
         **spec: Any) -> dict[str, Any]:
    res = req or REQ
    return {"name": name, "replicas": replicas, "template": {"spec": {
        "completionMode": "Indexed", "completions": pods, "parallelism": pods, **spec,
        "template": {"metadata": {"annotations": {"topolet.io/numa-policy": "single-numa-node"}},
                     "spec": {"restartPolicy": "Never", "containers": [
                         {"name": "c", "image": "pause", "resources": {"requests": dict(res),
                                                                       "limits": dict(res)}}]}}}}}


def jobset(*rjobs: dict[str, Any], uid: str = "js-uid", name: str = "train") -> dict[str, Any]:
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": name, "namespace": "team", "uid": uid, "resourceVersion": "7",
                         "labels": {"topolet.io/queue": "default"}},
            "spec": {"suspend": True, "replicatedJobs": list(rjobs) or [rjob("workers")]}}


# -- reading a JobSet -------------------------------------------------------------------------------

BAD: list[tuple[str, Callable[[dict[str, Any]], Any], str]] = [
    ("no replicated Jobs", lambda js: js["spec"].update(replicatedJobs=[]), "1 to 64 replicated Jobs"),
    ("a name that is no DNS label", lambda js: js["spec"]["replicatedJobs"][0].update(name="Bad_Name"),
     "DNS label"),
    ("a name twice", lambda js: js["spec"]["replicatedJobs"].append(rjob("workers")), "named twice"),
    ("replicas 0", lambda js: js["spec"]["replicatedJobs"][0].update(replicas=0), "replicas must be"),
    ("replicas a string", lambda js: js["spec"]["replicatedJobs"][0].update(replicas="2"),
     "replicas must be"),
    ("not Indexed", lambda js: js["spec"]["replicatedJobs"][0]["template"]["spec"].pop("completionMode"),
     "not Indexed"),
    ("no completions", lambda js: js["spec"]["replicatedJobs"][0]["template"]["spec"].pop("completions"),
     "positive completions"),
    ("pods in waves", lambda js: js["spec"]["replicatedJobs"][0]["template"]["spec"].update(parallelism=1),
     "in waves"),
    ("no containers", lambda js: js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
     .update(containers=[]), "no containers"),
    ("unreadable requests", lambda js: js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
     ["containers"][0]["resources"].update(requests={"cpu": "lots"}), "replicated Job workers"),
]


@pytest.mark.parametrize(("what", "change", "why"), BAD, ids=[b[0] for b in BAD])
def test_a_jobset_that_cannot_be_a_gang_says_why(what: str, change: Callable[[dict[str, Any]], Any],
                                                 why: str) -> None:
    js = jobset()
    change(js)
    with pytest.raises(JobSpecError, match=why):
        gang_from_jobset(js, {})


def test_a_jobset_is_one_pod_set_per_replicated_job_of_replicas_times_pods() -> None:
    js = jobset(rjob("workers", 2, 3), rjob("driver", 1, 1, {"cpu": "2", "memory": "1Gi"}))
    gang = gang_from_jobset(js, {})
    assert gang.key == "jobset:team/train"
    assert [(p.name, p.count, p.requests.cpu_milli, p.numa_policy) for p in gang.pod_sets] == [
        ("workers", 6, 12000, "single-numa-node"), ("driver", 1, 2000, "single-numa-node")]
    # Slots in name order, as admitted_record numbers them: driver's first.
    spans = blocks(replicated_jobs(js))
    assert {n: (b, r.count) for n, (b, r) in spans.items()} == {"driver": (0, 1), "workers": (1, 6)}
    assert spans["workers"][1].rule.value() == f"{JOB_INDEX_LABEL}*3+{COMPLETION_INDEX}"


def test_more_pods_than_completions_run_as_completions() -> None:
    (only,) = replicated_jobs(jobset(rjob("w", 2, 3, parallelism=5)))
    assert (only.per_job, only.count) == (3, 6)


FINISHED = [
    ({}, False),
    ({"terminalState": "Completed"}, True),
    ({"terminalState": "Failed"}, True),
    ({"conditions": [{"type": "Completed", "status": "True"}]}, True),
    ({"conditions": [{"type": "Failed", "status": "True"}]}, True),
    ({"conditions": [{"type": "Completed", "status": "False"}]}, False),
    ({"conditions": [{"type": "Suspended", "status": "True"}]}, False),
]


@pytest.mark.parametrize(("status", "finished"), FINISHED)
def test_a_jobset_is_finished_by_its_terminal_state_or_conditions(status: dict[str, Any],
                                                                   finished: bool) -> None:
    assert jobset_finished({**jobset(), "status": status}) is finished


SHAPES: list[tuple[str, Callable[[dict[str, Any]], Any], bool]] = [
    ("the same", lambda js: None, True),
    ("our placements written", lambda js: js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
     ["metadata"]["annotations"].update({PLACEMENTS_ANNOTATION: "n:0"}), True),
    ("more replicas", lambda js: js["spec"]["replicatedJobs"][0].update(replicas=3), False),
    ("more CPUs", lambda js: js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
     ["containers"][0]["resources"]["limits"].update(cpu="16"), False),
    ("another JobSet of the same name", lambda js: js["metadata"].update(uid="other"), False),
]


@pytest.mark.parametrize(("what", "change", "same"), SHAPES, ids=[s[0] for s in SHAPES])
def test_the_shape_covers_uid_replicas_and_resources(what: str, change: Callable[[dict[str, Any]], Any],
                                                      same: bool) -> None:
    js = jobset()
    changed = copy.deepcopy(js)
    change(changed)
    assert (jobset_shape(changed) == jobset_shape(js)) is same


# -- the admitting write ----------------------------------------------------------------------------

def placed(js: dict[str, Any], where: dict[str, list[tuple[str, int | None]]]) -> Placement:
    pods = tuple(PodPlacement(name, i, node, zone) for name, slots in where.items()
                 for i, (node, zone) in enumerate(slots))
    return Placement(f"jobset:team/{js['metadata']['name']}", pods)


def test_the_decision_writes_record_slots_by_rank_gate_and_unsuspends_in_one_patch() -> None:
    js = jobset(rjob("workers", 2, 3), rjob("driver", 1, 1))
    tenant = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["metadata"]
    tenant["annotations"]["keep"] = "me"
    tenant["annotations"][RANK_ANNOTATION] = "forged"  # never beside ours
    workers: list[tuple[str, int | None]] = [("n1", 0), ("n1", 1), ("n1", 2),
                                             ("n2", 0), ("n2", 1), ("n2", 2)]
    record = admitted_record(placed(js, {"workers": workers, "driver": [("n3", None)]}), "d1", "t",
                             jobset_shape(js))
    body = jobset_decision_patch(js, record)
    assert body["metadata"]["resourceVersion"] == "7"
    assert decode_record(body["metadata"]["annotations"][ADMISSION_ANNOTATION]) == record
    assert body["spec"]["suspend"] is False
    by_name = {r["name"]: r["template"]["spec"]["template"] for r in body["spec"]["replicatedJobs"]}
    w = by_name["workers"]
    assert w["metadata"]["annotations"] == {
        "topolet.io/numa-policy": "single-numa-node", "keep": "me",
        PLACEMENTS_ANNOTATION: "n1:0,n1:1,n1:2,n2:0,n2:1,n2:2",
        RANK_ANNOTATION: f"{JOB_INDEX_LABEL}*3+{COMPLETION_INDEX}"}
    assert w["metadata"]["labels"] == {BY_INDEX_LABEL[0]: BY_INDEX_LABEL[1]}
    assert w["spec"]["schedulingGates"] == [{"name": GATE}]
    assert by_name["driver"]["metadata"]["annotations"][PLACEMENTS_ANNOTATION] == "n3:"
    # Nothing else in the replicated Jobs changes; the object read is left as it was.
    for before, after in zip(jobset(rjob("workers", 2, 3), rjob("driver", 1, 1))["spec"]["replicatedJobs"],
                             body["spec"]["replicatedJobs"], strict=True):
        assert {k: v for k, v in after.items() if k != "template"} == {
            k: v for k, v in before.items() if k != "template"}
        assert after["template"]["spec"]["template"]["spec"]["containers"] == \
            before["template"]["spec"]["template"]["spec"]["containers"]
    assert RANK_ANNOTATION in tenant["annotations"]
    # The policy's rule reads back.
    assert parse_rank_rule(w["metadata"]["annotations"][RANK_ANNOTATION]) == replicated_jobs(js)[0].rule


def test_a_split_pod_is_left_gated_for_the_controller() -> None:
    js = jobset(rjob("w", 1, 1))
    split = PodPlacement("w", 0, "n1", None, zones=(0, 1))
    record = admitted_record(Placement("jobset:team/train", (split,)), "d", "t", jobset_shape(js))
    (entry,) = jobset_decision_patch(js, record)["spec"]["replicatedJobs"]
    template = entry["template"]["spec"]["template"]
    assert PLACEMENTS_ANNOTATION not in template["metadata"]["annotations"]
    assert template["spec"]["schedulingGates"] == [{"name": GATE}]


UNDECIDED: list[tuple[str, Callable[[dict[str, Any]], Any], bool]] = [
    ("only its status moved", lambda js: js.update(status={"replicatedJobsStatus": []}), True),
    ("decided by another replica", lambda js: js["metadata"].update(
        annotations={ADMISSION_ANNOTATION: "{}"}), False),
    ("unsuspended by someone", lambda js: js["spec"].update(suspend=False), False),
    ("re-created under the name", lambda js: js["metadata"].update(uid="new"), False),
    ("its template changed", lambda js: js["spec"]["replicatedJobs"][0].update(replicas=5), False),
]




# -- which pod holds which slot ---------------------------------------------------------------------

def pod(js: dict[str, Any], rjob_name: str, job_index: int, index: int, *, gated: bool = True,
        node: str | None = None, zone: int | None = None, created: int = 5) -> dict[str, Any]:
    """A pod as the Job controller makes it for the JobSet's Job `<js>-<rjob>-<job_index>`."""
    meta = js["metadata"]
    job_name = f"{meta['name']}-{rjob_name}-{job_index}"
    job_uid = f"uid-{job_name}"
    (entry,) = [r for r in js["spec"]["replicatedJobs"] if r["name"] == rjob_name]
    spec = copy.deepcopy(entry["template"]["spec"]["template"]["spec"])
    if gated:
        spec["schedulingGates"] = [{"name": GATE}]
    annotations = {COMPLETION_INDEX: str(index)}
    if node is not None:
        spec["nodeSelector"] = {HOSTNAME_LABEL: node}
        if zone is not None:
            annotations["topolet.io/numa-zone"] = str(zone)
    name = f"{job_name}-{index}"
    return {"metadata": {
        "name": name, "namespace": meta["namespace"], "uid": name, "resourceVersion": "1",
        "creationTimestamp": f"2026-12-07T10:00:{created:02d}Z", "annotations": annotations,
        "labels": {JOBSET_UID_LABEL: meta["uid"], JOBSET_NAME_LABEL: meta["name"],
                   REPLICATED_JOB_LABEL: rjob_name, JOB_INDEX_LABEL: str(job_index),
                   COMPLETION_INDEX: str(index), CONTROLLER_UID_LABEL: job_uid, JOB_NAME_LABEL: job_name},
        "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": job_name, "uid": job_uid,
                             "controller": True}]},
        "spec": spec, "status": {"phase": "Pending"}}


def admitted(js: dict[str, Any]) -> dict[int, SlotPlacement]:
    n = sum(r.count for r in replicated_jobs(js))
    return {i: SlotPlacement(f"n{i // 4}", i % 4) for i in range(n)}


def test_each_gated_pod_gets_the_slot_of_its_rank_and_pinned_ones_hold_theirs() -> None:
    js = jobset(rjob("workers", 2, 3), rjob("driver", 1, 1))
    slots = admitted(js)
    owner = jobset_owner(js)
    pods = [pod(js, "workers", j, i) for j in (1, 0) for i in (2, 1, 0)] + [pod(js, "driver", 0, 0)]
    done = jobset_slots(owner, slots, pods)
    got = {p["metadata"]["name"]: s for p, s in done.place}
    # driver is slot 0 (name order), workers 1..6 by job index × 3 + completion index
    assert got == {"train-driver-0-0": 0, **{f"train-workers-{j}-{i}": 1 + 3 * j + i
                                             for j in (0, 1) for i in range(3)}}
    assert done.refused == ()
    # Pinned where their slots are, they hold them (a pass after the policy pinned them).
    pinned = [pod(js, "workers", j, i, gated=False, node=slots[1 + 3 * j + i].node,
                  zone=slots[1 + 3 * j + i].zone) for j in (0, 1) for i in range(3)]
    held = jobset_slots(owner, slots, pinned)
    assert held.place == () and sorted(held.held.values()) == list(range(1, 7))


def _relabel(key: str, value: str) -> Callable[[dict[str, Any]], Any]:
    return lambda p: p["metadata"]["labels"].update({key: value})


FOREIGN: list[tuple[str, Callable[[dict[str, Any]], Any], str]] = [
    ("another JobSet's uid", _relabel(JOBSET_UID_LABEL, "other"), JOBSET_UID_LABEL),
    ("another JobSet's name", _relabel(JOBSET_NAME_LABEL, "other"), JOBSET_NAME_LABEL),
    ("a replicated Job it lacks", _relabel(REPLICATED_JOB_LABEL, "ghost"), "names no replicated Job"),
    ("a job index its Job's name does not carry", _relabel(JOB_INDEX_LABEL, "1"), "not the Job controller's"),
    ("made by another controller", lambda p: p["metadata"]["ownerReferences"][0].update(kind="ReplicaSet"),
     "kind 'ReplicaSet'"),
    ("more CPUs than its template", lambda p: p["spec"]["containers"][0]["resources"].update(
        requests={"cpu": "16", "memory": "64Mi"}, limits={"cpu": "16", "memory": "64Mi"}), "cpu 16"),
    ("in another namespace", lambda p: p["metadata"].update(namespace="other"), "another namespace"),
]


@pytest.mark.parametrize(("what", "change", "why"), FOREIGN, ids=[f[0] for f in FOREIGN])
def test_a_pod_not_made_for_the_jobset_takes_no_slot(what: str, change: Callable[[dict[str, Any]], Any],
                                                     why: str) -> None:
    js = jobset()
    foreign = pod(js, "workers", 0, 0, created=0)
    change(foreign)
    own = pod(js, "workers", 0, 0)
    done = jobset_slots(jobset_owner(js), admitted(js), [foreign, own])
    assert [(p["metadata"]["uid"], s) for p, s in done.place] == [(own["metadata"]["uid"], 0)]
    ((refused, said),) = done.refused
    assert refused is foreign and why in said


def test_forged_indexes_past_its_replicated_job_get_only_a_free_slot_of_it() -> None:
    """A pod whose rank is past its replicated Job's slots (a completion index over the pods per Job)
    gets none of another replicated Job's slots: a free one of its own, or none."""
    js = jobset(rjob("a", 1, 2), rjob("b", 1, 2))
    slots = admitted(js)
    owner = jobset_owner(js)
    pods = [pod(js, "a", 0, 0), pod(js, "a", 0, 1)]
    odd = pod(js, "a", 0, 1, created=9)
    odd["metadata"]["labels"][COMPLETION_INDEX] = odd["metadata"]["annotations"][COMPLETION_INDEX] = "7"
    odd["metadata"]["uid"] = "odd"
    done = jobset_slots(owner, slots, [*pods, odd])
    assert sorted(s for _, s in done.place) == [0, 1]  # a's block; the odd pod waits, b's slots stay free
    assert "odd" not in done.held


def test_pods_are_grouped_by_the_jobset_uid_they_carry() -> None:
    js = jobset()
    a, b = pod(js, "workers", 0, 0), pod(js, "workers", 0, 1)
    b["metadata"]["labels"].pop(JOBSET_UID_LABEL)
    assert pods_of_jobsets([a, b]) == {("team", "js-uid"): [a]}


def test_a_block_record_renumbers_one_replicated_jobs_slots_from_zero() -> None:
    js = jobset(rjob("a", 1, 2), rjob("b", 1, 3))
    record = admitted_record(placed(js, {"a": [("x", 0), ("x", 1)], "b": [("y", 0), ("y", 1), ("y", 2)]}),
                             "d", "t")
    assert block_record(record, 2, 3).slots == {i: SlotPlacement("y", i) for i in range(3)}


# -- a JobSet's own Jobs are not queued on their own -----------------------------------------------

def test_a_job_of_a_jobset_is_not_queued_as_a_gang_of_its_own() -> None:
    """A tenant who puts topolet.io/queue in a replicated Job's template gets Jobs labelled with it:
    each would be a second gang over the same pods.  The Job route tells it and leaves it alone."""
    told: list[tuple[str, str]] = []

    class Writes:
        def invalid(self, job: Any, reason: str, message: str, involved: Any = None) -> None:
            told.append((reason, message))

    intake = JobIntake(JobReader(), Writes(), AdmissionMetrics(), parse_queues([]))  # type: ignore[arg-type]
    job = {"metadata": {"name": "train-workers-0", "namespace": "team", "uid": "j", "resourceVersion": "1",
                        "labels": {"topolet.io/queue": "default"},
                        "ownerReferences": [{"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
                                             "name": "train", "uid": "js", "controller": True}]},
           "spec": json.loads(json.dumps(rjob("w")["template"]["spec"])) | {"suspend": True}}
    out = intake.sort([job], ({}, 0), frozenset())
    assert out.pending == [] and out.admitted == []
    assert told and told[0][0] == "InvalidJob" and "JobSet train" in told[0][1]


# -- TrainJobs: queued on themselves, shaped by their JobSet -----------------------------------------

def trainjob(patches: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": {"name": "train", "namespace": "team", "uid": "tj-uid", "resourceVersion": "9",
                         "labels": {"topolet.io/queue": "default"}},
            "spec": {"suspend": True, "runtimeRef": {"name": "torch"}, "trainer": {"numNodes": 6},
                     "runtimePatches": list(patches or [])}}


def test_a_trainjob_is_placed_by_a_runtime_patch_of_ours_then_recorded_and_unsuspended() -> None:
    """Two writes (Trainer's webhook takes a runtime patch only on a suspended TrainJob): our runtime
    patch beside the tenant's, then the record and the unsuspend together."""
    js = jobset(rjob("node", 1, 6))
    tenant = {"manager": "tenant.example.com/mine", "time": "2026-12-07T10:00:00Z",
              "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [{"name": "node"}]}}}}
    stale = {"manager": "topolet.io/controller", "trainingRuntimeSpec": {}}
    tj = trainjob([tenant, stale])
    slots: list[tuple[str, int | None]] = [("n1", 0), ("n1", 1), ("n1", 2),
                                           ("n2", 0), ("n2", 1), ("n2", 2)]
    record = admitted_record(placed(js, {"node": slots}), "d", "t", jobset_shape(js))
    body = trainjob_placement_patch(tj, js, record)
    assert body["metadata"] == {"resourceVersion": "9"}
    assert set(body["spec"]) == {"runtimePatches"}  # still suspended, no record yet
    after = {**tj, "metadata": {**tj["metadata"], "resourceVersion": "10"}}
    assert trainjob_decision_patch(after, js, record) == {
        "metadata": {"resourceVersion": "10", "annotations": {ADMISSION_ANNOTATION: record.encode()}},
        "spec": {"suspend": False}}
    mine, ours = body["spec"]["runtimePatches"]
    assert mine == tenant  # kept as it was; our stale one replaced
    assert ours == {"manager": "topolet.io/controller", "trainingRuntimeSpec": {"template": {"spec": {
        "replicatedJobs": [{"name": "node", "template": {"spec": {"template": {
            "metadata": {"annotations": {PLACEMENTS_ANNOTATION: "n1:0,n1:1,n1:2,n2:0,n2:1,n2:2",
                                         RANK_ANNOTATION: f"{JOB_INDEX_LABEL}*6+{COMPLETION_INDEX}"},
                         "labels": {BY_INDEX_LABEL[0]: BY_INDEX_LABEL[1]}},
            "spec": {"schedulingGates": [{"name": GATE}]}}}}}]}}}}


UNDECIDED_TRAINJOB: list[tuple[str, Callable[[dict[str, Any]], Any], bool]] = [
    ("only its status moved", lambda tj: tj.update(status={"conditions": []}), True),
    ("decided by another replica",
     lambda tj: tj["metadata"].update(annotations={ADMISSION_ANNOTATION: "{}"}), False),
    ("unsuspended by someone", lambda tj: tj["spec"].update(suspend=False), False),
    ("re-created under the name", lambda tj: tj["metadata"].update(uid="new"), False),
    ("our runtime patch written", lambda tj: tj["spec"]["runtimePatches"].append({"manager": "x"}), True),
    ("its trainer changed", lambda tj: tj["spec"]["trainer"].update(numNodes=8), False),
]


CONFLICTS = [("JobSet", *row) for row in UNDECIDED] + [("TrainJob", *row) for row in UNDECIDED_TRAINJOB]


@pytest.mark.parametrize(("kind", "what", "change", "still"), CONFLICTS,
                         ids=[f"{c[0]}: {c[1]}" for c in CONFLICTS])
def test_a_conflict_is_retried_only_on_the_object_decided_on(
        kind: str, what: str, change: Callable[[dict[str, Any]], Any], still: bool) -> None:
    obj, undecided = ((jobset(), jobset_still_undecided) if kind == "JobSet"
                      else (trainjob(), trainjob_still_undecided))
    fresh = copy.deepcopy(obj)
    change(fresh)
    assert undecided(obj, fresh) is still


@pytest.mark.parametrize(("status", "finished"), [
    ({}, False), ({"conditions": [{"type": "Complete", "status": "True"}]}, True),
    ({"conditions": [{"type": "Failed", "status": "True"}]}, True),
    ({"conditions": [{"type": "Suspended", "status": "True"}]}, False)])
def test_a_trainjob_is_finished_by_its_conditions(status: dict[str, Any], finished: bool) -> None:
    assert trainjob_finished({**trainjob(), "status": status}) is finished


def test_a_trainjobs_jobset_is_found_by_its_controller_reference() -> None:
    js = jobset()
    assert controller_uid(js, TRAINJOB) is None
    js["metadata"]["ownerReferences"] = [{"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                                          "name": "train", "uid": "tj-uid", "controller": True}]
    assert controller_uid(js, TRAINJOB) == "tj-uid"
    js["metadata"]["ownerReferences"][0]["controller"] = False
    assert controller_uid(js, TRAINJOB) is None


# -- on the Kueue route: a JobSet's pods hold the slots of its Workload's pod sets ------------------

def test_a_jobsets_pods_hold_their_workloads_slots_by_rank() -> None:
    """A Ready Workload of a JobSet (or a TrainJob's JobSet): one record per pod set (a replicated Job),
    slots by rank; each pinned pod of the JobSet holds its rank's slot of its pod set, a forged one
    none, and a pod set split over TAS domains (ledger keys per domain) none."""
    from agent.admission.gangs.record import AdmissionRecord
    from agent.admission.kueue.holds import jobset_held

    js = jobset(rjob("workers", 2, 3), rjob("driver", 1, 1))
    workers = {i: SlotPlacement(f"n{i // 3}", i % 3) for i in range(6)}
    held = [("workload:team/wl/driver", AdmissionRecord("admitted", "d", "t", {0: SlotPlacement("n9", 0)}),
             lambda: None),
            ("workload:team/wl/workers", AdmissionRecord("admitted", "d", "t", workers), lambda: None)]
    pods = [pod(js, "workers", j, i, gated=False, node=workers[3 * j + i].node, zone=workers[3 * j + i].zone)
            for j in (0, 1) for i in range(3)]
    pods.append(pod(js, "driver", 0, 0, gated=False, node="n9", zone=0))
    forged = pod(js, "workers", 0, 0, gated=False, node="n0", zone=0)
    forged["metadata"]["uid"] = "forged"
    forged["metadata"]["labels"][JOBSET_UID_LABEL] = "other"
    got = jobset_held(held, [*pods, forged], js)  # type: ignore[arg-type]
    assert got == {**{f"train-workers-{j}-{i}": ("workload:team/wl/workers", str(3 * j + i))
                      for j in (0, 1) for i in range(3)},
                   "train-driver-0-0": ("workload:team/wl/driver", "0")}
    split = [("workload:team/wl/workers/tas0", AdmissionRecord("admitted", "d", "t", workers), lambda: None)]
    assert jobset_held(split, pods, js) == {}  # type: ignore[arg-type]
