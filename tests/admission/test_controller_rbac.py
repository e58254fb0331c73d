"""The admission controller's credentials on a real API server: what issue 8 grants works, nothing else does.

Setup, all through the daemonset/ base as `kubectl apply -k` installs it: a controller Pod (service
account topolet-controller) on a Node, and a token bound to that pod as the kubelet would project it.
A user namespace holds a suspended Job labelled topolet.io/queue and a pod held by the scheduling gate
topolet.io/placement, the objects the controller works on. Three views of one question, each with the
controller's own token:

- the API server's own listing of the token's rules (SelfSubjectRulesReview), less what any service
  account gets, is exactly CONTROLLER_GRANTS;
- SelfSubjectAccessReview over a grid of resources, verbs and namespaces says yes exactly where
  CONTROLLER_GRANTS does;
- real requests: each thing the controller does succeeds, and each refused row is refused by RBAC.
"""

from __future__ import annotations

import ssl
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from agent.admission.gangs.record import AdmissionRecord, SlotPlacement
from agent.admission.gangs.shape import job_shape
from agent.admission.jobs.patches import (
    BY_INDEX_LABEL,
    decision_patch,
    job_started,
    lost_patch,
    node_affinity,
    pod_patch,
    restart_patch,
    unpin_patch,
)
from tests.admission.test_controller import (
    DUMP,
    all_bound_as_recorded,
    events,
    gang_job,
    get_job,
    record,
    wait_for,
)
from tests.conftest import REPO, topolet_bin
from tests.controlplane.cluster import Cluster
from tests.controlplane.fixtures import IN_CI, _apiserver_up_between_tests, control_plane
from tests.controlplane.fixtures import cluster as cluster  # noqa: F401 - fixture
from tests.controlplane.fixtures import cluster_session as cluster_session  # noqa: F401 - fixture
from tests.controlplane.harness import ControlPlane, _Process
from tests.controlplane.kubectl import BASE, Kubectl, api_request, build_kubectl
from tests.controlplane.kubectl import applied_base as applied_base  # noqa: F401 - fixture
from tests.controlplane.kubectl import kubectl as kubectl  # noqa: F401 - fixture
from tests.kube.test_manifests import CONTROLLER, CONTROLLER_GRANTS, NAMESPACE

try:
    from agent.kubeapi.client import KubeClient
except ImportError:
    if IN_CI:
        raise
    pytest.skip("the `kubernetes` Python client is not installed", allow_module_level=True)

__all__ = ["_apiserver_up_between_tests", "control_plane"]

MERGE = "application/merge-patch+json"
GATE = "topolet.io/placement"
OTHER_GATE = "example.com/quota"
POLICY = "topolet-controller-writes"
POLICY_TIMEOUT_S = 60.0
APPLY = "application/apply-patch+yaml"
STRATEGIC = "application/strategic-merge-patch+json"
LEASES = f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases"
NRT_PATH = "/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies"
RETRY_429_S = 30.0

Grant = tuple[str, str, str, str, str]


@dataclass(frozen=True)
class Setup:
    """The controller's pod-bound token, a token of a service account with no roles, and the objects."""

    plane: ControlPlane
    token: str
    baseline: str
    node: str
    team: str  # a user namespace
    job: str  # a suspended Job in it, labelled topolet.io/queue: the tests admit it
    pod: str  # a pod in it, held by the scheduling gate: the tests place it
    # Objects the refused rows aim at, which nothing changes:
    waiting: str  # a queued, suspended Job
    running: str  # a queued Job already unsuspended
    plain: str  # a suspended Job in no queue
    held: str  # a pod held by our gate and another one
    free: str  # a pod with no gate


def created(plane: ControlPlane, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """POST `body` as the admin; the stored object."""
    status, stored = api_request(plane, "POST", path, body=body)
    assert status == 201, stored
    return stored


def suspended_job(name: str) -> dict[str, Any]:
    """A Job as a user queues it for topolet: suspended, labelled with its queue."""
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "labels": {"topolet.io/queue": "research"}},
        "spec": {"suspend": True, "parallelism": 2, "completions": 2, "completionMode": "Indexed",
                 "template": {"spec": {"restartPolicy": "Never", "containers": [
                     {"name": "main", "image": "busybox",
                      "resources": {"requests": {"cpu": "2", "memory": "1Gi"},
                                    "limits": {"cpu": "2", "memory": "1Gi"}}}]}}},
    }


