"""End to end on the test cluster: a gang of single-numa-node pods on nodes that fit it by node totals but
not by zones.

Real parts throughout: kube-apiserver, kube-controller-manager (Job controller, garbage collector),
kube-scheduler, `topolet controller`, and one `topolet agent --enforcement off` per simulated node
reading a 64-CPU, 4-NUMA-node hardware dump (tests/controlplane/cluster.py). The only stand-in is the
kubelet's API part (pods bound to a simulated node are reported Running).

The cluster: node A has one free zone of 16 CPUs and three zones with 6 free; node B has 6 free in
every zone. A gang of 4 pods × 8 CPUs fits both nodes' totals (34 + 24 free CPUs) but only 2 of its
pods fit a single zone anywhere.

- Without the controller, the plain scheduler binds all 4 pods; at least 2 land where no zone fits
  and their agents refuse them (AllocationFailed Events), while the others hold their CPUs.
- With the controller, the Job stays suspended while the gang does not fit; once node B is emptied it
  is admitted, every pod is bound to the node the controller chose, and that node's agent pins it in
  one zone.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.admission.test_controller import pod_zone
from tests.controlplane.cluster import Cluster, SimNode
from tests.controlplane.fixtures import IN_CI
from tests.kube.kubelet_standin import wait_for

try:
    from agent.kubeapi.client import KubeClient
except ImportError:
    if IN_CI:
        raise
    pytest.skip("the `kubernetes` Python client is not installed", allow_module_level=True)

__all__ = ["wait_for"]

DUMP = "64fake-4n2s2ca2c2t"  # 64 CPUs, 4 NUMA nodes of 16
QUEUE_LABEL = "topolet.io/queue"
ADMISSION_ANNOTATION = "topolet.io/admission"
NUMA_POLICY = "topolet.io/numa-policy"
GANG_PODS, GANG_CPUS = 4, 8
FILLER_CPUS = 10  # leaves 6 CPUs in a 16-CPU zone: no 8-CPU pod fits there


def guaranteed(cpus: int) -> dict[str, Any]:
    res = {"cpu": str(cpus), "memory": "64Mi"}
    return {"requests": res, "limits": dict(res)}


def run_filler(api: KubeClient, namespace: str, node: SimNode, name: str) -> str:
    """A single-numa-node pod of FILLER_CPUS bound to `node` (no scheduler); returns its uid."""
    made = api.create(f"/api/v1/namespaces/{namespace}/pods", {
        "metadata": {"name": name, "annotations": {NUMA_POLICY: "single-numa-node"}},
        "spec": {"nodeName": node.name, "automountServiceAccountToken": False,
                 "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                                 "resources": guaranteed(FILLER_CPUS)}]},
    })
    return str(made["metadata"]["uid"])


def zone_free(cluster: Cluster, node: SimNode) -> list[int]:
    """Available CPUs per NUMA zone in the node's NRT, in zone order ([] before the first NRT)."""
    obj = cluster.nrt(node.name) or {}
    zones = sorted((z for z in obj.get("zones") or [] if z.get("type") == "Node"), key=lambda z: z["name"])
    return [sum(int(r["available"]) for r in z.get("resources") or [] if r["name"] == "cpu") for z in zones]


def fragmented_nodes(cluster: Cluster, api: KubeClient, namespace: str, dump: Path,
                     label: str) -> tuple[SimNode, SimNode, list[str]]:
    """Nodes A (zones free 16/6/6/6) and B (6/6/6/6), their fillers pinned; returns (A, B, B's fillers)."""
    tag = uuid.uuid4().hex[:6]
    a = cluster.add_node(f"a-{tag}", dump, labels={label: "true"})
    b = cluster.add_node(f"b-{tag}", dump, labels={label: "true"})
    for node in (a, b):
        def empty(node: SimNode = node) -> bool:
            return zone_free(cluster, node) == [16] * 4

        wait_for(empty, f"the NRT of {node.name}")
    on_b = []
    for i in range(4):
        if i:  # A keeps one zone free
            run_filler(api, namespace, a, f"fill-a{i}")
        on_b.append(f"fill-b{i}")
        run_filler(api, namespace, b, on_b[-1])
    wait_for(lambda: sorted(zone_free(cluster, a)) == [6, 6, 6, 16], "node A's fillers pinned one per zone")
    wait_for(lambda: zone_free(cluster, b) == [6] * 4, "node B's fillers pinned one per zone")
    return a, b, on_b


