"""The real agent process on the pod-cgroup route (`topolet agent --route pod-cgroup`): a real API
server, real v1 cgroups, the kubelet stand-in making the pod cgroup first and the containers after,
each container's cpuset copied from its pod's as runc does.

A Guaranteed pod bound to the node is allocated from the watch alone (nothing of it exists on the
node yet); its pod cgroup holds that CPU as soon as the stand-in makes it, before any container;
its container runs its first instruction there and the watch moves the allocation to it.  A
Burstable pod's cgroup and its QoS folder stay on the pool, and widen again when the pinned pod goes
(one ordered write: folder, pod, container).  An agent killed and started again (the state from its
file) writes a pod cgroup made while it was away, and one someone else widened, at once.

Needs root, writable cgroups and the control plane: skips on a laptop, fails under CI=true.
"""

from __future__ import annotations

from agent.api.qos import QOSClass
from agent.enforce.cgroup import list_children, read_cpus, write_set
from agent.enforce.kubepods import CgroupDriver, pod_cgroup_path, qos_cgroup_path
from agent.enforce.state import Allocation
from agent.enforce.state_file import StateFile
from tests.conftest import require
from tests.kube.kubelet_standin import KubeNode, kube_node, metric_sum, proc_cpus, wait_for

__all__ = ["kube_node"]

BURSTABLE = qos_cgroup_path(QOSClass.BURSTABLE, CgroupDriver.CGROUPFS)


def allocation(node: KubeNode, uid: str) -> Allocation | None:
    held = [a for a in StateFile(node.state_dir).load(missing_ok=True).allocations if a.owner.pod_uid == uid]
    return held[0] if len(held) == 1 else None


def pod_rel(uid: str) -> str:
    return pod_cgroup_path(uid, QOSClass.GUARANTEED, CgroupDriver.CGROUPFS)


def started(node: KubeNode) -> None:
    wait_for(lambda: "pod-cgroup route: watching" in node.log_text(), "the pod-cgroup route's watcher")


def test_pod_cgroup_holds_the_pin_before_any_container(kube_node: KubeNode) -> None:
    node = kube_node
    require(node.layout.version == 1, "the kube tests run on this machine's cgroup v1")
    everything = read_cpus(node.layout, "", effective=True)
    node.start_agent("--route", "pod-cgroup")
    started(node)
    wait_for(lambda: node.metrics_port() is not None, "the metrics server")
    assert metric_sum(node.metrics_port() or 0, "topolet_info", route="pod-cgroup") == 1
    shared = node.run_pod("shared", cpu="100m", limits=False)  # Burstable, before the pinned pod
    (shared_c,) = shared.containers.values()

    uid = node.create_pod("pinned", cpu="1", memory="64Mi")
    alloc = wait_for(lambda: allocation(node, uid), "the pinned pod's allocation, from the watch alone")
    assert len(alloc.cpus) == 1 and alloc.owner.container == "c0"
    pool = everything - alloc.cpus
    pod = node.kubelet.make_pod_cgroup(node.namespace, "pinned")  # the kubelet's first step
    wait_for(lambda: read_cpus(node.layout, pod_rel(uid)) == alloc.cpus, "the pod cgroup's cpuset")
    assert list_children(node.layout, pod_rel(uid)) == []  # no container yet
    # The Burstable folder, its pod and its container stay on the pool.
    wait_for(lambda: read_cpus(node.layout, BURSTABLE) == pool, "the Burstable folder on the pool")
    wait_for(lambda: proc_cpus(shared_c.pid) == pool.cpulist(), "the Burstable container on the pool")
    assert read_cpus(node.layout, shared.cgroup) == pool

    running = node.kubelet.start_pod(node.namespace, "pinned")
    assert running is pod
    c0 = running.containers["c0"]
    assert proc_cpus(c0.pid) == alloc.cpus.cpulist()  # from its first instruction
    moved = wait_for(lambda: (a := allocation(node, uid)) is not None and a.cgroup == c0.cgroup and a,
                     "the watch to move the allocation to the container")
    assert moved.cpus == alloc.cpus
    assert read_cpus(node.layout, c0.cgroup) == alloc.cpus

    # The pod goes: its CPU returns to the pool in one ordered write (folder, pod, container).
    node.kubelet.delete_pod(running)
    wait_for(lambda: allocation(node, uid) is None, "the release")
    wait_for(lambda: proc_cpus(shared_c.pid) == everything.cpulist(), "the Burstable container widened")
    assert read_cpus(node.layout, BURSTABLE) == everything
    assert read_cpus(node.layout, shared.cgroup) == everything
    assert metric_sum(node.metrics_port() or 0, "topolet_reconcile_errors_total") == 0
    assert "not within the parent" not in node.log_text(), node.log_text()[-3000:]

    # Away: a pod is bound and the kubelet makes its cgroup (on every CPU); started again, the agent
    # pins it from the first list and writes that cgroup at once.
    node.agent.kill()  # type: ignore[union-attr]
    node.agent.wait()  # type: ignore[union-attr]
    late_uid = node.create_pod("late", cpu="1", memory="64Mi")
    node.kubelet.make_pod_cgroup(node.namespace, "late")
    assert read_cpus(node.layout, pod_rel(late_uid)) == everything
    node.start_agent("--route", "pod-cgroup")
    late = wait_for(lambda: allocation(node, late_uid), "the late pod's allocation")
    wait_for(lambda: read_cpus(node.layout, pod_rel(late_uid)) == late.cpus, "the late pod cgroup written")
    started(node)

    # Away again: someone widens the pod cgroup; the state file brings the same CPUs back.
    node.agent.kill()  # type: ignore[union-attr]
    node.agent.wait()  # type: ignore[union-attr]
    write_set(node.layout, pod_rel(late_uid), "cpus", everything)
    node.start_agent("--route", "pod-cgroup")
    wait_for(lambda: read_cpus(node.layout, pod_rel(late_uid)) == late.cpus, "the pod cgroup written again")
    assert allocation(node, late_uid) == late
    c0 = node.kubelet.start_pod(node.namespace, "late").containers["c0"]
    assert proc_cpus(c0.pid) == late.cpus.cpulist()
    wait_for(lambda: (a := allocation(node, late_uid)) is not None and a.cgroup == c0.cgroup,
             "the watch to move the late allocation to its container")
    assert node.agent is not None and node.agent.poll() is None
