"""The DaemonSet's own pod, from the image `make image` builds, on a real node: `kubectl apply -k` an overlay.

The overlay (tests/realnode/node.py: write_overlay) is daemonset/ with its local-image component, the
image imported with `ctr -n k8s.io images import`, adapted to this test machine and nothing else.
The cluster's kube-controller-manager runs no DaemonSet controller, so the test starts a second one
with only `daemonset-controller` (same identity and flags); the real kube-scheduler binds the pod.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import pytest

from tests.conftest import require
from tests.kube.kubelet_standin import wait_for
from tests.realnode.node import (
    AGENT_NS,
    IMAGE_ENV,
    DaemonSetAgent,
    RealNode,
    container_id,
    cpuset_of,
    image_env,
)
from tests.realnode.test_realnode import all_cpus, exclusive_cpus, get_pod, nrt_available_cpus, run


@pytest.fixture(scope="module")
def daemonset(real_node: RealNode) -> Iterator[DaemonSetAgent]:
    """The DaemonSet applied with `kubectl apply -k` and its pod Running on the real node."""
    env = image_env()
    require(bool(env), f"no agent image: {IMAGE_ENV} missing (make image)")
    agent = DaemonSetAgent(real_node, env)
    try:
        agent.start()
        yield agent
    finally:
        print(agent.logs())
        agent.stop()


def test_daemonset_pod_publishes_and_pins_on_the_real_node(real_node: RealNode, daemonset: DaemonSetAgent,
                                                           pods: list[str]) -> None:
    """The DaemonSet's pod (the built image) publishes the NRT and labels and pins a Guaranteed pod in
    runc's cgroup; killing its container loses no allocation."""
    everything = all_cpus(real_node)
    wait_for(lambda: nrt_available_cpus(real_node) == len(everything), "the NRT from the DaemonSet's pod")
    with real_node.api() as api:
        path = f"/apis/nfd.k8s-sigs.io/v1alpha1/namespaces/{AGENT_NS}/nodefeatures"
        features = wait_for(lambda: api.list(path)["items"], "the agent's NodeFeature")
    labels = features[0]["spec"]["labels"]
    assert labels.get("topolet.io/numa.nodes") == "1"

    pod, pid = run(real_node, pods, "pinned-by-daemonset")
    pinned = wait_for(lambda: exclusive_cpus(pid), "the DaemonSet's agent to pin the pod")
    assert cpuset_of(pid)[0].name == container_id(pod)
    wait_for(lambda: nrt_available_cpus(real_node) == len(everything) - 1, "the NRT to count it")

    # Kill the agent's container: the kubelet restarts it, from the state on the host path.
    assert daemonset.pod is not None
    before = daemonset.pid()
    assert daemonset.memory_bytes() > 0
    os.kill(before, signal.SIGKILL)
    with real_node.api() as api:
        restarted = wait_for(lambda: (p := get_pod(api, daemonset.pod["metadata"]["name"], AGENT_NS)) and
                             any(cs.get("restartCount", 0) >= 1 and "running" in cs.get("state", {})
                                 for cs in p["status"].get("containerStatuses") or []) and p,
                             "the agent's container restarted", timeout=120)
    daemonset.pod = restarted
    assert daemonset.pid() != before
    time.sleep(3.0)
    assert exclusive_cpus(pid) == pinned
    wait_for(lambda: nrt_available_cpus(real_node) == len(everything) - 1, "the NRT after the restart")
