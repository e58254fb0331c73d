"""`Holds.of` for a pod group's Workload (a LeaderWorkerSet's, a StatefulSet's, plain pods'): its member
pods (those Kueue names among the Workload's owners) hold their slots by rank, pinned where their rank
says and asking what their template asks; no other pod holds one."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from agent.admission.engine.model import Placement, PodPlacement
from agent.admission.gangs.job import HOSTNAME_LABEL
from agent.admission.kueue.holds import PODSET_LABEL, Holds, group_members
from agent.admission.kueue.workloads import gang_from_workload, pod_set_updates, ready_state, slot_rule
from agent.api.ranks import RANK_ANNOTATION

POD_INDEX = "apps.kubernetes.io/pod-index"
KEY = "workload:team/sts-gang/main"
RES = {"cpu": "12", "memory": "64Mi"}


def ready_workload(pods: list[str]) -> dict[str, Any]:
    """A StatefulSet's Workload of three 12-CPU pods, Ready on n1 zones 0 and 1 and n2 zone 0, its
    members the pods named in `pods` (uid = name)."""
    refs: list[dict[str, Any]] = [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "gang",
                                   "uid": "sts-uid"}]
    refs += [{"apiVersion": "v1", "kind": "Pod", "name": p, "uid": p} for p in pods]
    wl = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
          "metadata": {"name": "sts-gang", "namespace": "team", "uid": "wl-uid", "resourceVersion": "9",
                       "annotations": {"kueue.x-k8s.io/is-group-workload": "true"}, "ownerReferences": refs},
          "spec": {"queueName": "lq", "podSets": [{
              "name": "main", "count": 3, "topologyRequest": {"podIndexLabel": POD_INDEX},
              "template": {"metadata": {"annotations": {"topolet.io/numa-policy": "single-numa-node"}},
                           "spec": {"containers": [{"name": "c", "image": "x",
                                                    "resources": {"requests": RES, "limits": RES}}]}}}]},
          "status": {"conditions": [{"type": "QuotaReserved", "status": "True"}],
                     "admission": {"clusterQueue": "cq",
                                   "podSetAssignments": [{"name": "main", "flavors": {"cpu": "default"}}]}}}
    gang = gang_from_workload(wl, {})
    placement = Placement(gang.key, (PodPlacement("main", 0, "n1", 0), PodPlacement("main", 1, "n1", 1),
                                     PodPlacement("main", 2, "n2", 0)))
    updates = pod_set_updates(gang, placement, lambda name: slot_rule(wl, name, lambda: False))
    wl["status"]["admissionChecks"] = [ready_state("fit", gang, placement, updates, "2026-12-07T10:00:00Z")]
    return wl


def pod(name: str, index: int, node: str, zone: int, *, cpu: str = "12", pod_set: str = "main",
        phase: str = "Running") -> dict[str, Any]:
    """A pod the placement policy pinned to (node, zone) as Kueue ungated it."""
    res = {**RES, "cpu": cpu}
    return {"metadata": {"name": name, "namespace": "team", "uid": name, "resourceVersion": "1",
                         "creationTimestamp": f"2026-12-07T10:00:0{index}Z",
                         "labels": {POD_INDEX: str(index), PODSET_LABEL: pod_set},
                         "annotations": {"topolet.io/numa-zone": str(zone)}},
            "spec": {"nodeSelector": {HOSTNAME_LABEL: node},
                     "containers": [{"name": "c", "image": "x",
                                     "resources": {"requests": res, "limits": res}}]},
            "status": {"phase": phase}}


def test_the_ready_state_carries_the_rule_the_holds_read() -> None:
    (update,) = ready_workload([])["status"]["admissionChecks"][0]["podSetUpdates"]
    assert update["annotations"][RANK_ANNOTATION] == POD_INDEX


@pytest.mark.parametrize(("pods", "members", "held"), [
    # Each member pinned where its rank says holds that slot.
    ([pod("p0", 0, "n1", 0), pod("p1", 1, "n1", 1), pod("p2", 2, "n2", 0)], ["p0", "p1", "p2"],
     {"p0": "0", "p1": "1", "p2": "2"}),
    # A pod the Workload does not name holds nothing, pinned where it may be.
    ([pod("p0", 0, "n1", 0), pod("forged", 1, "n1", 1)], ["p0"], {"p0": "0"}),
    # Nor a member that asks other than its template, or of another pod set, or finished.
    ([pod("fat", 0, "n1", 0, cpu="16"), pod("other", 1, "n1", 1, pod_set="x"),
      pod("done", 2, "n2", 0, phase="Succeeded")], ["fat", "other", "done"], {}),
    # A member whose rank's slot is elsewhere holds another matching free slot at most (none here).
    ([pod("p1", 1, "n2", 1)], ["p1"], {}),
])
def test_member_pods_hold_their_slots_by_rank(pods: list[dict[str, Any]], members: list[str],
                                              held: dict[str, str]) -> None:
    wl = ready_workload(members)
    assert group_members(wl) == frozenset(members)
    entries, slots, refused = Holds().of(wl, "fit", copy.deepcopy(pods), False)
    assert len(entries) == 1 and refused == []
    assert slots == {uid: (KEY, slot) for uid, slot in held.items()}


def test_no_member_holds_a_slot_of_a_workload_of_another_kind() -> None:
    """(Such a Workload's Ready state is written as a StatefulSet's, the owner changed after.)"""
    wl = ready_workload(["p0"])
    wl["metadata"]["ownerReferences"][0].update(apiVersion="ray.io/v1", kind="RayCluster")
    assert group_members(wl) == frozenset()
    _, slots, _ = Holds().of(wl, "fit", [pod("p0", 0, "n1", 0)], False)
    assert slots == {}


def test_an_mpijobs_workers_hold_their_slots_by_rank() -> None:
    """An MPIJob's Workload: the pods whose controller is the MPIJob (its workers, which the MPI
    operator makes) hold their slots by rank; a pod with another controller holds none."""
    wl = ready_workload([])
    wl["metadata"]["annotations"] = {}
    wl["metadata"]["ownerReferences"] = [{"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob",
                                          "name": "gang", "uid": "mpi-uid", "controller": True}]
    mpi = {"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob", "name": "gang", "uid": "mpi-uid",
           "controller": True}
    workers = [pod("w0", 0, "n1", 0), pod("w1", 1, "n1", 1), pod("w2", 2, "n2", 0)]
    for w in workers:
        w["metadata"]["ownerReferences"] = [dict(mpi)]
    workers[2]["metadata"]["ownerReferences"][0]["kind"] = "ReplicaSet"  # not the operator's
    _, slots, _ = Holds().of(wl, "fit", workers, False)
    assert slots == {"w0": (KEY, "0"), "w1": (KEY, "1")}


def test_the_mpi_operators_pods_are_its_workers_and_its_launcher() -> None:
    """`mpijob_pods`: a pod controlled by the MPIJob (a worker), or by the Job `<mpijob>-launcher` and
    labelled with the MPIJob's name and the launcher role; no other."""
    from agent.admission.kueue.holds import mpijob_pods

    wl = {"metadata": {"ownerReferences": [{"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob",
                                            "name": "gang", "uid": "mpi-uid", "controller": True}]}}

    def made(uid: str, api: str, kind: str, name: str, owner_uid: str, **labels: str) -> dict[str, Any]:
        return {"metadata": {"uid": uid, "labels": labels, "ownerReferences": [
            {"apiVersion": api, "kind": kind, "name": name, "uid": owner_uid, "controller": True}]}}

    launcher = {"training.kubeflow.org/job-name": "gang", "training.kubeflow.org/job-role": "launcher"}
    pods = [made("worker", "kubeflow.org/v2beta1", "MPIJob", "gang", "mpi-uid"),
            made("launcher", "batch/v1", "Job", "gang-launcher", "j", **launcher),
            made("other-mpijob", "kubeflow.org/v2beta1", "MPIJob", "gang", "other-uid"),
            made("other-job", "batch/v1", "Job", "x-launcher", "j", **launcher),
            made("no-role", "batch/v1", "Job", "gang-launcher", "j",
                 **{"training.kubeflow.org/job-name": "gang"})]
    assert mpijob_pods(wl, pods) == frozenset({"worker", "launcher"})  # type: ignore[arg-type]
