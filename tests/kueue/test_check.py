"""The `topolet.io/topology-fit` AdmissionCheck of `topolet controller --kueue on` on the test cluster (real
kube-apiserver, kube-controller-manager, kube-scheduler, simulated nodes served by real agents), with
Kueue's own CRDs (v0.17.0, from the Go module cache) installed.  Here the test plays Kueue's part on
the Workloads (reserving quota, resetting a check to Pending, finishing), so each step of the check is
driven and observed exactly; `test_e2e.py` runs the same check under real Kueue.

Each node of DUMP has 4 NUMA zones of 16 CPUs; single-numa-node pods of 12 CPUs take a zone each, so
the two nodes hold 8 of them and a pod of 20 CPUs can never fit."""

from __future__ import annotations

import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import REPO, require
from tests.controlplane.cluster import Cluster, install_mutating_policy
from tests.controlplane.fixtures import IN_CI, api, cluster, cluster_session, namespace
from tests.kube.kubelet_standin import wait_for

try:
    from agent.admission.kueue.workloads import FAILSAFE_LABEL
    from agent.errors import KubeAPIError
    from agent.kubeapi.client import KubeClient
except ImportError:
    if IN_CI:
        raise
    pytest.skip("the `kubernetes` Python client is not installed", allow_module_level=True)

__all__ = ["api", "cluster", "cluster_session", "namespace"]

DUMP = "64fake-4n2s2ca2c2t"
KUEUE_VERSION = "v0.17.0"
KUEUE = "/apis/kueue.x-k8s.io/v1beta2"
CONTROLLER_NAME = "topolet.io/topology-fit"
FAILSAFE = FAILSAFE_LABEL[0]
POLICY = REPO / "daemonset" / "components" / "kueue" / "placement-policy.yaml"
STAMP = "2026-01-01T00:00:00Z"


def kueue_crd_dir() -> Path:
    """config/components/crd/bases of the fetched Kueue module (tests/controlplane/build.sh fetches it)."""
    try:
        cache = subprocess.run(["go", "env", "GOMODCACHE"], capture_output=True, text=True,
                               check=False).stdout.strip()
    except FileNotFoundError:
        cache = ""
    root = Path(cache or Path.home() / "go" / "pkg" / "mod")
    return root / "sigs.k8s.io" / f"kueue@{KUEUE_VERSION}" / "config" / "components" / "crd" / "bases"


def install_kueue_crds(api: KubeClient) -> None:
    """Create Kueue's CRDs (idempotent) and wait until Workloads and AdmissionChecks are served."""
    crds = kueue_crd_dir()
    require(crds.is_dir(), f"Kueue {KUEUE_VERSION}'s CRDs at {crds} (tests/controlplane/build.sh kueue)")
    for path in sorted(crds.glob("*.yaml")):
        try:
            api.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                       yaml.safe_load(path.read_text()))
        except KubeAPIError as exc:
            if exc.status != 409:
                raise

    def served() -> bool:
        try:
            api.list(f"{KUEUE}/workloads")
            api.list(f"{KUEUE}/admissionchecks")
            return True
        except KubeAPIError:
            return False

    wait_for(served, "Kueue's CRDs to be served", timeout=60)


def install_policy(api: KubeClient) -> None:
    """Install the kueue component's MutatingAdmissionPolicy (idempotent) and wait until it applies: a
    dry-run create of a pod it should pin comes back pinned."""
    install_mutating_policy(api, POLICY, {"nodeSelector": {FAILSAFE: "true"}})


@pytest.fixture
def nodes(cluster: Cluster, dump_root: Callable[[str], Path]) -> tuple[str, list[str]]:
    """Two simulated nodes with a label only this test's pods select, once their NRTs are published."""
    return cluster.labelled_nodes("kq", dump_root(DUMP))


@pytest.fixture
def check(api: KubeClient, cluster: Cluster) -> Iterator[str]:
    """A fresh AdmissionCheck of ours (Kueue's CRDs installed first), deleted after the test."""
    install_kueue_crds(api)
    name = f"fit-{uuid.uuid4().hex[:8]}"
    api.create(f"{KUEUE}/admissionchecks", {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "AdmissionCheck",
                                            "metadata": {"name": name},
                                            "spec": {"controllerName": CONTROLLER_NAME}})
    yield name
    api.request("DELETE", f"{KUEUE}/admissionchecks/{name}")


