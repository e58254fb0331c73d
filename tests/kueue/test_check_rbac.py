"""daemonset/components/kueue: it builds over the base, and the controller decides the check with its own
service account's token and nothing more (the base's RBAC plus the component's), on the test cluster
with Kueue's CRDs."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import REPO, topolet_bin
from tests.controlplane.cluster import Cluster
from tests.controlplane.fixtures import IN_CI, api, cluster, cluster_session, namespace
from tests.controlplane.harness import _Process
from tests.controlplane.kubectl import BASE, base_with_components, build_kubectl, kustomize_build
from tests.kube.kubelet_standin import wait_for
from tests.kueue.test_check import (
    CONTROLLER_NAME,
    KUEUE,
    active,
    check,
    in_state,
    install_kueue_crds,
    nodes,
    submit,
)

try:
    from agent.errors import KubeAPIError
    from agent.kubeapi.client import KubeClient
except ImportError:
    if IN_CI:
        raise
    pytest.skip("the `kubernetes` Python client is not installed", allow_module_level=True)

__all__ = ["api", "check", "cluster", "cluster_session", "namespace", "nodes"]

SYSTEM = "topolet-system"
ACCOUNT = "topolet-controller"
RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
KUEUE_RULES = [
    {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads/status"], "verbs": ["patch"]},
    {"apiGroups": ["kueue.x-k8s.io"], "resources": ["admissionchecks"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": ["kueue.x-k8s.io"], "resources": ["admissionchecks/status"], "verbs": ["patch"]},
    {"apiGroups": ["kueue.x-k8s.io"], "resources": ["resourceflavors"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": ["leaderworkerset.x-k8s.io"], "resources": ["leaderworkersets"], "verbs": ["get"]},
    {"apiGroups": ["apps"], "resources": ["statefulsets"], "verbs": ["get"]},
]


def with_component(tmp_path: Path) -> list[dict[str, Any]]:
    """The base with the kueue component, as `kubectl kustomize` renders it."""
    return base_with_components(tmp_path, "kueue")


def test_the_component_adds_the_check_its_rbac_and_its_policy(tmp_path: Path) -> None:
    base = [d for d in yaml.safe_load_all(kustomize_build(build_kubectl())) if d]
    docs = with_component(tmp_path)
    names = {(d["kind"], d["metadata"]["name"]) for d in base}
    added = {(d["kind"], d["metadata"]["name"]) for d in docs} - names
    assert added == {("AdmissionCheck", "topology-fit"), ("ClusterRole", "topolet-controller-kueue"),
                     ("ClusterRoleBinding", "topolet-controller-kueue"),
                     ("MutatingAdmissionPolicy", "topolet-kueue-placement"),
                     ("MutatingAdmissionPolicyBinding", "topolet-kueue-placement"),
                     ("ValidatingAdmissionPolicy", "topolet-kueue-failsafe"),
                     ("ValidatingAdmissionPolicyBinding", "topolet-kueue-failsafe")}
    by_key = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    assert by_key[("AdmissionCheck", "topology-fit")]["spec"] == {"controllerName": CONTROLLER_NAME}
    assert by_key[("ClusterRole", "topolet-controller-kueue")]["rules"] == KUEUE_RULES
    binding = by_key[("ClusterRoleBinding", "topolet-controller-kueue")]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": SYSTEM}]
    # Nothing of the base changes but the policy that keeps admission's fields the controller's: it
    # skips Kueue's manager too, which copies a Ready Workload's placements onto its Job's template.
    fields = ("ValidatingAdmissionPolicy", "topolet-admission-fields")
    assert [d for d in docs if (d["kind"], d["metadata"]["name"]) not in added | {fields}] == \
        [d for d in base if (d["kind"], d["metadata"]["name"]) != fields]
    base_fields = next(d for d in base if (d["kind"], d["metadata"]["name"]) == fields)
    kueue = "system:serviceaccount:kueue-system:kueue-controller-manager"
    assert by_key[fields]["spec"]["matchConditions"] == [*base_fields["spec"]["matchConditions"], {
        "name": "not-kueue", "expression": f"request.userInfo.username != '{kueue}'"}]
    # Every manifest in the folder is in the component.
    listed = yaml.safe_load((BASE / "components" / "kueue" / "kustomization.yaml").read_text())["resources"]
    assert sorted(listed) == sorted(p.name for p in (BASE / "components" / "kueue").glob("*.yaml")
                                    if p.name != "kustomization.yaml")


@pytest.fixture
def own_token(api: KubeClient, cluster: Cluster, tmp_path: Path) -> Iterator[str]:
    """The base's and the component's RBAC applied to the test cluster; a token of the controller's
    service account.  The roles and bindings are removed after the test."""
    install_kueue_crds(api)
    rbac = [d for d in with_component(tmp_path) if d["kind"] in RBAC_KINDS]
    try:
        api.create("/api/v1/namespaces", {"metadata": {"name": SYSTEM}})
    except KubeAPIError as exc:
        if exc.status != 409:
            raise
    paths = []
    for doc in rbac:
        group = "/api/v1" if doc["kind"] == "ServiceAccount" else "/apis/rbac.authorization.k8s.io/v1"
        plural = doc["kind"].lower() + "s"
        scope = f"/namespaces/{doc['metadata']['namespace']}" if doc["metadata"].get("namespace") else ""
        try:
            api.create(f"{group}{scope}/{plural}", doc)
        except KubeAPIError as exc:
            if exc.status != 409:
                raise
        if doc["kind"] != "ServiceAccount":
            paths.append(f"{group}{scope}/{plural}/{doc['metadata']['name']}")
    yield cluster.plane.mint_token(SYSTEM, ACCOUNT)
    for path in paths:
        api.request("DELETE", path)


def test_the_controller_decides_with_its_own_token_and_can_do_nothing_else(
        api: KubeClient, cluster: Cluster, namespace: str, nodes: tuple[str, list[str]], check: str,
        own_token: str) -> None:
    label, _ = nodes
    with cluster.plane.client(own_token) as raw:
        mine = KubeClient(raw)
        submit(api, namespace, "a", 2, label, check)
        wl = f"{KUEUE}/namespaces/{namespace}/workloads/job-a"
        assert mine.get(wl)["metadata"]["name"] == "job-a"
        for method, path, body, content in (
                ("PATCH", wl, {"spec": {"active": False}}, "application/merge-patch+json"),
                ("POST", f"{KUEUE}/namespaces/{namespace}/workloads", {"metadata": {"name": "x"}},
                 "application/json"),
                ("DELETE", wl, None, None),
                ("GET", f"{KUEUE}/clusterqueues", None, None),
                ("PATCH", f"{KUEUE}/admissionchecks/{check}", {"spec": {}}, "application/merge-patch+json")):
            with pytest.raises(KubeAPIError) as refused:
                mine.request(method, path, body=body, content_type=content)
            assert refused.value.status == 403, (method, path)

    workdir = cluster.workdir / f"own-token-{uuid.uuid4().hex[:6]}"
    workdir.mkdir()
    kubeconfig = cluster.plane.write_kubeconfig(workdir / "kubeconfig", own_token)
    proc = _Process("topolet-controller-own-token",
                    # --kueue auto: on, as the component lets it read Kueue.
                    [topolet_bin(), "controller", "--kubeconfig", str(kubeconfig), "--listen",
                     "127.0.0.1:0", "--resync-seconds", "2"],
                    workdir / "controller.log", env={"POD_NAMESPACE": SYSTEM, "PYTHONPATH": str(REPO)})
    try:
        wait_for(lambda: active(api, check), "the check Active, set with the controller's token")
        wait_for(lambda: in_state(api, namespace, "a", check, "Ready"),
                 "a Ready, set with the controller's token")
        assert "Kueue check on" in proc.log_tail()
    finally:
        proc.stop()
