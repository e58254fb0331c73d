"""End to end on a real node: kubelet v1.37.2, containerd 1.6 and runc run pods, `topolet agent` pins them.

No stand-in: pods are scheduled by the real kube-scheduler, started by the real kubelet through
containerd and runc, in the cgroups runc made; the agent reads them from the API server and the
kubelet's pod-resources socket, and writes those cgroups.  What each test checks is read back from
the kernel (the cgroup the container's process is in, its affinity), not from the agent.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from agent.topology.cpuset import CPUSet
from tests.kube.kubelet_standin import wait_for
from tests.realnode.node import (
    NodeAgent,
    RealNode,
    container_id,
    cpuset_of,
    guaranteed_pod,
    proc_affinity,
    wait,
)

NS = "default"


@pytest.fixture(scope="module")
def agent(real_node: RealNode) -> Iterator[NodeAgent]:
    """`topolet agent` (enforcement on) for the real node, started once for the module."""
    a = NodeAgent(real_node)
    a.start()
    try:
        wait_for(lambda: nrt(real_node) is not None or not a.running(), "the agent's first NRT")
        assert a.running(), a.log()
        yield a
    finally:
        print(f"--- agent ---\n{a.log()[-4000:]}")
        a.stop()


def get_pod(api: Any, name: str, namespace: str = NS) -> dict[str, Any] | None:
    from agent.errors import KubeAPIError

    try:
        return dict(api.get(f"/api/v1/namespaces/{namespace}/pods/{name}"))
    except KubeAPIError as exc:
        if exc.status == 404:
            return None
        raise


def delete_pod(api: Any, name: str) -> None:
    from agent.errors import KubeAPIError

    try:
        api.request("DELETE", f"/api/v1/namespaces/{NS}/pods/{name}")
    except KubeAPIError as exc:
        if exc.status != 404:
            raise


def nrt(node: RealNode) -> dict[str, Any] | None:
    return node.cluster.nrt(node.name)


def nrt_available_cpus(node: RealNode) -> int | None:
    obj = nrt(node)
    if obj is None:
        return None
    return sum(int(r["available"]) for z in obj.get("zones") or [] for r in z.get("resources") or []
               if r["name"] == "cpu")


def run(node: RealNode, pods: list[str], name: str, **kw: Any) -> tuple[dict[str, Any], int]:
    """Create a pod on the node and wait until its container runs; (pod, the container's pid)."""
    pods.append(name)
    with node.api() as api:
        api.create(f"/api/v1/namespaces/{NS}/pods", guaranteed_pod(name, node.name, **kw))
        pod = wait(lambda: (p := get_pod(api, name)) is not None and container_id(p) and p,
                   f"pod {name} running")
    cid = container_id(pod)
    pid = wait(lambda: node.task_pids().get(str(cid)), f"the task of {name}")
    return pod, int(pid)


def exclusive_cpus(pid: int) -> CPUSet | None:
    """The container's cpuset when it is narrower than the whole node (its pin), else None."""
    _, cpus = cpuset_of(pid)
    got = CPUSet.parse(cpus)
    return got if len(got) == 1 else None


def all_cpus(node: RealNode) -> CPUSet:
    return CPUSet.parse((node.cpuset_root / "cpuset.cpus").read_text().strip())


def test_labels_and_nrt_for_the_real_node(real_node: RealNode, agent: NodeAgent) -> None:
    """(a) The agent labels the Node the kubelet registered and publishes its NRT."""
    labels = wait_for(lambda: {k: v for k, v in ((real_node.node_object() or {}).get("metadata") or {})
                               .get("labels", {}).items() if k.startswith("topolet.io/")},
                      "topolet.io labels on the Node")
    assert labels.get("topolet.io/numa.nodes") == "1"
    obj = nrt(real_node)
    assert obj is not None
    zones = [z for z in obj["zones"] if z["type"] == "Node"]
    assert [z["name"] for z in zones] == ["node-0"]
    cpu = {r["name"]: r for r in zones[0]["resources"]}["cpu"]
    assert int(cpu["capacity"]) == len(all_cpus(real_node))
    assert obj["metadata"]["ownerReferences"][0]["name"] == real_node.name


def test_guaranteed_pod_gets_exclusive_cpus_in_the_runtimes_cgroup(real_node: RealNode, agent: NodeAgent,
                                                                    pods: list[str]) -> None:
    """(b, c) A Guaranteed pod's container is pinned in the cgroup runc made; the pool shrinks; deleting
    the pod frees its CPU."""
    everything = all_cpus(real_node)
    before = wait_for(lambda: nrt_available_cpus(real_node), "the NRT's available CPUs")
    shared_pod, shared_pid = run(real_node, pods, "shared", cpu="100m", limits=False)
    pod, pid = run(real_node, pods, "pinned")
    pinned = wait_for(lambda: exclusive_cpus(pid), "the container's exclusive cpuset")
    folder, _ = cpuset_of(pid)
    # The cgroup is the runtime's own: kubepods/pod<uid>/<container id> under the kubelet's root.
    uid = pod["metadata"]["uid"]
    assert folder == real_node.cpuset_root / "kubepods" / f"pod{uid}" / str(container_id(pod))
    assert CPUSet.parse(proc_affinity(pid)) == pinned
    held = [a for a in agent.state().allocations if a.owner.pod_uid == pod["metadata"]["uid"]]
    assert [a.cpus for a in held] == [pinned]
    # The shared pool shrinks: the Burstable container runs on every CPU but the pinned one.
    wait_for(lambda: CPUSet.parse(cpuset_of(shared_pid)[1]) == everything - pinned, "the pool to shrink")
    assert not CPUSet.parse(proc_affinity(shared_pid)) & pinned
    wait_for(lambda: nrt_available_cpus(real_node) == before - 1, "the NRT to count the pinned CPU")

    with real_node.api() as api:
        delete_pod(api, "pinned")
        wait_for(lambda: get_pod(api, "pinned") is None, "the pinned pod gone")
    wait_for(lambda: not agent.state().allocations, "the allocation released")
    wait_for(lambda: CPUSet.parse(cpuset_of(shared_pid)[1]) == everything, "the pool to grow back")
    wait_for(lambda: nrt_available_cpus(real_node) == before, "the NRT to free the CPU")


def pinned_everywhere(node: RealNode, agent: NodeAgent, pids: dict[str, int]) -> dict[str, CPUSet]:
    """Check no CPU is held twice (state and kernel agree) and return each pod's pinned CPUs."""
    state = agent.state()
    held: dict[str, CPUSet] = {}
    for a in state.allocations:
        assert a.owner.pod_uid is not None
        held[a.owner.pod_uid] = a.cpus
    seen = CPUSet()
    for cpus in held.values():
        assert not cpus & seen, f"a CPU is held twice: {held}"
        seen |= cpus
    for uid, pid in pids.items():
        got = CPUSet.parse(cpuset_of(pid)[1])
        if uid in held:
            assert got == held[uid] == CPUSet.parse(proc_affinity(pid))
        else:
            assert not got & seen, f"pod {uid} on the pool runs on exclusive CPUs {got & seen}"
    return held


def test_agent_kubelet_and_containerd_restarts_lose_nothing(real_node: RealNode, agent: NodeAgent,
                                                           pods: list[str]) -> None:
    """(d) Killing the agent, restarting the kubelet and restarting containerd each keep the pin of a
    running pod and assign no CPU twice, also to a Guaranteed pod that arrives afterwards."""
    everything = all_cpus(real_node)
    shared, shared_pid = run(real_node, pods, "pool", cpu="100m", limits=False)
    pod, pid = run(real_node, pods, "held")
    uid = pod["metadata"]["uid"]
    pinned = wait_for(lambda: exclusive_cpus(pid), "the first pin")
    pids = {uid: pid, shared["metadata"]["uid"]: shared_pid}
    wait_for(lambda: CPUSet.parse(cpuset_of(shared_pid)[1]) == everything - pinned, "the pool to shrink")

    def unchanged(after: str) -> None:
        time.sleep(3.0)  # a few of the agent's reconcile passes (1 s) and the kubelet's sync
        assert real_node.task_pids().get(str(container_id(pod))) == pid, f"container restarted by {after}"
        held = pinned_everywhere(real_node, agent, pids)
        assert held == {uid: pinned}, f"after {after}: {held}"

    agent.kill()
    agent.start()
    wait_for(lambda: agent.metrics_port() is not None, "the restarted agent serving")
    unchanged("an agent crash")
    real_node.restart_kubelet()
    real_node.wait_ready()
    unchanged("a kubelet restart")
    real_node.restart_containerd()
    unchanged("a containerd restart")

    # A second Guaranteed pod (room made for it on a 2-CPU node): there the last CPU stays shared (the
    # agent keeps one for the pool) and the pod runs on it; on a bigger node it gets a CPU of its own.
    # Never the first pod's.
    with real_node.api() as api:
        delete_pod(api, "pool")
        wait_for(lambda: get_pod(api, "pool") is None, "the pool pod gone")
    del pids[shared["metadata"]["uid"]]
    second, second_pid = run(real_node, pods, "second")
    pids[second["metadata"]["uid"]] = second_pid
    time.sleep(3.0)
    held = pinned_everywhere(real_node, agent, pids)
    assert held[uid] == pinned
    assert len(held) == min(2, len(everything) - 1)


def test_agent_reads_the_kubelets_pod_resources(real_node: RealNode, agent: NodeAgent,
                                                pods: list[str]) -> None:
    """(e) The agent's pod-resources client gets the real kubelet's answers: List names the running
    containers, GetAllocatableResources offers no exclusive CPUs under `cpuManagerPolicy: none`."""
    from agent.kube.kubelet.podresources.client import PodResourcesClient

    run(real_node, pods, "listed")
    client = PodResourcesClient(str(real_node.pod_resources_socket), timeout=5.0)
    try:
        listed = wait_for(lambda: (NS, "listed", "c") in client.list() and client.list(),
                          "the pod in the kubelet's List")
        assert listed[(NS, "listed", "c")] == []  # no devices here
        allocatable = client.allocatable()
        assert allocatable is not None and allocatable.cpu_ids == frozenset()
        assert client.failures == 0
    finally:
        client.close()
    assert "CPU manager" in agent.log()
