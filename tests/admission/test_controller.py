"""`topolet controller` on the test cluster: real kube-apiserver, kube-controller-manager (Job controller,
garbage collector), kube-scheduler, and simulated nodes whose NRTs come from real agents on hwloc dumps.

Each node of DUMP has 4 NUMA zones of 16 CPUs; the tests' gangs ask for single-numa-node pods of 12
CPUs, so a node holds 4 of them and one pod can never have 20."""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from agent.admission.engine.model import ClusterView, Node, Resources, Zone
from agent.admission.report.metrics import capacity_figures
from tests.controlplane.cluster import Cluster
from tests.controlplane.fixtures import IN_CI
from tests.controlplane.harness import free_port
from tests.kube.kubelet_standin import wait_for

try:
    from agent.errors import KubeAPIError
    from agent.kubeapi.client import KubeClient
except ImportError:
    if IN_CI:
        raise
    pytest.skip("the `kubernetes` Python client is not installed", allow_module_level=True)

__all__ = ["wait_for"]

DUMP = "64fake-4n2s2ca2c2t"
QUEUE = "topolet.io/queue"
ADMISSION = "topolet.io/admission"
GATE = "topolet.io/placement"


@pytest.fixture
def nodes(cluster: Cluster, dump_root: Callable[[str], Path]) -> tuple[str, list[str]]:
    """Two simulated nodes with a label only this test's Jobs select, once their NRTs are published."""
    return cluster.labelled_nodes("sim", dump_root(DUMP))


