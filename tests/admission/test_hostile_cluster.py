"""Issue 21, on the test cluster (real kube-apiserver, controller-manager, scheduler, `topolet
controller` and `topolet agent`): what an ordinary tenant writes never stops, fools or jumps the
admission controller, nor stops a node's agent.  Each test failed before its fix.

Nodes of DUMP have 4 NUMA zones of 16 CPUs; the gangs ask for single-numa-node pods of 12 CPUs."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.enforce.state import State
from agent.kube.publish.nrt import nrt_object
from agent.kubeapi.client import KubeClient, resource_path
from tests.admission.test_controller import (
    DUMP,
    all_bound_as_recorded,
    delete_job,
    events,
    gang_job,
    get_job,
    job_pods,
    metric,
    record,
    scrape,
)
from tests.controlplane.cluster import NRT_GROUP, NRT_PLURAL, NRT_VERSION, Cluster
from tests.controlplane.harness import free_port
from tests.kube.kubelet_standin import wait_for


def two_nodes(cluster: Cluster, dump_root: Callable[[str], Path]) -> tuple[str, list[str]]:
    return cluster.labelled_nodes("hostile", dump_root(DUMP))


def create(api: KubeClient, ns: str, obj: dict[str, Any]) -> None:
    kind = obj["kind"]
    path = f"/apis/batch/v1/namespaces/{ns}/jobs" if kind == "Job" else f"/api/v1/namespaces/{ns}/pods"
    api.create(path, obj)


def bare_pod(name: str, node: str, cpu: str = "2",
             annotations: dict[str, str] | None = None) -> dict[str, Any]:
    res = {"cpu": cpu, "memory": "64Mi"}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "annotations": annotations or {}},
            "spec": {"nodeName": node, "restartPolicy": "Never", "automountServiceAccountToken": False,
                     "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                                     "resources": {"requests": res, "limits": res}}]}}


def test_poison_jobs_cost_only_themselves_and_a_victim_gang_is_admitted(
        cluster: Cluster, api: KubeClient, namespace: str, dump_root: Callable[[str], Path]) -> None:
    """Finding 1 (and 6): a forged record whose slot is "²" (isdigit() says yes, int() raises), one
    nested 100,000 deep, a template zone "²", and a gang too large for a record, beside a victim."""
    label, _ = two_nodes(cluster, dump_root)
    port = free_port()
    proc = cluster.start_controller("--listen", f"127.0.0.1:{port}", "--resync-seconds", "2")
    forged = gang_job("forged", 1, label)
    forged["metadata"]["annotations"] = {"topolet.io/admission": json.dumps(
        {"version": 1, "result": "admitted", "decision": "d", "time": "2026-01-01T00:00:00Z",
         "placement": {"²": {"node": "x", "zone": 0}}})}
    nested = gang_job("nested", 1, label)
    nested["metadata"]["annotations"] = {"topolet.io/admission": "[" * 100_000 + "]" * 100_000}
    zoned = gang_job("zoned", 1, label, cpu=1, policy="none")
    zoned["spec"]["template"]["metadata"]["annotations"]["topolet.io/numa-zone"] = "²"
    huge = gang_job("huge", 5000, label, cpu=1, indexed=False, policy="none")
    for job in (forged, nested, zoned, huge):
        create(api, namespace, job)
    create(api, namespace, gang_job("victim", 2, label))
    wait_for(lambda: all_bound_as_recorded(api, namespace, "victim", 2), "the victim gang admitted and bound",
             timeout=90)
    for name in ("forged", "nested"):
        wait_for(lambda n=name: "InvalidAdmissionRecord" in events(api, namespace, n), f"{name}'s Event")
    wait_for(lambda: (record(api, namespace, "huge") or {}).get("result") == "rejected",
             "the huge gang rejected")
    assert "5000 pods" in (record(api, namespace, "huge") or {}).get("reason", "")
    # Another gang still goes in: passes go on after the zoned Job's pods are placed (or it is refused).
    create(api, namespace, gang_job("later", 1, label))
    wait_for(lambda: all_bound_as_recorded(api, namespace, "later", 1), "a later gang admitted", timeout=90)
    status, text = scrape(port)
    assert status == 200 and scrape(port, "/healthz")[0] == 200
    assert metric(text, 'topolet_admission_invalid_objects_total{kind="Job"}') >= 2
    assert metric(text, 'topolet_admission_decisions_total{result="admitted"}') >= 2
    for name in ("forged", "nested"):  # left as they were
        assert get_job(api, namespace, name)["spec"]["suspend"] is True
    proc.stop()
    assert proc.popen.returncode == 0, proc.log_tail()


def test_a_poison_pod_never_stops_the_nodes_agent(
        cluster: Cluster, api: KubeClient, namespace: str, dump_root: Callable[[str], Path]) -> None:
    """Finding 2: a bare pod bound to the node with placements for it and completion index "²"; a
    Guaranteed pod created after it is still pinned, and the poison is told as a bad annotation."""
    _, names = two_nodes(cluster, dump_root)
    node = cluster.nodes[names[0]]
    create(api, namespace, bare_pod("poison", node.name, annotations={
        "topolet.io/placements": f"{node.name}:0", "batch.kubernetes.io/job-completion-index": "²"}))
    create(api, namespace, bare_pod("victim", node.name, cpu="2"))
    victim = api.get(f"/api/v1/namespaces/{namespace}/pods/victim")
    allocs = wait_for(lambda: [a for a in node.state().allocations
                               if a.owner.pod_uid == victim["metadata"]["uid"]], "the victim pod pinned",
                      timeout=60)
    assert len(allocs[0].cpus) == 2
    poison = api.get(f"/api/v1/namespaces/{namespace}/pods/poison")
    assert not [a for a in node.state().allocations if a.owner.pod_uid == poison["metadata"]["uid"]]
    wait_for(lambda: any(e["reason"] == "InvalidAnnotation" for e in api.list(
        f"/api/v1/namespaces/{namespace}/events",
        {"fieldSelector": "involvedObject.kind=Pod,involvedObject.name=poison"}).get("items") or []),
        "the poison pod's InvalidAnnotation Event", timeout=60)


def test_an_unreadable_quantity_costs_only_its_pod(
        cluster: Cluster, api: KubeClient, namespace: str, dump_root: Callable[[str], Path]) -> None:
    """Finding 8: a pod bound with `cpu: 1e33` (the API server takes it) on every node; the nodes stay
    in the view and a gang is admitted there."""
    label, names = two_nodes(cluster, dump_root)
    for name in names:
        create(api, namespace, bare_pod(f"huge-{name}", name, cpu="1e33"))
    port = free_port()
    proc = cluster.start_controller("--listen", f"127.0.0.1:{port}", "--resync-seconds", "2")
    create(api, namespace, gang_job("victim", 2, label))
    wait_for(lambda: all_bound_as_recorded(api, namespace, "victim", 2), "the victim gang admitted",
             timeout=90)
    _, text = scrape(port)
    assert metric(text, 'topolet_admission_invalid_objects_total{kind="Pod"}') >= 1
    proc.stop()


def test_a_template_priority_never_jumps_the_queue(
        cluster: Cluster, api: KubeClient, namespace: str, dump_root: Callable[[str], Path]) -> None:
    """Finding 7: `priority: 2147483647` in a Job's template with no PriorityClass (the API server takes
    it on a Job) is not the gang's priority: the older gang goes first."""
    label, _ = two_nodes(cluster, dump_root)
    proc = cluster.start_controller("--resync-seconds", "2")
    create(api, namespace, gang_job("hold", 8, label))  # all 8 zones
    wait_for(lambda: all_bound_as_recorded(api, namespace, "hold", 8), "hold admitted", timeout=90)
    create(api, namespace, gang_job("first", 6, label))
    wait_for(lambda: "Waiting" in events(api, namespace, "first"), "first waiting")
    jumper = gang_job("jumper", 6, label)
    jumper["spec"]["template"]["spec"]["priority"] = 2147483647
    create(api, namespace, jumper)
    wait_for(lambda: "Waiting" in events(api, namespace, "jumper"), "jumper waiting")
    delete_job(api, namespace, "hold")
    wait_for(lambda: (record(api, namespace, "first") or {}).get("result") == "admitted", "first admitted",
             timeout=150)
    assert record(api, namespace, "jumper") is None
    proc.stop()


