"""What a tenant cannot do to admission, on the real test cluster (issue 21, findings 3, 4 and 5).

A tenant here is a service account of a user namespace with a Role that may create, change and delete
Jobs and pods there, and nothing else: its real token, against the real kube-apiserver with the
controller's part of the base applied (`daemonset/controller/`, whose `fields-policy.yaml` keeps the
admission record, the placements, the placement policy's label and our gate's removal the
controller's). The real `topolet controller` (admin credentials: the cluster's, not the tenant's) runs
beside the Job controller, the scheduler and real agents on simulated nodes.

The Kueue route's rows are the same fields as Kueue's placement policy reads them (the kueue component
only adds Kueue's manager to the users the policy skips).

Where the policy cannot be (a record written by an administrator, or by anyone on a cluster without
the policy), the controller itself trusts only a record written for the Job as it is
(`agent.admission.jobs.jobread.distrust`): the forged-record test writes such records as the admin.
"""

from __future__ import annotations

import copy
import json
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agent.admission.kueue.workloads import FAILSAFE_LABEL
from tests.admission.test_controller import (
    ADMISSION,
    DUMP,
    GATE,
    all_bound_as_recorded,
    events,
    gang_job,
    get_job,
    job_pods,
    record,
    wait_for,
)
from tests.controlplane.cluster import Cluster
from tests.controlplane.fixtures import IN_CI
from tests.controlplane.kubectl import BASE, Kubectl, api_request, build_kubectl
from tests.kube.test_manifests import NAMESPACE

try:
    from agent.kubeapi.client import KubeClient
except ImportError:
    if IN_CI:
        raise
    pytest.skip("the `kubernetes` Python client is not installed", allow_module_level=True)

POLICY = "topolet-admission-fields"
POLICY_TIMEOUT_S = 60.0
MERGE = "application/merge-patch+json"
BY_INDEX = "topolet.io/placements-by-index"


@dataclass(frozen=True)
class Tenant:
    cluster: Cluster
    api: KubeClient  # the admin's
    namespace: str
    token: str
    label: str  # the label only this test's nodes carry
    nodes: tuple[str, ...]

    def request(self, method: str, path: str, body: Any = None,
                content_type: str = "application/json") -> tuple[int, dict[str, Any]]:
        """One request with the tenant's token; `path` relative to its namespace."""
        return api_request(self.cluster.plane, method, f"/{path.format(ns=self.namespace)}", self.token,
                           body, content_type)

    def jobs(self) -> str:
        return f"/apis/batch/v1/namespaces/{self.namespace}/jobs"


def refused_by_policy(status: int, body: dict[str, Any]) -> bool:
    """Refused by one of the policy's rules (an expression that fails to evaluate denies too: not this)."""
    message = str(body.get("message", ""))
    _, _, reason = message.partition("denied request: ")
    return (status == 403 and f"ValidatingAdmissionPolicy '{POLICY}'" in message
            and reason.startswith(("only topolet-controller", "a Job or JobSet queued", "an admitted Job",
                                   "only the training operators", "only the operators",
                                   "a pod keeps the index", "only the StatefulSet controller")))


def until_enforced(t: Tenant) -> None:
    """Until the API server enforces the policy: a dry-run of a pod in a zone of the tenant's choosing."""
    deadline = time.monotonic() + POLICY_TIMEOUT_S
    while True:
        status, body = t.request("POST", "api/v1/namespaces/{ns}/pods?dryRun=All", bare_pod({"zone": "0"}))
        if refused_by_policy(status, body):
            break
        assert status in (201, 429), body
        assert time.monotonic() < deadline, f"{POLICY} not enforced after {POLICY_TIMEOUT_S:.0f} s: {body}"
        time.sleep(0.5)


