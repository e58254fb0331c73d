"""topolet and the kubelet's own CPU manager on a real kubelet: `none` topolet pins, `static` it stands down.

With `cpuManagerPolicy: static` the kubelet owns the cpusets of every container (it pins Guaranteed
pods and reconciles all of them every `cpuManagerReconcilePeriod`), so topolet must never write them.
The agent asks the kubelet's pod-resources API (`GetAllocatableResources` offers CPUs only under
`static`) and stands down: it runs as with `--enforcement off` (labels and the NRT), counts the
kubelet's own exclusive CPUs (`List`) as taken in the NRT, and says so in one log line.  The `none`
side is tests/realnode/test_realnode.py, where the agent pins; the Event and the metric are
tests/kube/test_kubelet_static.py.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.topology.cpuset import CPUSet
from tests.controlplane.cluster import Cluster
from tests.kube.kubelet_standin import wait_for
from tests.realnode.conftest import pods_deleted_after, running_node
from tests.realnode.node import (
    NodeAgent,
    RealNode,
    RealNodeParts,
    WriteCounter,
    cpuset_of,
    proc_affinity,
)
from tests.realnode.test_realnode import all_cpus, nrt_available_cpus, run

WATCH_SECONDS = 60.0  # six of the kubelet's reconcile periods (10 s)


@pytest.fixture(scope="module")
def static_node(cluster_session: Cluster, realnode_parts: RealNodeParts) -> Iterator[RealNode]:
    """A real node whose kubelet runs `cpuManagerPolicy: static` with CPU 0 reserved."""
    yield from running_node(cluster_session, realnode_parts, cpu_manager_policy="static", reserved_cpus="0")


@pytest.fixture
def static_pods(static_node: RealNode) -> Iterator[list[str]]:
    """Names of pods a test creates on the static node; deleted (and waited for) after it."""
    yield from pods_deleted_after(static_node)


def test_agent_stands_down_beside_a_static_cpu_manager_and_no_cpuset_is_written_twice(
        static_node: RealNode, static_pods: list[str]) -> None:
    everything = all_cpus(static_node)
    _, pinned_pid = run(static_node, static_pods, "pinned")
    # No CPU request: the only allocatable CPU (CPU 0 is reserved) is the pinned pod's.
    _, shared_pid = run(static_node, static_pods, "shared", cpu=None, limits=False)
    # The kubelet pinned the Guaranteed container itself, away from its reserved CPU 0.
    pinned = CPUSet.parse(wait_for(lambda: (c := cpuset_of(pinned_pid)[1]) != everything.cpulist() and c,
                                   "the kubelet's own pin"))
    assert 0 not in pinned and len(pinned) == 1
    assert CPUSet.parse(proc_affinity(pinned_pid)) == pinned
    offered = everything - CPUSet([0])

    # Every cpuset of the node's pods, the pods' and the kubelet's QoS cgroups, watched for a minute
    # (six of the kubelet's reconcile periods) while the agent runs: none written twice.
    files = [Path(d) / "cpuset.cpus" for d, _, fs in os.walk(static_node.cpuset_root / "kubepods")
             if "cpuset.cpus" in fs]
    assert len(files) >= 5  # kubepods, 2 QoS, 2 pods and their 4 containers at least
    agent = NodeAgent(static_node)
    with WriteCounter(files) as writes:
        agent.start()
        try:
            # The NRT offers what the kubelet offers, less its pin.
            wait_for(lambda: nrt_available_cpus(static_node) == len(offered) - len(pinned) or
                     not agent.running(), "the NRT counting the kubelet's pin")
            log = agent.log()
            assert agent.running(), log
            assert "cpuManagerPolicy: static" in log and f"offers CPUs {offered.cpulist()}" in log, log
            assert "stands down" in log and "Traceback" not in log
            time.sleep(WATCH_SECONDS)
            assert agent.running(), agent.log()
        finally:
            agent.stop()
    assert not (static_node.cpuset_root / "topolet").exists()  # it made no cgroup of its own either
    # The kubelet writes a container's cpuset through the runtime when its decision for it is new to
    # its reconcile loop (seen here: once, for the Burstable container), never again while nothing
    # changes; the agent standing down writes none.
    twice = {str(p.relative_to(static_node.cpuset_root)): n for p, n in writes.counts.items() if n > 1}
    assert not twice, twice
    assert cpuset_of(pinned_pid)[1] == pinned.cpulist()


# ---- the question itself, against the pod-resources stand-in (no real node needed) --------------

@pytest.mark.parametrize("in_process", [False, True])
def test_exclusive_cpus_question_answers_what_the_socket_offers(in_process: bool) -> None:
    """Asked from a child process (a node without GPUs: grpc not loaded) or in this one."""
    from agent.kube.kubelet.podresources.exclusive import kubelet_exclusive_cpus
    from tests.kube.podresources_standin import PodResourcesStandIn

    with PodResourcesStandIn(allocatable_cpus=[1, 2, 5]) as static:
        assert kubelet_exclusive_cpus(static.path, in_process) == CPUSet([1, 2, 5])
        assert static.calls == ["GetAllocatableResources"]
    with PodResourcesStandIn() as none:
        assert kubelet_exclusive_cpus(none.path, in_process) == CPUSet()
    with PodResourcesStandIn(mode="garbage") as garbage:
        assert kubelet_exclusive_cpus(garbage.path, in_process) is None
    assert kubelet_exclusive_cpus("/nonexistent/kubelet.sock", in_process) is None
