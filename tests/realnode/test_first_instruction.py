"""The real agent pins Guaranteed pods from their first instruction, on a real node, on both routes.

For each route (`pod-cgroup` on containerd 1.6, `nri` on containerd 2.4.2 with the agent on the
node's NRI socket), bench/realnode_arms.py's arm runs `PODS` Guaranteed 1-CPU pods one at a time
(some with `topolet.io/memory-binding: "true"`) and a Burstable pod beside every `BURSTABLE_EVERY`th:
every container's first instruction (its `/proc/self/status` read with shell builtins, then
`nproc`) saw its allocation in the agent's state file, and no Burstable pod saw an exclusive CPU.
A Guaranteed pod with a second (shared, 100m) container is checked on its own.  The kubelet's static
arm and the timings are the bench's (`bench/kube.py --real-node`); nothing here asserts on timing.

In tests/vm's cgroup v2 guest (4 vCPUs over two emulated NUMA nodes:
tests/vm/test_guest_first_instruction.py) the same check runs on both routes with pods held together
(`WAVES`: a 2-CPU and a 1-CPU pod at once, their memory bound to the guest's two NUMA nodes, a
Burstable pod started among them); elsewhere that case skips, naming the guest.

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
import time
from types import ModuleType
from typing import Any

import pytest

from agent.topology.cpuset import CPUSet
from tests.conftest import REPO, require
from tests.controlplane.cluster import Cluster
from tests.realnode.node import RealNodeParts

PODS = 10
BURSTABLE_EVERY = 5  # two Burstable pods

# (kind, CPUs) per pod, each wave's pods held together on the guest's 4 CPUs (one always left shared):
# a 2-CPU pod fills one NUMA node and the 1-CPU pod can only go on the other, both memory-bound, so one
# wave binds memory on both nodes; with its Burstable pod, 3 pods per route (each costs the emulated
# guest most of a minute to start, so one wave, not more).
WAVES = [[("mem", 2), ("mem", 1)]]
SYSFS_NODES = "/sys/devices/system/node"


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


def run_arm(route: str, cluster: Cluster, parts: RealNodeParts, pods: int, multi: bool,
            waves: list[list[tuple[str, int]]] | None = None) -> Any:
    arms = arms_module()
    if route == arms.NRI:
        require(parts.containerd2 is not None, "no containerd 2.4.2 among the real node's parts")
    require(len(os.sched_getaffinity(0)) >= 2, "needs two CPUs to tell a pinned pod from the pool")
    started = time.monotonic()
    (result,) = arms.run_arms(cluster, parts, pods, BURSTABLE_EVERY, arms=(route,), multi=multi,
                              waves=waves).values()
    print(f"\n{route}: first instruction pinned {result.pinned}/{result.guaranteed}, Burstable clean "
          f"{result.burstable_clean}/{result.burstable}"
          + (f", memory bound to nodes {' '.join(result.bound_mems)}" if result.bound_mems else "")
          + f" ({time.monotonic() - started:.0f} s)"
          + "".join(f"\n  {s}" for s in result.seen)
          + "".join(f"\n  miss: {m}" for m in result.misses))
    return result


def numa_nodes() -> CPUSet:
    try:
        with open(f"{SYSFS_NODES}/online") as f:
            return CPUSet.parse(f.read().strip())
    except OSError:
        return CPUSet()


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


@pytest.mark.skipif(os.environ.get("TOPOLET_GUEST") != "1",
                    reason="needs 4 CPUs over two NUMA nodes: runs in tests/vm's guest "
                           "(tests/vm/test_guest_first_instruction.py)")
@pytest.mark.parametrize("route", ["pod-cgroup", "nri"])
def test_pods_held_together_on_two_numa_nodes(route: str, realnode_cluster: Cluster,
                                               realnode_parts: RealNodeParts) -> None:
    require(len(os.sched_getaffinity(0)) == 4 and len(numa_nodes()) == 2,
            f"needs 4 CPUs over two NUMA nodes (qemu -numa); has CPUs {sorted(os.sched_getaffinity(0))}, "
            f"NUMA nodes {numa_nodes().cpulist()}")
    result = run_arm(route, realnode_cluster, realnode_parts, 0, multi=False, waves=WAVES)
    guaranteed = sum(len(w) for w in WAVES)
    assert (result.guaranteed, result.burstable) == (guaranteed, len(WAVES)), result.misses
    assert (result.pinned, result.burstable_clean) == (guaranteed, len(WAVES)), result.misses
    # Memory bound to one emulated NUMA node each, never the whole machine's, and both nodes used.
    bound = [CPUSet.parse(m) for m in result.bound_mems]
    assert len(bound) == sum(k == "mem" for w in WAVES for k, _ in w), result.bound_mems
    assert all(len(m) == 1 and m <= numa_nodes() for m in bound), result.bound_mems
    assert CPUSet().union(*bound) == numa_nodes(), result.bound_mems
