"""A tenant's own pod that names its Job as owner takes no slot (issue 34, finding 2), on the real test
cluster with the tenant's real token (issue 21's Tenant fixture: namespace edit rights for Jobs and
pods, the controller's part of the base applied).

The finding: the tenant created a gated pod of its own with `ownerReferences: [{kind: Jobx, uid: <its
Job's uid>, controller: true}]` and 16 CPUs where the template says 12; the controller gave it slot 0
(node, zone, gate lifted) and one of the Job's real pods waited, gated, for ever.  Only the pods the
Job controller made for the Job from its admitted template hold slots now
(`agent.admission.gangs.slots.JobOwner`); every other pod naming the Job stays gated and is told in an
Event on the Job.

The real Job controller claims a pod whose owner reference has the Job's kind, name and uid and
whose labels match the Job's selector, whatever else it says (so it deletes such a pod of a suspended
Job, or one too many of a running one), and the fields policy refuses a tenant a gated pod that names
a `batch/*` Job (`daemonset/controller/fields-policy.yaml`): the tenant's variants are those both let
through, another kind.  The variants the policy refuses a tenant (another apiVersion, the Job's
labels missing, other requests) are written by the administrator, whom the policy does not check (as
anyone may where it is not installed), for a Job the Job controller leaves alone (`spec.managedBy`):
only the pod made as the Job controller makes them gets a slot.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

from tests.admission.test_controller import GATE, gang_job, pod_zone, record, wait_for
from tests.admission.test_tenants import Tenant, created_job, tenant

__all__ = ["tenant"]

CONTROLLER_UID = "batch.kubernetes.io/controller-uid"
HOSTNAME = "kubernetes.io/hostname"


def job_ref(job: dict[str, Any], *, block: bool = True) -> dict[str, Any]:
    """The owner reference the Job controller writes on the pods it makes for `job` (`block`: with
    blockOwnerDeletion, which a tenant's pods leave out: where the OwnerReferencesPermissionEnforcement
    admission plugin runs, setting it needs rights on the Job's finalizers)."""
    ref = {"apiVersion": "batch/v1", "kind": "Job", "name": job["metadata"]["name"],
           "uid": job["metadata"]["uid"], "controller": True}
    return {**ref, "blockOwnerDeletion": True} if block else ref


def pod_for(job: dict[str, Any], name: str, *, ref: dict[str, Any] | None = None,
            labels: dict[str, str] | None = None, cpu: int | None = None) -> dict[str, Any]:
    """A gated pod made from `job`'s template as the Job controller makes it (its labels, its spec, its
    owner reference), then with what the tenant changes: `ref`, `labels`, `cpu`."""
    template = copy.deepcopy(job["spec"]["template"])
    spec = template["spec"]
    spec["schedulingGates"] = [{"name": GATE}]
    if cpu is not None:
        res = {"cpu": str(cpu), "memory": "64Mi"}
        spec["containers"][0]["resources"] = {"requests": res, "limits": dict(res)}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": template["metadata"]["labels"] if labels is None else labels,
                         "ownerReferences": [ref or job_ref(job, block=False)]},
            "spec": spec}


def create_pods(t: Tenant, pods: Iterable[dict[str, Any]], *, admin: bool = False) -> None:
    """Each pod created with the tenant's token (`admin`: the administrator's), in order (the first
    ones the oldest)."""
    for pod in pods:
        if admin:
            t.api.create(f"/api/v1/namespaces/{t.namespace}/pods", pod)
            continue
        status, out = t.request("POST", "api/v1/namespaces/{ns}/pods", pod)
        assert status == 201, out.get("message")


def pods(t: Tenant) -> dict[str, dict[str, Any]]:
    out = t.api.list(f"/api/v1/namespaces/{t.namespace}/pods")
    return {p["metadata"]["name"]: p for p in out.get("items") or []
            if not p["metadata"].get("deletionTimestamp")}


def made_by_job_controller(pod: dict[str, Any], job: dict[str, Any]) -> bool:
    return any(r == job_ref(job) for r in pod["metadata"].get("ownerReferences") or [])


def bound_on_slots(t: Tenant, job: str, placed: list[dict[str, Any]]) -> bool:
    """Every pod of `placed` bound, ungated, on the node of a slot of the Job's record, in its zone, no
    two on the same slot."""
    rec = record(t.api, t.namespace, job)
    if rec is None or rec["result"] != "admitted" or not placed:
        return False
    free = sorted((p["node"], p["zone"]) for p in rec["placement"].values())
    for pod in placed:
        if not pod["spec"].get("nodeName"):
            return False
        assert not any(g["name"] == GATE for g in pod["spec"].get("schedulingGates") or [])
        assert pod["spec"]["nodeSelector"][HOSTNAME] == pod["spec"]["nodeName"]
        slot = (pod["spec"]["nodeName"], pod_zone(pod))
        assert slot in free, (slot, free)
        free.remove(slot)
    return True


