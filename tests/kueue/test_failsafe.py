"""The Kueue route's fail-safe node selector stays one no node carries (issue 34, finding 4), on the test
cluster's real API server (which runs the NodeRestriction admission plugin, as kubeadm's do).

Pods of a Ready Workload spread over several slots wait on `FAILSAFE_LABEL` until the kueue component's
placement policy pins each to its slot; a Node carrying it would draw every pod the policy did not pin.
The key lives under `node-restriction.kubernetes.io/`, which NodeRestriction refuses kubelets, and the
component's `topolet-kueue-failsafe` refuses it, and the former key `topolet.io/awaiting-placement`, to
every writer of Nodes: here a node's kubelet (impersonated: `system:node:<name>`, group
`system:nodes`) and the cluster's administrator. Pods of Jobs Kueue started with the former key are
still pinned by the placement policy (dry-run creates show what the API server would store).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.conftest import REPO
from tests.controlplane.cluster import Cluster
from tests.controlplane.fixtures import IN_CI, api, cluster, cluster_session, namespace
from tests.controlplane.harness import ControlPlane
from tests.controlplane.kubectl import api_request
from tests.kube.kubelet_standin import wait_for
from tests.kueue.test_check import install_policy

try:
    from agent.admission.kueue.workloads import FAILSAFE_LABEL, LEGACY_FAILSAFE_KEY
    from agent.kubeapi.client import KubeClient
except ImportError:
    if IN_CI:
        raise
    pytest.skip("the `kubernetes` Python client is not installed", allow_module_level=True)

__all__ = ["api", "cluster", "cluster_session", "namespace"]

FAILSAFE_POLICY = REPO / "daemonset" / "components" / "kueue" / "failsafe-policy.yaml"
NAME = "topolet-kueue-failsafe"
ADMISSIONREG = "/apis/admissionregistration.k8s.io/v1"
MERGE = "application/merge-patch+json"
KEYS = (FAILSAFE_LABEL[0], LEGACY_FAILSAFE_KEY)


def request_as(plane: ControlPlane, user: str, groups: tuple[str, ...], method: str, path: str,
               body: Any = None, content_type: str = MERGE) -> tuple[int, dict[str, Any]]:
    """One REST call as `user` in `groups`, impersonated with the administrator's token."""
    return api_request(plane, method, path, None, body, content_type, impersonate=(user, groups))


def refused_by_failsafe(status: int, body: dict[str, Any]) -> bool:
    message = str(body.get("message", ""))
    return status == 403 and f"ValidatingAdmissionPolicy '{NAME}'" in message and "fail-safe" in message


def node(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}}}


@pytest.fixture
def failsafe(cluster: Cluster, api: KubeClient) -> Iterator[str]:
    """A Node that carried the former key before the policy, then the policy installed and enforced;
    (that Node's name). The policy and the Node are removed after the test."""
    plane = cluster.plane
    carried = f"fs-old-{uuid.uuid4().hex[:6]}"

    def made() -> bool:  # (a policy removed by the test before is enforced a moment longer)
        status, body = api_request(plane, "POST", "/api/v1/nodes",
                                   body=node(carried, {LEGACY_FAILSAFE_KEY: "true"}))
        assert status == 201 or refused_by_failsafe(status, body), body
        return status == 201

    wait_for(made, "a Node with the former key, before the policy", timeout=60, interval=0.5)
    docs = list(yaml.safe_load_all(FAILSAFE_POLICY.read_text()))
    for doc in docs:
        plural = {"ValidatingAdmissionPolicy": "validatingadmissionpolicies",
                  "ValidatingAdmissionPolicyBinding": "validatingadmissionpolicybindings"}[doc["kind"]]
        status, body = api_request(plane, "POST", f"{ADMISSIONREG}/{plural}", body=doc)
        assert status == 201, body
    try:
        wait_for(lambda: refused_by_failsafe(*api_request(
            plane, "POST", "/api/v1/nodes?dryRun=All", body=node("canary", {LEGACY_FAILSAFE_KEY: "true"}))),
            f"{NAME} enforced", timeout=60, interval=0.5)
        yield carried
    finally:
        for plural in ("validatingadmissionpolicybindings", "validatingadmissionpolicies"):
            api_request(plane, "DELETE", f"{ADMISSIONREG}/{plural}/{NAME}")
        api_request(plane, "DELETE", f"/api/v1/nodes/{carried}")