@pytest.fixture
def tenant(cluster: Cluster, api: KubeClient, namespace: str,
           dump_root: Callable[[str], Path]) -> Iterator[Tenant]:
    """The controller's part of the base applied, two nodes of DUMP, and a tenant of `namespace`."""
    plane = cluster.plane
    status, body = api_request(plane, "POST", "/api/v1/namespaces", body={
        "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    assert status in (201, 409), body
    Kubectl(build_kubectl(), plane.kubeconfig).run("apply", "-k", str(BASE / "controller"))
    api.create(f"/api/v1/namespaces/{namespace}/serviceaccounts", {"metadata": {"name": "tenant"}})
    api.create(f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/roles", {
        "metadata": {"name": "tenant"},
        "rules": [{"apiGroups": ["batch"], "resources": ["jobs"],
                   "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]},
                  {"apiGroups": [""], "resources": ["pods"],
                   "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]}]})
    api.create(f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings", {
        "metadata": {"name": "tenant"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "tenant"},
        "subjects": [{"kind": "ServiceAccount", "name": "tenant", "namespace": namespace}]})
    token = plane.mint_token(namespace, "tenant")
    tag = uuid.uuid4().hex[:8]
    label = f"test.topolet.io/{tag}"
    names = tuple(cluster.add_node(f"ten-{tag}-{i}", dump_root(DUMP), labels={label: "true"}).name
                  for i in range(2))
    for name in names:
        wait_for(lambda n=name: cluster.nrt(n), f"the NRT of {name}")
    mine = Tenant(cluster, api, namespace, token, label, names)
    until_enforced(mine)
    yield mine


def bare_pod(what: dict[str, str]) -> dict[str, Any]:
    """A tenant's own pod: in a zone (`zone`), bound to a node (`node`), with placements (`placements`)."""
    notes = {}
    if "zone" in what:
        notes["topolet.io/numa-zone"] = what["zone"]
    if "placements" in what:
        notes["topolet.io/placements"] = what["placements"]
        notes["batch.kubernetes.io/job-completion-index"] = "0"
    res = {"cpu": "4", "memory": "64Mi"}
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                                            "resources": {"requests": res, "limits": res}}],
                            "automountServiceAccountToken": False}
    if "node" in what:
        spec["nodeName"] = what["node"]
    if "gated" in what:
        spec["schedulingGates"] = [{"name": GATE}]
    labels = {BY_INDEX: "true"} if "placements" in what else {}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"generateName": "bare-", "annotations": notes, "labels": labels}, "spec": spec}


def queued(name: str, label: str, count: int = 2, notes: dict[str, str] | None = None) -> dict[str, Any]:
    """A gang as a tenant queues it; `notes` added to its pod template's annotations."""
    job = gang_job(name, count, label)
    job["spec"]["template"]["metadata"]["annotations"].update(notes or {})
    return job


def admitted_by_admin(t: Tenant, name: str) -> str:
    """A queued Job the admin created and marked admitted (no controller runs in these rows)."""
    job = queued(name, t.label)
    job["metadata"]["annotations"] = {ADMISSION: json.dumps({"result": "admitted", "decision": "d",
                                                             "time": "t", "placement": {"0": {"node": "n"}}})}
    job["spec"]["suspend"] = False
    job["spec"]["template"]["spec"]["nodeSelector"]["test.topolet.io/nowhere"] = "true"  # never runs
    t.api.create(t.jobs(), job)
    return name


def tenant_pod(t: Tenant, gated: bool) -> str:
    status, pod = t.request("POST", "api/v1/namespaces/{ns}/pods", bare_pod({"gated": "1"} if gated else {}))
    assert status == 201, pod
    return str(pod["metadata"]["name"])


