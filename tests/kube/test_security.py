"""The agent's credentials on a real API server: each agent writes only its own node's objects.

Setup, all through the daemonset/ base as `kubectl apply -k` installs it: two Nodes A and B, one agent
Pod bound to each (spec.nodeName set, service account topolet-agent), and a token bound to each pod as
the kubelet would project it. Every request below is sent with one of those tokens (or an unbound token
of the same service account) and must get the status its row names. A refusal must come from the layer
that is meant to refuse it: RBAC for what the agent has no grant for, the admission policy for another
node's objects.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from agent.admission.kueue.workloads import FAILSAFE_LABEL, LEGACY_FAILSAFE_KEY
from agent.kube.publish.events import REPORTING_CONTROLLER
from agent.labels.nodefeature import NODE_NAME_LABEL, nodefeature_name, nodefeature_object
from tests.controlplane.fixtures import IN_CI
from tests.controlplane.harness import ControlPlane
from tests.controlplane.kubectl import api_request
from tests.controlplane.kubectl import applied_base as applied_base  # noqa: F401 - fixture
from tests.controlplane.kubectl import kubectl as kubectl  # noqa: F401 - fixture
from tests.kube.test_labels_sink import NODEFEATURE_CRD
from tests.kube.test_nrt import install_crd

try:
    import kubernetes  # noqa: F401
except ImportError:
    if IN_CI:
        raise
    pytest.skip("the `kubernetes` Python client is not installed", allow_module_level=True)

NAMESPACE = "topolet-system"
AGENT_SA = "topolet-agent"
POLICY = "topolet-agent-own-node"
NRT_PATH = "/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies"
NF_PATH = f"/apis/nfd.k8s-sigs.io/v1alpha1/namespaces/{NAMESPACE}/nodefeatures"
EVENTS_PATH = f"/apis/events.k8s.io/v1/namespaces/{NAMESPACE}/events"
NODE_EVENTS_PATH = "/apis/events.k8s.io/v1/namespaces/default/events"  # a cluster-scoped object's Events
MERGE = "application/merge-patch+json"
APPLY = "application/apply-patch+yaml"
POLICY_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Cluster:
    """Two nodes, an agent token bound to a pod on each, and an unbound agent token."""

    plane: ControlPlane
    a: str
    b: str
    token_a: str
    token_b: str
    unbound: str


def nrt(node: str, cpus: int = 2) -> dict[str, Any]:
    """A NodeResourceTopology for `node` with one NUMA zone."""
    return {
        "apiVersion": "topology.node.k8s.io/v1alpha2", "kind": "NodeResourceTopology",
        "metadata": {"name": node},
        "attributes": [{"name": "topologyManagerPolicy", "value": "none"}],
        "zones": [{"name": "node-0", "type": "Node", "resources": [
            {"name": "cpu", "capacity": str(cpus), "allocatable": str(cpus), "available": str(cpus)}]}],
    }


def nodefeature(node: str, labels: dict[str, str] | None = None, name: str | None = None) -> dict[str, Any]:
    """The agent's NodeFeature for `node`, as agent/labels builds it."""
    obj = nodefeature_object(node, NAMESPACE, labels or {"topolet.io/numa.nodes": "1"})
    if name is not None:
        obj["metadata"]["name"] = name
    return obj


def unchecked_nodefeature(node: str, labels: dict[str, str]) -> dict[str, Any]:
    """Node `node`'s NodeFeature asking for `labels` as they are (agent/labels would refuse bad ones)."""
    obj = nodefeature(node)
    obj["spec"]["labels"] = labels
    return obj


def event(instance: str, regarding: dict[str, Any] | None = None, *, controller: str = REPORTING_CONTROLLER,
          namespace: str = NAMESPACE, name: str | None = None, **fields: Any) -> dict[str, Any]:
    """An events.k8s.io/v1 Event as agent/kube/publish/events.py writes it, reported by `instance`, about
    a pod in `namespace` unless `regarding` says otherwise."""
    return {
        "apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": name or f"topolet-{uuid.uuid4().hex[:8]}", "namespace": namespace},
        "eventTime": "2026-01-01T00:00:00.000000Z", "reportingController": controller,
        "reportingInstance": instance, "action": "Reconcile", "reason": "InvalidAnnotation",
        "note": "topolet.io/smt: not one of full-cores, any", "type": "Warning",
        "regarding": regarding or {"apiVersion": "v1", "kind": "Pod", "namespace": namespace, "name": "p"},
        **fields,
    }


def node_ref(node: str) -> dict[str, Any]:
    """An object reference to Node `node`."""
    return {"apiVersion": "v1", "kind": "Node", "name": node}


def labels_patch(labels: dict[str, str | None]) -> dict[str, Any]:
    """A merge patch setting (or, with None, removing) Node labels."""
    return {"metadata": {"labels": labels}}


