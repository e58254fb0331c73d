"""The fields policy over the training kinds, on Kueue's test cluster with the operators' CRDs and
webhooks (tests/controlplane/operators.py) and the base's `topolet-admission-fields` as the kueue
component ships it: a tenant (a service account of its namespace, RBAC for the training kinds, Jobs
and pods) is refused the placement fields in every pod template of a JobSet, a TrainJob's runtime
patch, an MPIJob and a LeaderWorkerSet, and only a training operator's own identity (as its
manifests install it: the JobSet controller, Kubeflow Trainer, the MPI operator) may carry them, only
into the children of an object of its own kind it makes.  The index labels pods are ranked by are
refused the tenant in those templates and a StatefulSet's, in any pod it creates where only the
StatefulSet controller sets them (a StatefulSet's ordinal, a LeaderWorkerSet's worker index), and in
every pod once it exists: Kueue's pod integration pins a pod by what it carries as it ungates it.
Dry runs: nothing is created (but the pod a tenant tries to change)."""

from __future__ import annotations

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

    def update(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        return api_request(self.plane, "PUT", f"{path}?dryRun=All", self.token, body)


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


# (operator, its identity as its own manifests install it, the kind it copies templates from, the
# collections of the children it may carry placements into): the fields policy's byOperator table.
OPERATOR_ROWS: list[tuple[str, tuple[str, str], str, tuple[str, ...]]] = [
    ("the JobSet controller", ("jobset-system", "jobset-controller-manager"), "JobSet", ("jobs",)),
    ("Kubeflow Trainer", ("kubeflow-system", "kubeflow-trainer-controller-manager"), "TrainJob",
     ("jobsets",)),
    ("the MPI operator", ("mpi-operator", "mpi-operator"), "MPIJob", ("jobs", "pods")),
]
VERBS = ["get", "list", "create", "update", "patch"]
CHILDREN = [{"apiGroups": ["batch"], "resources": ["jobs"], "verbs": VERBS},
            {"apiGroups": [""], "resources": ["pods"], "verbs": VERBS},
            {"apiGroups": ["jobset.x-k8s.io"], "resources": ["jobsets"], "verbs": VERBS}]


@pytest.fixture
def actors(kueue: KueueScope, operators: Operators, shipped: Any) -> Iterator[tuple[Who, dict[str, Who]]]:
    """(the tenant, each operator's identity by kind) of a fresh namespace, once the policy refuses."""
    assert all(operators.running(n) for n in ("jobset", "trainer", "mpi-operator", "lws"))
    ns = kueue.namespace("tf")
    tenant = Who(kueue, service_account(kueue, ns, "tenant", [
        *CHILDREN,
        {"apiGroups": ["trainer.kubeflow.org"], "resources": ["trainjobs"], "verbs": VERBS},
        {"apiGroups": ["kubeflow.org"], "resources": ["mpijobs"], "verbs": VERBS},
        {"apiGroups": ["leaderworkerset.x-k8s.io"], "resources": ["leaderworkersets"], "verbs": VERBS},
        {"apiGroups": ["apps"], "resources": ["statefulsets"], "verbs": VERBS}],
        ns), ns)
    identities = {kind: Who(kueue, service_account(kueue, *sa, CHILDREN, ns), ns)
                  for _, sa, kind, _ in OPERATOR_ROWS}
    zoned = jobset_with("probe", {"topolet.io/numa-zone": "0"})
    wait_for(lambda: refused_by_policy(*tenant.create(collection_path("JobSet", ns), zoned)),
             "the policy to refuse a tenant's JobSet", timeout=POLICY_TIMEOUT_S)
    yield tenant, identities


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


def owned(body: dict[str, Any], owner: dict[str, Any] | None) -> dict[str, Any]:
    """`body` with `owner` (an object) as its controller, if any, and a generated name."""
    meta = body["metadata"]
    meta.pop("name", None)
    meta["generateName"] = "child-"
    if owner is not None:
        meta["ownerReferences"] = [{
            "apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": owner["metadata"]["name"],
            "uid": owner["metadata"]["uid"], "controller": True}]
    return body


def child(collection: str, notes: dict[str, str]) -> dict[str, Any]:
    """A child an operator makes, carrying `notes` where its pods will: a Job, a pod or a JobSet."""
    spec = {"restartPolicy": "Never", "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}
    if collection == "pods":
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"annotations": notes}, "spec": spec}
    if collection == "jobsets":
        body = jobset_with("x", notes)
        body["spec"]["suspend"] = True
        return body
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {},
            "spec": {"suspend": True, "template": {"metadata": {"annotations": notes}, "spec": spec}}}


