"""`agent.admission.kueue.workloads`: Kueue Workloads as gangs and the topology-fit check's bodies (pure)."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import pytest

from agent.admission.engine.model import Gang, Placement, PodPlacement, PodSet, Resources, Toleration
from agent.admission.gangs.record import SlotPlacement
from agent.admission.kueue.workloads import (
    BY_COMPLETION_INDEX,
    CONTROLLER_NAME,
    FAILSAFE_LABEL,
    NOT_INDEXED,
    WorkloadSpecError,
    active_status,
    check_active,
    checks_to_decide,
    gang_from_workload,
    group_owner,
    holding,
    our_checks,
    owner_notes,
    parse_placements,
    pod_group_notes,
    pod_set_updates,
    ready_state,
    records_of_state,
    retry_after,
    retry_state,
    slot_rule,
    status_apply,
    to_decide,
)
from agent.api.ranks import RankRule

GiB = 1024**3


def workload(count: int = 2, *, cpu: str = "4", policy: str | None = "single-numa-node",
             checks: dict[str, str] | None = None, conditions: tuple[str, ...] = ("QuotaReserved",),
             flavors: dict[str, str] | None = None, admitted_count: int | None = None,
             extra_spec: dict[str, Any] | None = None) -> dict[str, Any]:
    """A Workload as Kueue's Job integration writes it, one pod set "main"."""
    res = {"cpu": cpu, "memory": "1Gi"}
    annotations = {"topolet.io/numa-policy": policy} if policy else {}
    pod_spec: dict[str, Any] = {"containers": [{"name": "c", "image": "x",
                                                "resources": {"requests": res, "limits": res}}],
                                **(extra_spec or {})}
    assignment: dict[str, Any] = {"name": "main", "flavors": flavors or {"cpu": "default"}}
    if admitted_count is not None:
        assignment["count"] = admitted_count
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
        "metadata": {"name": "job-a-1", "namespace": "ns", "uid": "u-1", "resourceVersion": "7",
                     "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "a",
                                          "uid": "job-uid", "controller": True}]},
        "spec": {"queueName": "lq", "priority": 3,
                 "podSets": [{"name": "main", "count": count,
                              "template": {"metadata": {"annotations": annotations}, "spec": pod_spec}}]},
        "status": {
            "conditions": [{"type": c, "status": "True"} for c in conditions],
            "admission": {"clusterQueue": "cq", "podSetAssignments": [assignment]},
            "admissionChecks": [{"name": n, "state": s, "message": ""} for n, s in (checks or {}).items()],
        },
    }


# -- reading ----------------------------------------------------------------------------------------

def test_gang_from_workload_reads_the_pod_template_as_a_job_would() -> None:
    toleration = {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}
    wl = workload(3, extra_spec={"nodeSelector": {"pool": "a"}, "tolerations": [toleration]})
    gang = gang_from_workload(wl, {"default": {"zone": "z1"}})
    assert gang == Gang(key="workload:ns/job-a-1", priority=3, pod_sets=(PodSet(
        name="main", count=3, requests=Resources(cpu_milli=4000, memory=GiB), numa_policy="single-numa-node",
        node_selector={"pool": "a", "zone": "z1"},
        tolerations=(Toleration(key="gpu", operator="Exists", effect="NoSchedule"),)),))


@pytest.mark.parametrize(("policy", "guaranteed", "expected"), [
    ("restricted", "single-numa-node", "restricted"),  # the annotation wins
    (None, "single-numa-node", "single-numa-node"),    # Guaranteed whole CPUs: the nodes' policy
    (None, "none", "none"),
])
def test_numa_policy(policy: str | None, guaranteed: str, expected: str) -> None:
    assert gang_from_workload(workload(policy=policy), {}, guaranteed).pod_sets[0].numa_policy == expected


