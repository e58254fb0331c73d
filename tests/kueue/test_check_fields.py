"""Real Kueue v0.17.0 as its own service account (`kueue-system/kueue-controller-manager`, with the RBAC
Kueue's manifests give it: tests/controlplane/kueue.py) under the base's `topolet-admission-fields`
policy as the kueue component ships it (rendered by `kubectl kustomize`, the component's exemption for
Kueue's manager patched in), with the component's placement policy and `topolet controller --kueue on`.

Kueue's manager writes the guarded fields itself: it copies a Ready check's podSetUpdates
(`topolet.io/placements`, or `topolet.io/numa-zone`) onto its Job's pod template as it starts the Job.
So a tenant's queued Job is admitted by Kueue and the check, and its pods run where the check placed
them, only if the policy lets Kueue's real identity through; the same policy without the component's
exemption refuses that identity's write (checked too, so a policy that blocked Kueue would not go
unnoticed). The tenant (a service account of its namespace with Kueue's own end-user roles for Jobs and
Workloads, `kueue-job-editor-role` and `kueue-workload-editor-role`, and a Role for pods) is refused
every forgery: the policy refuses placements and zones on its Jobs and pods, and RBAC refuses it the
Workload status where the check's decision lives."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.admission.test_tenants import POLICY, refused_by_policy
from tests.controlplane.kubectl import api_request, base_with_components, build_kubectl, kustomize_build
from tests.controlplane.kueue import MANAGER_USER, KueueScope, job
from tests.kube.kubelet_standin import wait_for
from tests.kueue.test_check import FAILSAFE, KUEUE
from tests.kueue.test_check_e2e import NUMA, Setup

ADMISSIONREG = "/apis/admissionregistration.k8s.io/v1"
MERGE = "application/merge-patch+json"
POLICY_TIMEOUT_S = 60.0


def policy_doc(docs: list[dict[str, Any]], kind: str = "ValidatingAdmissionPolicy") -> dict[str, Any]:
    """The one document of `kind` named POLICY in rendered manifests."""
    (doc,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == POLICY]
    return doc


@pytest.fixture
def shipped(kueue: KueueScope, tmp_path: Path) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """The fields policy and its binding as the base with the kueue component renders them, installed on
    Kueue's cluster; (that policy, the base's own without the component); both removed after the test."""
    docs = base_with_components(tmp_path, "kueue")
    policy = policy_doc(docs)
    binding = policy_doc(docs, "ValidatingAdmissionPolicyBinding")
    kueue.api.create(f"{ADMISSIONREG}/validatingadmissionpolicies", policy)
    kueue.api.create(f"{ADMISSIONREG}/validatingadmissionpolicybindings", binding)
    try:
        yield policy, policy_doc([d for d in yaml.safe_load_all(kustomize_build(build_kubectl())) if d])
    finally:
        for plural in ("validatingadmissionpolicybindings", "validatingadmissionpolicies"):
            kueue.api.request("DELETE", f"{ADMISSIONREG}/{plural}/{POLICY}")


def tenant_token(s: Setup) -> str:
    """A tenant of `s.ns`: Kueue's end-user roles for Jobs and Workloads there, and pods."""
    api, ns = s.api, s.ns
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}"
    api.create(f"/api/v1/namespaces/{ns}/serviceaccounts", {"metadata": {"name": "tenant"}})
    api.create(f"{rbac}/roles", {"metadata": {"name": "pods"}, "rules": [{
        "apiGroups": [""], "resources": ["pods"],
        "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]}]})
    subject = [{"kind": "ServiceAccount", "name": "tenant", "namespace": ns}]
    for kind, role in (("Role", "pods"), ("ClusterRole", "kueue-job-editor-role"),
                       ("ClusterRole", "kueue-workload-editor-role")):
        api.create(f"{rbac}/rolebindings", {
            "metadata": {"name": f"tenant-{role}"}, "subjects": subject,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": role}})
    return s.kueue.cluster.plane.mint_token(ns, "tenant")


def queued_job(name: str, queue: str, count: int, notes: dict[str, str] | None = None) -> dict[str, Any]:
    """An Indexed Job of `count` single-numa-node pods of 12 CPUs for LocalQueue `queue`."""
    return job(name, queue, parallelism=count, indexed=True, annotations={**NUMA, **(notes or {})},
               requests={"cpu": "12", "memory": "64Mi"})


def test_kueue_as_itself_admits_and_places_and_a_tenant_forges_nothing(
        kueue: KueueScope, dump_root: Callable[[str], Path],
        shipped: tuple[dict[str, Any], dict[str, Any]]) -> None:
    with_component, base_only = shipped
    plane = kueue.cluster.plane
    s = Setup(kueue, dump_root, 200)
    token = tenant_token(s)

    def tenant(method: str, path: str, body: Any = None, content: str = "application/json"
               ) -> tuple[int, dict[str, Any]]:
        return api_request(plane, method, path.format(ns=s.ns), token, body, content)

    jobs = "/apis/batch/v1/namespaces/{ns}/jobs"
    # Kueue's manager really is its service account, not an administrator.
    kubeconfig = json.loads((kueue.kueue.workdir / "kueue.kubeconfig").read_text())
    manager_token = kubeconfig["users"][0]["user"]["token"]
    status, review = api_request(plane, "POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews",
                                 manager_token, {"apiVersion": "authentication.k8s.io/v1",
                                                 "kind": "SelfSubjectReview"})
    assert status == 201, review
    assert review["status"]["userInfo"]["username"] == MANAGER_USER
    assert "system:masters" not in review["status"]["userInfo"]["groups"]

    # A Job of the tenant's that stays queued (no such LocalQueue): suspended, its template its own.
    status, held = tenant("POST", jobs, queued_job("held", "nowhere", 2))
    assert status == 201, held
    held_path = f"{jobs}/held"
    placements = {"spec": {"template": {"metadata": {"annotations": {
        "topolet.io/placements": f"{s.nodes[0]}:0,{s.nodes[0]}:1"}}}}}

    def kueue_may_place() -> tuple[int, dict[str, Any]]:
        """What Kueue's manager does as it starts a Job (its template's placements), as a dry run."""
        return api_request(plane, "PATCH", f"{held_path.format(ns=s.ns)}?dryRun=All", manager_token,
                           placements, MERGE)

    # The shipped policy is enforced (the tenant is refused) and lets Kueue's manager through.
    deadline = time.monotonic() + POLICY_TIMEOUT_S
    while not refused_by_policy(*tenant("PATCH", held_path, placements, MERGE)):
        assert time.monotonic() < deadline, f"{POLICY} not enforced after {POLICY_TIMEOUT_S:.0f} s"
        time.sleep(0.5)
    status, answer = kueue_may_place()
    assert status == 200, answer.get("message")

    # What a tenant might forge on Kueue's route: each refused by the policy, with its message.
    bait = queued_job("bait", "lq", 2, {"topolet.io/placements": f"{s.nodes[0]}:0,{s.nodes[0]}:1"})
    bait["spec"]["template"]["spec"]["nodeSelector"] = {FAILSAFE: "true"}
    forgeries = [
        ("a Kueue Job whose pods come placed", "POST", jobs, bait, "application/json"),
        ("a Kueue Job whose pods name a zone", "POST", jobs,
         queued_job("zoned", "lq", 1, {"topolet.io/numa-zone": "3"}), "application/json"),
        ("placements on its queued Kueue Job", "PATCH", held_path, placements, MERGE),
        ("a zone on its queued Kueue Job", "PATCH", held_path,
         {"spec": {"template": {"metadata": {"annotations": {"topolet.io/numa-zone": "3"}}}}}, MERGE),
        ("a pod in a zone of its choosing", "POST", "/api/v1/namespaces/{ns}/pods",
         {"apiVersion": "v1", "kind": "Pod",
          "metadata": {"generateName": "bare-", "annotations": {"topolet.io/numa-zone": "3"}},
          "spec": {"automountServiceAccountToken": False,
                   "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}},
         "application/json"),
    ]
    for what, method, path, body, content in forgeries:
        status, answer = tenant(method, path, body, content)
        assert refused_by_policy(status, answer), (what, status, answer.get("message"))
        assert "only topolet-controller" in answer["message"], (what, answer["message"])

    # The tenant's own Kueue Job: Kueue reserves quota, the check places it, Kueue (as itself) starts it
    # with the placements on its template, and every pod runs on its slot's node and zone.
    status, made = tenant("POST", jobs, queued_job("a", "lq", 6))
    assert status == 201, made
    uid = made["metadata"]["uid"]
    wait_for(lambda: s.running_as_decided("a", uid, 6), "the tenant's Job admitted and running placed",
             timeout=180)
    template = s.api.get(f"/apis/batch/v1/namespaces/{s.ns}/jobs/a")["spec"]["template"]
    assert "topolet.io/placements" in template["metadata"]["annotations"], template["metadata"]

    # The decision lives in the Workload's status: the tenant may edit Workloads, never their status.
    name = s.workload(uid)["metadata"]["name"]
    ready = {"status": {"admissionChecks": [{
        "name": s.check, "state": "Ready", "message": "forged", "lastTransitionTime": "2026-01-01T00:00:00Z",
        "podSetUpdates": [{"name": "main", "nodeSelector": {"kubernetes.io/hostname": s.nodes[0]},
                           "annotations": {"topolet.io/numa-zone": "0"}}]}]}}
    status, answer = tenant("PATCH", f"{KUEUE}/namespaces/{{ns}}/workloads/{name}/status", ready, MERGE)
    assert status == 403 and "cannot patch resource \"workloads/status\"" in answer["message"], answer

    # Without the component's exemption the base's policy refuses Kueue's manager that write: a policy
    # that blocked Kueue would stop every Kueue Job that the check places.
    policy_path = f"{ADMISSIONREG}/validatingadmissionpolicies/{POLICY}"
    # The component exempts the identity Kueue's manager runs as here (tests/controlplane/kueue.py).
    assert with_component["spec"]["matchConditions"][-1] == {
        "name": "not-kueue", "expression": f"request.userInfo.username != '{MANAGER_USER}'"}
    assert "not-kueue" not in [c["name"] for c in base_only["spec"]["matchConditions"]]
    current = s.api.get(policy_path)
    s.api.request("PUT", policy_path, body={**base_only, "metadata": {
        **base_only["metadata"], "resourceVersion": current["metadata"]["resourceVersion"]}},
        content_type="application/json")
    wait_for(lambda: refused_by_policy(*kueue_may_place()), "the base's policy to refuse Kueue's manager",
             timeout=POLICY_TIMEOUT_S)
    assert "only topolet-controller places pods" in kueue_may_place()[1]["message"]