def refused_by(status: int, body: dict[str, Any]) -> str:
    """Which layer refused a request: "policy", "rbac", or "" when it was not refused."""
    if status != 403:
        return ""
    message = str(body.get("message", ""))
    if f"ValidatingAdmissionPolicy '{POLICY}'" in message:
        # A validation that fails to evaluate also denies (failurePolicy: Fail): not a refusal by rule.
        _, _, reason = message.partition("denied request: ")
        return "policy" if reason.startswith("topolet-agent ") else f"policy error: {message}"
    if "cannot" in message and "forbidden" in message:
        return "rbac"
    return f"other: {message}"


def make_node(plane: ControlPlane, name: str) -> str:
    status, body = api_request(plane, "POST", "/api/v1/nodes", body={
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name},
                     "annotations": {"node.alpha.kubernetes.io/ttl": "0"}},
        "spec": {"taints": [{"key": "example.com/dedicated", "value": "hpc", "effect": "NoSchedule"}]},
    })
    assert status == 201, body
    return str(body["metadata"]["uid"])


def make_agent_pod(plane: ControlPlane, node: str) -> tuple[str, str]:
    """An agent pod already bound to `node`, as the DaemonSet controller and scheduler would leave it."""
    name = f"topolet-agent-{uuid.uuid4().hex[:6]}"
    status, body = api_request(plane, "POST", f"/api/v1/namespaces/{NAMESPACE}/pods", body={
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"serviceAccountName": AGENT_SA, "nodeName": node,
                 "tolerations": [{"operator": "Exists"}],
                 "containers": [{"name": "agent", "image": "topolet:0.1.0"}]},
    })
    assert status == 201, body
    return name, str(body["metadata"]["uid"])


def new_agent(plane: ControlPlane) -> tuple[str, str, str]:
    """A fresh node and an agent pod on it: (node name, node uid, the pod's bound token)."""
    node = f"node-{uuid.uuid4().hex[:8]}"
    uid = make_node(plane, node)
    return node, uid, plane.mint_token(NAMESPACE, AGENT_SA, bound_pod=make_agent_pod(plane, node))


def wait_for_policy(plane: ControlPlane, token: str) -> None:
    """Until the API server enforces the policy: a dry-run create of an unrelated NRT is refused by it."""
    deadline = time.monotonic() + POLICY_TIMEOUT_S
    while True:
        status, body = api_request(plane, "POST", NRT_PATH + "?dryRun=All", token,
                                   nrt(f"canary-{uuid.uuid4().hex[:6]}"))
        if refused_by(status, body) == "policy":
            return
        assert status in (201, 403), body
        if time.monotonic() > deadline:
            pytest.fail(f"admission policy {POLICY} not enforced after {POLICY_TIMEOUT_S:.0f} s: {body}")
        time.sleep(0.5)


@pytest.fixture(scope="module")
def cluster(control_plane: ControlPlane, applied_base: Any) -> Iterator[Cluster]:  # noqa: F811 - fixture
    # NFD's NodeFeature CRD, as NFD installs it (the base has only the NRT CRD).
    with control_plane.client() as api:
        install_crd(api, NODEFEATURE_CRD)
    suffix = uuid.uuid4().hex[:6]
    a, b = f"node-a-{suffix}", f"node-b-{suffix}"
    for node in (a, b):
        make_node(control_plane, node)
    token_a = control_plane.mint_token(NAMESPACE, AGENT_SA, bound_pod=make_agent_pod(control_plane, a))
    token_b = control_plane.mint_token(NAMESPACE, AGENT_SA, bound_pod=make_agent_pod(control_plane, b))
    unbound = control_plane.mint_token(NAMESPACE, AGENT_SA)
    wait_for_policy(control_plane, token_a)
    # Node B's agent has published; node A's agent will try to overwrite it.
    for path, obj in ((NRT_PATH, nrt(b)), (NF_PATH, nodefeature(b)),
                      (EVENTS_PATH, event(b, name=f"topolet-{b}"))):
        status, body = api_request(control_plane, "POST", path, token_b, obj)
        assert status == 201, body
    yield Cluster(control_plane, a, b, token_a, token_b, unbound)


def as_agent(cluster: Cluster, method: str, path: str, body: Any = None, content_type: str = MERGE,
             token: str | None = None) -> tuple[int, dict[str, Any]]:
    return api_request(cluster.plane, method, path, token or cluster.token_a, body, content_type)


def node_labels(cluster: Cluster, node: str) -> dict[str, str]:
    status, body = api_request(cluster.plane, "GET", f"/api/v1/nodes/{node}")
    assert status == 200, body
    return dict(body["metadata"].get("labels") or {})


# ---- refused ---------------------------------------------------------------------------------------