def test_partial_admission_count_wins_and_a_priority_class_need_not_exist() -> None:
    wl = workload(8, admitted_count=5, extra_spec={"priorityClassName": "gone"})
    assert gang_from_workload(wl, {}).pod_sets[0].count == 5


@pytest.mark.parametrize(("change", "message"), [
    (lambda wl: wl["spec"].update(podSets=[]), "no podSets"),
    (lambda wl: wl["spec"]["podSets"][0].update(count=0), "count must be a positive integer"),
    (lambda wl: wl["spec"]["podSets"][0]["template"]["metadata"].update(
        annotations={"topolet.io/numa-policy": "tight"}), "topolet.io/numa-policy must be one of"),
    (lambda wl: wl["spec"]["podSets"][0]["template"]["spec"]["containers"][0]["resources"].update(
        requests={"cpu": "lots"}), "invalid quantity"),
    (lambda wl: wl["status"]["admission"]["podSetAssignments"][0].update(
        flavors={"cpu": "a", "memory": "b"}), "flavors disagree on node label pool"),
])
def test_malformed_workloads_say_why(change: Any, message: str) -> None:
    wl = workload()
    change(wl)
    with pytest.raises(WorkloadSpecError, match=message):
        gang_from_workload(wl, {"a": {"pool": "x"}, "b": {"pool": "y"}})


@pytest.mark.parametrize(("checks", "conditions", "active", "decide", "holds"), [
    ({"fit": "Pending"}, ("QuotaReserved",), True, "fit", None),
    ({"fit": "Pending"}, (), True, None, None),                         # no quota yet: Kueue first
    ({"fit": "Pending"}, ("QuotaReserved",), False, None, None),        # deactivated
    ({"fit": "Pending"}, ("QuotaReserved", "Finished"), True, None, None),
    ({"fit": "Pending"}, ("QuotaReserved", "Evicted"), True, None, None),  # quota not yet released
    ({"other": "Pending"}, ("QuotaReserved",), True, None, None),       # not our check
    ({"fit": "Ready"}, ("QuotaReserved", "Admitted"), True, None, "fit"),
    ({"fit": "Ready"}, ("QuotaReserved", "Admitted", "Finished"), True, None, None),
    ({"fit": "Ready"}, ("Evicted",), True, None, None),                 # evicted: quota released
    ({"fit": "Retry"}, ("QuotaReserved",), True, None, None),
])
def test_what_to_decide_and_what_holds_capacity(checks: dict[str, str], conditions: tuple[str, ...],
                                                 active: bool, decide: str | None, holds: str | None) -> None:
    wl = workload(checks=checks, conditions=conditions)
    wl["spec"]["active"] = active
    assert to_decide(wl, ("fit",)) == decide
    assert holding(wl, ("fit",)) == holds


@pytest.mark.parametrize(("checks", "conditions", "decide"), [
    ({"a": "Pending", "b": "Pending", "x": "Pending"}, ("QuotaReserved",), ("a", "b")),  # x: not ours
    ({"a": "Ready", "b": "Pending"}, ("QuotaReserved",), ("b",)),        # b added to the queue later
    ({"a": "Ready", "b": "Retry"}, ("QuotaReserved",), ()),
    ({"a": "Pending", "b": "Pending"}, (), ()),                          # no quota yet
    ({"a": "Pending", "b": "Pending"}, ("QuotaReserved", "Evicted"), ()),
])
def test_every_check_of_ours_to_decide(checks: dict[str, str], conditions: tuple[str, ...],
                                       decide: tuple[str, ...]) -> None:
    assert checks_to_decide(workload(checks=checks, conditions=conditions), ("a", "b")) == decide