def children_path(collection: str, ns: str) -> str:
    return {"jobs": f"/apis/batch/v1/namespaces/{ns}/jobs", "pods": f"/api/v1/namespaces/{ns}/pods",
            "jobsets": collection_path("JobSet", ns)}[collection]


def owner_of_kind(kueue: KueueScope, kind: str, ns: str) -> dict[str, Any]:
    """A real, suspended object of `kind` (Kueue's webhooks read a child's owner)."""
    body = {"JobSet": jobset_with("owner", {}), "TrainJob": trainjob_with("owner", {}),
            "MPIJob": mpijob_with("owner", {})}[kind]
    if kind == "MPIJob":
        body["spec"]["runPolicy"]["suspend"] = True
    else:
        body["spec"]["suspend"] = True
    made: dict[str, Any] = kueue.api.create(collection_path(kind, ns), body)
    return made


@pytest.mark.parametrize(("kind", "build"), KINDS, ids=[k for k, _ in KINDS])
def test_a_tenant_places_no_pod_of_a_training_kind(
        actors: tuple[Who, dict[str, Who]], kind: str,
        build: Callable[[str, dict[str, str]], dict[str, Any]]) -> None:
    tenant, _ = actors
    path = collection_path(kind, tenant.ns)
    status, made = tenant.create(path, build("plain", {}))
    assert status == 201, made.get("message")  # the kind itself is the tenant's to create
    for what, notes in FIELDS:
        status, answer = tenant.create(path, build(f"with-{what}", notes))
        assert refused_by_policy(status, answer), (kind, what, status, answer.get("message"))
        assert "only topolet-controller places pods" in answer["message"]
    # The index labels pods are ranked by, which a tenant would set to share another pod's slot (not
    # the offset: one for a whole template shifts every rank alike, and Kueue's webhooks write it).
    for key in ("jobset.sigs.k8s.io/job-index", "batch.kubernetes.io/job-completion-index",
                "training.kubeflow.org/replica-index", "leaderworkerset.sigs.k8s.io/worker-index",
                "kueue.x-k8s.io/role-hash"):
        for where in ("labels", "annotations"):
            body = build(f"forged-{where}", {})
            template = templates_of(kind, body)[-1]
            template.setdefault("metadata", {})[where] = {key: "0"}
            status, answer = tenant.create(path, body)
            assert refused_by_policy(status, answer), (kind, key, where, status, answer.get("message"))
            assert "only the operators set the index labels" in answer["message"]
    body = build("offset", {"kueue.x-k8s.io/pod-index-offset": "1"})
    status, answer = tenant.create(path, body)
    assert status == 201, answer.get("message")


PAUSE = "registry.k8s.io/pause:3.10"


def statefulset(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": name},
            "spec": {"replicas": 2, "serviceName": name, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name, **labels}},
                                  "spec": {"containers": [{"name": "c", "image": PAUSE}]}}}}


def pod(labels: dict[str, str], gated: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": PAUSE}]}
    if gated:
        spec["schedulingGates"] = [{"name": "kueue.x-k8s.io/admission"}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "p-", "labels": labels},
            "spec": spec}