def gang_job(name: str, count: int, label: str, cpu: int = 12, *, indexed: bool = True,
             policy: str = "single-numa-node", queue: str = "default") -> dict[str, Any]:
    res = {"cpu": str(cpu), "memory": "64Mi"}
    spec: dict[str, Any] = {
        "suspend": True, "parallelism": count,
        "template": {"metadata": {"annotations": {"topolet.io/numa-policy": policy}}, "spec": {
            "restartPolicy": "Never", "automountServiceAccountToken": False,
            "nodeSelector": {label: "true"},
            "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                            "resources": {"requests": res, "limits": res}}]}}}
    if indexed:
        spec.update(completionMode="Indexed", completions=count)
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "labels": {QUEUE: queue}},
            "spec": spec}


def get_job(api: KubeClient, ns: str, name: str) -> dict[str, Any]:
    return api.get(f"/apis/batch/v1/namespaces/{ns}/jobs/{name}")


def record(api: KubeClient, ns: str, name: str) -> dict[str, Any] | None:
    text = (get_job(api, ns, name)["metadata"].get("annotations") or {}).get(ADMISSION)
    return json.loads(text) if text else None


def job_pods(api: KubeClient, ns: str, job: str) -> list[dict[str, Any]]:
    out = api.list(f"/api/v1/namespaces/{ns}/pods", {"labelSelector": f"batch.kubernetes.io/job-name={job}"})
    return [p for p in out.get("items") or [] if not p["metadata"].get("deletionTimestamp")]


def events(api: KubeClient, ns: str, job: str) -> list[str]:
    out = api.list(f"/api/v1/namespaces/{ns}/events",
                   {"fieldSelector": f"involvedObject.kind=Job,involvedObject.name={job}"})
    return [e["reason"] for e in out.get("items") or []
            if e.get("reportingComponent") == "topolet.io/controller"]


def delete_job(api: KubeClient, ns: str, name: str) -> None:
    api.request("DELETE", f"/apis/batch/v1/namespaces/{ns}/jobs/{name}",
                body={"propagationPolicy": "Background"}, content_type="application/json")


def pod_zone(pod: dict[str, Any]) -> int:
    """The zone a placed pod names: its `topolet.io/numa-zone`, or (a Job placed on one node) its
    completion index's entry of `topolet.io/placements`, which must name the pod's own node."""
    ann = pod["metadata"].get("annotations") or {}
    if "topolet.io/numa-zone" in ann:
        return int(ann["topolet.io/numa-zone"])
    entry = ann["topolet.io/placements"].split(",")[int(ann["batch.kubernetes.io/job-completion-index"])]
    node, zone = entry.split(":")
    assert node == pod["spec"]["nodeName"], (entry, pod["spec"]["nodeName"])
    return int(zone)


def all_bound_as_recorded(api: KubeClient, ns: str, name: str, count: int) -> bool:
    """Every pod of the Job is bound, ungated, on the node its slot names, with the slot's zone."""
    rec = record(api, ns, name)
    pods = job_pods(api, ns, name)
    if rec is None or rec["result"] != "admitted" or len(pods) != count:
        return False
    placed = []
    for pod in pods:
        ann = pod["metadata"].get("annotations") or {}
        if not pod["spec"].get("nodeName"):
            return False
        assert not any(g["name"] == GATE for g in pod["spec"].get("schedulingGates") or [])
        assert pod["spec"]["nodeSelector"]["kubernetes.io/hostname"] == pod["spec"]["nodeName"]
        placed.append((pod["spec"]["nodeName"], pod_zone(pod)))
        index = ann.get("batch.kubernetes.io/job-completion-index")
        if index is not None:  # Indexed: the slot is the completion index
            assert placed[-1] == (rec["placement"][index]["node"], rec["placement"][index]["zone"])
    # Every slot taken once: the pods' (node, zone) are the record's, as a multiset.
    assert sorted(placed) == sorted((p["node"], p["zone"]) for p in rec["placement"].values())
    return True


def _zones(*pairs: tuple[int, int]) -> tuple[Zone, ...]:
    return tuple(Zone(numa=i, cpu_milli=free * 1000, cpu_capacity_milli=cap * 1000)
                 for i, (free, cap) in enumerate(pairs))


def test_events_are_queued_bounded_and_sent_off_the_pass(api: KubeClient, namespace: str) -> None:
    """`record` never waits on the API: it queues; a full queue drops (counted); the thread sends the rest."""
    from agent.admission.report.events import ObjectEvents

    dropped: list[int] = []
    sender = ObjectEvents(api, "test", on_drop=lambda: dropped.append(1), capacity=2)
    job = {"metadata": {"namespace": namespace, "name": "ev", "uid": str(uuid.uuid4())}}
    for reason in ("Waiting", "Admitted", "Rejected"):  # the thread is not started: the third is dropped
        sender.record(job, "Normal", reason, reason.lower())
    assert sender.dropped == 1 and dropped == [1]
    sender.start()
    sender.stop()
    assert sender.writes == 2 and sender.failures == 0
    assert sorted(events(api, namespace, "ev")) == ["Admitted", "Waiting"]


def test_version_cache_computes_once_per_version_and_forgets_gone_objects() -> None:
    from agent.admission.cluster.store import VersionCache

    calls: list[str] = []

    def compute(pod: Mapping[str, Any]) -> int:
        calls.append(pod["metadata"]["resourceVersion"])
        return len(calls)

    cache = VersionCache(compute)

    def pod(rv: str, uid: str = "u") -> dict[str, Any]:
        return {"metadata": {"uid": uid, "resourceVersion": rv}}

    assert cache.of(pod("1")) == 1 and cache.of(pod("1")) == 1
    assert cache.of(pod("2", "v")) == 2
    cache.retain([pod("1"), pod("2", "v")])
    assert cache.of(pod("1")) == 1 and cache.of(pod("2", "v")) == 2  # kept, unread or not
    assert cache.of(pod("3")) == 3  # a new version of u
    cache.retain([pod("3")])  # v is gone
    assert cache.of(pod("3")) == 3 and cache.of(pod("2", "v")) == 4
    assert calls == ["1", "2", "3", "2"]


def test_the_store_keeps_a_written_version_over_an_older_watch_event(api: KubeClient) -> None:
    """A write's response stored first, then the watch delivering the version before it: the Job must
    not look undecided again (its ledger entries would be dropped and its capacity given twice)."""
    import threading

    from agent.admission.cluster.store import Reflector

    store = Reflector(api, "/apis/batch/v1/jobs", "jobs", threading.Event())
    job = {"metadata": {"namespace": "ns", "name": "g", "uid": "u1", "resourceVersion": "10"}}
    admitted = {"metadata": {**job["metadata"], "resourceVersion": "12",
                             "annotations": {ADMISSION: "{}"}}}
    store.put(admitted)
    store.apply("MODIFIED", job)  # the Job controller's status write, older than ours
    assert store.snapshot() == [admitted]
    newer = {"metadata": {**admitted["metadata"], "resourceVersion": "13"}}
    store.apply("MODIFIED", newer)
    assert store.snapshot() == [newer]
    # The same name with another uid is another object: it replaces whatever version is stored.
    again = {"metadata": {"namespace": "ns", "name": "g", "uid": "u2", "resourceVersion": "5"}}
    store.apply("ADDED", again)
    assert store.snapshot() == [again]
    store.apply("DELETED", again)
    assert store.snapshot() == []


@pytest.mark.parametrize(("zones", "largest", "ratio"), [
    ((), 0.0, 0.0),
    (_zones((16, 16), (16, 16)), 16.0, 0.0),  # every free CPU in an empty zone
    (_zones((16, 16), (4, 16)), 16.0, 0.2),  # 4 of 20 free CPUs in a used zone
    (_zones((8, 16), (4, 16)), 8.0, 1.0),
    (_zones((0, 16), (0, 16)), 0.0, 0.0),  # full: nothing free, nothing fragmented
])
def test_capacity_figures(zones: tuple[Zone, ...], largest: float, ratio: float) -> None:
    node = Node("n", free=Resources(cpu_milli=30_500, memory=1 << 30, gpus=2), zones=zones)
    figures = capacity_figures(ClusterView(nodes=(node, node)))
    assert figures.free == {"cpu": 61.0, "memory": float(2 << 30), "nvidia.com/gpu": 4.0}
    assert figures.largest_free_zone_cpus == largest
    assert figures.fragmentation_ratio == pytest.approx(ratio)


def scrape(port: int, path: str = "/metrics") -> tuple[int, str]:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, ""
    except OSError:
        return 0, ""


def metric(text: str, series: str) -> float:
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return float("nan")


def test_admits_whole_gangs_rejects_never_waits_and_flags_bad_jobs(
        cluster: Cluster, api: KubeClient, namespace: str, nodes: tuple[str, list[str]]) -> None:
    label, names = nodes
    port = free_port()
    proc = cluster.start_controller("--listen", f"127.0.0.1:{port}", "--resync-seconds", "2")

    api.create(f"/apis/batch/v1/namespaces/{namespace}/jobs", gang_job("a", 4, label))
    wait_for(lambda: all_bound_as_recorded(api, namespace, "a", 4), "gang a admitted and bound")
    rec = record(api, namespace, "a")
    assert rec is not None
    assert {p["node"] for p in rec["placement"].values()} <= set(names)
    # Every pod lands in a zone of its own node: (node, zone) pairs are distinct, 12 of 16 CPUs each.
    assert len({(p["node"], p["zone"]) for p in rec["placement"].values()}) == 4
    # Events go out from their own thread, off the pass: the pods may be bound before it has sent one.
    wait_for(lambda: "Admitted" in events(api, namespace, "a"), "the Admitted event")
    # Four zones of one node hold it: the one-node route pins the pod template, with no gate, and the
    # agent reads each pod's zone from the placements by its completion index.
    (node_a,) = {p["node"] for p in rec["placement"].values()}
    template = get_job(api, namespace, "a")["spec"]["template"]
    assert template["spec"]["nodeSelector"]["kubernetes.io/hostname"] == node_a
    assert not template["spec"].get("schedulingGates")
    assert template["metadata"]["annotations"]["topolet.io/placements"] == ",".join(
        f"{node_a}:{rec['placement'][str(i)]['zone']}" for i in range(4))
    # The node's agent pins each pod in the zone the controller counted on.
    for pod in job_pods(api, namespace, "a"):
        node = cluster.nodes[pod["spec"]["nodeName"]]
        zone = pod_zone(pod)
        allocs = wait_for(lambda p=pod, n=node: [a for a in n.state().allocations
                                                 if a.owner.pod_uid == p["metadata"]["uid"]],
                          "the agent's allocation")
        assert {node.topology.numa_of(c) for c in allocs[0].cpus} == {zone}

    # 20 CPUs in one zone of 16: never.
    api.create(f"/apis/batch/v1/namespaces/{namespace}/jobs", gang_job("huge", 1, label, cpu=20))
    wait_for(lambda: (record(api, namespace, "huge") or {}).get("result") == "rejected", "huge rejected")
    assert get_job(api, namespace, "huge")["spec"]["suspend"] is True
    wait_for(lambda: "Rejected" in events(api, namespace, "huge"), "the Rejected event")

    # A malformed Job: an Event, and the Job is left as it is.
    bad = gang_job("bad", 1, label, policy="tight")
    api.create(f"/apis/batch/v1/namespaces/{namespace}/jobs", bad)
    wait_for(lambda: "InvalidJob" in events(api, namespace, "bad"), "the InvalidJob event")
    got = get_job(api, namespace, "bad")
    assert got["spec"]["suspend"] is True and ADMISSION not in (got["metadata"].get("annotations") or {})
    assert not got["spec"]["template"]["spec"].get("schedulingGates")
    # A malformed topolet.io/admission annotation: the same.
    garbled = gang_job("garbled", 1, label)
    garbled["metadata"]["annotations"] = {ADMISSION: "{not json"}
    api.create(f"/apis/batch/v1/namespaces/{namespace}/jobs", garbled)
    wait_for(lambda: "InvalidAdmissionRecord" in events(api, namespace, "garbled"), "its Event")
    got = get_job(api, namespace, "garbled")
    assert got["spec"]["suspend"] is True and got["metadata"]["annotations"][ADMISSION] == "{not json"

    # 8 pods of 12 CPUs need all 8 zones; a holds 4: not now, and no pod is created meanwhile.
    api.create(f"/apis/batch/v1/namespaces/{namespace}/jobs", gang_job("wide", 8, label))
    wait_for(lambda: "Waiting" in events(api, namespace, "wide"), "the Waiting event")
    time.sleep(3)  # a few more passes: the reason does not change, so no second Waiting event
    assert events(api, namespace, "wide").count("Waiting") == 1
    assert record(api, namespace, "wide") is None and not job_pods(api, namespace, "wide")

    status, text = scrape(port)
    assert status == 200
    assert metric(text, 'topolet_admission_decisions_total{result="admitted"}') >= 1
    assert metric(text, 'topolet_admission_decisions_total{result="rejected"}') >= 1
    assert metric(text, 'topolet_admission_decisions_total{result="error"}') >= 1
    assert metric(text, 'topolet_admission_decisions_total{result="waiting"}') >= 1
    assert metric(text, 'topolet_admission_queue_depth{queue="default"}') == 1  # wide (the built-in queue)
    assert metric(text, 'topolet_admission_nodes{state="usable"}') >= 2
    assert metric(text, "topolet_admission_leader") == 1
    assert scrape(port, "/healthz")[0] == 200

    # a finishes (deleted): its capacity frees and wide goes in, whole.
    delete_job(api, namespace, "a")
    wait_for(lambda: all_bound_as_recorded(api, namespace, "wide", 8), "gang wide admitted and bound",
             timeout=150)

    # SIGTERM: a clean exit.
    proc.stop()
    assert proc.popen.returncode == 0, proc.log_tail()


@pytest.fixture
def one_pod_nodes(cluster: Cluster, dump_root: Callable[[str], Path]) -> str:
    """Eight simulated nodes that take one pod each: every gang of two spans two nodes."""
    tag = uuid.uuid4().hex[:8]
    label = f"test.topolet.io/{tag}"
    names = [cluster.add_node(f"one-{tag}-{i}", dump_root(DUMP), labels={label: "true"}, pods=1).name
             for i in range(8)]
    for name in names:
        wait_for(lambda n=name: cluster.nrt(n), f"the NRT of {name}")
    return label


def test_the_placement_policy_pins_indexed_pods_and_the_controller_patches_the_rest(
        cluster: Cluster, api: KubeClient, namespace: str, one_pod_nodes: str) -> None:
    """With daemonset/controller/placement-policy.yaml installed, the pods of an Indexed Job over
    several nodes are created pinned (no patch); a non-indexed Job's pods, which carry no index, are
    patched one by one.  (Nodes of one pod each: no gang fits one node, where its template is pinned.)"""
    label = one_pod_nodes
    port = free_port()
    cluster.start_controller("--listen", f"127.0.0.1:{port}", "--resync-seconds", "2")
    api.create(f"/apis/batch/v1/namespaces/{namespace}/jobs", gang_job("indexed", 2, label))
    api.create(f"/apis/batch/v1/namespaces/{namespace}/jobs", gang_job("plain", 2, label, indexed=False))
    # Node affinity of the template's own: a required one is kept as it is; beside a preferred one the
    # policy adds the required term on the node's name.
    own = gang_job("own-affinity", 2, label, cpu=4)
    own["spec"]["template"]["spec"]["affinity"] = {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": label, "operator": "Exists"}]}]}}}
    preferred = gang_job("preferred", 2, label, cpu=4)
    preferred["spec"]["template"]["spec"]["affinity"] = {"nodeAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 1, "preference": {"matchExpressions": [{"key": label, "operator": "Exists"}]}}]}}
    for body in (own, preferred):
        api.create(f"/apis/batch/v1/namespaces/{namespace}/jobs", body)
    for name in ("indexed", "plain", "own-affinity", "preferred"):
        wait_for(lambda n=name: all_bound_as_recorded(api, namespace, n, 2), f"gang {name} bound")
    for pod in job_pods(api, namespace, "own-affinity"):
        assert pod["spec"]["affinity"] == own["spec"]["template"]["spec"]["affinity"]
    for pod in job_pods(api, namespace, "preferred"):
        affinity = pod["spec"]["affinity"]["nodeAffinity"]
        assert affinity["preferredDuringSchedulingIgnoredDuringExecution"][0]["weight"] == 1
        assert affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0][
            "matchFields"][0]["values"] == [pod["spec"]["nodeName"]]
    job = get_job(api, namespace, "indexed")
    slots = job["spec"]["template"]["metadata"]["annotations"]["topolet.io/placements"].split(",")
    rec = record(api, namespace, "indexed")
    assert rec is not None
    placed = [rec["placement"][str(i)] for i in range(2)]
    assert slots == [f"{p['node']}:{p['zone']}" for p in placed]
    assert "topolet.io/placements" not in get_job(api, namespace, "plain")["spec"]["template"].get(
        "metadata", {}).get("annotations", {})
    for name in ("indexed", "plain"):
        for pod in job_pods(api, namespace, name):  # the node's agent never sees the slots annotation
            assert "topolet.io/placements" not in pod["metadata"]["annotations"]
            # Both routes also pin by the node's name, which the scheduler narrows to that one node.
            node = pod["spec"]["nodeSelector"]["kubernetes.io/hostname"]
            terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            assert terms["nodeSelectorTerms"] == [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]
            assert pod["spec"]["nodeName"] == node
    status, text = scrape(port)
    assert status == 200
    assert metric(text, "topolet_admission_pods_patched_total") == 2  # plain's two, none of indexed's
    # The policy selects pods by the template's label: the same gated pod without it is left as created.
    assert job["spec"]["template"]["metadata"]["labels"]["topolet.io/placements-by-index"] == "true"
    unlabelled = {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "generateName": "unlabelled-", "annotations": {
            "topolet.io/placements": f"{placed[0]['node']}:0",
            "batch.kubernetes.io/job-completion-index": "0"}},
        "spec": {"schedulingGates": [{"name": "topolet.io/placement"}],
                 "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}}
    dry = api.request("POST", f"/api/v1/namespaces/{namespace}/pods", query={"dryRun": "All"},
                      body=unlabelled, content_type="application/json")
    assert dry["spec"]["schedulingGates"] == [{"name": "topolet.io/placement"}]
    assert "nodeSelector" not in dry["spec"]


def _admitted_once(api: KubeClient, ns: str, name: str, decision: str | None) -> str:
    rec = record(api, ns, name)
    assert rec is not None and rec["result"] == "admitted"
    if decision is not None:
        assert rec["decision"] == decision, "the gang was decided twice"
    return str(rec["decision"])


@pytest.mark.parametrize("step", ["after-decision", "after-unsuspend", "after-pod-patch"])
def test_kill_9_at_a_step_then_restart(
        cluster: Cluster, api: KubeClient, namespace: str, nodes: tuple[str, list[str]], step: str) -> None:
    label, _ = nodes
    crashing = cluster.start_controller("--listen", "127.0.0.1:0", "--resync-seconds", "2",
                                        "--crash-at", step)
    api.create(f"/apis/batch/v1/namespaces/{namespace}/jobs", gang_job("g", 4, label, indexed=False))
    wait_for(lambda: crashing.popen.poll() is not None, f"the controller to kill itself {step}")
    assert crashing.popen.returncode == -signal.SIGKILL
    decision = _admitted_once(api, namespace, "g", None)

    cluster.start_controller("--listen", "127.0.0.1:0", "--resync-seconds", "2")
    wait_for(lambda: all_bound_as_recorded(api, namespace, "g", 4), "the restarted controller to finish g")
    _admitted_once(api, namespace, "g", decision)

    # No capacity leaked: with g gone, a gang needing all 8 zones of both nodes goes in.
    delete_job(api, namespace, "g")
    api.create(f"/apis/batch/v1/namespaces/{namespace}/jobs", gang_job("all", 8, label))
    wait_for(lambda: all_bound_as_recorded(api, namespace, "all", 8), "gang all admitted", timeout=150)


def test_failover_to_the_other_replica(
        cluster: Cluster, api: KubeClient, namespace: str, nodes: tuple[str, list[str]]) -> None:
    label, _ = nodes
    flags = ("--listen", "127.0.0.1:0", "--resync-seconds", "2", "--leader-elect",
             "--lease-duration", "4", "--renew-deadline", "3", "--retry-period", "0.5")
    replicas = {name: cluster.start_controller(*flags, "--identity", name) for name in ("r0", "r1")}

    def holder() -> str | None:
        try:
            lease = api.get("/apis/coordination.k8s.io/v1/namespaces/default/leases/topolet-controller")
        except KubeAPIError:
            return None
        held = lease["spec"].get("holderIdentity")
        return held if held in replicas else None

    first = wait_for(holder, "a leader")
    api.create(f"/apis/batch/v1/namespaces/{namespace}/jobs", gang_job("before", 2, label))
    wait_for(lambda: all_bound_as_recorded(api, namespace, "before", 2), "the leader to admit a gang")

    os.killpg(replicas[first].popen.pid, signal.SIGKILL)
    replicas[first].popen.wait(10)
    other = "r1" if first == "r0" else "r0"
    api.create(f"/apis/batch/v1/namespaces/{namespace}/jobs", gang_job("after", 2, label))
    wait_for(lambda: holder() == other, "the other replica to take the Lease", timeout=60)
    wait_for(lambda: all_bound_as_recorded(api, namespace, "after", 2), "the new leader to admit a gang")
    _admitted_once(api, namespace, "before", str(record(api, namespace, "before")["decision"]))  # type: ignore[index]


def test_not_ready_node_is_left_out(
        cluster: Cluster, api: KubeClient, namespace: str, nodes: tuple[str, list[str]]) -> None:
    label, names = nodes
    cluster.set_ready(names[0], False)
    port = free_port()
    cluster.start_controller("--listen", f"127.0.0.1:{port}", "--resync-seconds", "2")
    # 5 pods of 12 CPUs need 5 zones: only the 4 of the ready node are usable, so not now.
    api.create(f"/apis/batch/v1/namespaces/{namespace}/jobs", gang_job("five", 5, label))
    wait_for(lambda: "Waiting" in events(api, namespace, "five"), "five to wait")
    assert metric(scrape(port)[1], 'topolet_admission_nodes{state="not_ready"}') >= 1
    api.create(f"/apis/batch/v1/namespaces/{namespace}/jobs", gang_job("four", 4, label))
    wait_for(lambda: all_bound_as_recorded(api, namespace, "four", 4), "four admitted and bound")
    assert {p["node"] for p in (record(api, namespace, "four") or {})["placement"].values()} == {names[1]}
    assert record(api, namespace, "five") is None