# (id, method, path template, body builder, content type, refusing layer). {a}/{b}: the two nodes.
REFUSED: list[tuple[str, str, str, Any, str, str]] = [
    ("label node B", "PATCH", "/api/v1/nodes/{b}",
     lambda c: labels_patch({"topolet.io/numa.nodes": "2"}), MERGE, "policy"),
    ("label node B under NFD's prefix", "PATCH", "/api/v1/nodes/{b}",
     lambda c: labels_patch({"feature.node.kubernetes.io/cpu-model.vendor_id": "Intel"}), MERGE, "policy"),
    ("create node B's NRT", "POST", NRT_PATH, lambda c: nrt(c.b), "application/json", "policy"),
    ("server-side apply node B's NRT", "PATCH", NRT_PATH + "/{b}?fieldManager=topolet&force=true",
     lambda c: nrt(c.b, cpus=1), APPLY, "policy"),
    ("merge-patch node B's NRT", "PATCH", NRT_PATH + "/{b}",
     lambda c: {"attributes": [{"name": "topologyManagerPolicy", "value": "stolen"}]}, MERGE, "policy"),
    ("create a NodeFeature for node B", "POST", NF_PATH,
     lambda c: nodefeature(c.b, name=f"topolet-{c.b}-x"), "application/json", "policy"),
    ("server-side apply node B's NodeFeature", "PATCH",
     NF_PATH + "/" + nodefeature_name("{b}") + "?fieldManager=topolet&force=true",
     lambda c: nodefeature(c.b, {"topolet.io/numa.nodes": "9"}), APPLY, "policy"),
    ("take over node B's NodeFeature by relabelling it", "PATCH", NF_PATH + "/" + nodefeature_name("{b}"),
     lambda c: {"metadata": {"labels": {NODE_NAME_LABEL: c.a}}}, MERGE, "policy"),
    ("delete node B's NodeFeature", "DELETE", NF_PATH + "/" + nodefeature_name("{b}"), None, MERGE, "policy"),
    ("create a NodeFeature for node B named after node A", "POST", NF_PATH,
     lambda c: nodefeature(c.b, name=nodefeature_name(c.a) + "-x"), "application/json", "policy"),
    # One NodeFeature per node, by name, with only our labels.
    ("a second NodeFeature for its own node", "POST", NF_PATH,
     lambda c: nodefeature(c.a, name=nodefeature_name(c.a) + "-2"), "application/json", "policy"),
    ("a NodeFeature named after node B, labelled A", "POST", NF_PATH,
     lambda c: nodefeature(c.a, name=nodefeature_name(c.b)), "application/json", "policy"),
    ("own NodeFeature: a label outside our prefixes", "PATCH",
     NF_PATH + "/" + nodefeature_name("{a}") + "?fieldManager=topolet&force=true",
     lambda c: unchecked_nodefeature(c.a, {"topolet.io/numa.nodes": "1",
                                           "node-role.kubernetes.io/control-plane": ""}),
     APPLY, "policy"),
    ("own NodeFeature: a look-alike prefix", "PATCH",
     NF_PATH + "/" + nodefeature_name("{a}") + "?fieldManager=topolet&force=true",
     lambda c: unchecked_nodefeature(c.a, {"topolet.io.example.com/numa.nodes": "1"}), APPLY, "policy"),
    ("own NodeFeature: a label name past 63 characters", "PATCH",
     NF_PATH + "/" + nodefeature_name("{a}") + "?fieldManager=topolet&force=true",
     lambda c: unchecked_nodefeature(c.a, {"topolet.io/" + "n" * 64: "1"}), APPLY, "policy"),
    ("own NodeFeature: an invalid label value", "PATCH",
     NF_PATH + "/" + nodefeature_name("{a}") + "?fieldManager=topolet&force=true",
     lambda c: unchecked_nodefeature(c.a, {"topolet.io/numa.nodes": "1; rm -rf"}), APPLY, "policy"),
    ("own NodeFeature: raw features for the cluster's rules", "PATCH",
     NF_PATH + "/" + nodefeature_name("{a}") + "?fieldManager=topolet&force=true",
     lambda c: {**nodefeature(c.a), "spec": {**nodefeature(c.a)["spec"], "features": {
         "flags": {"cpu.cpuid": {"elements": {"AVX512F": {}}}}}}}, APPLY, "policy"),
    # Events: reported as itself, about its Node or a pod, through events.k8s.io only.
    ("an Event reported as node B", "POST", EVENTS_PATH, lambda c: event(c.b), "application/json", "policy"),
    ("an Event reported by another controller", "POST", EVENTS_PATH,
     lambda c: event(c.a, controller="kubelet"), "application/json", "policy"),
    ("an Event about node B", "POST", NODE_EVENTS_PATH,
     lambda c: event(c.a, node_ref(c.b), namespace="default"), "application/json", "policy"),
    ("an Event about a Secret", "POST", EVENTS_PATH,
     lambda c: event(c.a, {"apiVersion": "v1", "kind": "Secret", "namespace": NAMESPACE, "name": "s"}),
     "application/json", "policy"),
    ("an Event about a Deployment", "POST", EVENTS_PATH,
     lambda c: event(c.a, {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": NAMESPACE,
                           "name": "topolet-controller"}), "application/json", "policy"),
    ("an Event relating node B", "POST", EVENTS_PATH, lambda c: event(c.a, related=node_ref(c.b)),
     "application/json", "policy"),
    ("count up node B's Event", "PATCH", EVENTS_PATH + "/topolet-{b}",
     lambda c: {"series": {"count": 99, "lastObservedTime": "2026-01-01T00:01:00.000000Z"}}, MERGE, "policy"),
    ("a core/v1 Event", "POST", f"/api/v1/namespaces/{NAMESPACE}/events",
     lambda c: {"apiVersion": "v1", "kind": "Event", "metadata": {"name": f"core-{uuid.uuid4().hex[:6]}"},
                "involvedObject": {"kind": "Pod", "namespace": NAMESPACE, "name": "p"},
                "reason": "InvalidAnnotation", "message": "x", "type": "Warning",
                "source": {"component": "topolet", "host": c.a}}, "application/json", "rbac"),
    ("patch a core/v1 Event", "PATCH", f"/api/v1/namespaces/{NAMESPACE}/events/topolet-{{a}}",
     lambda c: {"count": 2}, MERGE, "rbac"),
    ("delete an Event", "DELETE", EVENTS_PATH + "/topolet-{b}", None, MERGE, "rbac"),
    ("own node: a label outside our prefixes", "PATCH", "/api/v1/nodes/{a}",
     lambda c: labels_patch({"example.com/role": "gpu"}), MERGE, "policy"),
    # Only the labels it publishes (issue 34, finding 4): not a selector other pods wait on.
    ("own node: the Kueue route's fail-safe selector", "PATCH", "/api/v1/nodes/{a}",
     lambda c: labels_patch({FAILSAFE_LABEL[0]: "true"}), MERGE, "policy"),
    ("own node: the fail-safe selector's former key", "PATCH", "/api/v1/nodes/{a}",
     lambda c: labels_patch({LEGACY_FAILSAFE_KEY: "true"}), MERGE, "policy"),
    ("own node: a topolet.io/ label it does not publish", "PATCH", "/api/v1/nodes/{a}",
     lambda c: labels_patch({"topolet.io/pool": "gpu"}), MERGE, "policy"),
    ("own node: the user's MIG layout label", "PATCH", "/api/v1/nodes/{a}",
     lambda c: labels_patch({"topolet.io/mig.config": "all-1g.10gb"}), MERGE, "policy"),
    ("own node: a published label's look-alike", "PATCH", "/api/v1/nodes/{a}",
     lambda c: labels_patch({"topolet.io/numa.nodes.x": "1"}), MERGE, "policy"),
    ("own NodeFeature: the fail-safe selector's former key", "PATCH",
     NF_PATH + "/" + nodefeature_name("{a}") + "?fieldManager=topolet&force=true",
     lambda c: unchecked_nodefeature(c.a, {"topolet.io/numa.nodes": "1", LEGACY_FAILSAFE_KEY: "true"}),
     APPLY, "policy"),
    ("own node: remove kubernetes.io/hostname", "PATCH", "/api/v1/nodes/{a}",
     lambda c: labels_patch({"kubernetes.io/hostname": None}), MERGE, "policy"),
    ("own node: change kubernetes.io/hostname", "PATCH", "/api/v1/nodes/{a}",
     lambda c: labels_patch({"kubernetes.io/hostname": "elsewhere"}), MERGE, "policy"),
    ("own node: an annotation outside topolet.io/", "PATCH", "/api/v1/nodes/{a}",
     lambda c: {"metadata": {"annotations": {"node.alpha.kubernetes.io/ttl": "30"}}}, MERGE, "policy"),
    ("own node: drop its taints", "PATCH", "/api/v1/nodes/{a}",
     lambda c: {"spec": {"taints": None}}, MERGE, "policy"),
    ("own node: cordon it", "PATCH", "/api/v1/nodes/{a}",
     lambda c: {"spec": {"unschedulable": True}}, MERGE, "policy"),
    ("own node: add a finalizer", "PATCH", "/api/v1/nodes/{a}",
     lambda c: {"metadata": {"finalizers": ["example.com/keep"]}}, MERGE, "policy"),
    ("own node: add an owner reference", "PATCH", "/api/v1/nodes/{a}",
     lambda c: {"metadata": {"ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": c.b,
                                                  "uid": str(uuid.uuid4())}]}}, MERGE, "policy"),
    ("own node: update its status", "PATCH", "/api/v1/nodes/{a}/status",
     lambda c: {"status": {"capacity": {"cpu": "1000"}}}, MERGE, "rbac"),
    ("own node: its conditions", "PATCH", "/api/v1/nodes/{a}/status",
     lambda c: {"status": {"conditions": [{"type": "Ready", "status": "False"}]}}, MERGE, "rbac"),
    ("read a Secret in its namespace", "GET", f"/api/v1/namespaces/{NAMESPACE}/secrets/anything",
     None, MERGE, "rbac"),
    ("list Secrets in its namespace", "GET", f"/api/v1/namespaces/{NAMESPACE}/secrets", None, MERGE, "rbac"),
    ("list Secrets everywhere", "GET", "/api/v1/secrets", None, MERGE, "rbac"),
    ("create a Secret", "POST", f"/api/v1/namespaces/{NAMESPACE}/secrets",
     lambda c: {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "x"}}, "application/json", "rbac"),
    ("mint a token for itself", "POST", f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{AGENT_SA}/token",
     lambda c: {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}},
     "application/json", "rbac"),
    ("delete its own NRT", "DELETE", NRT_PATH + "/{a}", None, MERGE, "rbac"),
    ("delete node B", "DELETE", "/api/v1/nodes/{b}", None, MERGE, "rbac"),
    ("create a node", "POST", "/api/v1/nodes",
     lambda c: {"apiVersion": "v1", "kind": "Node", "metadata": {"name": c.a + "-twin"}}, "application/json",
     "rbac"),
    ("update node B's status", "PATCH", "/api/v1/nodes/{b}/status",
     lambda c: {"status": {"capacity": {"cpu": "1000"}}}, MERGE, "rbac"),
    ("a NodeFeature in another namespace", "POST", NF_PATH.replace(NAMESPACE, "default"),
     lambda c: {**nodefeature(c.a), "metadata": {**nodefeature(c.a)["metadata"], "namespace": "default"}},
     "application/json", "rbac"),
    ("exec into pods", "POST", f"/api/v1/namespaces/{NAMESPACE}/pods/anything/exec?command=sh",
     None, MERGE, "rbac"),
    ("read ConfigMaps", "GET", f"/api/v1/namespaces/{NAMESPACE}/configmaps", None, MERGE, "rbac"),
    # The admission controller's powers (daemonset/controller/) are not the agent's.
    ("unsuspend a Job", "PATCH", "/apis/batch/v1/namespaces/default/jobs/anything",
     lambda c: {"spec": {"suspend": False}}, MERGE, "rbac"),
    ("patch a pod's labels", "PATCH", f"/api/v1/namespaces/{NAMESPACE}/pods/anything",
     lambda c: {"metadata": {"labels": {"app": "x"}}}, MERGE, "rbac"),
    ("evict a pod", "POST", f"/api/v1/namespaces/{NAMESPACE}/pods/anything/eviction",
     lambda c: {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "anything"}},
     "application/json", "rbac"),
    ("bind a pod to a node", "POST", f"/api/v1/namespaces/{NAMESPACE}/pods/anything/binding",
     lambda c: {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "anything"},
                "target": {"apiVersion": "v1", "kind": "Node", "name": c.a}}, "application/json", "rbac"),
    ("delete a pod", "DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/anything", None, MERGE, "rbac"),
    ("lift a pod's scheduling gate", "PATCH", f"/api/v1/namespaces/{NAMESPACE}/pods/anything",
     lambda c: {"spec": {"schedulingGates": []}}, MERGE, "rbac"),
    ("take the admission controller's Lease", "POST",
     f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases",
     lambda c: {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": "topolet-controller"}, "spec": {"holderIdentity": c.a}},
     "application/json", "rbac"),
    ("grant itself a role", "POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
     lambda c: {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": {"name": "x"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io",
                                                       "kind": "ClusterRole", "name": "cluster-admin"},
                "subjects": [{"kind": "ServiceAccount", "name": AGENT_SA, "namespace": NAMESPACE}]},
     "application/json", "rbac"),
]