def gang_job(name: str, label: str, *, queue: str | None) -> dict[str, Any]:
    """An Indexed Job of GANG_PODS single-numa-node pods of GANG_CPUS; suspended and queued with a queue."""
    meta: dict[str, Any] = {"name": name}
    if queue is not None:
        meta["labels"] = {QUEUE_LABEL: queue}
    return {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": meta,
        "spec": {"completionMode": "Indexed", "completions": GANG_PODS, "parallelism": GANG_PODS,
                 "suspend": queue is not None,
                 "template": {
                     "metadata": {"annotations": {NUMA_POLICY: "single-numa-node"}},
                     "spec": {"restartPolicy": "Never", "automountServiceAccountToken": False,
                              "nodeSelector": {label: "true"},
                              "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                                              "resources": guaranteed(GANG_CPUS)}]}}},
    }


def job_pods(api: KubeClient, namespace: str, job: str) -> list[dict[str, Any]]:
    out = api.list(f"/api/v1/namespaces/{namespace}/pods", {"labelSelector": f"job-name={job}"})
    return list(out.get("items") or [])


def pod_events(api: KubeClient, namespace: str, uid: str, reason: str) -> list[dict[str, Any]]:
    out = api.list(f"/api/v1/namespaces/{namespace}/events", {"fieldSelector": f"involvedObject.uid={uid}"})
    return [e for e in out.get("items") or [] if e.get("reason") == reason]


def allocation(node: SimNode, uid: str) -> Any:
    """The agent's allocation for pod `uid` on `node`, or None."""
    return next((a for a in node.state().allocations if a.owner.pod_uid == uid), None)


def one_zone(node: SimNode, cpus: Any) -> bool:
    return len({node.topology.numa_of(c) for c in cpus}) == 1


def test_without_the_controller_the_scheduler_half_places_the_gang(
        cluster: Cluster, api: KubeClient, namespace: str, dump_root: Callable[[str], Path]) -> None:
    label = f"e2e.topolet.io/{uuid.uuid4().hex[:8]}"
    a, b, _ = fragmented_nodes(cluster, api, namespace, dump_root(DUMP), label)
    nodes = {a.name: a, b.name: b}
    api.create(f"/apis/batch/v1/namespaces/{namespace}/jobs", gang_job("plain", label, queue=None))

    def all_running() -> list[dict[str, Any]] | None:
        pods = job_pods(api, namespace, "plain")
        return pods if len(pods) == GANG_PODS and all(
            p.get("status", {}).get("phase") == "Running" for p in pods) else None

    pods = wait_for(all_running, "the scheduler to bind every gang pod (node totals fit)")
    assert {p["spec"]["nodeName"] for p in pods} <= set(nodes)

    # Each bound pod's agent decides: pinned in one zone, or refused with an Event and left unpinned.
    def decided() -> tuple[list[str], list[str]] | None:
        pinned, refused = [], []
        for p in pods:
            uid, node = p["metadata"]["uid"], nodes[p["spec"]["nodeName"]]
            if allocation(node, uid) is not None:
                pinned.append(uid)
            elif pod_events(api, namespace, uid, "AllocationFailed"):
                refused.append(uid)
        return (pinned, refused) if len(pinned) + len(refused) == GANG_PODS else None

    pinned, refused = wait_for(decided, "every gang pod pinned or refused by its node's agent")
    # Only node A's free zone holds 8-CPU pods (two of them): at least half the gang cannot be aligned.
    assert len(refused) >= GANG_PODS - 2, (pinned, refused)
    for p in pods:
        if p["metadata"]["uid"] in refused:
            event = pod_events(api, namespace, p["metadata"]["uid"], "AllocationFailed")[0]
            assert event["type"] == "Warning" and "single-numa-node" in event["message"], event
    # The refused pods still hold their requests on their nodes, as the scheduler counted them, and
    # the pinned ones hold their CPUs: the gang is stuck holding capacity it cannot use.
    for uid in pinned:
        p = next(p for p in pods if p["metadata"]["uid"] == uid)
        node = nodes[p["spec"]["nodeName"]]
        assert one_zone(node, allocation(node, uid).cpus)
    refusing = {nodes[p["spec"]["nodeName"]].name for p in pods if p["metadata"]["uid"] in refused}
    refusals = sum(nodes[n].metric("topolet_allocations_total", result="refused") for n in refusing)
    assert refusals >= len(refused)


def admission_record(api: KubeClient, namespace: str, job: str) -> Any:
    """The controller's decision recorded on the Job (agent.admission.gangs.record.AdmissionRecord)."""
    from agent.admission.gangs.job import ADMISSION_ANNOTATION
    from agent.admission.gangs.record import decode_record

    obj = api.get(f"/apis/batch/v1/namespaces/{namespace}/jobs/{job}")
    return decode_record(obj["metadata"]["annotations"][ADMISSION_ANNOTATION])


def test_the_controller_admits_the_gang_only_when_every_pod_fits(
        cluster: Cluster, api: KubeClient, namespace: str, dump_root: Callable[[str], Path]) -> None:
    label = f"e2e.topolet.io/{uuid.uuid4().hex[:8]}"
    a, b, b_fillers = fragmented_nodes(cluster, api, namespace, dump_root(DUMP), label)
    nodes = {a.name: a, b.name: b}
    cluster.start_controller()
    api.create(f"/apis/batch/v1/namespaces/{namespace}/jobs", gang_job("gang", label, queue="default"))
    job_path = f"/apis/batch/v1/namespaces/{namespace}/jobs/gang"

    def job_events(reason: str) -> list[dict[str, Any]]:
        uid = api.get(job_path)["metadata"]["uid"]
        return pod_events(api, namespace, uid, reason)

    waiting = wait_for(lambda: job_events("Waiting"), "the controller to say the gang waits")
    assert "zone" in waiting[0]["message"], waiting[0]  # the binding constraint is named
    job = api.get(job_path)
    assert job["spec"]["suspend"] is True
    assert ADMISSION_ANNOTATION not in (job["metadata"].get("annotations") or {})
    assert not job_pods(api, namespace, "gang")

    # Node B empties: now every pod fits a zone and the gang is admitted whole.
    for name in b_fillers:
        api.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}")
    wait_for(lambda: api.get(job_path)["spec"].get("suspend") is False, "the controller to admit the gang")
    record = admission_record(api, namespace, "gang")
    assert record.result == "admitted" and sorted(record.slots) == list(range(GANG_PODS))
    assert {p.node for p in record.slots.values()} <= set(nodes)

    def bound() -> list[dict[str, Any]] | None:
        pods = job_pods(api, namespace, "gang")
        return pods if len(pods) == GANG_PODS and all(
            p.get("status", {}).get("phase") == "Running" for p in pods) else None

    pods = wait_for(bound, "every gang pod bound and running")
    # Each pod is on the node, and names the zone, of one slot of the record: all slots used, once.
    where = sorted((p["spec"]["nodeName"], pod_zone(p)) for p in pods)
    assert where == sorted((s.node, s.zone) for s in record.slots.values()), (where, record)
    for p in pods:
        assert not p["spec"].get("schedulingGates")
        node, uid = nodes[p["spec"]["nodeName"]], p["metadata"]["uid"]
        zone = pod_zone(p)

        def pinned(node: SimNode = node, uid: str = uid) -> Any:
            # An agent that rejects what the controller wrote on the pod says so at once: fail with it.
            bad = pod_events(api, namespace, uid, "InvalidAnnotation")
            assert not bad, f"{node.name}'s agent rejects the admitted pod: {bad[0]['message']}"
            return allocation(node, uid)

        alloc = wait_for(pinned, f"{node.name}'s agent to pin pod {p['metadata']['name']}")
        # Pinned in one zone, the one the controller counted the pod against.
        assert len(alloc.cpus) == GANG_CPUS and {node.topology.numa_of(c) for c in alloc.cpus} == {zone}
        assert not pod_events(api, namespace, uid, "AllocationFailed")
    assert job_events("Admitted")