def gated_pod(name: str, gates: tuple[str, ...] = (GATE,)) -> dict[str, Any]:
    """A pod as the Job controller creates it from an admitted Job's template: held by our gate."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"schedulingGates": [{"name": g} for g in gates],
                     "containers": [{"name": "main", "image": "busybox"}]}}


@pytest.fixture(scope="module")
def setup(control_plane: ControlPlane, applied_base: Any) -> Iterator[Setup]:  # noqa: F811 - fixture
    suffix = uuid.uuid4().hex[:6]
    node = f"node-c-{suffix}"
    created(control_plane, "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": node, "labels": {"kubernetes.io/hostname": node}}})
    pod = created(control_plane, f"/api/v1/namespaces/{NAMESPACE}/pods", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"{CONTROLLER}-{suffix}"},
        "spec": {"serviceAccountName": CONTROLLER, "nodeName": node,
                 "containers": [{"name": "controller", "image": "topolet:0.1.0"}]}})
    token = control_plane.mint_token(NAMESPACE, CONTROLLER,
                                     bound_pod=(pod["metadata"]["name"], pod["metadata"]["uid"]))
    team = f"team-{suffix}"
    created(control_plane, "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                  "metadata": {"name": team}})
    # Pods need their service account to exist; without a controller-manager nobody makes "default".
    for account in ("default", "baseline"):
        status, body = api_request(control_plane, "POST", f"/api/v1/namespaces/{team}/serviceaccounts",
                                   body={"apiVersion": "v1", "kind": "ServiceAccount",
                                         "metadata": {"name": account}})
        assert status in (201, 409), body
    baseline = control_plane.mint_token(team, "baseline")
    jobs, pods = f"/apis/batch/v1/namespaces/{team}/jobs", f"/api/v1/namespaces/{team}/pods"
    for job in (suspended_job("gang"), suspended_job("waiting"),
                {**suspended_job("running"), "spec": {**suspended_job("running")["spec"], "suspend": False}},
                {**suspended_job("plain"), "metadata": {"name": "plain"}}):
        created(control_plane, jobs, job)
    for pod in (gated_pod("gang-0"), gated_pod("held", (GATE, OTHER_GATE)), gated_pod("free", ())):
        created(control_plane, pods, pod)
    wait_for_policy(control_plane, token)
    yield Setup(control_plane, token, baseline, node, team, job="gang", pod="gang-0", waiting="waiting",
                running="running", plain="plain", held="held", free="free")


def wait_for_policy(plane: ControlPlane, token: str) -> None:
    """Until the API server enforces the controller's policy: a dry-run create of a Lease of another
    name (RBAC allows it) is refused by the policy."""
    deadline = time.monotonic() + POLICY_TIMEOUT_S
    while True:
        status, body = api_request(plane, "POST", f"{LEASES}?dryRun=All", token, {
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": f"canary-{uuid.uuid4().hex[:6]}"}})
        if refused_by(status, body) == "policy":
            return
        assert status in (201, 429), body
        if time.monotonic() > deadline:
            pytest.fail(f"admission policy {POLICY} not enforced after {POLICY_TIMEOUT_S:.0f} s: {body}")
        time.sleep(0.5)


def as_controller(setup: Setup, method: str, path: str, body: Any = None,
                  content_type: str = MERGE) -> tuple[int, dict[str, Any]]:
    """One request with the controller's token. A 429 is retried: the API server answers it while
    the watch cache of a resource is still initialising (a CRD just established, a restart)."""
    deadline = time.monotonic() + RETRY_429_S
    while True:
        status, answer = api_request(setup.plane, method, path, setup.token, body, content_type)
        if status != 429 or time.monotonic() > deadline:
            return status, answer
        time.sleep(0.5)


def refused_by(status: int, body: dict[str, Any]) -> str:
    """Which layer refused a request: "policy" (the controller's admission policy), "rbac", or "" when
    it was not refused."""
    if status != 403:
        return ""
    message = str(body.get("message", ""))
    if f"ValidatingAdmissionPolicy '{POLICY}'" in message:
        # A validation that fails to evaluate also denies (failurePolicy: Fail): not a refusal by rule.
        _, _, reason = message.partition("denied request: ")
        return "policy" if reason.startswith("topolet-controller ") else f"policy error: {message}"
    if "cannot" in message and "forbidden" in message:
        return "rbac"
    return f"other: {message}"


def refused_by_rbac(status: int, body: dict[str, Any]) -> bool:
    """Whether RBAC (not admission, not validation) refused the request."""
    return refused_by(status, body) == "rbac"


def now_micro() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# ---- the API server's own listing of the token's rules --------------------------------------------


def rules_in(setup: Setup, token: str, namespace: str) -> set[tuple[str, str, str, str]]:
    """SelfSubjectRulesReview in `namespace`, flattened to (group, resource, verb, resource name)."""
    status, review = api_request(setup.plane, "POST",
                                 "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews", token,
                                 {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectRulesReview",
                                  "spec": {"namespace": namespace}})
    assert status == 201, review
    assert review["status"].get("incomplete") is not True, review["status"]
    return {(group, resource, verb, name)
            for rule in review["status"]["resourceRules"]
            for group in rule.get("apiGroups", [])
            for resource in rule.get("resources", [])
            for verb in rule["verbs"]
            for name in rule.get("resourceNames") or [""]}


@pytest.mark.parametrize("where", ["own", "team"])
def test_the_api_server_lists_exactly_the_issues_grants(setup: Setup, where: str) -> None:
    namespace = NAMESPACE if where == "own" else setup.team
    # What every authenticated service account has (self-reviews, discovery) is not the controller's.
    extra = rules_in(setup, setup.token, namespace) - rules_in(setup, setup.baseline, namespace)
    expected = {(g, r, v, n) for scope, g, r, v, n in CONTROLLER_GRANTS if scope in ("*", namespace)}
    assert extra == expected, {"extra": extra - expected, "missing": expected - extra}


# ---- SelfSubjectAccessReview over a grid ----------------------------------------------------------

# (API group, resource[/subresource], namespaced). What the controller touches, what lies next to it,
# and what an attacker holding its token would want.
GRID_RESOURCES: list[tuple[str, str, bool]] = [
    ("batch", "jobs", True), ("batch", "jobs/status", True), ("batch", "cronjobs", True),
    ("jobset.x-k8s.io", "jobsets", True), ("jobset.x-k8s.io", "jobsets/status", True),
    ("trainer.kubeflow.org", "trainjobs", True), ("trainer.kubeflow.org", "trainjobs/status", True),
    ("", "pods", True), ("", "pods/status", True), ("", "pods/binding", True), ("", "pods/eviction", True),
    ("", "pods/exec", True), ("", "pods/log", True), ("", "pods/ephemeralcontainers", True),
    ("", "nodes", False), ("", "nodes/status", False), ("", "nodes/proxy", False),
    ("topology.node.k8s.io", "noderesourcetopologies", False),
    ("scheduling.k8s.io", "priorityclasses", False), ("", "limitranges", True), ("", "resourcequotas", True),
    ("", "events", True), ("events.k8s.io", "events", True),
    ("coordination.k8s.io", "leases", True),
    ("", "secrets", True), ("", "configmaps", True), ("", "serviceaccounts", True),
    ("", "serviceaccounts/token", True), ("", "namespaces", False), ("", "persistentvolumeclaims", True),
    ("apps", "deployments", True), ("apps", "deployments/scale", True), ("apps", "daemonsets", True),
    ("apps", "replicasets", True), ("policy", "poddisruptionbudgets", True),
    ("rbac.authorization.k8s.io", "roles", True), ("rbac.authorization.k8s.io", "rolebindings", True),
    ("rbac.authorization.k8s.io", "clusterroles", False),
    ("rbac.authorization.k8s.io", "clusterrolebindings", False),
    ("nfd.k8s-sigs.io", "nodefeatures", True),
    ("apiextensions.k8s.io", "customresourcedefinitions", False),
    ("admissionregistration.k8s.io", "validatingadmissionpolicies", False),
    ("admissionregistration.k8s.io", "mutatingwebhookconfigurations", False),
    ("certificates.k8s.io", "certificatesigningrequests", False),
    ("kueue.x-k8s.io", "workloads", True),
]
GRID_VERBS = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")
# Verbs that reach past RBAC's own checks: granting roles one does not hold, acting as someone else.
POWER = [("rbac.authorization.k8s.io", "clusterroles", "escalate"),
         ("rbac.authorization.k8s.io", "clusterroles", "bind"),
         ("rbac.authorization.k8s.io", "roles", "escalate"),
         ("rbac.authorization.k8s.io", "roles", "bind"),
         ("", "serviceaccounts", "impersonate"), ("", "users", "impersonate"), ("", "groups", "impersonate"),
         ("authentication.k8s.io", "userextras/scopes", "impersonate"),
         ("certificates.k8s.io", "signers", "sign"), ("certificates.k8s.io", "signers", "approve")]


def granted(namespace: str, group: str, resource: str, verb: str, name: str) -> bool:
    """Whether CONTROLLER_GRANTS allows the request (namespace "" = cluster scope or all namespaces)."""
    return any(scope in ("*", namespace) and (g, r, v) == (group, resource, verb) and n in ("", name)
               for scope, g, r, v, n in CONTROLLER_GRANTS)


def access_allowed(setup: Setup, namespace: str, group: str, resource: str, verb: str, name: str) -> bool:
    plural, _, subresource = resource.partition("/")
    attributes = {"namespace": namespace, "group": group, "resource": plural, "subresource": subresource,
                  "verb": verb, "name": name}
    status, review = api_request(setup.plane, "POST",
                                 "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", setup.token,
                                 {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                                  "spec": {"resourceAttributes": attributes}})
    assert status == 201, review
    return bool(review["status"]["allowed"])


def test_access_reviews_allow_exactly_the_issues_grants(setup: Setup) -> None:
    wrong = []
    checked = 0
    for group, resource, namespaced in GRID_RESOURCES:
        for namespace in ((NAMESPACE, setup.team, "") if namespaced else ("",)):
            names = ("", CONTROLLER, "other") if resource == "leases" else ("",)
            for name in names:
                for verb in GRID_VERBS:
                    expected = granted(namespace, group, resource, verb, name)
                    checked += 1
                    if access_allowed(setup, namespace, group, resource, verb, name) != expected:
                        wrong.append((namespace, group, resource, verb, name, expected))
    assert checked > 500
    assert not wrong, wrong


@pytest.mark.parametrize(("group", "resource", "verb"), POWER)
def test_no_power_verbs(setup: Setup, group: str, resource: str, verb: str) -> None:
    for namespace in ("", NAMESPACE):
        assert not access_allowed(setup, namespace, group, resource, verb, "")


# ---- real requests: what the controller does ------------------------------------------------------


def test_lists_and_watches_what_it_decides_on(setup: Setup) -> None:
    status, jobs = as_controller(setup, "GET", "/apis/batch/v1/jobs?labelSelector=topolet.io%2Fqueue")
    assert status == 200, jobs
    assert (setup.team, setup.job) in {(j["metadata"]["namespace"], j["metadata"]["name"])
                                       for j in jobs["items"]}
    for path in ("/api/v1/pods", "/api/v1/nodes", NRT_PATH, "/apis/scheduling.k8s.io/v1/priorityclasses",
                 "/api/v1/limitranges"):
        status, body = as_controller(setup, "GET", path)
        assert status == 200, (path, body)
        # A watch that ends after one second: the answer is the stream's status, 200.
        status, body = as_controller(setup, "GET", f"{path}?watch=1&timeoutSeconds=1")
        assert status == 200, (path, body)
    status, node = as_controller(setup, "GET", f"/api/v1/nodes/{setup.node}")
    assert status == 200, node
    status, classes = as_controller(setup, "GET", "/apis/scheduling.k8s.io/v1/priorityclasses")
    assert "system-cluster-critical" in {c["metadata"]["name"] for c in classes["items"]}


# Every route an admission takes, each with the very patch the controller sends (`patches.decision_patch`
# over the record `JobWrites.admit` writes): (id, indexed, slots as (node, zone); None: the setup's node).
ROUTES: list[tuple[str, bool, list[tuple[str | None, int | None]]]] = [
    ("indexed, one node, two zones: the template pinned, the placements", True, [(None, 0), (None, 1)]),
    ("non-indexed, one node, one zone: the template pinned, the zone", False, [(None, 2), (None, 2)]),
    ("non-indexed, one node, two zones: gated", False, [(None, 0), (None, 1)]),
    ("indexed, two nodes: gated, the placements and the policy's label", True, [(None, 0), ("elsewhere", 1)]),
    ("non-indexed, two nodes: gated", False, [(None, 0), ("elsewhere", 1)]),
]


@pytest.mark.parametrize(("indexed", "slots"), [r[1:] for r in ROUTES], ids=[r[0] for r in ROUTES])
def test_admits_a_job_with_the_patch_the_controller_sends(
        setup: Setup, indexed: bool, slots: list[tuple[str | None, int | None]]) -> None:
    jobs = f"/apis/batch/v1/namespaces/{setup.team}/jobs"
    body = suspended_job(f"route-{uuid.uuid4().hex[:6]}")
    if not indexed:
        del body["spec"]["completionMode"]
    job = created(setup.plane, jobs, body)
    places = {i: SlotPlacement(node or setup.node, zone) for i, (node, zone) in enumerate(slots)}
    record = AdmissionRecord("admitted", uuid.uuid4().hex, "2026-12-02T00:00:00Z", places,
                             shape=job_shape(job))
    patch = decision_patch(job, record)
    status, out = as_controller(setup, "PATCH", f"{jobs}/{job['metadata']['name']}", patch)
    assert status == 200, out
    assert out["spec"]["suspend"] is False
    assert out["metadata"]["annotations"]["topolet.io/admission"] == record.encode()
    template = out["spec"]["template"]
    if "schedulingGates" in patch["spec"]["template"]["spec"]:  # gated: the pods are placed one by one
        assert template["spec"]["schedulingGates"] == [{"name": GATE}]
        assert "kubernetes.io/hostname" not in template["spec"].get("nodeSelector", {})
    else:  # one node: the pods are created pinned
        assert template["spec"]["nodeSelector"] == {"kubernetes.io/hostname": setup.node}
        assert template["spec"]["affinity"] == {"nodeAffinity": node_affinity(setup.node)}
        assert not template["spec"].get("schedulingGates")
    notes = template.get("metadata", {}).get("annotations", {})
    sent = patch["spec"]["template"]["metadata"]["annotations"]
    expected = {k: v for k, v in sent.items() if v is not None}
    assert {k: v for k, v in notes.items() if k.startswith("topolet.io/")} == expected
    by_index = patch["spec"]["template"]["metadata"].get("labels", {})
    assert (template["metadata"]["labels"].get(BY_INDEX_LABEL[0]) == BY_INDEX_LABEL[1]) is bool(by_index)


def test_queues_again_a_job_whose_node_is_gone_with_the_patches_the_controller_sends(setup: Setup) -> None:
    """Finding 9c: an admitted Job whose node is gone before its pods bind is suspended as its record
    is removed (`lost_patch`), its start time cleared (`restart_patch`, on the status) and its
    template given back (`unpin_patch`), then admitted afresh; the same writes with anything more are
    refused by the policy."""
    jobs = f"/apis/batch/v1/namespaces/{setup.team}/jobs"
    name = f"lost-{uuid.uuid4().hex[:6]}"
    path = f"{jobs}/{name}"
    job = created(setup.plane, jobs, suspended_job(name))
    places = {0: SlotPlacement(setup.node, 0), 1: SlotPlacement(setup.node, 1)}
    record = AdmissionRecord("admitted", uuid.uuid4().hex, "2026-12-02T00:00:00Z", places,
                             shape=job_shape(job))
    status, job = as_controller(setup, "PATCH", path, decision_patch(job, record))
    assert status == 200, job.get("message")
    # What the Job controller writes once the Job runs (no controller-manager on this plane).
    status, job = api_request(setup.plane, "PATCH", f"{path}/status", body={"status": {
        "startTime": now_micro()[:19] + "Z"}}, content_type=MERGE)
    assert status == 200 and job["status"].get("startTime"), job

    keep_record = {"metadata": {"resourceVersion": job["metadata"]["resourceVersion"]},
                   "spec": {"suspend": True}}
    assert refused_by(*as_controller(setup, "PATCH", path, keep_record)) == "policy"
    status, job = as_controller(setup, "PATCH", path, lost_patch(job))
    assert status == 200, job.get("message")
    assert job["spec"]["suspend"] is True
    assert "topolet.io/admission" not in job["metadata"].get("annotations", {})

    more = {"metadata": {"resourceVersion": job["metadata"]["resourceVersion"]},
            "status": {"startTime": None, "failed": 1}}
    assert refused_by(*as_controller(setup, "PATCH", f"{path}/status", more)) == "policy"
    status, job = as_controller(setup, "PATCH", f"{path}/status", restart_patch(job))
    assert status == 200, job.get("message")
    assert not job_started(job)

    body = unpin_patch(job, set())  # the setup's node counts as gone
    assert body is not None
    status, job = as_controller(setup, "PATCH", path, body)
    assert status == 200, job.get("message")
    spec = job["spec"]["template"]["spec"]
    assert "affinity" not in spec and "kubernetes.io/hostname" not in spec.get("nodeSelector", {})
    notes = job["spec"]["template"].get("metadata", {}).get("annotations", {})
    assert not {k for k in notes if k.startswith("topolet.io/")}
    assert unpin_patch(job, set()) is None

    # Decided afresh (the gated route this time): the controller's decision patch goes through.
    places = {0: SlotPlacement(setup.node, 0), 1: SlotPlacement("elsewhere", 1)}
    record = AdmissionRecord("admitted", uuid.uuid4().hex, "2026-12-02T00:00:00Z", places,
                             shape=job_shape(job))
    status, job = as_controller(setup, "PATCH", path, decision_patch(job, record))
    assert status == 200, job.get("message")
    assert job["spec"]["suspend"] is False
    assert job["spec"]["template"]["spec"]["schedulingGates"] == [{"name": GATE}]


PREFERRED = {"preferredDuringSchedulingIgnoredDuringExecution": [
    {"weight": 1, "preference": {"matchExpressions": [{"key": "pool", "operator": "Exists"}]}}]}
ANTI = {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
    {"weight": 1, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                                      "labelSelector": {"matchLabels": {"app": "x"}}}}]}}
OWN_REQUIRED = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
    {"matchExpressions": [{"key": "pool", "operator": "Exists"}]}]}}
# Gated pods as the Job controller creates them, each placed with the very patch the controller sends
# (`patches.pod_patch`): (id, the pod's affinity, its annotations, its gates, the zone).
PODS: list[tuple[str, dict[str, Any] | None, dict[str, str], tuple[str, ...], int | str | None]] = [
    ("no affinity: the node's name added, a zone", None, {}, (GATE,), 1),
    ("no affinity, no zone", None, {}, (GATE,), None),
    ("a preferred node affinity and pod anti-affinity of its own: kept, the node's name added",
     {"nodeAffinity": PREFERRED, **ANTI}, {}, (GATE,), 0),
    ("a required node affinity of its own: kept as it is", {"nodeAffinity": OWN_REQUIRED}, {}, (GATE,), 3),
    ("the template's placements removed, another gate kept", None,
     {"topolet.io/placements": "x:0", "batch.kubernetes.io/job-completion-index": "0"},
     (GATE, OTHER_GATE), 0),
    ("a pod the container scope split: a zone per container", None, {}, (GATE,), "0,1"),
]


@pytest.mark.parametrize(("affinity", "notes", "gates", "zone"), [p[1:] for p in PODS],
                         ids=[p[0] for p in PODS])
def test_places_a_gated_pod_with_the_patch_the_controller_sends(
        setup: Setup, affinity: dict[str, Any] | None, notes: dict[str, str], gates: tuple[str, ...],
        zone: int | str | None) -> None:
    body = gated_pod(f"placed-{uuid.uuid4().hex[:6]}", gates)
    body["metadata"]["annotations"] = notes
    if affinity is not None:
        body["spec"]["affinity"] = affinity
    pod = created(setup.plane, f"/api/v1/namespaces/{setup.team}/pods", body)
    path = f"/api/v1/namespaces/{setup.team}/pods/{pod['metadata']['name']}"
    status, out = as_controller(setup, "PATCH", path, pod_patch(pod, setup.node, zone))
    assert status == 200, out
    assert out["spec"]["nodeSelector"] == {"kubernetes.io/hostname": setup.node}
    assert [g["name"] for g in out["spec"].get("schedulingGates") or []] == [g for g in gates if g != GATE]
    got_notes = out["metadata"].get("annotations") or {}
    assert "topolet.io/placements" not in got_notes
    assert got_notes.get("topolet.io/numa-zone") == (None if zone is None else str(zone))
    node_affinity_now = out["spec"]["affinity"]["nodeAffinity"]
    if affinity is not None and "requiredDuringSchedulingIgnoredDuringExecution" in affinity.get(
            "nodeAffinity", {}):
        assert out["spec"]["affinity"] == affinity
    else:
        assert node_affinity_now["requiredDuringSchedulingIgnoredDuringExecution"] == \
            node_affinity(setup.node)["requiredDuringSchedulingIgnoredDuringExecution"]
        assert {k: v for k, v in out["spec"]["affinity"].items() if k != "nodeAffinity"} == \
            {k: v for k, v in (affinity or {}).items() if k != "nodeAffinity"}
        assert node_affinity_now.get("preferredDuringSchedulingIgnoredDuringExecution") == \
            (affinity or {}).get("nodeAffinity", {}).get("preferredDuringSchedulingIgnoredDuringExecution")
    # Binding is the kube-scheduler's (the "bind a pod" row below: the controller cannot).
    assert not out["spec"].get("nodeName")


def test_holds_its_lease_in_its_own_namespace(setup: Setup) -> None:
    # A controller elsewhere in the session may have left the Lease behind; the test starts without it.
    status, body = api_request(setup.plane, "DELETE", f"{LEASES}/{CONTROLLER}")
    assert status in (200, 404), body
    lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": CONTROLLER},
             "spec": {"holderIdentity": "replica-a", "leaseDurationSeconds": 15,
                      "acquireTime": now_micro(), "renewTime": now_micro()}}
    status, stored = as_controller(setup, "POST", LEASES, lease, "application/json")
    assert status == 201, stored
    status, stored = as_controller(setup, "GET", f"{LEASES}/{CONTROLLER}")
    assert status == 200, stored
    stored["spec"]["holderIdentity"] = "replica-b"
    stored["spec"]["renewTime"] = now_micro()
    status, stored = as_controller(setup, "PUT", f"{LEASES}/{CONTROLLER}", stored, "application/json")
    assert status == 200, stored
    assert stored["spec"]["holderIdentity"] == "replica-b"
    # Update, not patch or delete: the election needs the resourceVersion check of a PUT.
    attempts: list[tuple[str, dict[str, Any] | None]] = [("PATCH", {"spec": {"holderIdentity": "x"}}),
                                                          ("DELETE", None)]
    for method, patch in attempts:
        status, refused = as_controller(setup, method, f"{LEASES}/{CONTROLLER}", patch)
        assert refused_by_rbac(status, refused), (method, status, refused)


def test_posts_events_on_jobs(setup: Setup) -> None:
    core = f"/api/v1/namespaces/{setup.team}/events"
    name = f"{setup.job}.{uuid.uuid4().hex[:8]}"
    status, body = as_controller(setup, "POST", core, event(setup, name), "application/json")
    assert status == 201, body
    assert body["involvedObject"]["name"] == setup.job
    # A bound pod whose requests it cannot read is told so (agent/admission/controller/intake.py).
    about_pod = {**event(setup, f"{setup.held}.{uuid.uuid4().hex[:8]}"), "reason": "InvalidRequests",
                 "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": setup.team,
                                    "name": setup.held}}
    status, body = as_controller(setup, "POST", core, about_pod, "application/json")
    assert status == 201, body
    # The Kueue check tells a Workload why it waits or is rejected (agent/admission/kueue/writes.py).
    about_workload = {**event(setup, f"job-w.{uuid.uuid4().hex[:8]}"),
                      "involvedObject": {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
                                         "namespace": setup.team, "name": "job-w"}}
    status, body = as_controller(setup, "POST", core, about_workload, "application/json")
    assert status == 201, body


def event(setup: Setup, name: str) -> dict[str, Any]:
    """A core/v1 Event on the setup's Job, as agent/admission/report/events.py posts it."""
    return {"apiVersion": "v1", "kind": "Event", "metadata": {"name": name},
            "involvedObject": {"apiVersion": "batch/v1", "kind": "Job", "namespace": setup.team,
                               "name": setup.job},
            "reason": "Waiting", "message": "pod needs 16 CPUs in one zone; largest free zone has 12",
            "type": "Normal", "source": {"component": "topolet.io/controller"}}


# ---- real requests: what it must not do -----------------------------------------------------------

Row = tuple[str, str, str, Any]
# (id, method, path template, body). {team}, {job}, {pod}, {node}: the setup's objects.
REFUSED: list[Row] = [
    ("read a Secret in its namespace", "GET", f"/api/v1/namespaces/{NAMESPACE}/secrets/anything", None),
    ("list Secrets everywhere", "GET", "/api/v1/secrets", None),
    ("list ConfigMaps in a user namespace", "GET", "/api/v1/namespaces/{team}/configmaps", None),
    ("read a ConfigMap in its namespace", "GET",
     f"/api/v1/namespaces/{NAMESPACE}/configmaps/topolet-dashboards", None),
    ("create a Job", "POST", "/apis/batch/v1/namespaces/{team}/jobs", lambda s: suspended_job("made-up")),
    ("delete a Job", "DELETE", "/apis/batch/v1/namespaces/{team}/jobs/{job}", None),
    ("delete every Job", "DELETE", "/apis/batch/v1/namespaces/{team}/jobs", None),
    ("create a pod", "POST", "/api/v1/namespaces/{team}/pods", lambda s: gated_pod("made-up")),
    ("delete a pod", "DELETE", "/api/v1/namespaces/{team}/pods/{pod}", None),
    ("delete every pod", "DELETE", "/api/v1/namespaces/{team}/pods", None),
    ("write a pod's status", "PATCH", "/api/v1/namespaces/{team}/pods/{pod}/status",
     lambda s: {"status": {"phase": "Failed"}}),
    ("bind a pod", "POST", "/api/v1/namespaces/{team}/pods/{pod}/binding",
     lambda s: {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": s.pod},
                "target": {"apiVersion": "v1", "kind": "Node", "name": s.node}}),
    ("evict a pod", "POST", "/api/v1/namespaces/{team}/pods/{pod}/eviction",
     lambda s: {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": s.pod}}),
    ("exec into a pod", "POST", "/api/v1/namespaces/{team}/pods/{pod}/exec?command=sh", None),
    ("read a pod's log", "GET", "/api/v1/namespaces/{team}/pods/{pod}/log", None),
    ("label a Node", "PATCH", "/api/v1/nodes/{node}",
     lambda s: {"metadata": {"labels": {"topolet.io/numa.nodes": "9"}}}),
    ("cordon a Node", "PATCH", "/api/v1/nodes/{node}", lambda s: {"spec": {"unschedulable": True}}),
    ("write a Node's status", "PATCH", "/api/v1/nodes/{node}/status",
     lambda s: {"status": {"capacity": {"cpu": "1000"}}}),
    ("delete a Node", "DELETE", "/api/v1/nodes/{node}", None),
    ("create an NRT", "POST", NRT_PATH,
     lambda s: {"apiVersion": "topology.node.k8s.io/v1alpha2", "kind": "NodeResourceTopology",
                "metadata": {"name": s.node}, "zones": []}),
    ("patch an NRT", "PATCH", NRT_PATH + "/{node}", lambda s: {"attributes": []}),
    ("delete an NRT", "DELETE", NRT_PATH + "/{node}", None),
    ("create a PriorityClass", "POST", "/apis/scheduling.k8s.io/v1/priorityclasses",
     lambda s: {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": "top"},
                "value": 1000000000}),
    ("delete an Event", "DELETE", "/api/v1/namespaces/{team}/events/anything", None),
    ("rewrite an Event", "PATCH", "/api/v1/namespaces/{team}/events/anything",
     lambda s: {"message": "all is well"}),
    ("post an events.k8s.io Event", "POST", "/apis/events.k8s.io/v1/namespaces/{team}/events",
     lambda s: {"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "x"},
                "regarding": {"kind": "Job", "namespace": s.team, "name": s.job}, "reason": "Admitted",
                "action": "Admit", "type": "Normal", "eventTime": now_micro(),
                "reportingController": "topolet.io/controller", "reportingInstance": "x"}),
    ("create a Lease in a user namespace", "POST", "/apis/coordination.k8s.io/v1/namespaces/{team}/leases",
     lambda s: {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": CONTROLLER}}),
    ("read a Lease in kube-system", "GET", "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/"
     "kube-scheduler", None),
    ("update a Lease in kube-system", "PUT", "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/"
     "kube-controller-manager",
     lambda s: {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": "kube-controller-manager"}, "spec": {"holderIdentity": "topolet"}}),
    ("read another Lease in its namespace", "GET", f"{LEASES}/other", None),
    ("update another Lease in its namespace", "PUT", f"{LEASES}/other",
     lambda s: {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "other"},
                "spec": {"holderIdentity": "topolet"}}),
    ("list Leases in its namespace", "GET", LEASES, None),
    ("scale itself up", "PATCH", f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{CONTROLLER}/scale",
     lambda s: {"spec": {"replicas": 5}}),
    ("change its own Deployment", "PATCH", f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{CONTROLLER}",
     lambda s: {"spec": {"template": {"spec": {"serviceAccountName": "topolet-agent"}}}}),
    ("mint a token for itself", "POST",
     f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{CONTROLLER}/token",
     lambda s: {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}}),
    ("widen its own ClusterRole", "PATCH", f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{CONTROLLER}",
     lambda s: {"rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]}),
    ("grant itself cluster-admin", "POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
     lambda s: {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": {"name": "x"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                            "name": "cluster-admin"},
                "subjects": [{"kind": "ServiceAccount", "name": CONTROLLER, "namespace": NAMESPACE}]}),
    ("create a Role in its namespace", "POST",
     f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NAMESPACE}/roles",
     lambda s: {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "x"},
                "rules": []}),
]


@pytest.mark.parametrize(("method", "path", "make_body"), [row[1:] for row in REFUSED],
                         ids=[row[0] for row in REFUSED])
def test_refused_by_rbac(setup: Setup, method: str, path: str, make_body: Any) -> None:
    url = path.format(team=setup.team, job=setup.job, pod=setup.pod, node=setup.node)
    status, body = as_controller(setup, method, url, make_body(setup) if make_body else None,
                                 "application/json" if method in ("POST", "PUT") else MERGE)
    assert refused_by_rbac(status, body), (status, body)


def with_toleration(setup: Setup) -> dict[str, Any]:
    """A merge patch giving the held pod one more toleration (the list is replaced whole)."""
    status, pod = api_request(setup.plane, "GET", f"/api/v1/namespaces/{setup.team}/pods/{setup.held}")
    assert status == 200, pod
    extra = {"key": "example.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    return {"spec": {"tolerations": [*(pod["spec"].get("tolerations") or []), extra]}}


def applied(kind: str, api_version: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": kind, "metadata": {"name": name}, "spec": spec}


PolicyRow = tuple[str, str, str, Any, str]
# What RBAC lets through and the controller's admission policy refuses: (id, method, path template,
# body builder, content type). {team}, {held}, {free}, {waiting}, {running}, {plain}: the setup's.
POLICY_REFUSED: list[PolicyRow] = [
    # RBAC lets it patch a Job's status to clear a start time (a Job queued again after its node was
    # gone); anything else there is the policy's to refuse.
    ("write a Job's status", "PATCH", "/apis/batch/v1/namespaces/{team}/jobs/{waiting}/status",
     lambda s: {"status": {"succeeded": 2}}, MERGE),
    ("clear the start time of a running Job", "PATCH",
     "/apis/batch/v1/namespaces/{team}/jobs/{running}/status",
     lambda s: {"status": {"startTime": None}}, MERGE),
    ("change a held pod's image", "PATCH", "/api/v1/namespaces/{team}/pods/{held}",
     lambda s: {"spec": {"containers": [{"name": "main", "image": "registry.example.com/evil"}]}}, STRATEGIC),
    ("label a held pod", "PATCH", "/api/v1/namespaces/{team}/pods/{held}",
     lambda s: {"metadata": {"labels": {"app": "other"}}}, MERGE),
    ("annotate a held pod outside topolet.io/", "PATCH", "/api/v1/namespaces/{team}/pods/{held}",
     lambda s: {"metadata": {"annotations": {"example.com/owner": "x"}}}, MERGE),
    ("give a held pod another node selector", "PATCH", "/api/v1/namespaces/{team}/pods/{held}",
     lambda s: {"spec": {"nodeSelector": {"example.com/pool": "gpu"}}}, MERGE),
    ("give a held pod a toleration", "PATCH", "/api/v1/namespaces/{team}/pods/{held}", with_toleration,
     MERGE),
    ("give a held pod a deadline", "PATCH", "/api/v1/namespaces/{team}/pods/{held}",
     lambda s: {"spec": {"activeDeadlineSeconds": 1}}, MERGE),
    ("lift another scheduling gate", "PATCH", "/api/v1/namespaces/{team}/pods/{held}",
     lambda s: {"spec": {"schedulingGates": [{"name": GATE}]}}, MERGE),
    ("pin a held pod to another node than its selector", "PATCH", "/api/v1/namespaces/{team}/pods/{held}",
     lambda s: {"spec": {"nodeSelector": {"kubernetes.io/hostname": s.node},
                         "affinity": {"nodeAffinity": node_affinity("elsewhere")}}}, MERGE),
    ("give a held pod any other required node affinity", "PATCH", "/api/v1/namespaces/{team}/pods/{held}",
     lambda s: {"spec": {"nodeSelector": {"kubernetes.io/hostname": s.node},
                         "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                             "nodeSelectorTerms": [{"matchExpressions": [
                                 {"key": "pool", "operator": "Exists"}]}]}}}}}, MERGE),
    ("change a held pod's other topolet.io/ annotations", "PATCH", "/api/v1/namespaces/{team}/pods/{held}",
     lambda s: {"metadata": {"annotations": {"topolet.io/cpu-policy": "shared"}}}, MERGE),
    ("give a held pod placements", "PATCH", "/api/v1/namespaces/{team}/pods/{held}",
     lambda s: {"metadata": {"annotations": {"topolet.io/placements": f"{s.node}:0"}}}, MERGE),
    ("give a held pod a zone that is no NUMA node id", "PATCH", "/api/v1/namespaces/{team}/pods/{held}",
     lambda s: {"metadata": {"annotations": {"topolet.io/numa-zone": "\u00b2"}}}, MERGE),
    ("give a held pod containers' zones that are no list of NUMA node ids", "PATCH",
     "/api/v1/namespaces/{team}/pods/{held}",
     lambda s: {"metadata": {"annotations": {"topolet.io/numa-zone": "0,,1"}}}, MERGE),
    ("annotate a queued Job beyond its record", "PATCH", "/apis/batch/v1/namespaces/{team}/jobs/{waiting}",
     lambda s: {"metadata": {"annotations": {"topolet.io/colocate": "kubernetes.io/hostname"}}}, MERGE),
    ("place a pod not held by our gate", "PATCH", "/api/v1/namespaces/{team}/pods/{free}",
     lambda s: {"metadata": {"annotations": {"topolet.io/numa-zone": "0"}}}, MERGE),
    ("annotate a Job in no queue", "PATCH", "/apis/batch/v1/namespaces/{team}/jobs/{plain}",
     lambda s: {"metadata": {"annotations": {"topolet.io/admission": "{}"}}}, MERGE),
    ("unsuspend a Job in no queue", "PATCH", "/apis/batch/v1/namespaces/{team}/jobs/{plain}",
     lambda s: {"spec": {"suspend": False}}, MERGE),
    ("suspend a running Job", "PATCH", "/apis/batch/v1/namespaces/{team}/jobs/{running}",
     lambda s: {"spec": {"suspend": True}}, MERGE),
    ("grow a queued Job", "PATCH", "/apis/batch/v1/namespaces/{team}/jobs/{waiting}",
     lambda s: {"spec": {"parallelism": 100}}, MERGE),
    ("take a Job out of its queue", "PATCH", "/apis/batch/v1/namespaces/{team}/jobs/{waiting}",
     lambda s: {"metadata": {"labels": {"topolet.io/queue": None}}}, MERGE),
    ("add another gate to a Job's template", "PATCH", "/apis/batch/v1/namespaces/{team}/jobs/{waiting}",
     lambda s: {"spec": {"template": {"spec": {"schedulingGates": [{"name": GATE}, {"name": OTHER_GATE}]}}}},
     MERGE),
    ("change a queued Job's node selector", "PATCH", "/apis/batch/v1/namespaces/{team}/jobs/{waiting}",
     lambda s: {"spec": {"template": {"spec": {"nodeSelector": {"example.com/pool": "gpu"}}}}}, MERGE),
    ("label a queued Job's pods", "PATCH", "/apis/batch/v1/namespaces/{team}/jobs/{waiting}",
     lambda s: {"spec": {"template": {"metadata": {"labels": {"app": "other"}}}}}, MERGE),
    ("give a queued Job's pods the placement policy's label with another value", "PATCH",
     "/apis/batch/v1/namespaces/{team}/jobs/{waiting}",
     lambda s: {"spec": {"template": {"metadata": {"labels": {BY_INDEX_LABEL[0]: "false"}}}}}, MERGE),
    ("annotate a queued Job's pods beyond the placements", "PATCH",
     "/apis/batch/v1/namespaces/{team}/jobs/{waiting}",
     lambda s: {"spec": {"template": {"metadata": {"annotations": {"topolet.io/cpu-policy": "shared"}}}}},
     MERGE),
    ("give a queued Job's pods any other node affinity", "PATCH",
     "/apis/batch/v1/namespaces/{team}/jobs/{waiting}",
     lambda s: {"spec": {"template": {"spec": {
         "nodeSelector": {"kubernetes.io/hostname": s.node},
         "affinity": {"nodeAffinity": {
             **node_affinity(s.node), "preferredDuringSchedulingIgnoredDuringExecution": [
                 {"weight": 1,
                  "preference": {"matchExpressions": [{"key": "pool", "operator": "Exists"}]}}]}}}}}},
     MERGE),
    ("pin a queued Job's pods to another node than its selector", "PATCH",
     "/apis/batch/v1/namespaces/{team}/jobs/{waiting}",
     lambda s: {"spec": {"template": {"spec": {"nodeSelector": {"kubernetes.io/hostname": s.node},
                                               "affinity": {"nodeAffinity": node_affinity("elsewhere")}}}}},
     MERGE),
    ("give a queued Job's pods a node affinity with no hostname selector", "PATCH",
     "/apis/batch/v1/namespaces/{team}/jobs/{waiting}",
     lambda s: {"spec": {"template": {"spec": {"affinity": {"nodeAffinity": node_affinity(s.node)}}}}},
     MERGE),
    ("create another Lease in its namespace", "POST", LEASES,
     lambda s: {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "other"}},
     "application/json"),
    ("post an Event about a Workload kind outside Kueue's group", "POST", "/api/v1/namespaces/{team}/events",
     lambda s: {**event(s, f"x.{uuid.uuid4().hex[:8]}"),
                "involvedObject": {"apiVersion": "example.com/v1", "kind": "Workload", "namespace": s.team,
                                   "name": "w"}},
     "application/json"),
    ("post an Event about a pod, but for its unreadable requests", "POST", "/api/v1/namespaces/{team}/events",
     lambda s: {**event(s, f"x.{uuid.uuid4().hex[:8]}"),
                "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": s.team, "name": s.held}},
     "application/json"),
]