def test_our_checks_and_active() -> None:
    acs: list[dict[str, Any]] = [{"metadata": {"name": n, "generation": 2}, "spec": {"controllerName": c}}
           for n, c in (("b", CONTROLLER_NAME), ("x", "kueue.x-k8s.io/provisioning-request"),
                        ("a", CONTROLLER_NAME))]
    assert our_checks(acs) == ("a", "b")
    ac = acs[0]
    assert not check_active(ac)
    body = active_status(ac, "2026-01-01T00:00:00Z")
    ac["status"] = body["status"]
    assert check_active(ac)
    ac["metadata"]["generation"] = 3  # a changed spec wants a new observation
    assert not check_active(ac)


# -- deciding ---------------------------------------------------------------------------------------

def _placement(slots: Sequence[tuple[str, int | None]], pod_set: str = "main") -> Placement:
    return Placement("workload:ns/job-a-1",
                     tuple(PodPlacement(pod_set, i, n, z) for i, (n, z) in enumerate(slots)))


def test_one_slot_pins_through_the_node_selector_and_needs_no_policy() -> None:
    gang = gang_from_workload(workload(3), {})
    updates = pod_set_updates(gang, _placement([("n1", 2)] * 3), lambda _: NOT_INDEXED)
    assert updates == [{"name": "main", "nodeSelector": {"kubernetes.io/hostname": "n1"},
                        "annotations": {"topolet.io/numa-zone": "2"}}]
    node_only = pod_set_updates(gang, _placement([("n1", None)] * 3), lambda _: NOT_INDEXED)
    assert node_only == [{"name": "main", "nodeSelector": {"kubernetes.io/hostname": "n1"}}]


def test_many_slots_go_by_completion_index_behind_the_failsafe_selector() -> None:
    gang = gang_from_workload(workload(3), {})
    slots = [("n1", 0), ("n2", 1), ("n1", 1)]
    updates = pod_set_updates(gang, _placement(slots), lambda _: BY_COMPLETION_INDEX)
    assert updates == [{"name": "main", "annotations": {"topolet.io/placements": "n1:0,n2:1,n1:1"},
                        "nodeSelector": {FAILSAFE_LABEL[0]: FAILSAFE_LABEL[1]}}]
    with pytest.raises(WorkloadSpecError, match="make it an Indexed Job"):
        pod_set_updates(gang, _placement(slots), lambda _: NOT_INDEXED)


JOBSET_REQUEST = {"podIndexLabel": "batch.kubernetes.io/job-completion-index",
                  "subGroupIndexLabel": "jobset.sigs.k8s.io/job-index", "subGroupCount": 2}


def owned_by(wl: dict[str, Any], api_version: str, kind: str, request: dict[str, Any] | None = None,
             admitted: int | None = None) -> dict[str, Any]:
    """`wl` as Kueue writes it for an owner of `kind`, its pod set's topologyRequest `request`."""
    wl["metadata"]["ownerReferences"] = [{"apiVersion": api_version, "kind": kind, "name": "a", "uid": "o-1",
                                          "controller": True}]
    if request is not None:
        wl["spec"]["podSets"][0]["topologyRequest"] = request
    if admitted is not None:
        wl["status"]["admission"]["podSetAssignments"][0]["count"] = admitted
    return wl


def never(_: object = None) -> bool:
    raise AssertionError("a JobSet's Workload needs no Job read")