def test_each_node_places_by_its_own_topology_policy(
        cluster: Cluster, api: KubeClient, namespace: str, dump_root: Callable[[str], Path]) -> None:
    """Finding 9: a Guaranteed gang that names no NUMA policy is placed on each node as that node's
    kubelet Topology Manager would admit it.  Two nodes of four 16-CPU zones, whose NRTs report
    single-numa-node and none; nine pods of 12 CPUs: four fit the single-numa-node node (one a zone),
    five the none node (on its totals).  Before, the strictest policy any node reported held on both
    (eight pods at most), and the gang was refused."""
    tag = uuid.uuid4().hex[:8]
    label = f"test.topolet.io/{tag}"
    names: dict[str, str] = {}
    for policy in ("single-numa-node", "none"):
        node = cluster.add_node(f"policy-{tag}-{policy}", dump_root(DUMP), labels={label: "true"},
                                agent=False)
        uid = api.get(f"/api/v1/nodes/{node.name}")["metadata"]["uid"]
        api.create(resource_path(NRT_GROUP, NRT_VERSION, NRT_PLURAL),
                   nrt_object((node.name, uid), node.topology, State(), topology_manager_policy=policy))
        names[policy] = node.name
    proc = cluster.start_controller("--resync-seconds", "2")
    gang = gang_job("gang", 9, label)
    del gang["spec"]["template"]["metadata"]["annotations"]["topolet.io/numa-policy"]
    create(api, namespace, gang)

    def bound() -> bool:
        rec = record(api, namespace, "gang") or {}
        pods = job_pods(api, namespace, "gang")
        return rec.get("result") == "admitted" and len(pods) == 9 and all(
            p["spec"].get("nodeName") == rec["placement"][p["metadata"]["annotations"][
                "batch.kubernetes.io/job-completion-index"]]["node"] for p in pods)

    wait_for(bound, "the gang admitted and bound", timeout=90)
    slots = (record(api, namespace, "gang") or {})["placement"].values()
    single = [s.get("zone") for s in slots if s["node"] == names["single-numa-node"]]
    spread = [s.get("zone") for s in slots if s["node"] == names["none"]]
    assert sorted(single) == [0, 1, 2, 3], slots  # one pod a zone: each fits one zone
    assert spread == [None] * 5, slots  # node totals: no zone
    proc.stop()