@pytest.mark.parametrize(("method", "path", "make_body", "content_type"), [row[1:] for row in POLICY_REFUSED],
                         ids=[row[0] for row in POLICY_REFUSED])
def test_refused_by_its_admission_policy(setup: Setup, method: str, path: str, make_body: Any,
                                         content_type: str) -> None:
    url = path.format(team=setup.team, held=setup.held, free=setup.free, waiting=setup.waiting,
                      running=setup.running, plain=setup.plain)
    status, body = as_controller(setup, method, url, make_body(setup), content_type)
    assert refused_by(status, body) == "policy", (status, body.get("message") if isinstance(body, dict)
                                                  else body)


@pytest.mark.parametrize("kind", ["Pod", "Job"])
def test_cannot_create_by_server_side_apply(setup: Setup, kind: str) -> None:
    """A server-side apply patch of an object that does not exist creates it: the API server asks RBAC
    for `create` as well as `patch` then."""
    if kind == "Pod":
        path, obj = f"/api/v1/namespaces/{setup.team}/pods", applied("Pod", "v1", "applied",
                                                                     gated_pod("applied")["spec"])
    else:
        path, obj = f"/apis/batch/v1/namespaces/{setup.team}/jobs", applied("Job", "batch/v1", "applied",
                                                                           suspended_job("applied")["spec"])
    status, body = as_controller(setup, "PATCH", f"{path}/applied?fieldManager=topolet", obj, APPLY)
    assert refused_by(status, body) == "rbac", (status, body)


