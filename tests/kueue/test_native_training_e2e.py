"""The native route for JobSets and TrainJobs end to end: one labelled `topolet.io/queue` and created
suspended is admitted whole by `topolet controller` (no Kueue in the way), its pods placed by rank.

Real parts: the API server, kube-controller-manager's Job controller, the kube-scheduler, the real
JobSet controller v0.11.1 and Kubeflow Trainer v2.2.0 (tests/controlplane/operators.py, on the
session's Kueue cluster, whose operators this test shares), daemonset/controller/placement-policy.yaml
and one agent per node.  Each node of DUMP has 4 NUMA zones of 16 CPUs: single-numa-node pods of 12
CPUs take a zone each, so a JobSet of 2 Jobs × 3 such pods (a TrainJob of 6 nodes) spans both nodes by
construction and two of them never fit at once.

The controller writes the record, our gate and each replicated Job's slots by rank into the JobSet's
templates (a TrainJob's: into its runtime patch, which Trainer merges into its JobSet), and
unsuspends it, in one write; the JobSet controller copies the templates into its Jobs as it resumes
them; the placement policy pins each pod to its rank's slot (job index × 3 + completion
index) as the Job controller creates it.  A kill -9 right after the first decision books nothing twice;
suspending the running JobSet releases its slots (the next one runs); deleting one does too.  The
templates carry a forged completion index, which the Job controller overwrites: it moves no pod (the
job index is the fields policy's: tests/kueue/test_training_fields.py)."""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agent.api.ranks import RankRule
from tests.admission.test_tenants import refused_by_policy
from tests.controlplane.fixtures import kueue, kueue_session, operators
from tests.controlplane.kubectl import api_request
from tests.controlplane.kueue import KueueScope
from tests.controlplane.operators import Operators, collection_path, jobset, trainjob
from tests.kube.kubelet_standin import wait_for
from tests.kueue.test_check import DUMP
from tests.kueue.test_check_e2e import NUMA
from tests.kueue.test_check_fields import POLICY_TIMEOUT_S, shipped
from tests.kueue.test_training_fields import service_account

__all__ = ["kueue", "kueue_session", "operators", "shipped"]

pytestmark = pytest.mark.integration

REQUESTS = {"cpu": "12", "memory": "64Mi"}
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
JOB_INDEX = "jobset.sigs.k8s.io/job-index"
ADMISSION = "topolet.io/admission"
FORGED = {COMPLETION_INDEX: "0"}  # in the templates: the Job controller writes the real one