@pytest.mark.parametrize(("api_version", "kind", "request_", "count", "expected"), [
    # A JobSet's pods by job index x pods per Job + completion index, as Kueue's TAS ranks them.
    ("jobset.x-k8s.io/v1alpha2", "JobSet", JOBSET_REQUEST, 6,
     RankRule("batch.kubernetes.io/job-completion-index", "jobset.sigs.k8s.io/job-index", 3)),
    ("jobset.x-k8s.io/v1alpha2", "JobSet", {"podIndexLabel": "batch.kubernetes.io/job-completion-index"}, 6,
     RankRule("batch.kubernetes.io/job-completion-index")),
    # What Kueue wrote does not tell the pods apart: the message names what is missing.
    ("jobset.x-k8s.io/v1alpha2", "JobSet", None, 6,
     "its pods cannot be told apart: its topologyRequest names no podIndexLabel"),
    ("jobset.x-k8s.io/v1alpha2", "JobSet", {**JOBSET_REQUEST, "subGroupCount": 4}, 6,
     "its pods cannot be told apart: its 6 pods do not split into 4 equal sub-groups"),
    ("jobset.x-k8s.io/v1alpha2", "JobSet", {**JOBSET_REQUEST, "podIndexLabel": "bad key!"}, 6,
     "its pods cannot be told apart: its index labels"),
    # An owner whose operator is not trusted to copy placements: refused by kind, whatever Kueue wrote.
    ("kubeflow.org/v2beta1", "MPIJob", {"podIndexLabel": "training.kubeflow.org/replica-index"}, 6,
     RankRule("training.kubeflow.org/replica-index")),
    ("trainer.kubeflow.org/v1alpha1", "TrainJob", {**JOBSET_REQUEST, "subGroupCount": 1}, 6,
     RankRule("batch.kubernetes.io/job-completion-index", "jobset.sigs.k8s.io/job-index", 6)),
    # A kind topolet has no table entry for: refused by kind, whatever Kueue wrote.
    ("ray.io/v1", "RayCluster", {"podIndexLabel": "ray.io/index"}, 3,
     "its owner is a RayCluster (ray.io/v1), whose pods topolet does not tell"),
    ("jobset.x-k8s.io/v1", "JobSet", JOBSET_REQUEST, 6, "its owner is a JobSet (jobset.x-k8s.io/v1)"),
])
def test_slot_rule_reads_the_topology_request_of_a_trusted_owner(
        api_version: str, kind: str, request_: dict[str, Any] | None, count: int,
        expected: RankRule | str) -> None:
    wl = owned_by(workload(count), api_version, kind, request_)
    rule = slot_rule(wl, "main", never)
    if isinstance(expected, RankRule):
        assert rule == expected
    else:
        assert isinstance(rule, str) and rule.startswith(expected), rule


def group_owned(wl: dict[str, Any], owners: Sequence[tuple[str, str]], request: dict[str, Any] | None,
                pod_sets: Sequence[tuple[str, int]] = ()) -> dict[str, Any]:
    """`wl` as Kueue's pod integration writes a pod group's: owners without `controller` (the
    LeaderWorkerSet or StatefulSet, then its pods), the group annotation, each pod set's `request`."""
    wl["metadata"]["ownerReferences"] = [{"apiVersion": a, "kind": k, "name": f"o{i}", "uid": f"o-{i}"}
                                         for i, (a, k) in enumerate(owners)]
    wl["metadata"]["annotations"] = {"kueue.x-k8s.io/is-group-workload": "true"}
    template = wl["spec"]["podSets"][0]
    if pod_sets:
        wl["spec"]["podSets"] = [{**template, "name": n, "count": c} for n, c in pod_sets]
        wl["status"]["admission"]["podSetAssignments"] = [{"name": n, "flavors": {"cpu": "default"}}
                                                          for n, _ in pod_sets]
    for ps in wl["spec"]["podSets"]:
        if request is not None:
            ps["topologyRequest"] = request
    return wl


LWS = ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet")
STS = ("apps/v1", "StatefulSet")
POD = ("v1", "Pod")
WORKER_INDEX = {"podIndexLabel": "leaderworkerset.sigs.k8s.io/worker-index"}