def test_cannot_act_as_another_service_account(setup: Setup) -> None:
    req = urllib.request.Request(setup.plane.url + f"/api/v1/namespaces/{NAMESPACE}/secrets")
    req.add_header("Authorization", f"Bearer {setup.token}")
    req.add_header("Impersonate-User", "system:serviceaccount:topolet-system:topolet-agent")
    ctx = ssl.create_default_context(cafile=str(setup.plane.ca_file))
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(req, timeout=30, context=ctx)
    assert refused.value.code == 403
    assert "cannot impersonate" in refused.value.read().decode()


def test_refusals_left_the_objects_alone(setup: Setup) -> None:
    """Run after the refused rows (file order): the objects they aimed at are as they were."""
    status, node = api_request(setup.plane, "GET", f"/api/v1/nodes/{setup.node}")
    assert status == 200, node
    assert "topolet.io/numa.nodes" not in node["metadata"].get("labels", {})
    assert not node["spec"].get("unschedulable")
    status, pod = api_request(setup.plane, "GET", f"/api/v1/namespaces/{setup.team}/pods/{setup.pod}")
    assert status == 200, pod
    assert not pod["spec"].get("nodeName")
    status, deployment = api_request(setup.plane, "GET",
                                     f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{CONTROLLER}")
    assert status == 200, deployment
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == CONTROLLER
    status, role = api_request(setup.plane, "GET",
                               f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{CONTROLLER}")
    assert status == 200, role
    assert not any("*" in rule["verbs"] for rule in role["rules"])
    status, held = api_request(setup.plane, "GET", f"/api/v1/namespaces/{setup.team}/pods/{setup.held}")
    assert status == 200, held
    assert held["spec"]["schedulingGates"] == [{"name": GATE}, {"name": OTHER_GATE}]
    assert [c["image"] for c in held["spec"]["containers"]] == ["busybox"]
    assert not held["spec"].get("nodeSelector") and not held["spec"].get("activeDeadlineSeconds")
    assert not held["metadata"].get("labels")
    status, free = api_request(setup.plane, "GET", f"/api/v1/namespaces/{setup.team}/pods/{setup.free}")
    assert status == 200, free
    assert "topolet.io/numa-zone" not in (free["metadata"].get("annotations") or {})
    jobs = f"/apis/batch/v1/namespaces/{setup.team}/jobs"
    for name, suspended in ((setup.waiting, True), (setup.running, False), (setup.plain, True)):
        status, job = api_request(setup.plane, "GET", f"{jobs}/{name}")
        assert status == 200, job
        assert job["spec"]["suspend"] is suspended
        assert job["spec"]["parallelism"] == 2
        assert "topolet.io/admission" not in (job["metadata"].get("annotations") or {})
        assert not job["spec"]["template"]["spec"].get("schedulingGates")
    for name in ("applied",):
        assert api_request(setup.plane, "GET", f"{jobs}/{name}")[0] == 404
        assert api_request(setup.plane, "GET", f"/api/v1/namespaces/{setup.team}/pods/{name}")[0] == 404


# ---- the real controller, with nothing but these grants -------------------------------------------


def test_the_controller_admits_a_gang_with_only_its_own_grants(
        cluster: Cluster,  # noqa: F811 - fixture
        dump_root: Callable[[str], Path], tmp_path: Path) -> None:
    """`topolet controller --leader-elect` with the service account's token, on the test cluster (Job
    controller, kube-scheduler, a node whose NRT a real agent publishes): it takes its Lease, admits a
    gang end to end (its pods created pinned), places a non-indexed gang over two zones pod by pod
    (each gated pod patched with its node, zone and required node affinity) and rejects one that never
    fits, and the API server refuses it nothing."""
    plane = cluster.plane
    # The controller's part alone, as the README says it may be applied: on the namespace it expects.
    status, body = api_request(plane, "POST", "/api/v1/namespaces", body={
        "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    assert status in (201, 409), body
    Kubectl(build_kubectl(), plane.kubeconfig).run("apply", "-k", str(BASE / "controller"))
    token = plane.mint_token(NAMESPACE, CONTROLLER)
    # Every write below passes through the controller's admission policy, not just RBAC.
    wait_for_policy(plane, token)

    tag = uuid.uuid4().hex[:8]
    label = f"test.topolet.io/{tag}"
    node = cluster.add_node(f"sim-{tag}", dump_root(DUMP), labels={label: "true"}).name
    wait_for(lambda: cluster.nrt(node), f"the NRT of {node}")
    team = f"t-{tag}"
    status, body = api_request(plane, "POST", "/api/v1/namespaces", body={
        "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": team}})
    assert status == 201, body

    kubeconfig = plane.write_kubeconfig(tmp_path / "controller.kubeconfig", token, user=CONTROLLER)
    replica = f"{CONTROLLER}-{tag}"
    proc = _Process(replica, [topolet_bin(), "controller", "--kubeconfig", str(kubeconfig),
                              "--namespace", NAMESPACE, "--leader-elect", "--listen", "127.0.0.1:0",
                              "--resync-seconds", "2", "--queue", f"research=BestEffortFIFO:{team}"],
                    tmp_path / "controller.log",
                    env={"POD_NAME": replica, "POD_NAMESPACE": NAMESPACE, "PYTHONPATH": str(REPO)})
    try:
        with plane.client() as admin_client:
            api = KubeClient(admin_client)

            def holder() -> str:
                status, lease = api_request(plane, "GET", f"{LEASES}/{CONTROLLER}")
                return str(lease["spec"].get("holderIdentity")) if status == 200 else ""

            wait_for(lambda: holder() == replica, "the controller to take its Lease")
            jobs = f"/apis/batch/v1/namespaces/{team}/jobs"
            api.create(jobs, gang_job("fits", 2, label, queue="research"))
            api.create(jobs, gang_job("zones", 2, label, indexed=False, queue="research"))
            api.create(jobs, gang_job("never", 1, label, cpu=1000, queue="research"))
            wait_for(lambda: all_bound_as_recorded(api, team, "fits", 2), "gang fits admitted and bound")
            wait_for(lambda: all_bound_as_recorded(api, team, "zones", 2), "gang zones placed and bound")
            zones = record(api, team, "zones")
            assert zones is not None
            assert len({(p["node"], p["zone"]) for p in zones["placement"].values()}) == 2
            template = get_job(api, team, "zones")["spec"]["template"]
            assert template["spec"]["schedulingGates"] == [{"name": GATE}]
            wait_for(lambda: (record(api, team, "never") or {}).get("result") == "rejected", "never rejected")
            wait_for(lambda: "Admitted" in events(api, team, "fits"), "the Admitted Event")
            wait_for(lambda: "Rejected" in events(api, team, "never"), "the Rejected Event")
            assert proc.running(), proc.log_tail()
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n--- the controller's log:\n{proc.log_tail()}") from exc
    finally:
        proc.stop()
    # Other tests' namespaces may still be terminating on this shared cluster: the API server refuses
    # new Events there with a 403 that says so, whoever asks. Every other 403 is a missing grant.
    log = "\n".join(line for line in (tmp_path / "controller.log").read_text().splitlines()
                    if "because it is being terminated" not in line)
    assert "403" not in log and "forbidden" not in log.lower(), log[-4000:]