@pytest.mark.parametrize(("method", "path", "make_body", "content_type", "layer"),
                         [row[1:] for row in REFUSED], ids=[row[0] for row in REFUSED])
def test_node_a_agent_is_refused(cluster: Cluster, method: str, path: str, make_body: Any,
                                 content_type: str, layer: str) -> None:
    before = node_labels(cluster, cluster.b)
    status, body = as_agent(cluster, method, path.format(a=cluster.a, b=cluster.b),
                            make_body(cluster) if make_body else None, content_type)
    assert refused_by(status, body) == layer, (status, body)
    assert node_labels(cluster, cluster.b) == before


def test_refusals_leave_node_b_objects_as_node_b_wrote_them(cluster: Cluster) -> None:
    for path, expected in ((f"{NRT_PATH}/{cluster.b}", nrt(cluster.b)),
                           (f"{NF_PATH}/{nodefeature_name(cluster.b)}", nodefeature(cluster.b))):
        status, body = api_request(cluster.plane, "GET", path)
        assert status == 200, body
        for key in ("zones", "attributes", "spec"):
            assert body.get(key) == expected.get(key), key
        assert body["metadata"].get("labels", {}).get(NODE_NAME_LABEL) == expected["metadata"].get(
            "labels", {}).get(NODE_NAME_LABEL)


