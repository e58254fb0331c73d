"""The DaemonSet's own pod, from the image `make image` builds, on a real node: `kubectl apply -k` an overlay.

The overlay (tests/realnode/node.py: write_overlay) is daemonset/ with its local-image component, the
image imported with `ctr -n k8s.io images import`, adapted to this test machine and nothing else.
The cluster's kube-controller-manager runs no DaemonSet controller, so the test starts a second one
with only `daemonset-controller` (same identity and flags); the real kube-scheduler binds the pod.
tests/vm/test_guest_realnode.py runs this module on cgroup v2, the node in a qemu guest and the
cluster (and that DaemonSet controller) on its host.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.enforce.state_file import StateFile
from agent.topology.cpuset import CPUSet
from tests.conftest import require
from tests.realnode.node import (
    AGENT_NS,
    IMAGE_ENV,
    DaemonSetAgent,
    RealNode,
    container_id,
    cpuset_of,
    image_env,
    milestone,
    proc_affinity,
    wait,
)
from tests.realnode.remote import load_remote
from tests.realnode.test_realnode import (
    all_cpus,
    delete_pod,
    exclusive_cpus,
    get_pod,
    nrt,
    nrt_available_cpus,
    run,
)


@pytest.fixture(scope="module")
def daemonset(real_node: RealNode) -> Iterator[DaemonSetAgent]:
    """The DaemonSet applied with `kubectl apply -k` and its pod Running on the real node."""
    env = image_env()
    require(bool(env), f"no agent image: {IMAGE_ENV} missing (make image)")
    remote = load_remote()
    agent = (DaemonSetAgent(real_node, env) if remote is None else
             DaemonSetAgent(real_node, env, kubectl=Path(remote.kubectl),
                            start_controller=not remote.daemonset_controller))
    try:
        agent.start()
        yield agent
    finally:
        print(agent.logs())
        agent.stop()


def test_daemonset_pod_publishes_and_pins_on_the_real_node(real_node: RealNode, daemonset: DaemonSetAgent,
                                                           pods: list[str]) -> None:
    """The DaemonSet's pod (the built image) publishes the NRT and labels and pins a Guaranteed pod in
    runc's cgroup while the shared pool shrinks; killing its container, restarting the kubelet and
    restarting containerd lose no allocation and assign nothing twice; deleting the pod frees its CPU."""
    everything = all_cpus(real_node)
    wait(lambda: nrt_available_cpus(real_node) == len(everything), "the NRT from the DaemonSet's pod")
    # No NRI on this node (containerd 1.6; the NRI folder mounted is the node's own, empty): --route
    # auto falls back to the pod-cgroup route and says so.
    def route() -> str | None:
        return {a["name"]: a["value"] for a in (nrt(real_node) or {}).get("attributes") or []}.get(
            "topolet.io/pinning-route")
    wait(lambda: route() == "pod-cgroup", "the NRT to report the pod-cgroup route")
    # No NFD master labels this node: --label-sink auto labels the Node itself.
    labels = wait(lambda: real_node.node_labels().get("topolet.io/numa.nodes"), "the agent's Node labels")
    assert labels == "1"

    _, shared_pid = run(real_node, pods, "pool-of-daemonset", cpu="100m", limits=False)
    pod, pid = run(real_node, pods, "pinned-by-daemonset")
    pinned = wait(lambda: exclusive_cpus(pid), "the DaemonSet's agent to pin the pod")
    milestone("pod pinned")
    # Written in the cgroup runc made for the container: kubepods/pod<uid>/<container id>.
    folder, _ = cpuset_of(pid)
    uid = pod["metadata"]["uid"]
    assert folder == real_node.cpuset_root / "kubepods" / f"pod{uid}" / str(container_id(pod))
    assert CPUSet.parse(proc_affinity(pid)) == pinned
    wait(lambda: CPUSet.parse(cpuset_of(shared_pid)[1]) == everything - pinned, "the pool to shrink")
    assert not CPUSet.parse(proc_affinity(shared_pid)) & pinned
    wait(lambda: nrt_available_cpus(real_node) == len(everything) - 1, "the NRT to count it")

    # Kill the agent's container: the kubelet restarts it, from the state on the host path.
    assert daemonset.pod is not None
    before = daemonset.pid()
    assert daemonset.memory_bytes() > 0
    os.kill(before, signal.SIGKILL)
    with real_node.api() as api:
        restarted = wait(lambda: (p := get_pod(api, daemonset.pod["metadata"]["name"], AGENT_NS)) and
                             any(cs.get("restartCount", 0) >= 1 and "running" in cs.get("state", {})
                                 for cs in p["status"].get("containerStatuses") or []) and p,
                             "the agent's container restarted", timeout=120)
    daemonset.pod = restarted
    assert daemonset.pid() != before
    time.sleep(3.0)
    assert exclusive_cpus(pid) == pinned
    wait(lambda: nrt_available_cpus(real_node) == len(everything) - 1, "the NRT after the restart")

    # Restarting the kubelet, then containerd, keeps the pin (the container runs on under its shim)
    # and assigns no CPU twice.
    agent_state = StateFile(str(real_node.dir / "agent-state"))
    for what, restart in (("a kubelet restart", real_node.restart_kubelet),
                          ("a containerd restart", real_node.restart_containerd)):
        restart()
        real_node.wait_ready()
        time.sleep(3.0)  # a few of the agent's reconcile passes (1 s)
        assert real_node.task_pids().get(str(container_id(pod))) == pid, f"container restarted by {what}"
        assert exclusive_cpus(pid) == pinned, what
        assert CPUSet.parse(cpuset_of(shared_pid)[1]) == everything - pinned, what
        held = [a.cpus for a in agent_state.load(missing_ok=True).allocations]
        assert held == [pinned], f"after {what}: {held}"
    milestone("restarts survived")

    with real_node.api() as api:
        delete_pod(api, "pinned-by-daemonset")
        wait(lambda: get_pod(api, "pinned-by-daemonset") is None, "the pinned pod gone")
    wait(lambda: CPUSet.parse(cpuset_of(shared_pid)[1]) == everything, "the pool to grow back")
    wait(lambda: nrt_available_cpus(real_node) == len(everything), "the NRT to free the CPU")