def test_a_tenant_sets_no_ordinal_and_changes_no_index_of_a_pod(actors: tuple[Who, dict[str, Who]],
                                                                 kueue: KueueScope) -> None:
    """A StatefulSet's template may not carry a pod index; a tenant's pod may not carry a StatefulSet's
    ordinal or a LeaderWorkerSet's worker index (only the StatefulSet controller's pods do), but may
    carry a plain pod group's index (the tenant makes those pods); no index a pod carries may change."""
    tenant, _ = actors
    sets = f"/apis/apps/v1/namespaces/{tenant.ns}/statefulsets"
    status, answer = tenant.create(sets, statefulset("plain", {}))
    assert status == 201, answer.get("message")
    for key in ("apps.kubernetes.io/pod-index", "kueue.x-k8s.io/role-hash"):
        status, answer = tenant.create(sets, statefulset("forged", {key: "0"}))
        assert refused_by_policy(status, answer), (key, status, answer.get("message"))
        assert "only the operators set the index labels" in answer["message"]
    pods = f"/api/v1/namespaces/{tenant.ns}/pods"
    for key in ("apps.kubernetes.io/pod-index", "leaderworkerset.sigs.k8s.io/worker-index"):
        status, answer = tenant.create(pods, pod({key: "1"}))
        assert refused_by_policy(status, answer), (key, status, answer.get("message"))
        assert "only the StatefulSet controller creates a pod with a StatefulSet ordinal" in answer["message"]
    status, answer = tenant.create(pods, pod({"kueue.x-k8s.io/pod-group-pod-index": "1"}))
    assert status == 201, answer.get("message")
    made = kueue.api.create(pods, pod({"kueue.x-k8s.io/pod-group-pod-index": "1"}, gated=True))
    path = f"{pods}/{made['metadata']['name']}"
    for key, value in (("kueue.x-k8s.io/pod-group-pod-index", "0"), ("apps.kubernetes.io/pod-index", "0"),
                       ("kueue.x-k8s.io/role-hash", "leader"), ("kueue.x-k8s.io/pod-index-offset", "1")):
        labels = {**made["metadata"]["labels"], key: value}
        changed = {**made, "metadata": {**made["metadata"], "labels": labels}}
        status, answer = tenant.update(path, changed)
        assert refused_by_policy(status, answer), (key, status, answer.get("message"))
        assert "a pod keeps the index labels it is ranked by" in answer["message"]
    other = {**made, "metadata": {**made["metadata"], "labels": {**made["metadata"]["labels"], "mine": "x"}}}
    status, answer = tenant.update(path, other)
    assert status == 200, answer.get("message")  # any other label is the tenant's


def templates_of(kind: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The pod templates of a training kind's object (a TrainJob: its runtime patch's)."""
    spec = body["spec"]
    if kind == "JobSet":
        return [r["template"]["spec"]["template"] for r in spec["replicatedJobs"]]
    if kind == "TrainJob":
        patch = spec["runtimePatches"][0]["trainingRuntimeSpec"]
        return [r["template"]["spec"]["template"] for r in patch["template"]["spec"]["replicatedJobs"]]
    if kind == "MPIJob":
        return [spec["mpiReplicaSpecs"][k]["template"] for k in ("Launcher", "Worker")]
    return [spec["leaderWorkerTemplate"]["workerTemplate"]]


@pytest.mark.parametrize(("operator", "kind", "collections"), [(o, k, c) for o, _, k, c in OPERATOR_ROWS],
                         ids=[r[2] for r in OPERATOR_ROWS])
def test_an_operator_carries_placements_only_into_its_own_objects_children(
        kueue: KueueScope, actors: tuple[Who, dict[str, Who]], operator: str, kind: str,
        collections: tuple[str, ...]) -> None:
    tenant, identities = actors
    me = identities[kind]
    mine = owner_of_kind(kueue, kind, tenant.ns)
    other = kueue.api.create(f"/api/v1/namespaces/{tenant.ns}/configmaps", {"metadata": {"name": "owner"}})
    other.update(apiVersion="v1", kind="ConfigMap")
    for what, notes in FIELDS:
        for collection in ("jobs", "pods", "jobsets"):
            path = children_path(collection, tenant.ns)
            status, answer = me.create(path, owned(child(collection, notes), mine))
            if collection in collections:
                assert status == 201, (operator, collection, what, answer.get("message"))
            else:
                assert refused_by_policy(status, answer), (operator, collection, what, answer.get("message"))
            for who, owner in ((me, None), (me, other), (tenant, mine)):
                status, answer = who.create(path, owned(child(collection, notes), owner))
                assert refused_by_policy(status, answer), (operator, collection, what, owner is None,
                                                           answer.get("message"))