# ---- allowed on its own node -------------------------------------------------------------------------


def test_labels_its_own_node_and_removes_them_again(cluster: Cluster) -> None:
    a = cluster.a
    patch = labels_patch({"topolet.io/numa.nodes": "1", "feature.node.kubernetes.io/cpu-model.vendor_id":
                            "AMD"})
    patch["metadata"]["annotations"] = {"topolet.io/managed-labels": "topolet.io/numa.nodes"}
    status, body = as_agent(cluster, "PATCH", f"/api/v1/nodes/{a}", patch)
    assert status == 200, body
    labels = node_labels(cluster, a)
    assert labels["topolet.io/numa.nodes"] == "1"
    assert labels["feature.node.kubernetes.io/cpu-model.vendor_id"] == "AMD"
    assert labels["kubernetes.io/hostname"] == a
    status, body = as_agent(cluster, "PATCH", f"/api/v1/nodes/{a}",
                            labels_patch({"topolet.io/numa.nodes": None}))
    assert status == 200, body
    assert "topolet.io/numa.nodes" not in node_labels(cluster, a)
    status, body = as_agent(cluster, "GET", f"/api/v1/nodes/{a}")
    assert status == 200, body


def test_sets_what_it_publishes_and_removes_what_it_once_published(cluster: Cluster) -> None:
    """Its MIG state and GPU labels; a topolet.io/ label an earlier version published (the admin's
    here), removed; the user's MIG layout left as the user set it."""
    a = cluster.a
    status, body = api_request(cluster.plane, "PATCH", f"/api/v1/nodes/{a}", body=labels_patch(
        {"topolet.io/retired.label": "1", "topolet.io/mig.config": "all-disabled"}), content_type=MERGE)
    assert status == 200, body
    status, body = as_agent(cluster, "PATCH", f"/api/v1/nodes/{a}", labels_patch({
        "topolet.io/mig.config.state": "success", "topolet.io/gpu.count": "8",
        "feature.node.kubernetes.io/pci-0302_10de.present": "true", "topolet.io/retired.label": None}))
    assert status == 200, body
    labels = node_labels(cluster, a)
    assert labels["topolet.io/mig.config.state"] == "success" and labels["topolet.io/gpu.count"] == "8"
    assert "topolet.io/retired.label" not in labels and labels["topolet.io/mig.config"] == "all-disabled"


