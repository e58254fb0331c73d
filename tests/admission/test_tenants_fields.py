"""Placement fields through every door that makes pods, on the real test cluster (issue 34, finding 3).

The fields policy (`daemonset/controller/fields-policy.yaml`, applied with the controller's part of the
base) keeps `topolet.io/numa-zone`, `topolet.io/placements` and `topolet.io/placements-by-index` the
controller's in every pod template a built-in controller copies (ReplicaSets, Deployments,
StatefulSets, DaemonSets, CronJobs, Jobs, ReplicationControllers, PodTemplates), and trusts the Job
controller's identities with them only for a Job's own pod. kube-controller-manager's controllers
share the user `system:kube-controller-manager` unless it runs with
`--use-service-account-credentials` (off by default): here the pods are created with that user's real
token, and a second kube-controller-manager runs the ReplicaSet controller under it, as such a
cluster does. The tenant (its namespace's service account, with a Role for workloads and pods) is
refused every template with a zone, and a gated pod that names a Job as its owner.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.admission.test_controller import wait_for
from tests.admission.test_tenants import MERGE, POLICY, Tenant, bare_pod, refused_by_policy, until_enforced
from tests.controlplane.cluster import Cluster
from tests.controlplane.fixtures import IN_CI
from tests.controlplane.harness import CONTROLLER_MANAGER_USER
from tests.controlplane.kubectl import BASE, Kubectl, api_request, build_kubectl
from tests.kube.test_manifests import NAMESPACE

try:
    from agent.kubeapi.client import KubeClient
except ImportError:
    if IN_CI:
        raise
    pytest.skip("the `kubernetes` Python client is not installed", allow_module_level=True)

NOWHERE = "test.topolet.io/nowhere"  # a node selector no node matches: nothing here ever runs
ZONE = {"topolet.io/numa-zone": "3"}
FORGED_OWNER = "only the Job controller makes a Job's pods"
RBAC = "/apis/rbac.authorization.k8s.io/v1"


@pytest.fixture
def tenant(cluster: Cluster, api: KubeClient, namespace: str) -> Iterator[Tenant]:
    """The controller's part of the base applied, and a tenant of `namespace` that may create and change
    workloads of every built-in kind and pods there (no nodes: nothing here is scheduled)."""
    plane = cluster.plane
    status, body = api_request(plane, "POST", "/api/v1/namespaces", body={
        "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    assert status in (201, 409), body
    Kubectl(build_kubectl(), plane.kubeconfig).run("apply", "-k", str(BASE / "controller"))
    verbs = ["get", "list", "watch", "create", "update", "patch", "delete"]
    api.create(f"/api/v1/namespaces/{namespace}/serviceaccounts", {"metadata": {"name": "tenant"}})
    api.create(f"{RBAC}/namespaces/{namespace}/roles", {"metadata": {"name": "tenant"}, "rules": [
        {"apiGroups": [""], "resources": ["pods", "replicationcontrollers", "podtemplates"], "verbs": verbs},
        {"apiGroups": ["batch"], "resources": ["jobs", "cronjobs"], "verbs": verbs},
        {"apiGroups": ["apps"], "resources": ["replicasets", "deployments", "statefulsets", "daemonsets"],
         "verbs": verbs}]})
    api.create(f"{RBAC}/namespaces/{namespace}/rolebindings", {
        "metadata": {"name": "tenant"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "tenant"},
        "subjects": [{"kind": "ServiceAccount", "name": "tenant", "namespace": namespace}]})
    mine = Tenant(cluster, api, namespace, plane.mint_token(namespace, "tenant"), NOWHERE, ())
    until_enforced(mine)
    yield mine


def template(notes: dict[str, str], labels: dict[str, str] | None = None, *,
             restart: str = "Always") -> dict[str, Any]:
    """A pod template with `notes` as annotations and `labels` beside the workload's selector label."""
    return {"metadata": {"labels": {"app": "w", **(labels or {})}, "annotations": dict(notes)},
            "spec": {"restartPolicy": restart, "automountServiceAccountToken": False,
                     "nodeSelector": {NOWHERE: "true"},
                     "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}}


# kind -> (apiVersion, collection path under the namespace)
KINDS = {
    "ReplicaSet": ("apps/v1", "apis/apps/v1/namespaces/{ns}/replicasets"),
    "Deployment": ("apps/v1", "apis/apps/v1/namespaces/{ns}/deployments"),
    "StatefulSet": ("apps/v1", "apis/apps/v1/namespaces/{ns}/statefulsets"),
    "DaemonSet": ("apps/v1", "apis/apps/v1/namespaces/{ns}/daemonsets"),
    "CronJob": ("batch/v1", "apis/batch/v1/namespaces/{ns}/cronjobs"),
    "Job": ("batch/v1", "apis/batch/v1/namespaces/{ns}/jobs"),
    "ReplicationController": ("v1", "api/v1/namespaces/{ns}/replicationcontrollers"),
    "PodTemplate": ("v1", "api/v1/namespaces/{ns}/podtemplates"),
}


def workload(kind: str, notes: dict[str, str], labels: dict[str, str] | None = None, *,
             name: str | None = None, replicas: int = 0) -> dict[str, Any]:
    """A `kind` whose pods come with `notes` and `labels` (no replicas unless asked: nothing runs)."""
    api_version = KINDS[kind][0]
    meta = {"name": name or f"{kind.lower()}-{uuid.uuid4().hex[:6]}"}
    selector = {"matchLabels": {"app": "w"}}
    spec: dict[str, Any]
    if kind in ("ReplicaSet", "Deployment"):
        spec = {"replicas": replicas, "selector": selector, "template": template(notes, labels)}
    elif kind == "StatefulSet":
        spec = {"replicas": replicas, "serviceName": "w", "selector": selector,
                "template": template(notes, labels)}
    elif kind == "DaemonSet":
        spec = {"selector": selector, "template": template(notes, labels)}
    elif kind == "CronJob":
        spec = {"schedule": "0 0 1 1 *", "suspend": True, "jobTemplate": {"spec": {
            "template": template(notes, labels, restart="Never")}}}
    elif kind == "Job":
        spec = {"suspend": True, "template": template(notes, labels, restart="Never")}
    elif kind == "ReplicationController":
        spec = {"replicas": replicas, "selector": {"app": "w"}, "template": template(notes, labels)}
    else:
        return {"apiVersion": api_version, "kind": kind, "metadata": meta,
                "template": template(notes, labels)}
    return {"apiVersion": api_version, "kind": kind, "metadata": meta, "spec": spec}


def template_patch(kind: str, notes: dict[str, str]) -> dict[str, Any]:
    """A merge patch adding `notes` to a `kind`'s pod template."""
    inner = {"template": {"metadata": {"annotations": notes}}}
    if kind == "PodTemplate":
        return inner
    if kind == "CronJob":
        return {"spec": {"jobTemplate": {"spec": inner}}}
    return {"spec": inner}


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_tenant_cannot_put_a_zone_in_any_pod_template(tenant: Tenant, kind: str) -> None:
    """Created with the zone, with placements and the placement policy's label, or given the zone
    later: refused for every kind; the same workload without them is the tenant's to make."""
    path = KINDS[kind][1]
    for what, body in (("a zone", workload(kind, ZONE)),
                       ("placements", workload(kind, {"topolet.io/placements": "n:3"},
                                               {"topolet.io/placements-by-index": "true"}))):
        status, answer = tenant.request("POST", path, body)
        assert refused_by_policy(status, answer), (kind, what, status, answer.get("message"))
        assert "only topolet-controller places pods" in answer["message"], answer["message"]
    status, made = tenant.request("POST", path, workload(kind, {"example.com/team": "a"}))
    assert status == 201, made
    status, answer = tenant.request("PATCH", f"{path}/{made['metadata']['name']}",
                                    template_patch(kind, ZONE), MERGE)
    assert refused_by_policy(status, answer), (kind, "patched", status, answer.get("message"))


def owned_pod(owner_kind: str, api_version: str = "apps/v1", *, controller: bool = True,
              notes: dict[str, str] | None = None, gated: bool = False) -> dict[str, Any]:
    """A pod as a controller makes it: owned by a `owner_kind`, with `notes` (the zone by default)."""
    pod = bare_pod({"gated": "1"} if gated else {})
    pod["metadata"]["annotations"] = dict(ZONE if notes is None else notes)
    pod["spec"]["nodeSelector"] = {NOWHERE: "true"}
    pod["metadata"]["ownerReferences"] = [{
        "apiVersion": api_version, "kind": owner_kind, "name": "owner", "uid": str(uuid.uuid4()),
        "controller": controller, "blockOwnerDeletion": True}]
    return pod


@pytest.fixture
def controller_roles(api: KubeClient) -> Iterator[None]:
    """kube-controller-manager's shared user granted its Job and ReplicaSet controllers' roles, as a
    cluster without --use-service-account-credentials grants them (the bootstrap role only reads)."""
    names = []
    for role in ("system:controller:job-controller", "system:controller:replicaset-controller"):
        name = f"test-shared-{role.rsplit(':', 1)[1]}-{uuid.uuid4().hex[:6]}"
        api.create(f"{RBAC}/clusterrolebindings", {
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                          "name": CONTROLLER_MANAGER_USER}]})
        names.append(name)
    yield
    for name in names:
        api.request("DELETE", f"{RBAC}/clusterrolebindings/{name}")