def test_a_gang_whose_node_is_gone_before_its_pods_bind_is_placed_again(
        cluster: Cluster, api: KubeClient, namespace: str, dump_root: Callable[[str], Path]) -> None:
    """Finding 9c: a gang admitted over two of three nodes (five single-numa-node pods of 12 CPUs, its
    pods gated: the controller is killed right after its decision), then one of those Nodes deleted
    before any pod is bound.  The restarted controller suspends the Job as it removes the record,
    clears its start time and our template fields, and admits it afresh on the nodes there are;
    before, the gang waited for a node that never came back."""
    label, names = cluster.labelled_nodes("lost", dump_root(DUMP), 3)
    crashing = cluster.start_controller("--resync-seconds", "2", "--crash-at", "after-decision")
    create(api, namespace, gang_job("g", 5, label, indexed=False))
    wait_for(lambda: crashing.popen.poll() is not None, "the controller to kill itself after its decision")
    first = record(api, namespace, "g") or {}
    assert first.get("result") == "admitted"
    gone = first["placement"]["0"]["node"]
    assert not any(p["spec"].get("nodeName") for p in job_pods(api, namespace, "g"))
    cluster.remove_node(gone)

    proc = cluster.start_controller("--resync-seconds", "2")
    wait_for(lambda: "NodeGone" in events(api, namespace, "g"), "the Job queued again (NodeGone)", timeout=60)
    wait_for(lambda: all_bound_as_recorded(api, namespace, "g", 5), "the gang admitted again and bound",
             timeout=150)
    again = record(api, namespace, "g") or {}
    assert again["decision"] != first["decision"]
    assert gone not in {p["node"] for p in again["placement"].values()}
    proc.stop()
