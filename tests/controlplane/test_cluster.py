"""The test cluster: kube-controller-manager makes a Job's pods, kube-scheduler binds them to simulated
nodes shaped like hardware dumps, and a simulated node's real agent publishes its NRT and records the
pinning of a pod bound there."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.controlplane.cluster import Cluster, node_resources
from tests.controlplane.fixtures import IN_CI, api, cluster, cluster_session, namespace
from tests.kube.kubelet_standin import wait_for

try:
    from agent.errors import KubeAPIError
    from agent.kubeapi.client import KubeClient
except ImportError:
    if IN_CI:
        raise
    pytest.skip("the `kubernetes` Python client is not installed", allow_module_level=True)

__all__ = ["api", "cluster", "cluster_session", "namespace"]

DUMP = "64fake-4n2s2ca2c2t"  # 64 CPUs in 4 NUMA nodes of 16






def indexed_job(name: str, count: int, node_label: str, cpu: str) -> dict[str, Any]:
    """An Indexed Job of `count` Guaranteed pods that may only run on nodes labelled `node_label`."""
    res = {"cpu": cpu, "memory": "64Mi"}
    return {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
        "spec": {"completionMode": "Indexed", "completions": count, "parallelism": count,
                 "template": {"spec": {
                     "restartPolicy": "Never", "automountServiceAccountToken": False,
                     "nodeSelector": {node_label: "true"},
                     "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                                     "resources": {"requests": res, "limits": res}}]}}},
    }


def job_pods(api: KubeClient, namespace: str, job: str) -> list[dict[str, Any]]:
    out = api.list(f"/api/v1/namespaces/{namespace}/pods", {"labelSelector": f"job-name={job}"})
    return list(out.get("items") or [])


def test_node_resources_follow_the_dump(dump_root: Callable[[str], Path]) -> None:
    from agent.topology.discover import discover

    topology = discover(str(dump_root(DUMP)))
    capacity, allocatable = node_resources(topology, reserved_cpus=2, pods=50)
    assert capacity["cpu"] == "64" and allocatable["cpu"] == "62"
    assert capacity["memory"] == allocatable["memory"] == "4Gi"  # 4 nodes of 1 GiB
    assert capacity["pods"] == "50"


def test_job_pods_are_made_and_bound_to_a_simulated_node(
        cluster: Cluster, api: KubeClient, namespace: str, dump_root: Callable[[str], Path]) -> None:
    tag = uuid.uuid4().hex[:8]
    label = f"test.topolet.io/{tag}"
    node = cluster.add_node(f"sim-{tag}", dump_root(DUMP), labels={label: "true"}, agent=False)
    got = api.get(f"/api/v1/nodes/{node.name}")
    assert got["status"]["allocatable"]["cpu"] == "64"
    assert any(c["type"] == "Ready" and c["status"] == "True" for c in got["status"]["conditions"])

    api.create(f"/apis/batch/v1/namespaces/{namespace}/jobs", indexed_job("j", 2, label, "4"))
    pods = wait_for(lambda: len(job_pods(api, namespace, "j")) == 2 and job_pods(api, namespace, "j"),
                    "the job controller to create 2 pods")
    indexes = sorted(p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"] for p in pods)
    assert indexes == ["0", "1"]
    wait_for(lambda: all(p["spec"].get("nodeName") == node.name for p in job_pods(api, namespace, "j")),
             "the scheduler to bind both pods to the simulated node")

    # A pod that fits no node stays unbound, with the scheduler's reason on it.
    api.create(f"/apis/batch/v1/namespaces/{namespace}/jobs", indexed_job("big", 1, label, "128"))

    def unschedulable() -> bool:
        pods = job_pods(api, namespace, "big")
        return bool(pods) and any(c.get("reason") == "Unschedulable"
                                  for c in pods[0].get("status", {}).get("conditions") or [])

    wait_for(unschedulable, "the scheduler to mark the oversized pod Unschedulable")
    assert not job_pods(api, namespace, "big")[0]["spec"].get("nodeName")

    # Deleting the Job deletes its pods (garbage collector, foreground-free background deletion).
    api.request("DELETE", f"/apis/batch/v1/namespaces/{namespace}/jobs/j",
                body={"propagationPolicy": "Background"}, content_type="application/json")
    wait_for(lambda: not [p for p in job_pods(api, namespace, "j")
                          if not p["metadata"].get("deletionTimestamp")],
             "the garbage collector to delete the Job's pods")


def test_simulated_node_agent_publishes_nrt_and_pins_a_bound_pod(
        cluster: Cluster, api: KubeClient, namespace: str, dump_root: Callable[[str], Path]) -> None:
    tag = uuid.uuid4().hex[:8]
    label = f"test.topolet.io/{tag}"
    node = cluster.add_node(f"sim-{tag}", dump_root(DUMP), labels={label: "true"}, reserved_cpus="0")
    nrt = wait_for(lambda: cluster.nrt(node.name), "the agent's NodeResourceTopology", timeout=90)
    zones = [z for z in nrt["zones"] if z.get("type") == "Node"]
    assert len(zones) == 4

    def free_cpus() -> int:
        obj = cluster.nrt(node.name) or {}
        return sum(int(r["available"]) for z in obj.get("zones") or [] for r in z.get("resources") or []
                   if r["name"] == "cpu")

    assert free_cpus() == 63  # 64 less the reserved one
    job = indexed_job("pinned", 1, label, "8")
    job["spec"]["template"]["metadata"] = {"annotations": {"topolet.io/numa-policy": "single-numa-node"}}
    api.create(f"/apis/batch/v1/namespaces/{namespace}/jobs", job)

    def running() -> dict[str, Any] | None:
        pods = job_pods(api, namespace, "pinned")
        return pods[0] if pods and pods[0].get("status", {}).get("phase") == "Running" else None

    pod = wait_for(running, "the simulated kubelet to report the bound pod Running")
    assert pod["spec"]["nodeName"] == node.name
    allocs = wait_for(lambda: [a for a in node.state().allocations
                               if a.owner.pod_uid == pod["metadata"]["uid"]], "the agent's allocation")
    cpus = allocs[0].cpus
    assert len(cpus) == 8 and len({node.topology.numa_of(c) for c in cpus}) == 1
    wait_for(lambda: free_cpus() == 55, "the NRT to count the pinned pod")

    # Deleting the pod: the simulated kubelet finishes the deletion, the agent frees the CPUs.
    api.request("DELETE", f"/apis/batch/v1/namespaces/{namespace}/jobs/pinned",
                body={"propagationPolicy": "Foreground"}, content_type="application/json")

    def gone() -> bool:
        try:
            api.get(f"/api/v1/namespaces/{namespace}/pods/{pod['metadata']['name']}")
        except KubeAPIError as exc:
            return exc.status == 404
        return False

    wait_for(gone, "the pod's deletion to finish")
    wait_for(lambda: free_cpus() == 63, "the NRT to show the CPUs free again")