def test_publishes_its_own_nrt_by_server_side_apply(cluster: Cluster) -> None:
    a = cluster.a
    path = f"{NRT_PATH}/{a}?fieldManager=topolet&force=true"
    status, body = as_agent(cluster, "PATCH", path, nrt(a), APPLY)
    assert status == 201, body  # server-side apply creates it
    status, body = as_agent(cluster, "PATCH", path, nrt(a, cpus=1), APPLY)
    assert status == 200, body
    assert body["zones"][0]["resources"][0]["available"] == "1"
    status, body = as_agent(cluster, "GET", f"{NRT_PATH}/{a}")
    assert status == 200, body


def test_creates_its_own_nrt_with_post(cluster: Cluster) -> None:
    # Node A's NRT may exist already (test order), so a third node and its agent.
    c, _, token = new_agent(cluster.plane)
    status, body = as_agent(cluster, "POST", NRT_PATH, nrt(c), "application/json", token=token)
    assert status == 201, body
    status, body = as_agent(cluster, "PATCH", f"{NRT_PATH}/{c}",
                            {"attributes": [{"name": "topologyManagerPolicy", "value": "single-numa-node"}]},
                            MERGE, token=token)
    assert status == 200, body


def test_publishes_its_own_nodefeature(cluster: Cluster) -> None:
    a = cluster.a
    path = f"{NF_PATH}/{nodefeature_name(a)}?fieldManager=topolet&force=true"
    status, body = as_agent(cluster, "PATCH", path, nodefeature(a), APPLY)
    assert status == 201, body
    status, body = as_agent(cluster, "PATCH", path, nodefeature(a, {"topolet.io/numa.nodes": "2"}), APPLY)
    assert status == 200, body
    assert body["spec"]["labels"] == {"topolet.io/numa.nodes": "2"}
    # An empty raw-features block, as NFD's own clients write it, asks for nothing and passes.
    empty = nodefeature(a, {"topolet.io/numa.nodes": "2"})
    empty["spec"]["features"] = {"flags": {}, "attributes": {}, "instances": {}}
    status, body = as_agent(cluster, "PATCH", path, empty, APPLY)
    assert status == 200, body
    # ...but cannot hand its own object to node B.
    status, body = as_agent(cluster, "PATCH", f"{NF_PATH}/{nodefeature_name(a)}",
                            {"metadata": {"labels": {NODE_NAME_LABEL: cluster.b}}})
    assert refused_by(status, body) == "policy", body


def test_reports_events_about_its_node_and_pods(cluster: Cluster) -> None:
    a = cluster.a
    for path, obj in ((NODE_EVENTS_PATH, event(a, node_ref(a), namespace="default")),
                      (EVENTS_PATH, event(a))):
        status, body = as_agent(cluster, "POST", path, obj, "application/json")
        assert status == 201, body
        series = {"series": {"count": 2, "lastObservedTime": "2026-01-01T00:05:00.000000Z"}}
        status, body = as_agent(cluster, "PATCH", f"{path}/{obj['metadata']['name']}", series)
        assert status == 200, body
        assert body["series"]["count"] == 2
    # The core/v1 view of the same object names its reporter; any reader can tell which node wrote it.
    status, body = api_request(cluster.plane, "GET", f"/api/v1/namespaces/{NAMESPACE}/events/"
                               + obj["metadata"]["name"])
    assert status == 200, body
    assert (body["reportingComponent"], body["reportingInstance"]) == (REPORTING_CONTROLLER, a)