def template(label: str, cpu: int = 12) -> dict[str, Any]:
    res = {"cpu": str(cpu), "memory": "64Mi"}
    return {"metadata": {"annotations": {"topolet.io/numa-policy": "single-numa-node"}},
            "spec": {"restartPolicy": "Never", "automountServiceAccountToken": False,
                     "nodeSelector": {label: "true"},
                     "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                                     "resources": {"requests": res, "limits": res}}]}}


def submit(api: KubeClient, ns: str, name: str, count: int, label: str, check: str, *, cpu: int = 12,
           indexed: bool = True, also: tuple[str, ...] = ()) -> None:
    """What Kueue's Job integration makes of a queued Job: the suspended Job, its Workload, and (the
    ClusterQueue's quota being free) the quota reserved with our check (and the checks `also`) Pending."""
    spec: dict[str, Any] = {"suspend": True, "parallelism": count, "template": template(label, cpu)}
    if indexed:
        spec.update(completionMode="Indexed", completions=count)
    job = api.create(f"/apis/batch/v1/namespaces/{ns}/jobs",
                     {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name}, "spec": spec})
    api.create(f"{KUEUE}/namespaces/{ns}/workloads", {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
        "metadata": {"name": f"job-{name}", "ownerReferences": [{
            "apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": job["metadata"]["uid"],
            "controller": True, "blockOwnerDeletion": True}]},
        "spec": {"queueName": "lq", "podSets": [{"name": "main", "count": count,
                                                 "template": template(label, cpu)}]}})
    set_status(api, ns, name, check, "Pending", quota=True, also=also)


def set_status(api: KubeClient, ns: str, name: str, check: str, state: str, *, quota: bool,
               finished: bool = False, retry_count: int | None = None, also: tuple[str, ...] = ()) -> None:
    """Kueue's writes: QuotaReserved (and Finished), the admission, our check (and the checks `also`)
    reset to `state`."""
    wl = workload(api, ns, name)
    count = wl["spec"]["podSets"][0]["count"]
    conditions = [{"type": "QuotaReserved", "status": "True" if quota else "False", "reason": "Test",
                   "message": "", "lastTransitionTime": STAMP}]
    if finished:
        conditions.append({"type": "Finished", "status": "True", "reason": "Test", "message": "",
                           "lastTransitionTime": STAMP})
    entry: dict[str, Any] = {"name": check, "state": state, "message": "",
                             "lastTransitionTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if retry_count is not None:
        entry["retryCount"] = retry_count
    status: dict[str, Any] = {"conditions": conditions,
                              "admissionChecks": [entry, *({**entry, "name": n} for n in also)]}
    if quota:
        status["admission"] = {"clusterQueue": "cq", "podSetAssignments": [{
            "name": "main", "count": count, "flavors": {"cpu": "default", "memory": "default"},
            "resourceUsage": {"cpu": str(12 * count), "memory": f"{64 * count}Mi"}}]}
    api.patch(f"{KUEUE}/namespaces/{ns}/workloads/job-{name}/status", {"status": status},
              "application/merge-patch+json")


def workload(api: KubeClient, ns: str, name: str) -> dict[str, Any]:
    return api.get(f"{KUEUE}/namespaces/{ns}/workloads/job-{name}")


def state_of(api: KubeClient, ns: str, name: str, check: str) -> dict[str, Any]:
    for entry in workload(api, ns, name).get("status", {}).get("admissionChecks") or []:
        if entry["name"] == check:
            return dict(entry)
    return {}


def in_state(api: KubeClient, ns: str, name: str, check: str, state: str) -> dict[str, Any] | None:
    got = state_of(api, ns, name, check)
    return got if got.get("state") == state else None


def slots(entry: dict[str, Any]) -> list[tuple[str, int]]:
    """The (node, zone) per pod a Ready state's podSetUpdates name."""
    (update,) = entry["podSetUpdates"]
    text = (update.get("annotations") or {}).get("topolet.io/placements")
    if text is not None:
        assert update["nodeSelector"] == {FAILSAFE: "true"}
        return [(n, int(z)) for n, z in (e.split(":") for e in text.split(","))]
    return [(update["nodeSelector"]["kubernetes.io/hostname"],
             int(update["annotations"]["topolet.io/numa-zone"]))]


def active(api: KubeClient, check: str) -> bool:
    ac = api.get(f"{KUEUE}/admissionchecks/{check}")
    return any(c["type"] == "Active" and c["status"] == "True"
               for c in ac.get("status", {}).get("conditions") or [])


def managers(entry_owner: dict[str, Any]) -> set[str]:
    return {m["manager"] for m in entry_owner["metadata"].get("managedFields") or []
            if m.get("subresource") == "status"}


def workload_events(api: KubeClient, ns: str, name: str) -> list[tuple[str, str, str]]:
    """(type, reason, message) of the controller's Events on Workload job-<name>, oldest first."""
    out = api.list(f"/api/v1/namespaces/{ns}/events",
                   {"fieldSelector": f"involvedObject.kind=Workload,involvedObject.name=job-{name}"})
    items = sorted(out.get("items") or [],
                   key=lambda e: (e.get("firstTimestamp") or "", e["metadata"]["name"]))
    return [(e["type"], e["reason"], e["message"]) for e in items
            if e.get("reportingComponent") == "topolet.io/controller"
            and e["involvedObject"].get("apiVersion") == "kueue.x-k8s.io/v1beta2"]


# -- tests -------------------------------------------------------------------------------------------

def test_ready_retry_rejected_then_ready_once_capacity_frees(
        cluster: Cluster, api: KubeClient, namespace: str, nodes: tuple[str, list[str]], check: str) -> None:
    label, names = nodes
    cluster.start_controller("--resync-seconds", "2", "--kueue", "on")
    wait_for(lambda: active(api, check), "the check to be Active")

    # 6 pods of 12 CPUs: 6 of the 8 zones, each pod in a zone of its own, by completion index.
    submit(api, namespace, "a", 6, label, check)
    ready = wait_for(lambda: in_state(api, namespace, "a", check, "Ready"), "a Ready")
    placed = slots(ready)
    assert len(placed) == 6 and len(set(placed)) == 6 and {n for n, _ in placed} <= set(names)
    assert "topolet.io/topology-fit" in managers(workload(api, namespace, "a"))

    # 4 more do not fit now: Retry, naming the constraint, with the first backoff step.
    submit(api, namespace, "b", 4, label, check)
    retry = wait_for(lambda: in_state(api, namespace, "b", check, "Retry"), "b Retry")
    assert retry["requeueAfterSeconds"] == 5
    assert "does not fit now" in retry["message"] and "zone" in retry["message"], retry["message"]
    # ... and an Event on the Workload says so.
    told = wait_for(lambda: workload_events(api, namespace, "b"), "a Waiting Event on b")
    assert told == [("Normal", "Waiting", retry["message"])], told

    # 20 CPUs in one zone of 16: never.
    submit(api, namespace, "huge", 1, label, check, cpu=20)
    rejected = wait_for(lambda: in_state(api, namespace, "huge", check, "Rejected"), "huge Rejected")
    assert "can never fit" in rejected["message"]
    told = wait_for(lambda: workload_events(api, namespace, "huge"), "a Rejected Event on huge")
    assert told == [("Warning", "Rejected", rejected["message"])], told

    # One pod on the 2 free zones, not indexed: pinned by node selector and zone, no policy needed.
    submit(api, namespace, "one", 1, label, check, indexed=False)
    one = wait_for(lambda: in_state(api, namespace, "one", check, "Ready"), "one Ready")
    (update,) = one["podSetUpdates"]
    assert FAILSAFE not in update["nodeSelector"]
    assert not set(slots(one)) & set(placed)

    # Kueue requeues b (Pending, retryCount 1) while a still runs: Retry again, backoff doubled.
    set_status(api, namespace, "b", check, "Pending", quota=True, retry_count=1)
    retry = wait_for(lambda: in_state(api, namespace, "b", check, "Retry"), "b Retry again")
    assert retry["requeueAfterSeconds"] == 10

    # a finishes: its zones free, and b, requeued, fits them.
    set_status(api, namespace, "a", check, "Ready", quota=True, finished=True)
    set_status(api, namespace, "b", check, "Pending", quota=True, retry_count=2)
    ready_b = wait_for(lambda: in_state(api, namespace, "b", check, "Ready"), "b Ready once a finished")
    assert not set(slots(ready_b)) & set(slots(one))


def test_every_check_of_ours_on_a_workload_is_decided(
        cluster: Cluster, api: KubeClient, namespace: str, nodes: tuple[str, list[str]], check: str) -> None:
    """Two AdmissionChecks of ours Pending on one Workload: one decision sets both Ready with the same
    podSetUpdates.  One more added once the Workload is Ready gets that same state."""
    label, names = nodes
    more = [f"{check}-{i}" for i in (2, 3)]
    for name in more:
        api.create(f"{KUEUE}/admissionchecks", {"apiVersion": "kueue.x-k8s.io/v1beta2",
                                                "kind": "AdmissionCheck", "metadata": {"name": name},
                                                "spec": {"controllerName": CONTROLLER_NAME}})
    try:
        cluster.start_controller("--resync-seconds", "2", "--kueue", "on")
        wait_for(lambda: all(active(api, c) for c in (check, *more)), "the checks to be Active")
        submit(api, namespace, "a", 2, label, check, also=(more[0],))
        first = wait_for(lambda: in_state(api, namespace, "a", check, "Ready"), "a Ready")
        second = wait_for(lambda: in_state(api, namespace, "a", more[0], "Ready"), "a Ready on the second")
        assert second["podSetUpdates"] == first["podSetUpdates"]
        assert len(slots(first)) == 2 and {n for n, _ in slots(first)} <= set(names)

        # Kueue adds the state of a check new on the ClusterQueue as Pending.
        states = workload(api, namespace, "a")["status"]["admissionChecks"]
        late = {"name": more[1], "state": "Pending", "message": "",
                "lastTransitionTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        api.patch(f"{KUEUE}/namespaces/{namespace}/workloads/job-a/status",
                  {"status": {"admissionChecks": [*states, late]}}, "application/merge-patch+json")
        third = wait_for(lambda: in_state(api, namespace, "a", more[1], "Ready"), "a Ready on the late one")
        assert third["podSetUpdates"] == first["podSetUpdates"]
        # Still the one decision: the check's first state is untouched.
        assert in_state(api, namespace, "a", check, "Ready") == first
    finally:
        for name in more:
            api.request("DELETE", f"{KUEUE}/admissionchecks/{name}")


def test_one_ledger_with_the_job_route(
        cluster: Cluster, api: KubeClient, namespace: str, nodes: tuple[str, list[str]], check: str) -> None:
    """A Ready Workload's zones are not given to a queued Job, nor a queued Job's to a Workload."""
    label, _ = nodes
    cluster.start_controller("--resync-seconds", "2", "--kueue", "on")
    submit(api, namespace, "w", 6, label, check)
    wait_for(lambda: in_state(api, namespace, "w", check, "Ready"), "w Ready")
    job = {"apiVersion": "batch/v1", "kind": "Job",
           "metadata": {"name": "queued", "labels": {"topolet.io/queue": "default"}},
           "spec": {"suspend": True, "parallelism": 4, "completionMode": "Indexed", "completions": 4,
                    "template": template(label)}}
    api.create(f"/apis/batch/v1/namespaces/{namespace}/jobs", job)

    def waiting() -> bool:
        out = api.list(f"/api/v1/namespaces/{namespace}/events",
                       {"fieldSelector": "involvedObject.kind=Job,involvedObject.name=queued"})
        return any(e["reason"] == "Waiting" for e in out.get("items") or [])

    wait_for(waiting, "the queued Job to wait behind the Workload's zones")
    got = api.get(f"/apis/batch/v1/namespaces/{namespace}/jobs/queued")
    assert "topolet.io/admission" not in (got["metadata"].get("annotations") or {})

    # And the other way: 2 zones are left, so a Workload of 2 fits and one more of 1 does not.
    submit(api, namespace, "two", 2, label, check)
    wait_for(lambda: in_state(api, namespace, "two", check, "Ready"), "two Ready")
    submit(api, namespace, "three", 1, label, check)
    wait_for(lambda: in_state(api, namespace, "three", check, "Retry"), "three Retry")


def test_kill_9_right_after_a_ready_write_then_restart(
        cluster: Cluster, api: KubeClient, namespace: str, nodes: tuple[str, list[str]], check: str) -> None:
    """The decision lives only on the Workload: a restarted controller rebuilds the ledger from it."""
    label, _ = nodes
    crashing = cluster.start_controller("--resync-seconds", "2", "--kueue", "on",
                                        "--crash-at", "after-decision")
    submit(api, namespace, "a", 6, label, check)
    wait_for(lambda: crashing.popen.poll() is not None, "the controller to kill itself after the decision")
    assert crashing.popen.returncode == -signal.SIGKILL
    first = in_state(api, namespace, "a", check, "Ready")
    assert first is not None

    cluster.start_controller("--resync-seconds", "2", "--kueue", "on")
    submit(api, namespace, "b", 4, label, check)
    retry = wait_for(lambda: in_state(api, namespace, "b", check, "Retry"), "b Retry: a's zones are held")
    assert "does not fit now" in retry["message"]
    assert in_state(api, namespace, "a", check, "Ready") == first  # decided once, never again
    # b's 2 zones are still there for a Workload that fits them: nothing leaked either.
    submit(api, namespace, "c", 2, label, check)
    ready_c = wait_for(lambda: in_state(api, namespace, "c", check, "Ready"), "c Ready")
    assert not set(slots(ready_c)) & set(slots(first))


def test_the_policy_pins_each_pod_by_index_and_holds_what_it_cannot_read(
        cluster: Cluster, api: KubeClient, namespace: str, nodes: tuple[str, list[str]]) -> None:
    """The Job as Kueue starts it from a Ready state (podSetUpdates merged into the template): the API
    server pins each pod as the Job controller creates it, the scheduler binds it there and the
    node's agent pins it in the zone; a pod whose index has no slot stays Pending (fail-safe)."""
    label, names = nodes
    install_policy(api)
    tpl = template(label)
    tpl["metadata"]["annotations"]["topolet.io/placements"] = f"{names[0]}:2,{names[1]}:0"
    tpl["spec"]["nodeSelector"][FAILSAFE] = "true"
    api.create(f"/apis/batch/v1/namespaces/{namespace}/jobs", {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "started"},
        "spec": {"parallelism": 3, "completions": 3, "completionMode": "Indexed", "template": tpl}})

    def pods() -> dict[str, dict[str, Any]]:
        out = api.list(f"/api/v1/namespaces/{namespace}/pods",
                       {"labelSelector": "batch.kubernetes.io/job-name=started"})
        return {p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]: p
                for p in out.get("items") or []}

    wait_for(lambda: len(pods()) == 3 and all(pods()[i]["spec"].get("nodeName") for i in ("0", "1")),
             "pods 0 and 1 bound")
    got = pods()
    for index, (node, zone) in (("0", (names[0], 2)), ("1", (names[1], 0))):
        pod = got[index]
        assert pod["spec"]["nodeName"] == node
        assert pod["spec"]["nodeSelector"] == {label: "true", "kubernetes.io/hostname": node}
        ann = pod["metadata"]["annotations"]
        assert ann["topolet.io/numa-zone"] == str(zone) and "topolet.io/placements" not in ann
        sim = cluster.nodes[node]
        allocs = wait_for(lambda p=pod, n=sim: [a for a in n.state().allocations
                                                if a.owner.pod_uid == p["metadata"]["uid"]],
                          "the agent's allocation")
        assert {sim.topology.numa_of(c) for c in allocs[0].cpus} == {zone}
    time.sleep(3)  # the scheduler has had its chance at pod 2
    stray = pods()["2"]
    assert not stray["spec"].get("nodeName") and stray["spec"]["nodeSelector"][FAILSAFE] == "true"


def test_kueue_auto_is_on_only_where_the_controller_may_read_kueue(
        cluster: Cluster, api: KubeClient, namespace: str) -> None:
    """`--kueue auto`'s probe: on with Kueue served and readable; off (None) for an identity without
    RBAC for it, whose reflectors would never sync and hold up the Job route."""
    from agent.admission.kueue.check import kueue_served

    install_kueue_crds(api)
    assert kueue_served(api) is True
    wait_for(lambda: _service_account(api, namespace), "the namespace's default service account")
    token = cluster.plane.mint_token(namespace, "default")
    with cluster.plane.client(token) as limited:
        assert kueue_served(KubeClient(limited)) is None


def _service_account(api: KubeClient, namespace: str) -> bool:
    try:
        api.get(f"/api/v1/namespaces/{namespace}/serviceaccounts/default")
        return True
    except KubeAPIError:
        return False