def test_no_node_can_be_given_the_failsafe_selector(cluster: Cluster, failsafe: str) -> None:
    plane = cluster.plane
    name = f"fs-{uuid.uuid4().hex[:6]}"
    status, body = api_request(plane, "POST", "/api/v1/nodes", body=node(name))
    assert status == 201, body
    try:
        kubelet = (f"system:node:{name}", ("system:nodes",))
        # The kubelet may label its own Node (so the refusals below are about the keys).
        status, body = request_as(plane, *kubelet, "PATCH", f"/api/v1/nodes/{name}",
                                  {"metadata": {"labels": {"example.com/rack": "r1"}}})
        assert status == 200, body
        # The key: NodeRestriction refuses kubelets its prefix, and the policy refuses everyone.
        status, body = request_as(plane, *kubelet, "PATCH", f"/api/v1/nodes/{name}",
                                  {"metadata": {"labels": {FAILSAFE_LABEL[0]: "true"}}})
        assert status == 403, body
        # The former key: only the policy stands in the kubelet's way, through the Node or its status.
        for path in (f"/api/v1/nodes/{name}", f"/api/v1/nodes/{name}/status"):
            status, body = request_as(plane, *kubelet, "PATCH", path,
                                      {"metadata": {"labels": {LEGACY_FAILSAFE_KEY: "true"}}})
            assert refused_by_failsafe(status, body), (path, status, body)
        # Nor the administrator: no Node created with either, none given either.
        for key in KEYS:
            status, body = api_request(plane, "POST", "/api/v1/nodes", body=node(f"{name}-x", {key: "true"}))
            assert refused_by_failsafe(status, body), (key, status, body)
            status, body = api_request(plane, "PATCH", f"/api/v1/nodes/{name}",
                                       body={"metadata": {"labels": {key: "true"}}}, content_type=MERGE)
            assert refused_by_failsafe(status, body), (key, status, body)
        labels = api_request(plane, "GET", f"/api/v1/nodes/{name}")[1]["metadata"]["labels"]
        assert not set(KEYS) & set(labels) and labels["example.com/rack"] == "r1"
    finally:
        api_request(plane, "DELETE", f"/api/v1/nodes/{name}")


def test_a_node_that_carried_the_former_key_keeps_working_and_loses_it(
        cluster: Cluster, failsafe: str) -> None:
    """Its other writes pass while it carries the key; changing its value does not; removing it does."""
    plane, path = cluster.plane, f"/api/v1/nodes/{failsafe}"
    status, body = request_as(plane, f"system:node:{failsafe}", ("system:nodes",), "PATCH", path,
                              {"metadata": {"labels": {"example.com/rack": "r2"}}})
    assert status == 200, body
    status, body = api_request(plane, "PATCH", path, content_type=MERGE,
                               body={"metadata": {"labels": {LEGACY_FAILSAFE_KEY: "yes"}}})
    assert refused_by_failsafe(status, body), body
    status, body = api_request(plane, "PATCH", path, content_type=MERGE,
                               body={"metadata": {"labels": {LEGACY_FAILSAFE_KEY: None}}})
    assert status == 200 and LEGACY_FAILSAFE_KEY not in body["metadata"]["labels"], body


def waiting_pod(selector: dict[str, str], index: int, placements: str) -> dict[str, Any]:
    """A pod as the Job controller creates it from a template Kueue gave a Ready state's podSetUpdates."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "generateName": "waiting-", "annotations": {
            "topolet.io/placements": placements, "batch.kubernetes.io/job-completion-index": str(index)}},
        "spec": {"nodeSelector": {"example.com/pool": "a", **selector}, "automountServiceAccountToken": False,
                 "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}}


@pytest.mark.parametrize("keys", [(FAILSAFE_LABEL[0],), (LEGACY_FAILSAFE_KEY,), KEYS],
                         ids=["the key", "the former key", "both"])
def test_the_placement_policy_pins_pods_waiting_on_either_key(
        api: KubeClient, namespace: str, keys: tuple[str, ...]) -> None:
    """Pods of a Job Kueue started before the key moved (its template keeps the former one) are pinned
    like the others; one whose index has no slot keeps waiting, on the key it came with."""
    install_policy(api)
    pods = f"/api/v1/namespaces/{namespace}/pods"
    selector = dict.fromkeys(keys, "true")
    deadline = time.monotonic() + 30
    while True:  # the policy applies to the new key at once; give a fresh install a moment
        pod = api.request("POST", pods, query={"dryRun": "All"}, body=waiting_pod(selector, 1, "n0:1,n1:2"),
                          content_type="application/json")
        if pod["spec"]["nodeSelector"].get("kubernetes.io/hostname") or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert pod["spec"]["nodeSelector"] == {"example.com/pool": "a", "kubernetes.io/hostname": "n1"}
    notes = pod["metadata"]["annotations"]
    assert notes["topolet.io/numa-zone"] == "2" and "topolet.io/placements" not in notes
    stray = api.request("POST", pods, query={"dryRun": "All"}, body=waiting_pod(selector, 2, "n0:1,n1:2"),
                        content_type="application/json")
    assert stray["spec"]["nodeSelector"] == {"example.com/pool": "a", **selector}
