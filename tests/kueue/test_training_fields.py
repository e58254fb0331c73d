"""The fields policy over the training kinds, on Kueue's test cluster with the operators' CRDs and
webhooks (tests/controlplane/operators.py) and the base's `topolet-admission-fields` as the kueue
component ships it: a tenant (a service account of its namespace, RBAC for the training kinds, Jobs
and pods) is refused the placement fields in every pod template of a JobSet, a TrainJob's runtime
patch, an MPIJob and a LeaderWorkerSet, and the JobSet controller's service account
(`jobset-system:jobset-controller-manager`, as JobSet's own manifests name it) may carry them into a
JobSet's own Job and nowhere else.  Dry runs: nothing is created."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from agent.errors import KubeAPIError
from tests.admission.test_tenants import refused_by_policy
from tests.controlplane.fixtures import kueue, kueue_session, operators
from tests.controlplane.kubectl import api_request
from tests.controlplane.kueue import KueueScope
from tests.controlplane.operators import Operators, collection_path, jobset, leaderworkerset, mpijob, trainjob
from tests.kube.kubelet_standin import wait_for
from tests.kueue.test_check_fields import POLICY_TIMEOUT_S, shipped

__all__ = ["kueue", "kueue_session", "operators", "shipped"]

pytestmark = pytest.mark.integration

JOBSET_SA = ("jobset-system", "jobset-controller-manager")
RULE = "jobset.sigs.k8s.io/job-index*3+batch.kubernetes.io/job-completion-index"
FIELDS = [("placements", {"topolet.io/placements": "n0:0,n1:0"}),
          ("rank", {"topolet.io/placement-rank": RULE}), ("zone", {"topolet.io/numa-zone": "1"})]


class Who:
    """Dry-run requests as one service account's token."""

    def __init__(self, kueue: KueueScope, token: str, ns: str) -> None:
        self.plane, self.token, self.ns = kueue.cluster.plane, token, ns

    def create(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        return api_request(self.plane, "POST", f"{path}?dryRun=All", self.token, body)


def service_account(kueue: KueueScope, ns: str, name: str, rules: list[dict[str, Any]],
                    grant_in: str) -> str:
    """Service account `ns/name` granted `rules` in namespace `grant_in`; its token."""
    api = kueue.api
    for path, body in (("/api/v1/namespaces", {"metadata": {"name": ns}}),
                       (f"/api/v1/namespaces/{ns}/serviceaccounts", {"metadata": {"name": name}})):
        try:
            api.create(path, body)
        except KubeAPIError as exc:
            if exc.status != 409:
                raise
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{grant_in}"
    role = f"{ns}-{name}"
    api.create(f"{rbac}/roles", {"metadata": {"name": role}, "rules": rules})
    api.create(f"{rbac}/rolebindings", {
        "metadata": {"name": role}, "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}],
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role}})
    return kueue.cluster.plane.mint_token(ns, name)