def test_an_agent_cannot_squat_another_nodes_nodefeature(cluster: Cluster) -> None:
    """Node C has not published yet; A takes its object name, labelled A or C, and is refused either
    way, so C's own apply later creates its NodeFeature as it should."""
    from agent.kube.publish.labels_sink import LabelPublisher

    c, _, token_c = new_agent(cluster.plane)
    for labelled in (cluster.a, c):
        squat = nodefeature(labelled, name=nodefeature_name(c))
        status, body = as_agent(cluster, "POST", NF_PATH, squat, "application/json")
        assert refused_by(status, body) == "policy", (labelled, status, body)
        status, body = as_agent(cluster, "PATCH", f"{NF_PATH}/{nodefeature_name(c)}?fieldManager=topolet",
                                squat, APPLY)
        assert refused_by(status, body) == "policy", (labelled, status, body)
    status, body = api_request(cluster.plane, "GET", f"{NF_PATH}/{nodefeature_name(c)}")
    assert status == 404, body
    with cluster.plane.client(token_c) as api:
        assert LabelPublisher(api, c, NAMESPACE, sink="nodefeature").publish({"topolet.io/numa.nodes": "2"})
    status, body = api_request(cluster.plane, "GET", f"{NF_PATH}/{nodefeature_name(c)}")
    assert status == 200, body
    assert body["metadata"]["labels"][NODE_NAME_LABEL] == c
    assert body["spec"]["labels"] == {"topolet.io/numa.nodes": "2"}


def test_lists_the_pods_on_its_node(cluster: Cluster) -> None:
    status, body = as_agent(cluster, "GET", f"/api/v1/pods?fieldSelector=spec.nodeName={cluster.a}")
    assert status == 200, body
    assert [p["spec"]["nodeName"] for p in body["items"]] == [cluster.a]


def test_sees_whether_nfd_is_installed_through_discovery(cluster: Cluster) -> None:
    status, body = as_agent(cluster, "GET", "/apis/nfd.k8s-sigs.io/v1alpha1")
    assert status == 200, body
    assert "nodefeatures" in {r["name"] for r in body["resources"]}


# ---- the agent's own publishers, with its own credentials -----------------------------------------