# (id, what the tenant sends: Tenant -> (method, path, body, content type)). Every one is refused by the
# policy, whatever RBAC grants.
Row = tuple[str, Callable[[Tenant], tuple[str, str, Any, str]]]
REFUSED: list[Row] = [
    ("create a queued Job with an admission record of its own", lambda t: (
        "POST", "apis/batch/v1/namespaces/{ns}/jobs",
        {**queued("forged", t.label), "metadata": {"name": "forged", "labels": {"topolet.io/queue": "q"},
                                                    "annotations": {ADMISSION: '{"result":"admitted"}'}}},
        "application/json")),
    ("write an admission record onto its queued Job", lambda t: (
        "PATCH", f"apis/batch/v1/namespaces/{{ns}}/jobs/{created_job(t, queued('w', t.label))}",
        {"metadata": {"annotations": {ADMISSION: '{"result":"admitted"}'}}}, MERGE)),
    ("create a Job whose pods name a zone", lambda t: (
        "POST", "apis/batch/v1/namespaces/{ns}/jobs",
        queued("zoned", t.label, notes={"topolet.io/numa-zone": "3"}), "application/json")),
    ("create a Job with the gate, the placement policy's label and placements of its own", lambda t: (
        "POST", "apis/batch/v1/namespaces/{ns}/jobs", policy_bait(t), "application/json")),
    ("give its queued Job's pods placements", lambda t: (
        "PATCH", f"apis/batch/v1/namespaces/{{ns}}/jobs/{created_job(t, queued('p', t.label))}",
        {"spec": {"template": {"metadata": {"annotations": {"topolet.io/placements": f"{t.nodes[0]}:3"}}}}},
        MERGE)),
    ("create a queued Job unsuspended", lambda t: (
        "POST", "apis/batch/v1/namespaces/{ns}/jobs",
        {**queued("running", t.label), "spec": {**queued("running", t.label)["spec"], "suspend": False}},
        "application/json")),
    ("unsuspend its queued Job", lambda t: (
        "PATCH", f"apis/batch/v1/namespaces/{{ns}}/jobs/{created_job(t, queued('u', t.label))}",
        {"spec": {"suspend": False}}, MERGE)),
    ("scale an admitted Job beyond its record (parallelism 2 -> 8)", lambda t: (
        "PATCH", f"apis/batch/v1/namespaces/{{ns}}/jobs/{admitted_by_admin(t, 'scaled')}",
        {"spec": {"parallelism": 8}}, MERGE)),
    ("take an admitted Job out of its queue", lambda t: (
        "PATCH", f"apis/batch/v1/namespaces/{{ns}}/jobs/{admitted_by_admin(t, 'unqueued')}",
        {"metadata": {"labels": {"topolet.io/queue": None}}}, MERGE)),
    ("create a pod in a NUMA zone of its choosing", lambda t: (
        "POST", "api/v1/namespaces/{ns}/pods", bare_pod({"zone": "3"}), "application/json")),
    ("create a pod bound to a node, in a zone of its choosing", lambda t: (
        "POST", "api/v1/namespaces/{ns}/pods", bare_pod({"zone": "3", "node": t.nodes[0]}),
        "application/json")),
    ("create a pod with placements and the placement policy's label", lambda t: (
        "POST", "api/v1/namespaces/{ns}/pods", bare_pod({"placements": f"{t.nodes[0]}:3", "gated": "1"}),
        "application/json")),
    # The Kueue route (daemonset/components/kueue): the same fields, as Kueue's placement policy reads them.
    ("create a Kueue Job whose pods come with placements and the awaiting-placement selector", lambda t: (
        "POST", "apis/batch/v1/namespaces/{ns}/jobs", kueue_bait(t), "application/json")),
    ("create a pod Kueue's placement policy would pin", lambda t: (
        "POST", "api/v1/namespaces/{ns}/pods", awaiting(bare_pod({"placements": f"{t.nodes[0]}:3"})),
        "application/json")),
    ("give its own pod a zone", lambda t: (
        "PATCH", f"api/v1/namespaces/{{ns}}/pods/{tenant_pod(t, gated=False)}",
        {"metadata": {"annotations": {"topolet.io/numa-zone": "3"}}}, MERGE)),
    ("lift our gate from its own pod", lambda t: (
        "PATCH", f"api/v1/namespaces/{{ns}}/pods/{tenant_pod(t, gated=True)}",
        {"spec": {"schedulingGates": None}}, MERGE)),
]