def test_the_shared_identity_places_only_a_jobs_pods(tenant: Tenant, controller_roles: None) -> None:
    """Pods created (dry run) with the zone as the user kube-controller-manager's controllers share,
    and as the Job controller's own service account: only a Job's pod passes (controller reference,
    kind Job, batch/v1)."""
    plane = tenant.cluster.plane
    job_controller = plane.mint_token("kube-system", "job-controller")
    pods = f"/api/v1/namespaces/{tenant.namespace}/pods?dryRun=All"
    for token in (plane.controller_manager_token, job_controller):
        status, answer = api_request(plane, "POST", pods, token, owned_pod("Job", "batch/v1"))
        assert status == 201, answer.get("message")
        for what, pod in (("a ReplicaSet's pod", owned_pod("ReplicaSet")),
                          ("a StatefulSet's pod", owned_pod("StatefulSet")),
                          ("a DaemonSet's pod", owned_pod("DaemonSet")),
                          ("a pod a Job owns but does not control", owned_pod("Job", "batch/v1",
                                                                              controller=False)),
                          ("a pod of a look-alike Job kind", owned_pod("Job", "example.com/v1")),
                          ("a pod nobody owns", bare_pod({"zone": "3"}))):
            status, answer = api_request(plane, "POST", pods, token, pod)
            assert refused_by_policy(status, answer), (what, status, answer.get("message"))