def test_agent_publishers_work_with_the_agents_credentials(cluster: Cluster) -> None:
    """What agent/kube sends (label sinks and auto's moves between them, NRT apply, Events) passes RBAC
    and the policy on its node."""
    from agent.kube.publish.events import EventRecorder
    from agent.kube.publish.labels_sink import LabelPublisher
    from agent.kube.publish.nrt_publisher import NRTPublisher

    node, uid, token = new_agent(cluster.plane)
    with cluster.plane.client(token) as api:
        on_node = LabelPublisher(api, node, NAMESPACE, sink="node")
        assert on_node.publish({"topolet.io/numa.nodes": "1", "topolet.io/cpu.threads-per-core": "2"})
        assert on_node.publish({"topolet.io/numa.nodes": "1"})  # drops the key it no longer sets
        labels = node_labels(cluster, node)
        assert labels["topolet.io/numa.nodes"] == "1"
        assert "topolet.io/cpu.threads-per-core" not in labels
        # auto: on the Node until nfd-master labels it (its annotation, written here as nfd-master
        # writes it), then a NodeFeature and the Node labels removed, and back: the NodeFeature deleted.
        auto = LabelPublisher(api, node, NAMESPACE, sink="auto", check_seconds=0.0)
        assert auto.publish({"feature.node.kubernetes.io/memory-numa": "false"})
        assert auto.resolved_sink == "node"
        assert node_labels(cluster, node)["feature.node.kubernetes.io/memory-numa"] == "false"
        status, body = api_request(cluster.plane, "PATCH", f"/api/v1/nodes/{node}", body={"metadata": {
            "annotations": {"nfd.node.kubernetes.io/feature-labels": "cpu-cpuid.AVX2"}}}, content_type=MERGE)
        assert status == 200, body
        assert auto.publish({"feature.node.kubernetes.io/memory-numa": "false"})
        assert auto.resolved_sink == "nodefeature"
        status, body = api_request(cluster.plane, "GET", f"{NF_PATH}/{nodefeature_name(node)}")
        assert status == 200, body
        assert body["spec"]["labels"] == {"feature.node.kubernetes.io/memory-numa": "false"}
        assert "feature.node.kubernetes.io/memory-numa" not in node_labels(cluster, node)
        status, body = api_request(cluster.plane, "PATCH", f"/api/v1/nodes/{node}", body={"metadata": {
            "annotations": {"nfd.node.kubernetes.io/feature-labels": None}}}, content_type=MERGE)
        assert status == 200, body
        assert auto.publish({"feature.node.kubernetes.io/memory-numa": "false"})
        assert auto.resolved_sink == "node"
        assert node_labels(cluster, node)["feature.node.kubernetes.io/memory-numa"] == "false"
        status, body = api_request(cluster.plane, "GET", f"{NF_PATH}/{nodefeature_name(node)}")
        assert status == 404, body
        assert auto.failures == 0
        obj = nrt(node)
        obj["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid}]
        assert NRTPublisher(api, node).publish(obj)
        recorder = EventRecorder(api, node)
        pod = {"metadata": {"namespace": NAMESPACE, "name": "some-pod", "uid": str(uuid.uuid4())}}
        assert recorder.warn(pod, "InvalidAnnotation", "topolet.io/smt: not one of full-cores, any")
        # About its own Node (standing down beside the kubelet's static CPU manager, an NRT left to NFD).
        assert recorder.on_node("Normal", "KubeletCPUManagerStatic", "topolet stands down", uid)
        assert recorder.failures == 0


def test_agent_publishers_for_another_node_are_refused(cluster: Cluster) -> None:
    """A misconfigured --node-name cannot make an agent write another node's objects."""
    from agent.errors import KubeAPIError
    from agent.kube.publish.labels_sink import LabelPublisher
    from agent.kube.publish.nrt_publisher import NRTPublisher

    with cluster.plane.client(cluster.token_a) as api:
        for sink in ("node", "nodefeature"):
            with pytest.raises(KubeAPIError) as refused:
                LabelPublisher(api, cluster.b, NAMESPACE, sink=sink).publish({"topolet.io/numa.nodes": "7"})
            assert refused.value.status == 403
        # B's NRT gone (an earlier test made one without topolet's label, which the publisher would
        # leave alone as another publisher's): the publisher then tries its write, and is refused.
        api_request(cluster.plane, "DELETE", f"{NRT_PATH}/{cluster.b}")
        with pytest.raises(KubeAPIError) as refused:
            NRTPublisher(api, cluster.b).publish(nrt(cluster.b, cpus=7))
        assert refused.value.status == 403
    assert node_labels(cluster, cluster.b).get("topolet.io/numa.nodes") != "7"


# ---- tokens that name no node ------------------------------------------------------------------------

UNBOUND: list[tuple[str, str, str, Any, str]] = [
    ("label node A", "PATCH", "/api/v1/nodes/{a}", lambda c: labels_patch({"topolet.io/numa.nodes": "3"}),
     MERGE),
    ("create node A's NRT", "POST", NRT_PATH, lambda c: nrt(c.a + "-u"), "application/json"),
    ("apply node A's NodeFeature", "PATCH", NF_PATH + "/" + nodefeature_name("{a}") + "?fieldManager=topolet",
     lambda c: nodefeature(c.a), APPLY),
]


@pytest.mark.parametrize(("method", "path", "make_body", "content_type"),
                         [row[1:] for row in UNBOUND], ids=[row[0] for row in UNBOUND])
def test_a_token_not_bound_to_a_pod_on_a_node_cannot_write(
    cluster: Cluster, method: str, path: str, make_body: Any, content_type: str
) -> None:
    status, body = as_agent(cluster, method, path.format(a=cluster.a, b=cluster.b), make_body(cluster),
                            content_type, token=cluster.unbound)
    assert refused_by(status, body) == "policy", (status, body)
    assert "token bound to a pod on a node" in body["message"]


def test_a_token_not_bound_to_a_pod_on_a_node_still_reads(cluster: Cluster) -> None:
    """The refusals above are the policy's, not a broken token: the same token reads what RBAC grants."""
    status, body = as_agent(cluster, "GET", f"/api/v1/nodes/{cluster.a}", token=cluster.unbound)
    assert status == 200, body


def test_token_of_a_pod_not_yet_scheduled_cannot_write(cluster: Cluster) -> None:
    pod, uid = make_agent_pod_unscheduled(cluster.plane)
    token = cluster.plane.mint_token(NAMESPACE, AGENT_SA, bound_pod=(pod, uid))
    status, body = as_agent(cluster, "PATCH", f"/api/v1/nodes/{cluster.a}",
                            labels_patch({"topolet.io/numa.nodes": "4"}), token=token)
    assert refused_by(status, body) == "policy", body


def make_agent_pod_unscheduled(plane: ControlPlane) -> tuple[str, str]:
    name = f"topolet-agent-{uuid.uuid4().hex[:6]}"
    status, body = api_request(plane, "POST", f"/api/v1/namespaces/{NAMESPACE}/pods", body={
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"serviceAccountName": AGENT_SA, "containers": [{"name": "agent", "image": "topolet:0.1.0"}]},
    })
    assert status == 201, body
    return name, str(body["metadata"]["uid"])


# ---- everyone else -----------------------------------------------------------------------------------


def test_the_policy_leaves_other_users_alone(cluster: Cluster) -> None:
    """An administrator still labels node B however it likes: the policy matches only the agent."""
    status, body = api_request(cluster.plane, "PATCH", f"/api/v1/nodes/{cluster.b}",
                               body=labels_patch({"example.com/owner": "admin"}), content_type=MERGE)
    assert status == 200, body
    assert node_labels(cluster, cluster.b)["example.com/owner"] == "admin"