def created_job(t: Tenant, job: dict[str, Any]) -> str:
    """`job` created by the tenant (allowed: suspended, in a queue, nothing of the controller's)."""
    status, out = t.request("POST", "apis/batch/v1/namespaces/{ns}/jobs", job)
    assert status == 201, out
    return str(out["metadata"]["name"])


def policy_bait(t: Tenant) -> dict[str, Any]:
    job = queued("bait", t.label, notes={"topolet.io/placements": f"{t.nodes[0]}:3,{t.nodes[0]}:3"})
    job["spec"]["template"]["metadata"]["labels"] = {BY_INDEX: "true"}
    job["spec"]["template"]["spec"]["schedulingGates"] = [{"name": GATE}]
    return job


def awaiting(pod_or_template: dict[str, Any]) -> dict[str, Any]:
    """With the node selector Kueue's route holds pods by until its placement policy pins them."""
    pod_or_template["spec"].setdefault("nodeSelector", {})[FAILSAFE_LABEL[0]] = FAILSAFE_LABEL[1]
    pod_or_template["metadata"].pop("labels", None)
    return pod_or_template


def kueue_bait(t: Tenant) -> dict[str, Any]:
    job = queued("kueue-bait", t.label, notes={"topolet.io/placements": f"{t.nodes[0]}:3,{t.nodes[0]}:3"})
    job["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "lq"}
    awaiting(job["spec"]["template"])
    return job


@pytest.mark.parametrize("send", [r[1] for r in REFUSED], ids=[r[0] for r in REFUSED])
def test_a_tenant_cannot_write_what_the_controller_alone_writes(
        tenant: Tenant, send: Callable[[Tenant], tuple[str, str, Any, str]]) -> None:
    method, path, body, content_type = send(tenant)
    status, answer = tenant.request(method, path, body, content_type)
    assert refused_by_policy(status, answer), (status, answer.get("message"))


def test_what_a_tenant_may_still_do(tenant: Tenant) -> None:
    """Queue a Job, suspend an admitted one (the controller then leaves it so), annotate and delete
    its own objects."""
    name = created_job(tenant, queued("mine", tenant.label))
    assert get_job(tenant.api, tenant.namespace, name)["spec"]["suspend"] is True
    admitted = admitted_by_admin(tenant, "resuspend")
    status, out = tenant.request("PATCH", f"apis/batch/v1/namespaces/{{ns}}/jobs/{admitted}",
                                 {"spec": {"suspend": True}}, MERGE)
    assert status == 200, out
    pod = tenant_pod(tenant, gated=True)
    status, out = tenant.request("PATCH", f"api/v1/namespaces/{{ns}}/pods/{pod}",
                                 {"metadata": {"annotations": {"example.com/owner": "me"}}}, MERGE)
    assert status == 200, out
    status, out = tenant.request("DELETE", f"apis/batch/v1/namespaces/{{ns}}/jobs/{name}")
    assert status == 200, out


def test_a_record_the_controller_did_not_write_books_nothing(tenant: Tenant) -> None:
    """A suspended queued Job carrying a record the controller did not write (8 slots over both nodes,
    its time far in the future: what a tenant wrote where the policy is missing, here the admin): the
    controller never unsuspends it, removes the record with an Event and decides the Job itself (it can
    never fit: rejected); a gang that needs every zone of both nodes goes in meanwhile.  A record copied
    from another Job is not trusted either."""
    t, api, ns = tenant, tenant.api, tenant.namespace
    squatter = queued("squatter", t.label, count=1)
    squatter["spec"]["template"]["spec"]["nodeSelector"]["test.topolet.io/nowhere"] = "true"
    forged = {"version": 1, "result": "admitted", "decision": "forged", "time": "2999-01-01T00:00:00Z",
              "placement": {str(i): {"node": t.nodes[i % 2], "zone": i // 2} for i in range(8)}}
    squatter["metadata"]["annotations"] = {ADMISSION: json.dumps(forged)}
    api.create(t.jobs(), squatter)
    t.cluster.start_controller("--listen", "127.0.0.1:0", "--resync-seconds", "2")
    wait_for(lambda: "UntrustedAdmissionRecord" in events(api, ns, "squatter"), "the squatter's Event")
    wait_for(lambda: (record(api, ns, "squatter") or {}).get("result") == "rejected", "the squatter rejected")
    assert get_job(api, ns, "squatter")["spec"]["suspend"] is True and not job_pods(api, ns, "squatter")

    api.create(t.jobs(), gang_job("all", 8, t.label))
    wait_for(lambda: all_bound_as_recorded(api, ns, "all", 8), "gang all admitted and bound", timeout=150)

    # The admitted record of "all", copied onto another Job: not this Job's, so queued again (the
    # cluster is full: it waits, suspended, its record gone).
    copycat = gang_job("copycat", 8, t.label)
    copied = get_job(api, ns, "all")["metadata"]["annotations"][ADMISSION]
    copycat["metadata"]["annotations"] = {ADMISSION: copied}
    api.create(t.jobs(), copycat)
    wait_for(lambda: "UntrustedAdmissionRecord" in events(api, ns, "copycat"), "the copycat's Event")
    wait_for(lambda: record(api, ns, "copycat") is None and "Waiting" in events(api, ns, "copycat"),
             "the copycat queued again")
    assert get_job(api, ns, "copycat")["spec"]["suspend"] is True and not job_pods(api, ns, "copycat")


def test_a_job_suspended_after_admission_stays_suspended(tenant: Tenant) -> None:
    """The tenant suspends its admitted gang: the controller leaves it suspended (with an Event) and
    its slots go to the next gang."""
    t, api, ns = tenant, tenant.api, tenant.namespace
    t.cluster.start_controller("--listen", "127.0.0.1:0", "--resync-seconds", "2")
    name = created_job(t, gang_job("first", 4, t.label))
    wait_for(lambda: all_bound_as_recorded(api, ns, name, 4), "gang first admitted and bound")
    decision = (record(api, ns, name) or {})["decision"]
    status, out = t.request("PATCH", f"apis/batch/v1/namespaces/{{ns}}/jobs/{name}",
                            {"spec": {"suspend": True}}, MERGE)
    assert status == 200, out
    wait_for(lambda: "SuspendedAfterAdmission" in events(api, ns, name), "the SuspendedAfterAdmission Event")
    created_job(t, gang_job("next", 8, t.label))
    wait_for(lambda: all_bound_as_recorded(api, ns, "next", 8), "gang next admitted and bound", timeout=150)
    job = get_job(api, ns, name)
    assert job["spec"]["suspend"] is True and (record(api, ns, name) or {})["decision"] == decision


def test_the_decision_wins_over_placements_the_template_came_with(tenant: Tenant) -> None:
    """A queued Job whose template came with our gate, the placement policy's label and placements and a
    zone of its own (the admin's here: a tenant is refused them): its pod lands where the record says."""
    t, api, ns = tenant, tenant.api, tenant.namespace
    job = copy.deepcopy(queued("bait", t.label, count=1,
                               notes={"topolet.io/placements": "nowhere:3", "topolet.io/numa-zone": "3"}))
    job["spec"]["template"]["metadata"]["labels"] = {BY_INDEX: "true"}
    job["spec"]["template"]["spec"]["schedulingGates"] = [{"name": GATE}]
    api.create(t.jobs(), job)
    t.cluster.start_controller("--listen", "127.0.0.1:0", "--resync-seconds", "2")
    wait_for(lambda: all_bound_as_recorded(api, ns, "bait", 1), "the bait placed where its record says")
    (pod,) = job_pods(api, ns, "bait")
    assert "nowhere" not in json.dumps(pod["metadata"].get("annotations") or {})