@pytest.mark.parametrize(("owners", "request_", "pod_sets", "pod_set", "expected"), [
    # A LeaderWorkerSet's group: leader and workers are pod sets of their own; the workers by their
    # worker index (less the offset 1 Kueue's webhook writes into their template: agent.api.ranks).
    ([LWS, POD, POD], WORKER_INDEX, [("leader", 1), ("worker", 3)], "worker",
     RankRule("leaderworkerset.sigs.k8s.io/worker-index")),
    ([LWS], WORKER_INDEX, [("main", 4)], "main", RankRule("leaderworkerset.sigs.k8s.io/worker-index")),
    # A StatefulSet's pods by their ordinal.
    ([STS, POD, POD, POD], {"podIndexLabel": "apps.kubernetes.io/pod-index"}, [], "main",
     RankRule("apps.kubernetes.io/pod-index")),
    # A plain pod group of one role, by Kueue's index label; of several roles the index runs across them.
    ([POD, POD], {"podIndexLabel": "kueue.x-k8s.io/pod-group-pod-index"}, [("a1b2", 2)], "a1b2",
     RankRule("kueue.x-k8s.io/pod-group-pod-index")),
    ([POD, POD, POD], {"podIndexLabel": "kueue.x-k8s.io/pod-group-pod-index"}, [("a1b2", 2), ("c3d4", 1)],
     "a1b2", "its pods cannot be told apart: its pod group has 2 roles"),
    # Without a pod index label: the message names what is missing.
    ([STS], {}, [], "main", "its pods cannot be told apart: its topologyRequest names no podIndexLabel"),
    # A pod set group (TAS ranks leader and workers together): not by the pod set's labels alone.
    ([LWS], {**WORKER_INDEX, "podSetGroupName": "g"}, [("leader", 1), ("worker", 3)], "worker",
     "its pods cannot be told apart: its pod set is ranked with others in the pod set group 'g'"),
    # Two owners that are not pods: no one owner to trust.
    ([LWS, STS], WORKER_INDEX, [], "main", "its owner is no owner"),
])
def test_slot_rule_of_a_pod_group_reads_its_owner_without_controller(
        owners: list[tuple[str, str]], request_: dict[str, Any], pod_sets: list[tuple[str, int]],
        pod_set: str, expected: RankRule | str) -> None:
    wl = group_owned(workload(4), owners, request_, pod_sets)
    rule = slot_rule(wl, pod_set, never)
    if isinstance(expected, RankRule):
        assert rule == expected
    else:
        assert isinstance(rule, str) and rule.startswith(expected), rule


def test_a_pod_groups_numa_policy_comes_from_its_owners_templates() -> None:
    """Kueue writes a LeaderWorkerSet's and a StatefulSet's pod sets without their templates'
    annotations: they are read from the owner object, and the Workload's own win."""
    lws = {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet", "spec": {
        "leaderWorkerTemplate": {"leaderTemplate": {"metadata": {"annotations": {"a": "leader"}}},
                                 "workerTemplate": {"metadata": {"annotations": {
                                     "topolet.io/numa-policy": "restricted", "n": 1}}}}}}
    assert owner_notes(lws) == {"leader": {"a": "leader"}, "worker": {"topolet.io/numa-policy": "restricted"},
                                "main": {"topolet.io/numa-policy": "restricted"}}
    sts = {"apiVersion": "apps/v1", "kind": "StatefulSet", "spec": {"template": {}}}
    assert owner_notes(sts) == {"main": {}}
    assert owner_notes({"apiVersion": "v1", "kind": "Pod"}) == {}
    wl = group_owned(workload(2, policy=None), [STS, POD], {"podIndexLabel": "apps.kubernetes.io/pod-index"})
    assert group_owner(wl) == wl["metadata"]["ownerReferences"][0]
    restricted = {"main": {"topolet.io/numa-policy": "restricted"}}
    (plain,) = gang_from_workload(wl, {}).pod_sets
    (read,) = gang_from_workload(wl, {}, template_notes=restricted).pod_sets
    assert (plain.numa_policy, read.numa_policy) == ("node", "restricted")
    own = group_owned(workload(2), [STS], None)
    (kept,) = gang_from_workload(own, {}, template_notes=restricted).pod_sets
    assert kept.numa_policy == "single-numa-node"
    assert group_owner(workload(2)) is None  # a Job's: its controlling owner


