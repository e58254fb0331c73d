"""Pod warnings on a real control plane: a pod cycling bad annotation values gets a bounded number of
Events (`agent.kube.pods.warnings.WarningLimiter`), and the agent goes on pinning other pods.

Only the kubelet is a stand-in (kubelet_standin.py).  A later pod with a bad annotation is the
barrier: warnings reach the API in the order the agent meets them, so once that pod's Event exists
every warning before it has been sent (or held back).
"""

from __future__ import annotations

import math
import time

from kubernetes import client as k8s

from agent.kube.pods.warnings import WARN_BURST, WARN_REFILL_SECONDS
from tests.kube.kubelet_standin import KubeNode, kube_node, wait_for

__all__ = ["kube_node"]

CYCLES = 20


def test_cycling_bad_annotation_values_costs_a_bounded_number_of_events(kube_node: KubeNode) -> None:
    node = kube_node
    node.start_agent()
    started = time.monotonic()
    pod = node.run_pod("cycler", cpu="100m", memory="32Mi", limits=False,
                       annotations={"topolet.io/smt": "v0"})
    wait_for(lambda: node.events(pod.uid), "the first InvalidAnnotation Event")
    core = k8s.CoreV1Api(node.api)
    for i in range(1, CYCLES):
        core.patch_namespaced_pod(pod.name, node.namespace,
                                  {"metadata": {"annotations": {"topolet.io/smt": f"v{i}"}}})
    marker = node.run_pod("barrier", cpu="100m", memory="32Mi", limits=False,
                          annotations={"topolet.io/smt": "barrier"})
    wait_for(lambda: node.events(marker.uid), "the barrier pod's Event")
    events = [e for e in node.events(pod.uid) if e.reason == "InvalidAnnotation"]
    # A burst, then one per refill period for as long as the test has run: never one per value.
    allowed = WARN_BURST + math.floor((time.monotonic() - started) / WARN_REFILL_SECONDS)
    assert WARN_BURST <= len(events) <= allowed < CYCLES
    values = {e.message.split("=", 1)[1].split(":")[0] for e in events}
    assert {f"'v{i}'" for i in range(WARN_BURST)} <= values  # the first ones went out at once
    assert node.agent is not None and node.agent.poll() is None