def _jobset(name: str, label: str) -> dict[str, Any]:
    body = jobset(name, None, replicas=2, pods=3, requests=REQUESTS)
    body["metadata"]["labels"] = {"topolet.io/queue": "default"}
    body["spec"]["suspend"] = True
    template = body["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    template["metadata"] = {"annotations": {**NUMA, **FORGED}, "labels": dict(FORGED)}
    template["spec"]["nodeSelector"] = {label: "true"}
    return body


def _trainjob(name: str, label: str) -> dict[str, Any]:
    body = trainjob(name, None, nodes=6, requests=REQUESTS)
    body["metadata"]["labels"] = {"topolet.io/queue": "default"}
    body["spec"]["suspend"] = True
    body["spec"]["trainer"]["resourcesPerNode"]["limits"] = dict(REQUESTS)
    # The tenant's own runtime patch: the NUMA policy and the nodes (no placement field).
    body["spec"]["runtimePatches"] = [{"manager": "tests.topolet.io/mine", "trainingRuntimeSpec": {
        "template": {"spec": {"replicatedJobs": [{"name": "node", "template": {"spec": {"template": {
            "metadata": {"annotations": {**NUMA, **FORGED}, "labels": dict(FORGED)},
            "spec": {"nodeSelector": {label: "true"}}}}}}]}}}}]
    return body


@dataclass(frozen=True)
class Kind:
    kind: str
    body: Callable[[str, str], dict[str, Any]]
    rule: RankRule  # of its one replicated Job's pods


KINDS = [Kind("JobSet", _jobset, RankRule(COMPLETION_INDEX, JOB_INDEX, 3)),
         Kind("TrainJob", _trainjob, RankRule(COMPLETION_INDEX, JOB_INDEX, 6))]


class Native:
    """Two agent-served nodes only this test's pods select, a fresh namespace, and the controller."""

    def __init__(self, kueue: KueueScope, dump_root: Callable[[str], Path], kind: Kind = KINDS[0],
                 *controller_args: str) -> None:
        self.kueue, self.api, self.kind = kueue, kueue.api, kind
        self.label, self.nodes = kueue.cluster.labelled_nodes("js", dump_root(DUMP))
        self.ns = kueue.namespace("js")
        self.path = collection_path(kind.kind, self.ns)
        self.controller = self.start(*controller_args)

    def start(self, *args: str) -> Any:
        return self.kueue.cluster.start_controller("--resync-seconds", "2", "--kueue", "off", *args)

    def submit(self, name: str) -> str:
        return str(self.api.create(self.path, self.kind.body(name, self.label))["metadata"]["uid"])

    def get(self, name: str) -> dict[str, Any]:
        return self.api.get(f"{self.path}/{name}")  # type: ignore[no-any-return]

    def record(self, name: str) -> dict[str, Any] | None:
        text = (self.get(name)["metadata"].get("annotations") or {}).get(ADMISSION)
        return None if text is None else json.loads(text)

    def pods(self, name: str) -> list[dict[str, Any]]:
        listed = self.api.list(f"/api/v1/namespaces/{self.ns}/pods",
                               {"labelSelector": f"jobset.sigs.k8s.io/jobset-name={name}"})
        return [p for p in listed.get("items") or [] if not p["metadata"].get("deletionTimestamp")]

    def events(self, uid: str) -> list[str]:
        listed = self.api.list(f"/api/v1/namespaces/{self.ns}/events",
                               {"fieldSelector": f"involvedObject.uid={uid}"})
        return [str(e.get("reason")) for e in listed.get("items") or []]

    def placed_by_rank(self, name: str) -> bool:
        """Every pod bound on its rank's slot of the record, in its zone, pinned there by the node's
        agent; one pod a slot, both nodes."""
        rec = self.record(name)
        pods = self.pods(name)
        if (rec is None or rec["result"] != "admitted" or len(pods) != 6
                or not all(p["spec"].get("nodeName") for p in pods)):
            return False
        ranks, nodes = [], set()
        for pod in pods:
            meta = pod["metadata"]
            rank = self.kind.rule.rank(meta)
            assert rank is not None, meta
            slot = rec["placement"][str(rank)]
            assert pod["spec"]["nodeName"] == slot["node"], (rank, slot)
            assert meta["annotations"]["topolet.io/numa-zone"] == str(slot["zone"])
            assert not {"topolet.io/placements", "topolet.io/placement-rank"} & set(meta["annotations"])
            assert not pod["spec"].get("schedulingGates")
            sim = self.kueue.cluster.nodes[slot["node"]]
            allocs = [a for a in sim.state().allocations if a.owner.pod_uid == meta["uid"]]
            if not allocs:
                return False
            assert {sim.topology.numa_of(c) for c in allocs[0].cpus} == {slot["zone"]}
            ranks.append(rank)
            nodes.add(slot["node"])
        assert sorted(ranks) == list(range(6)), ranks
        assert len(nodes) == 2
        return True


@pytest.mark.parametrize("kind", KINDS, ids=[k.kind for k in KINDS])
def test_a_gang_queued_natively_is_admitted_whole_and_placed_by_rank(
        kueue: KueueScope, operators: Operators, dump_root: Callable[[str], Path], kind: Kind) -> None:
    """Two gangs queued, zones for one; the controller is killed right after its first decision.
    After the restart the admitted one runs placed by rank and the other waits suspended (never both
    admitted); suspending the first releases its slots and the second runs; deleting the second lets a
    third run."""
    assert operators.running("jobset") and operators.running("trainer")
    s = Native(kueue, dump_root, kind, "--crash-at", "after-decision")
    uids = {name: s.submit(name) for name in ("a", "b")}

    def admitted() -> list[str]:
        return [n for n in uids if (s.record(n) or {}).get("result") == "admitted"]

    wait_for(lambda: s.controller.popen.poll() is not None,
             "the controller to kill itself after its first decision", timeout=120)
    assert s.controller.popen.returncode == -signal.SIGKILL
    (first,) = wait_for(admitted, f"one {kind.kind} admitted")
    decided = s.record(first)
    assert decided is not None
    s.start()
    (second,) = [n for n in uids if n != first]

    def one_runs_the_other_waits() -> bool:
        assert admitted() == [first], f"both {kind.kind}s admitted at once: double-booked"
        assert s.get(second)["spec"]["suspend"] is True
        return "Waiting" in s.events(uids[second]) and s.placed_by_rank(first)

    wait_for(one_runs_the_other_waits, f"{first} placed by rank, {second} waiting", timeout=180)
    assert s.record(first) == decided, "the admitted gang was decided again after the restart"

    # Suspended again: its pods go, its slots are released, and the second runs.
    s.api.patch(f"{s.path}/{first}", {"spec": {"suspend": True}}, "application/merge-patch+json")
    wait_for(lambda: s.placed_by_rank(second), f"{second} placed once {first} is suspended", timeout=240)
    assert "Admitted" in s.events(uids[second])  # (the first was killed before its Event)
    assert "SuspendedAfterAdmission" in s.events(uids[first])
    assert s.get(first)["spec"]["suspend"] is True  # never unsuspended but by its admitting write

    # Deleted: the third takes its slots.
    uids["c"] = s.submit("c")
    wait_for(lambda: "Waiting" in s.events(uids["c"]), f"c waiting behind {second}", timeout=60)
    s.api.request("DELETE", f"{s.path}/{second}", body={"propagationPolicy": "Foreground"},
                  content_type="application/json")
    wait_for(lambda: s.placed_by_rank("c"), f"c placed once {second} is deleted", timeout=240)


def test_a_jobset_that_can_never_fit_is_rejected_and_stays_suspended(
        kueue: KueueScope, operators: Operators, dump_root: Callable[[str], Path]) -> None:
    """A JobSet whose pods fit no zone anywhere gets a rejected record and a Warning Event; one whose
    pods would run in waves (parallelism under completions) is told why and left alone."""
    assert operators.running("jobset")
    s = Native(kueue, dump_root)
    big = jobset("big", None, replicas=1, pods=1, requests={"cpu": "20", "memory": "64Mi"})
    big["metadata"]["labels"] = {"topolet.io/queue": "default"}
    big["spec"]["suspend"] = True
    template = big["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    template["metadata"] = {"annotations": dict(NUMA)}
    template["spec"]["nodeSelector"] = {s.label: "true"}
    uid = str(s.api.create(s.path, big)["metadata"]["uid"])
    wait_for(lambda: (s.record("big") or {}).get("result") == "rejected", "the 20-CPU JobSet rejected")
    wait_for(lambda: "Rejected" in s.events(uid), "the Rejected Event (sent off the pass)")
    assert s.get("big")["spec"]["suspend"] is True
    plain = jobset("plain", None, replicas=1, pods=2, requests=REQUESTS)
    plain["metadata"]["labels"] = {"topolet.io/queue": "default"}
    plain["spec"]["suspend"] = True
    plain["spec"]["replicatedJobs"][0]["template"]["spec"]["parallelism"] = 1  # its pods in two waves
    uid = str(s.api.create(s.path, plain)["metadata"]["uid"])
    wait_for(lambda: "InvalidJobSet" in s.events(uid), "the JobSet of pods in waves told why")
    assert s.record("plain") is None and s.get("plain")["spec"]["suspend"] is True


def test_a_tenant_cannot_admit_or_place_its_own_jobset(
        kueue: KueueScope, operators: Operators, shipped: Any) -> None:
    """With the fields policy as shipped, a tenant (RBAC for JobSets in its namespace) cannot create a
    queued JobSet unsuspended, unsuspend its queued JobSet, write an admission record on it, or carry
    placement fields or index labels in its templates: only topolet-controller's admitting write does
    the first three, and the policy refuses the rest to everyone but the controller."""
    assert operators.running("jobset")
    ns = kueue.namespace("jt")
    token = service_account(kueue, ns, "tenant", [{"apiGroups": ["jobset.x-k8s.io"], "resources": ["jobsets"],
                                                  "verbs": ["get", "list", "create", "update", "patch"]}], ns)
    plane, path = kueue.cluster.plane, collection_path("JobSet", ns)

    def queued(name: str, suspend: bool = True, notes: dict[str, str] | None = None,
               labels: dict[str, str] | None = None) -> dict[str, Any]:
        body = jobset(name, None, replicas=2, pods=3)
        body["metadata"]["labels"] = {"topolet.io/queue": "default"}
        body["metadata"]["annotations"] = dict(notes or {})
        body["spec"]["suspend"] = suspend
        body["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["metadata"] = {
            "labels": dict(labels or {})}
        return body

    wait_for(lambda: refused_by_policy(*api_request(plane, "POST", f"{path}?dryRun=All", token,
                                                    queued("probe", suspend=False))),
             "the policy to refuse a tenant's unsuspended queued JobSet", timeout=POLICY_TIMEOUT_S)
    record = json.dumps({"version": 1, "result": "admitted", "decision": "forged", "time": "t",
                         "placement": {"0": {"node": "n", "zone": 0}}})
    for what, body in (("a record", queued("rec", notes={ADMISSION: record})),
                       ("a job index", queued("idx", labels={JOB_INDEX: "0"})),
                       ("placements", queued("pl", labels={"topolet.io/placements-by-index": "true"}))):
        assert refused_by_policy(*api_request(plane, "POST", f"{path}?dryRun=All", token, body)), what
    status, made = api_request(plane, "POST", path, token, queued("mine"))
    assert status == 201, made
    for what, patch in (("unsuspend", {"spec": {"suspend": False}}),
                        ("record", {"metadata": {"annotations": {ADMISSION: record}}})):
        status, body = api_request(plane, "PATCH", f"{path}/mine", token, patch,
                                   content_type="application/merge-patch+json")
        assert refused_by_policy(status, body), (what, status, body)
    assert kueue.api.get(f"{path}/mine")["spec"]["suspend"] is True