def test_a_plain_pod_groups_numa_policy_comes_from_its_pods() -> None:
    def pod(name: str, ns: str, group: str | None, role: str | None, policy: str | None) -> dict[str, Any]:
        notes = {k: v for k, v in (("kueue.x-k8s.io/role-hash", role), ("topolet.io/numa-policy", policy),
                                   ("other", "x")) if v is not None}
        labels = {"kueue.x-k8s.io/pod-group-name": group} if group else {}
        return {"metadata": {"name": name, "namespace": ns, "labels": labels, "annotations": notes}}

    pods = [pod("b", "ns", "g", "r1", "restricted"), pod("a", "ns", "g", "r1", "single-numa-node"),
            pod("c", "ns", "g", "r2", None), pod("d", "other", "g", "r1", "restricted"),
            pod("e", "ns", None, "r1", "restricted"), pod("f", "ns", "h", None, "restricted")]
    assert pod_group_notes(pods) == {("ns", "g"): {"r1": {"topolet.io/numa-policy": "single-numa-node"}},
                                     ("other", "g"): {"r1": {"topolet.io/numa-policy": "restricted"}}}


def test_only_kueues_group_workloads_are_read_by_owners_without_controller() -> None:
    wl = group_owned(workload(3), [STS], {"podIndexLabel": "apps.kubernetes.io/pod-index"})
    del wl["metadata"]["annotations"]
    assert str(slot_rule(wl, "main", never)).startswith("its owner is no owner")


def test_slot_rule_of_a_job_is_its_completion_index_when_indexed() -> None:
    assert slot_rule(workload(3), "main", lambda: True) == BY_COMPLETION_INDEX
    assert slot_rule(workload(3), "main", lambda: False) == NOT_INDEXED
    no_owner = workload(3)
    no_owner["metadata"].pop("ownerReferences")
    assert str(slot_rule(no_owner, "main", never)).startswith("its owner is no owner")


def test_slot_rule_splits_the_admitted_count() -> None:
    """Partial admission: the sub-groups split the count Kueue admitted, not the one asked."""
    wl = owned_by(workload(8), "jobset.x-k8s.io/v1alpha2", "JobSet", JOBSET_REQUEST, admitted=6)
    assert slot_rule(wl, "main", never) == RankRule("batch.kubernetes.io/job-completion-index",
                                                    "jobset.sigs.k8s.io/job-index", 3)
    assert "no pod set 'other'" in str(slot_rule(wl, "other", never))


def test_a_ranked_pod_set_carries_its_rule_beside_its_slots() -> None:
    wl = owned_by(workload(4), "jobset.x-k8s.io/v1alpha2", "JobSet", {**JOBSET_REQUEST, "subGroupCount": 2})
    gang = gang_from_workload(wl, {})
    placement = _placement([("n1", 0), ("n1", 1), ("n2", 0), ("n2", 1)])
    updates = pod_set_updates(gang, placement, lambda name: slot_rule(wl, name, never))
    assert updates == [{"name": "main", "annotations": {
        "topolet.io/placements": "n1:0,n1:1,n2:0,n2:1",
        "topolet.io/placement-rank":
            "jobset.sigs.k8s.io/job-index*2+batch.kubernetes.io/job-completion-index"},
        "nodeSelector": {FAILSAFE_LABEL[0]: FAILSAFE_LABEL[1]}}]
    (record,) = records_of_state(wl, ready_state("fit", gang, placement, updates, "t")).values()
    assert record.slots[2] == SlotPlacement("n2", 0)  # slot = rank: job 1's first pod
    ray = owned_by(workload(4), "ray.io/v1", "RayCluster", {"podIndexLabel": "x"})
    with pytest.raises(WorkloadSpecError, match=r"over 4 node/zone slots \(n1, n2\) and its owner is a"):
        pod_set_updates(gang, placement, lambda name: slot_rule(ray, name, never))


