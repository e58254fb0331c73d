"""The real agent pins Guaranteed pods from their first instruction, on a real node, on both routes.

For each route (`pod-cgroup` on containerd 1.6, `nri` on containerd 2.4.2 with the agent on the
node's NRI socket), bench/realnode_arms.py's arm runs `PODS` Guaranteed 1-CPU pods one at a time
(some with `topolet.io/memory-binding: "true"`) and a Burstable pod beside every `BURSTABLE_EVERY`th:
every container's first instruction (its `/proc/self/status` read with shell builtins, then
`nproc`) saw its allocation in the agent's state file, and no Burstable pod saw an exclusive CPU.
A Guaranteed pod with a second (shared, 100m) container is checked on its own.  The kubelet's static
arm and the timings are the bench's (`bench/kube.py --real-node`); nothing here asserts on timing.

A Guaranteed pod with an exclusive and a shared container, on each route: on pod-cgroup its pod
cgroup holds the union of both sets, so each container's cgroup is written as runc makes it, told
apart by the runtime's bundle (`agent.enforce.bundles`, `--runtime-bundles`).

Needs what tests/realnode needs, containerd 2.4.2 for the NRI route and two CPUs: a skip on a laptop,
a failure under CI=true.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from types import ModuleType
from typing import Any

import pytest

from tests.conftest import REPO, require
from tests.controlplane.cluster import Cluster
from tests.realnode.node import RealNodeParts

PODS = 10
BURSTABLE_EVERY = 5  # two Burstable pods


def arms_module() -> ModuleType:
    """bench/realnode_arms.py (bench/ is no package)."""
    name = "realnode_arms"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / "bench" / "realnode_arms.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def run_arm(route: str, cluster: Cluster, parts: RealNodeParts, pods: int, multi: bool) -> Any:
    arms = arms_module()
    if route == arms.NRI:
        require(parts.containerd2 is not None, "no containerd 2.4.2 among the real node's parts")
    require(len(os.sched_getaffinity(0)) >= 2, "needs two CPUs to tell a pinned pod from the pool")
    (result,) = arms.run_arms(cluster, parts, pods, BURSTABLE_EVERY, arms=(route,), multi=multi).values()
    print(f"\n{route}: first instruction pinned {result.pinned}/{result.guaranteed}, Burstable clean "
          f"{result.burstable_clean}/{result.burstable}"
          + "".join(f"\n  miss: {m}" for m in result.misses))
    return result


@pytest.mark.parametrize("route", [
    "pod-cgroup",
    "nri",  # the node's kubelet runs under a cgroup root of its own: the agent reads NRI's paths below it
])
def test_first_instruction_equals_the_allocation(route: str, realnode_cluster: Cluster,
                                                 realnode_parts: RealNodeParts) -> None:
    result = run_arm(route, realnode_cluster, realnode_parts, PODS, multi=False)
    assert (result.guaranteed, result.burstable) == (PODS, PODS // BURSTABLE_EVERY), result.misses
    assert (result.pinned, result.burstable_clean) == (PODS, PODS // BURSTABLE_EVERY), result.misses


@pytest.mark.parametrize("route", ["pod-cgroup", "nri"])
def test_multi_container_pod(route: str, realnode_cluster: Cluster, realnode_parts: RealNodeParts) -> None:
    result = run_arm(route, realnode_cluster, realnode_parts, 1, multi=True)
    assert (result.guaranteed, result.pinned) == (1, 1), result.misses