def test_a_replicaset_with_a_zone_makes_no_pod_through_the_shared_identity(
        tenant: Tenant, controller_roles: None, tmp_path: Path) -> None:
    """A second kube-controller-manager runs the ReplicaSet controller as `system:kube-controller-manager`
    (no --use-service-account-credentials). A ReplicaSet whose template has a zone (the admin's: a
    tenant is refused it, so here one written before the policy covered ReplicaSets) gets no pod: the
    controller's creates are refused, and it says so on the ReplicaSet. Its twin without the zone gets
    its pod through the same controller."""
    cluster, api, ns = tenant.cluster, tenant.api, tenant.namespace
    kubeconfig = cluster.plane.write_kubeconfig(tmp_path / "kcm-shared.kubeconfig",
                                                cluster.plane.controller_manager_token,
                                                user=CONTROLLER_MANAGER_USER)

    def argv(port: int) -> list[str]:
        return [str(cluster.binaries.kube_controller_manager), "--kubeconfig", str(kubeconfig),
                "--bind-address", "127.0.0.1", "--secure-port", str(port),
                "--cert-dir", str(tmp_path / "certs"), "--leader-elect=false",
                "--controllers", "replicaset-controller", "--profiling=false"]

    rs_path = f"/apis/apps/v1/namespaces/{ns}/replicasets"
    zoned = workload("ReplicaSet", ZONE, name="zoned", replicas=1)
    plain = workload("ReplicaSet", {}, name="plain", replicas=1)
    for rs in (zoned, plain):  # different selectors: each controls only its own pods
        for part in (rs["spec"]["selector"]["matchLabels"], rs["spec"]["template"]["metadata"]["labels"]):
            part["app"] = rs["metadata"]["name"]
        api.create(rs_path, rs)
    kcm = cluster._start(f"kube-controller-manager-shared-{uuid.uuid4().hex[:4]}", argv)
    try:
        def pods_of(name: str) -> list[dict[str, Any]]:
            out = api.list(f"/api/v1/namespaces/{ns}/pods", {"labelSelector": f"app={name}"})
            return list(out.get("items") or [])

        def refused() -> str:
            rs = api.get(f"{rs_path}/zoned")
            return next((str(c.get("message")) for c in rs.get("status", {}).get("conditions") or []
                         if c.get("type") == "ReplicaFailure" and c.get("reason") == "FailedCreate"), "")

        wait_for(lambda: pods_of("plain"), "the plain ReplicaSet's pod", timeout=60)
        message = wait_for(refused, "the zoned ReplicaSet's FailedCreate", timeout=60)
        assert POLICY in message and "only topolet-controller places pods" in message, message
        assert not pods_of("zoned")
        (pod,) = pods_of("plain")
        assert "topolet.io/numa-zone" not in (pod["metadata"].get("annotations") or {})
    finally:
        kcm.stop()
        for name in ("zoned", "plain"):
            api.request("DELETE", f"{rs_path}/{name}")