@pytest.fixture
def actors(kueue: KueueScope, operators: Operators, shipped: Any) -> Iterator[tuple[Who, Who]]:
    """(the tenant, the JobSet controller's identity) of a fresh namespace, once the policy refuses."""
    assert all(operators.running(n) for n in ("jobset", "trainer", "mpi-operator", "lws"))
    ns = kueue.namespace("tf")
    verbs = ["get", "list", "create", "update", "patch"]
    tenant = Who(kueue, service_account(kueue, ns, "tenant", [
        {"apiGroups": ["jobset.x-k8s.io"], "resources": ["jobsets"], "verbs": verbs},
        {"apiGroups": ["trainer.kubeflow.org"], "resources": ["trainjobs"], "verbs": verbs},
        {"apiGroups": ["kubeflow.org"], "resources": ["mpijobs"], "verbs": verbs},
        {"apiGroups": ["leaderworkerset.x-k8s.io"], "resources": ["leaderworkersets"], "verbs": verbs},
        {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": verbs},
        {"apiGroups": [""], "resources": ["pods"], "verbs": verbs}], ns), ns)
    controller = Who(kueue, service_account(kueue, *JOBSET_SA, [
        {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": verbs},
        {"apiGroups": [""], "resources": ["pods"], "verbs": verbs}], ns), ns)
    zoned = jobset_with("probe", {"topolet.io/numa-zone": "0"})
    wait_for(lambda: refused_by_policy(*tenant.create(collection_path("JobSet", ns), zoned)),
             "the policy to refuse a tenant's JobSet", timeout=POLICY_TIMEOUT_S)
    yield tenant, controller


def jobset_with(name: str, notes: dict[str, str]) -> dict[str, Any]:
    body = jobset(name, None)
    body["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["metadata"] = {"annotations": notes}
    return body


def trainjob_with(name: str, notes: dict[str, str]) -> dict[str, Any]:
    body = trainjob(name, None)
    body["spec"]["runtimePatches"] = [{"manager": "tenant.example.com/mine", "trainingRuntimeSpec": {
        "template": {"spec": {"replicatedJobs": [{"name": "node", "template": {"spec": {"template": {
            "metadata": {"annotations": notes}}}}}]}}}}]
    return body


def mpijob_with(name: str, notes: dict[str, str]) -> dict[str, Any]:
    body = mpijob(name, None)
    body["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["metadata"] = {"annotations": notes}
    return body


def lws_with(name: str, notes: dict[str, str]) -> dict[str, Any]:
    body = leaderworkerset(name, None)
    body["spec"]["leaderWorkerTemplate"]["workerTemplate"]["metadata"] = {"annotations": notes}
    return body


KINDS: list[tuple[str, Callable[[str, dict[str, str]], dict[str, Any]]]] = [
    ("JobSet", jobset_with), ("TrainJob", trainjob_with), ("MPIJob", mpijob_with),
    ("LeaderWorkerSet", lws_with)]


def job_of(owner: dict[str, Any] | None, notes: dict[str, str]) -> dict[str, Any]:
    """A Job whose template carries `notes`, controlled by `owner` (an object) if any."""
    spec = {"restartPolicy": "Never", "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}
    job: dict[str, Any] = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"generateName": "child-"},
                           "spec": {"suspend": True, "template": {"metadata": {"annotations": notes},
                                                                  "spec": spec}}}
    if owner is not None:
        job["metadata"]["ownerReferences"] = [{
            "apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": owner["metadata"]["name"],
            "uid": owner["metadata"]["uid"], "controller": True}]
    return job


@pytest.mark.parametrize(("kind", "build"), KINDS, ids=[k for k, _ in KINDS])
def test_a_tenant_places_no_pod_of_a_training_kind(
        actors: tuple[Who, Who], kind: str, build: Callable[[str, dict[str, str]], dict[str, Any]]) -> None:
    tenant, _ = actors
    path = collection_path(kind, tenant.ns)
    status, made = tenant.create(path, build("plain", {}))
    assert status == 201, made.get("message")  # the kind itself is the tenant's to create
    for what, notes in FIELDS:
        status, answer = tenant.create(path, build(f"with-{what}", notes))
        assert refused_by_policy(status, answer), (kind, what, status, answer.get("message"))
        assert "only topolet-controller places pods" in answer["message"]


def test_only_the_jobset_controller_carries_placements_into_a_jobsets_own_job(
        kueue: KueueScope, actors: tuple[Who, Who]) -> None:
    tenant, controller = actors
    jobs = f"/apis/batch/v1/namespaces/{tenant.ns}/jobs"
    pods = f"/api/v1/namespaces/{tenant.ns}/pods"
    # Real owners (Kueue's Job webhook reads a Job's owner): a suspended JobSet, and a ConfigMap.
    owned = jobset("owner", None)
    owned["spec"]["suspend"] = True
    js = kueue.api.create(collection_path("JobSet", tenant.ns), owned)
    other = kueue.api.create(f"/api/v1/namespaces/{tenant.ns}/configmaps", {"metadata": {"name": "owner"}})
    other.update(apiVersion="v1", kind="ConfigMap")
    for what, notes in FIELDS:
        status, answer = controller.create(jobs, job_of(js, notes))
        assert status == 201, (what, answer.get("message"))
        for who, body in ((controller, job_of(None, notes)), (controller, job_of(other, notes)),
                          (tenant, job_of(js, notes))):
            status, answer = who.create(jobs, body)
            assert refused_by_policy(status, answer), (what, body["metadata"], answer.get("message"))
        pod = copy.deepcopy(job_of(js, notes)["spec"]["template"])
        status, answer = controller.create(pods, {"apiVersion": "v1", "kind": "Pod", **pod,
                                                  "metadata": {"generateName": "p-", **pod["metadata"]}})
        assert refused_by_policy(status, answer), (what, answer.get("message"))
