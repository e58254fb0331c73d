"""What the kubelet granted, on a real control plane: a deferred in-place resize keeps the pod's pinned
CPUs, and memory binding holds only for Guaranteed pods (others get an Event and stay unbound).

Only the kubelet is a stand-in (kubelet_standin.py): here it also writes the resize fields of the
status (`allocatedResources`, `resources`, the `PodResizePending` condition) as a kubelet that
defers a resize does.  A later pod with a bad annotation is the barrier: the agent handles pod
changes in order, so once that pod's Event exists, every change before it has been applied.
"""

from __future__ import annotations

from typing import Any

from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from agent.api.qos import QOSClass
from agent.enforce.state_file import StateFile
from agent.topology.cpuset import CPUSet
from tests.kube.kubelet_standin import KubeNode, kube_node, proc_cpus, wait_for

__all__ = ["kube_node"]


def allocations(node: KubeNode, uid: str) -> list[Any]:
    return [a for a in StateFile(node.state_dir).load(missing_ok=True).allocations if a.owner.pod_uid == uid]


def barrier(node: KubeNode, name: str) -> None:
    """Wait until the agent has applied every pod change made before this call."""
    marker = node.run_pod(name, cpu="100m", memory="32Mi", limits=False,
                          annotations={"topolet.io/smt": "barrier"})
    wait_for(lambda: [e for e in node.events(marker.uid) if e.reason == "InvalidAnnotation"],
             f"the barrier pod {name}'s Event")


def reasons(node: KubeNode, uid: str) -> list[str]:
    return [e.reason for e in node.events(uid)]


def resized(core: k8s.CoreV1Api, name: str, namespace: str, body: dict[str, Any]) -> bool:
    """Ask for a resize; False while the API server refuses it for a Node capacity it has not yet seen
    (its resize admission reads Nodes from an informer's cache, which trails a status patch)."""
    try:
        core.patch_namespaced_pod_resize(name, namespace, body)
    except ApiException as e:
        if e.status == 403 and "NodeCapacity" in (e.body or ""):
            return False
        raise
    return True


def test_a_deferred_resize_keeps_the_granted_cpus(kube_node: KubeNode) -> None:
    node = kube_node
    node.start_agent()
    pod = node.run_pod("grow", cpu="1", memory="64Mi")
    wait_for(lambda: len(allocations(node, pod.uid)) == 1, "the 1-CPU allocation")
    (before,) = allocations(node, pod.uid)
    core = k8s.CoreV1Api(node.api)
    # A kubelet that can resize reports what it granted (the API server allows a resize only then).
    one = {"cpu": "1", "memory": "64Mi"}
    status = node.kubelet.status_body(pod)
    status["status"]["containerStatuses"][0].update(allocatedResources=one,
                                                    resources={"requests": one, "limits": one})
    core.patch_namespaced_pod_status(pod.name, node.namespace, status)
    # The API server admits a resize only within the Node's allocatable, which the kubelet reports.
    room = {"cpu": "4", "memory": "4Gi", "pods": "110"}
    core.patch_node_status(node.name, {"status": {"capacity": room, "allocatable": room}})
    # The user asks for 2 CPUs; the kubelet defers it (no room) and keeps the 1 CPU it granted.
    two = {"cpu": "2", "memory": "64Mi"}
    resize = {"spec": {"containers": [{"name": "c0", "resources": {"requests": two, "limits": two}}]}}
    wait_for(lambda: resized(core, pod.name, node.namespace, resize), "the API server to see the Node's room")
    status["status"]["conditions"].append({"type": "PodResizePending", "status": "True", "reason": "Deferred",
                                           "message": "Node didn't have enough capacity"})
    core.patch_namespaced_pod_status(pod.name, node.namespace, status)
    spec = core.read_namespaced_pod(pod.name, node.namespace).spec.containers[0].resources.requests
    assert spec["cpu"] == "2"  # the API took the resize: only the status says what was granted
    barrier(node, "after-resize")
    (after,) = allocations(node, pod.uid)
    assert after.cpus == before.cpus  # neither grown to the spec's 2 nor released
    assert CPUSet.parse(proc_cpus(pod.containers["c0"].pid) or "") == before.cpus
    assert "AllocationFailed" not in reasons(node, pod.uid)
    assert node.agent is not None and node.agent.poll() is None


def burstable_opt_in(node: KubeNode, name: str) -> Any:
    """A pod with a whole CPU request equal to its limit, memory requested without a limit, opted in to
    exclusive CPUs and memory binding: Burstable, as the Memory Manager would never bind it."""
    body = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "annotations": {"topolet.io/cpu-policy": "exclusive",
                                                   "topolet.io/memory-binding": "true"}},
        "spec": {"nodeName": node.name, "automountServiceAccountToken": False,
                 "containers": [{"name": "c0", "image": "registry.k8s.io/pause:3.10",
                                 "resources": {"requests": {"cpu": "1", "memory": "64Mi"},
                                               "limits": {"cpu": "1"}}}]},
    }
    k8s.CoreV1Api(node.api).create_namespaced_pod(node.namespace, body)
    return node.kubelet.start_pod(node.namespace, name)


def test_memory_binding_only_for_guaranteed_pods(kube_node: KubeNode) -> None:
    node = kube_node
    node.start_agent()
    loose = burstable_opt_in(node, "loose")
    assert loose.qos is QOSClass.BURSTABLE
    wait_for(lambda: "NotEligible" in reasons(node, loose.uid), "a NotEligible Event on the Burstable pod")
    (event,) = [e for e in node.events(loose.uid) if e.reason == "NotEligible"]
    assert event.type == "Warning" and "memory-binding" in event.message
    (held,) = wait_for(lambda: allocations(node, loose.uid), "the Burstable pod's CPUs")
    assert len(held.cpus) == 1 and not held.mems  # pinned, memory left unbound
    node.kubelet.delete_pod(loose)
    wait_for(lambda: not allocations(node, loose.uid), "the Burstable pod's release")

    bound = node.run_pod("bound", cpu="1", memory="64Mi", annotations={"topolet.io/memory-binding": "true"})
    (held,) = wait_for(lambda: allocations(node, bound.uid), "the Guaranteed pod's CPUs")
    assert held.mems  # bound to its CPUs' NUMA node
    assert "NotEligible" not in reasons(node, bound.uid)
