"""End to end on the test cluster: each node's Topology Manager scope decides whether a pod whose
containers each fit a NUMA zone, but whose sum fits none, is admitted there.

Real parts throughout, as tests/admission/test_e2e.py: kube-apiserver, kube-controller-manager,
kube-scheduler, `topolet controller`, and one `topolet agent --enforcement off` per simulated node
reading a 64-CPU, 4-NUMA-node dump; node P's agent runs `--numa-scope pod`, node C's the default
(`container`, the kubelet's). Fillers leave 6 CPUs free in every zone of both. A one-pod Job of two
5-CPU containers (10 CPUs, single-numa-node) fits no zone whole: the controller places it on C, split
a container per zone (`topolet.io/numa-zone: "<z0>,<z1>"`), never on P, and C's agent pins each
container in the zone the controller counted it in.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.kubeapi.client import KubeClient
from tests.admission.test_e2e import (  # skips this module where test_e2e skips (no kubernetes client)
    DUMP,
    NUMA_POLICY,
    QUEUE_LABEL,
    admission_record,
    guaranteed,
    job_pods,
    pod_events,
    run_filler,
    zone_free,
)
from tests.controlplane.cluster import Cluster, SimNode
from tests.kube.kubelet_standin import wait_for
from tests.kube.test_nrt import attributes

CONTAINER_CPUS = 5


def scope_of(cluster: Cluster, node: SimNode) -> str | None:
    return attributes(cluster.nrt(node.name) or {"attributes": []}).get("topologyManagerScope")


def split_job(name: str, label: str) -> dict[str, Any]:
    container = {"image": "registry.k8s.io/pause:3.10", "resources": guaranteed(CONTAINER_CPUS)}
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "labels": {QUEUE_LABEL: "default"}},
        "spec": {"parallelism": 1, "completions": 1, "suspend": True, "template": {
            "metadata": {"annotations": {NUMA_POLICY: "single-numa-node"}},
            "spec": {"restartPolicy": "Never", "automountServiceAccountToken": False,
                     "nodeSelector": {label: "true"},
                     "containers": [{"name": "a", **container}, {"name": "b", **container}]}}},
    }


def test_a_container_scope_node_takes_a_pod_split_over_zones(
        cluster: Cluster, api: KubeClient, namespace: str, dump_root: Callable[[str], Path]) -> None:
    label = f"e2e.topolet.io/{uuid.uuid4().hex[:8]}"
    tag = uuid.uuid4().hex[:6]
    # Named so that the pod-scope node comes first: of two equal nodes, the engine takes the first.
    pod_scope = cluster.add_node(f"a-{tag}", dump_root(DUMP), labels={label: "true"},
                                 agent_args=("--numa-scope", "pod"))
    container_scope = cluster.add_node(f"b-{tag}", dump_root(DUMP), labels={label: "true"})
    for node in (pod_scope, container_scope):
        wait_for(lambda node=node: zone_free(cluster, node) == [16] * 4, f"the NRT of {node.name}")
        for i in range(4):
            run_filler(api, namespace, node, f"fill-{node.name}-{i}")
    for node, scope in ((pod_scope, "pod"), (container_scope, "container")):
        wait_for(lambda node=node: zone_free(cluster, node) == [6] * 4, f"{node.name}'s fillers pinned")
        assert scope_of(cluster, node) == scope  # the agent's flag, published

    cluster.start_controller()
    api.create(f"/apis/batch/v1/namespaces/{namespace}/jobs", split_job("split", label))
    job_path = f"/apis/batch/v1/namespaces/{namespace}/jobs/split"
    wait_for(lambda: api.get(job_path)["spec"].get("suspend") is False, "the controller to admit the pod")
    (slot,) = admission_record(api, namespace, "split").slots.values()
    assert slot.node == container_scope.name and slot.zone is None
    assert len(slot.zones) == 2 and len(set(slot.zones)) == 2, slot

    def running() -> dict[str, Any] | None:
        pods = job_pods(api, namespace, "split")
        return pods[0] if len(pods) == 1 and pods[0].get("status", {}).get("phase") == "Running" else None

    pod = wait_for(running, "the pod bound and running")
    assert pod["spec"]["nodeName"] == container_scope.name
    assert pod["metadata"]["annotations"]["topolet.io/numa-zone"] == ",".join(map(str, slot.zones))
    uid = pod["metadata"]["uid"]

    def pinned() -> dict[str, Any] | None:
        bad = pod_events(api, namespace, uid, "InvalidAnnotation")
        assert not bad, f"the agent rejects the placed pod: {bad[0]['message']}"
        held = {a.owner.container: a for a in container_scope.state().allocations if a.owner.pod_uid == uid}
        return held if len(held) == 2 else None

    held = wait_for(pinned, "the agent to pin both containers")
    for name, zone in zip(("a", "b"), slot.zones, strict=True):
        cpus = held[name].cpus
        assert len(cpus) == CONTAINER_CPUS
        assert {container_scope.topology.numa_of(c) for c in cpus} == {zone}, (name, zone, cpus)
    assert not pod_events(api, namespace, uid, "AllocationFailed")