@pytest.mark.parametrize("slots", [[("n1", 0), ("n2", 1), ("n1", None)], [("n1", 3)] * 4])
def test_the_record_comes_back_from_the_ready_state(slots: list[tuple[str, int | None]]) -> None:
    wl = workload(len(slots), checks={"fit": "Pending"})
    gang = gang_from_workload(wl, {})
    placement = _placement(slots)
    updates = pod_set_updates(gang, placement, lambda _: BY_COMPLETION_INDEX)
    state = ready_state("fit", gang, placement, updates, "2026-01-01T00:00:00Z")
    (record,) = records_of_state(wl, state).values()
    assert record.slots == {i: SlotPlacement(n, z) for i, (n, z) in enumerate(slots)}
    assert record.time == "2026-01-01T00:00:00Z"
    (again,) = records_of_state(copy.deepcopy(wl), copy.deepcopy(state)).values()
    assert again.decision == record.decision  # the same on every read (a restart ledgers it once)
    (later,) = records_of_state(wl, {**state, "lastTransitionTime": "2026-01-01T00:05:00Z"}).values()
    assert later.decision != record.decision  # a re-admission is a new decision


@pytest.mark.parametrize(("state", "message"), [
    ({"name": "fit", "podSetUpdates": []}, "no placement for pod set main"),
    ({"name": "fit", "podSetUpdates": [{"name": "main"}]}, "has no node"),
    ({"name": "fit", "podSetUpdates": [{"name": "main", "annotations": {"topolet.io/placements": "n1:x"}}]},
     "bad entry 0"),
])
def test_unreadable_ready_states(state: dict[str, Any], message: str) -> None:
    with pytest.raises(WorkloadSpecError, match=message):
        records_of_state(workload(), state)


def test_parse_placements() -> None:
    expected = [SlotPlacement("a", 0), SlotPlacement("b"), SlotPlacement("c", 12)]
    assert parse_placements("a:0,b:,c:12") == expected
    for bad in ("", "a", ":1", "a:-1"):
        with pytest.raises(WorkloadSpecError):
            parse_placements(bad)


@pytest.mark.parametrize(("count", "seconds"), [(0, 5), (1, 10), (3, 40), (6, 300), (10**6, 300), (-1, 5)])
def test_retry_backoff_doubles_up_to_a_cap(count: int, seconds: int) -> None:
    assert retry_after(count) == seconds


def test_retry_names_the_constraint_and_the_apply_body_carries_the_version() -> None:
    state = retry_state("fit", "pod needs 16 CPUs in one zone; largest free zone has 12", 2, "t")
    assert state["state"] == "Retry" and state["requeueAfterSeconds"] == 20
    assert "largest free zone has 12" in state["message"]
    body = status_apply(workload(), [state])
    assert body["metadata"] == {"name": "job-a-1", "namespace": "ns", "resourceVersion": "7"}
    assert body["status"] == {"admissionChecks": [state]}


def test_every_operator_owner_has_a_trusted_operator_in_the_fields_policy() -> None:
    """A kind whose operator carries the placements (OPERATOR_OWNERS) but whose operator the fields
    policy does not trust would be Ready with pods that are refused (or stay Pending) forever: the
    policy's byOperator table names every such owner.  The pod integration's kinds (UNGATED_OWNERS) get
    them from Kueue's manager, which the kueue component trusts."""
    import yaml

    from agent.admission.kueue.workloads import OPERATOR_OWNERS
    from tests.conftest import REPO

    text = (REPO / "daemonset" / "controller" / "fields-policy.yaml").read_text()
    doc = yaml.safe_load(text.split("\n---")[0])
    (table,) = [v["expression"] for v in doc["spec"]["variables"] if v["name"] == "byOperator"]
    for api_version, kind in OPERATOR_OWNERS:
        assert f"'{api_version}', '{kind}']" in table, (api_version, kind)