def foreign_pod_events(t: Tenant, job: str) -> dict[str, str]:
    """The controller's ForeignPod Events on the Job: pod name -> message."""
    out = t.api.list(f"/api/v1/namespaces/{t.namespace}/events",
                     {"fieldSelector": f"involvedObject.kind=Job,involvedObject.name={job}"})
    told = {}
    for e in out.get("items") or []:
        if e.get("reportingComponent") == "topolet.io/controller" and e["reason"] == "ForeignPod":
            told[e["message"].split()[1]] = e["message"]
    return told


def assert_left_gated(pod: dict[str, Any]) -> None:
    """Never given a slot: still gated, no node, no zone."""
    assert [g["name"] for g in pod["spec"].get("schedulingGates") or []] == [GATE], pod["metadata"]["name"]
    assert HOSTNAME not in (pod["spec"].get("nodeSelector") or {})
    assert not pod["spec"].get("nodeName")
    assert "topolet.io/numa-zone" not in (pod["metadata"].get("annotations") or {})


def test_a_pod_naming_its_job_as_another_kind_gets_no_slot(tenant: Tenant) -> None:
    """The finding: the tenant's gated pods, older than the Job's own, naming the Job's name and uid as
    kind Jobx (with 16 CPUs) or kind job; the Job controller leaves both alone.  The Job's two real
    pods get both slots; the forged ones stay gated and the Job is told why."""
    t = tenant
    name = created_job(t, gang_job("gang", 2, t.label, indexed=False))
    job = t.api.get(f"{t.jobs()}/{name}")
    mine = job_ref(job, block=False)
    forged = {
        "forged-jobx": pod_for(job, "forged-jobx", ref={**mine, "kind": "Jobx"}, cpu=16),
        "forged-lowercase": pod_for(job, "forged-lowercase", ref={**mine, "kind": "job"}),
    }
    create_pods(t, forged.values())
    t.cluster.start_controller("--resync-seconds", "2")

    def real() -> list[dict[str, Any]]:
        return [p for n, p in pods(t).items() if n not in forged and made_by_job_controller(p, job)]

    wait_for(lambda: len(real()) == 2 and bound_on_slots(t, name, real()), "the Job's own pods on its slots",
             timeout=150)
    told = wait_for(lambda: (e := foreign_pod_events(t, name)).keys() >= forged.keys() and e,
                    "an Event on the Job for each forged pod")
    assert "kind 'Jobx'" in told["forged-jobx"] and "kind 'job'" in told["forged-lowercase"]
    now = pods(t)
    for pod_name in forged:
        assert_left_gated(now[pod_name])


def test_pods_made_for_a_job_get_slots_only_as_the_job_controller_makes_them(tenant: Tenant) -> None:
    """A tenant's Job managed elsewhere (`spec.managedBy`: the Job controller leaves it and its pods
    alone), its pods written by the administrator: those with another apiVersion in their owner
    reference, without the Job's labels, or with 16 CPUs where the template says 12 stay gated though
    they are older; the one made as the Job controller makes them takes a slot."""
    t = tenant
    queued = gang_job("managed", 2, t.label, indexed=False)
    queued["spec"]["managedBy"] = "example.com/tenant"
    name = created_job(t, queued)
    job = t.api.get(f"{t.jobs()}/{name}")
    forged = {
        "forged-apiversion": pod_for(job, "forged-apiversion",
                                     ref={**job_ref(job, block=False), "apiVersion": "batch/v2"}),
        "forged-unlabelled": pod_for(job, "forged-unlabelled", labels={}),
        "forged-16cpus": pod_for(job, "forged-16cpus", cpu=16),
    }
    create_pods(t, [*forged.values(), pod_for(job, "made")], admin=True)
    t.cluster.start_controller("--resync-seconds", "2")

    wait_for(lambda: bound_on_slots(t, name, [pods(t)["made"]]),
             "the pod made as the Job controller does, placed", timeout=150)
    told = wait_for(lambda: (e := foreign_pod_events(t, name)).keys() >= forged.keys() and e,
                    "an Event on the Job for each forged pod")
    assert "apiVersion 'batch/v2'" in told["forged-apiversion"]
    assert CONTROLLER_UID in told["forged-unlabelled"]
    assert "cpu 16 where its template asks 12" in told["forged-16cpus"]
    now = pods(t)
    for pod_name in forged:
        assert_left_gated(now[pod_name])
    assert "made" not in foreign_pod_events(t, name)