def test_a_tenant_cannot_forge_a_jobs_gated_pod(tenant: Tenant, controller_roles: None) -> None:
    """A gated pod naming the tenant's own Job as its controller (issue 34, finding 2's pod) is refused,
    created so or given the owner later; the Job controller's identities may make one, and the tenant
    may still make a gated pod of its own and one that a Job owns without our gate."""
    plane, ns = tenant.cluster.plane, tenant.namespace
    status, job = tenant.request("POST", KINDS["Job"][1], workload("Job", {}, name="mine"))
    assert status == 201, job
    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": "mine", "uid": job["metadata"]["uid"],
             "controller": True}

    def forged(gated: bool = True, **ref: Any) -> dict[str, Any]:
        pod = owned_pod("Job", "batch/v1", notes={}, gated=gated)
        pod["metadata"]["ownerReferences"] = [{**owner, **ref}]
        return pod

    pods = "api/v1/namespaces/{ns}/pods"
    for what, pod in (("as its controller", forged()),
                      ("as an owner", forged(controller=False)),
                      ("of another batch version", forged(apiVersion="batch/v2"))):
        status, answer = tenant.request("POST", pods, pod)
        assert status == 403 and FORGED_OWNER in str(answer.get("message")), (what, status, answer)
    status, mine = tenant.request("POST", pods, bare_pod({"gated": "1"}))
    assert status == 201, mine
    status, answer = tenant.request("PATCH", f"{pods}/{mine['metadata']['name']}",
                                    {"metadata": {"ownerReferences": [owner]}}, MERGE)
    assert status == 403 and FORGED_OWNER in str(answer.get("message")), (status, answer)
    status, answer = tenant.request("POST", f"{pods}?dryRun=All", forged(gated=False))
    assert status == 201, answer.get("message")
    for token in (plane.controller_manager_token, plane.mint_token("kube-system", "job-controller")):
        status, answer = api_request(plane, "POST", f"/{pods.format(ns=ns)}?dryRun=All", token,
                                     forged())
        assert status == 201, answer.get("message")