def test_a_tas_assignment_is_placed_inside() -> None:
    """Kueue's TAS ungater pins the pod of rank r to the r-th pod place of its assignment's domains: the
    pod set is placed as one part per domain, each on its domain's nodes, and the slots come back in
    rank order."""
    wl = owned_by(workload(5), "jobset.x-k8s.io/v1alpha2", "JobSet", {**JOBSET_REQUEST, "subGroupCount": 1})
    wl["status"]["admission"]["podSetAssignments"][0]["topologyAssignment"] = {
        "levels": ["block", "kubernetes.io/hostname"],
        "slices": [{"domainCount": 2,
                    "valuesPerLevel": [{"universal": "b1"},
                                       {"individual": {"prefix": "n", "roots": ["2", "1"]}}],
                    "podCounts": {"individual": [3, 2]}}]}
    gang = gang_from_workload(wl, {})
    assert [(p.name, p.count, dict(p.node_selector)) for p in gang.pod_sets] == [
        ("main/tas0", 3, {"block": "b1", "kubernetes.io/hostname": "n2"}),
        ("main/tas3", 2, {"block": "b1", "kubernetes.io/hostname": "n1"})]
    placement = Placement(gang.key, (
        PodPlacement("main/tas3", 1, "n1", 1), PodPlacement("main/tas0", 0, "n2", 0),
        PodPlacement("main/tas0", 1, "n2", 1), PodPlacement("main/tas0", 2, "n2", 2),
        PodPlacement("main/tas3", 0, "n1", 0)))
    (update,) = pod_set_updates(gang, placement, lambda name: slot_rule(wl, name, never))
    assert update["name"] == "main"
    assert update["annotations"]["topolet.io/placements"] == "n2:0,n2:1,n2:2,n1:0,n1:1"
    (record,) = records_of_state(wl, ready_state("fit", gang, placement, [update], "t")).values()
    assert record.slots[3] == SlotPlacement("n1", 0)


@pytest.mark.parametrize(("assignment", "message"), [
    ({}, "its levels are not node label keys"),
    ({"levels": ["kubernetes.io/hostname"]}, "it has no domains"),
    ({"levels": ["kubernetes.io/hostname"], "slices": [{"domainCount": 1, "valuesPerLevel": [],
                                                        "podCounts": {"universal": 5}}]}, "slice 0"),
    ({"levels": ["kubernetes.io/hostname"], "slices": [{"domainCount": 2, "valuesPerLevel": [
        {"individual": {"roots": ["a"]}}], "podCounts": {"universal": 2}}]}, "no value for domain 1"),
    ({"levels": ["kubernetes.io/hostname"], "slices": [{"domainCount": 1, "valuesPerLevel": [
        {"universal": "a"}], "podCounts": {"individual": [-1]}}]}, "no pod count for domain 0"),
    ({"levels": ["kubernetes.io/hostname"], "slices": [{"domainCount": 1, "valuesPerLevel": [
        {"universal": "a"}], "podCounts": {"universal": 4}}]}, "its domains hold 4 pods, the pod set 5"),
    ({"levels": ["pool"], "slices": [{"domainCount": 1, "valuesPerLevel": [
        {"universal": "b"}], "podCounts": {"universal": 5}}]},
     "its domain {'pool': 'b'} contradicts the pod set's node selector on pool"),
])
def test_a_tas_assignment_that_cannot_be_read_is_refused(assignment: dict[str, Any], message: str) -> None:
    wl = workload(5, extra_spec={"nodeSelector": {"pool": "a"}})
    wl["status"]["admission"]["podSetAssignments"][0]["topologyAssignment"] = assignment
    with pytest.raises(WorkloadSpecError) as raised:
        gang_from_workload(wl, {})
    assert str(raised.value).startswith("podSets[0] (main): its topologyAssignment: "), raised.value
    assert message in str(raised.value)
