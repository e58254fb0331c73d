"""Beside the kubelet's static CPU manager the agent stands down instead of exiting: labels and the
NRT, no cgroup written, the kubelet's own exclusive CPUs (pod-resources `List`, the stand-in's)
counted as taken, and it says so in a log line, an Event on its Node and `topolet_info`.  A kubelet
restarted with the other policy under a running agent stops it (the restarted pod comes up in the
mode that fits).  The real kubelet's side is tests/realnode/test_cpu_manager.py.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from agent.cli import build_parser
from agent.cli.compose import agent_config, kube_agent
from agent.enforce.state import State
from agent.errors import ConfigError
from agent.kube.daemon import KUBELET_STATIC
from agent.kube.kubelet.resources import Kubelet
from agent.kube.publish.nrt import KubeletCPUs
from agent.kube.publish.nrt_build import build_nrt
from agent.metrics.registry import Metrics
from agent.topology.cpuset import CPUSet
from tests.kube.kubelet_standin import KubeNode, kube_node, wait_for
from tests.kube.podresources_standin import PodResourcesStandIn, short_tmpdir
from tests.kube.test_nrt import TWO_SOCKETS_AND_CXL, allocation, resources, zones_by_name
from tests.kube.test_nrt_devices import agent_args

__all__ = ["kube_node"]


@pytest.mark.parametrize(("offered", "pinned", "node0", "node1"), [
    # CPU 0 reserved by the kubelet (not offered): allocatable 3 on node 0; one pod holds 1 and 4.
    ([1, 2, 3, 4, 5, 6, 7], [1, 4], ("4", "3", "2"), ("4", "4", "3")),
    # Nothing handed out yet.
    ([1, 2, 3, 5, 6, 7], [], ("4", "3", "3"), ("4", "3", "3")),
    # Everything offered is taken.
    ([2, 3, 6, 7], [2, 3, 6, 7], ("4", "2", "0"), ("4", "2", "0")),
])
def test_builder_counts_the_kubelets_cpus_in_place_of_the_state(
        offered: list[int], pinned: list[int], node0: tuple[str, str, str],
        node1: tuple[str, str, str]) -> None:
    # What topolet recorded (standing down it still decides) is not what holds CPUs: the kubelet's
    # sets are, so the state's allocations and reserved CPUs are not counted as well.
    state = State(allocations=(allocation("a", [2, 3]),), reserved=CPUSet([5]))
    zones = zones_by_name(build_nrt(("w", "u"), TWO_SOCKETS_AND_CXL, state, (),
                                    kubelet_cpus=KubeletCPUs(CPUSet(offered), CPUSet(pinned))))
    assert resources(zones["node-0"])["cpu"] == node0
    assert resources(zones["node-1"])["cpu"] == node1
    assert "cpu" not in resources(zones["node-2"])  # the CXL node: memory only, as before


def test_kubelet_reads_its_exclusive_cpus_only_under_static() -> None:
    folder = short_tmpdir()
    socket = os.path.join(folder, "kubelet.sock")
    cpu_ids = {("ns", "p", "c0"): [2, 3], ("ns", "p", "c1"): [], ("ns", "q", "c0"): [6]}
    with PodResourcesStandIn({k: [] for k in cpu_ids}, folder=folder, cpu_ids=cpu_ids) as none:
        kubelet = Kubelet(socket, ())
        kubelet.check_cpu_manager()
        assert kubelet.static_cpus is None
        assert not kubelet.refresh_cpus() and none.calls == ["GetAllocatableResources"]
    with PodResourcesStandIn({k: [] for k in cpu_ids}, folder=folder, cpu_ids=cpu_ids,
                             allocatable_cpus=range(1, 8)) as static:
        kubelet = Kubelet(socket, ())
        kubelet.check_cpu_manager()
        assert kubelet.static_cpus == CPUSet(range(1, 8))
        assert kubelet.refresh_cpus() and kubelet.pinned_cpus == CPUSet([2, 3, 6])
        assert not kubelet.refresh_cpus()  # unchanged: the publisher is not woken
        static.cpu_ids = {("ns", "q", "c0"): [6]}
        static.assignments = {("ns", "q", "c0"): []}
        assert kubelet.refresh_cpus() and kubelet.pinned_cpus == CPUSet([6])
    # The socket gone (a restarting kubelet): its last answer stands.
    assert not kubelet.refresh_cpus() and kubelet.pinned_cpus == CPUSet([6])
    os.rmdir(folder)


# ---- the agent, on a real API server -------------------------------------------------------------

@pytest.fixture
def node(kube_node: KubeNode, monkeypatch: pytest.MonkeyPatch) -> KubeNode:
    monkeypatch.setenv("POD_NAMESPACE", kube_node.namespace)
    return kube_node


def cpu_zones(node: KubeNode) -> dict[str, tuple[str, str, str]] | None:
    obj = node.nrt()
    if obj is None:
        return None
    return {z["name"]: resources(z)["cpu"] for z in obj["zones"] if "cpu" in resources(z)}


def node_events(node: KubeNode) -> list[dict[str, Any]]:
    from agent.kubeapi.client import KubeClient, resource_path

    found = KubeClient(node.api).get(resource_path("events.k8s.io", "v1", "events", namespace="default"),
                                     what="list events")
    return [e for e in found.get("items", []) if e.get("regarding", {}).get("kind") == "Node"
            and e["regarding"].get("name") == node.name]


def test_agent_stands_down_under_a_static_kubelet_and_counts_its_cpus(
        node: KubeNode, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cpus = CPUSet(_node_cpus())
    offered = CPUSet(sorted(cpus)[1:])  # the kubelet reserves the first CPU
    first = sorted(offered)[0]
    pod = (node.namespace, "guaranteed", "c0")
    metrics = Metrics()
    with PodResourcesStandIn({pod: []}, cpu_ids={pod: [first]}, allocatable_cpus=offered) as kubelet:
        args = agent_args(node, kubelet.path)
        # Enforcement on (the default) and a cpuset root that does not exist: standing down, the agent
        # never looks at it.
        args[args.index("--cgroup-root") + 1] = str(tmp_path / "no-cgroup")
        with caplog.at_level(logging.WARNING, logger="topolet.kube"):
            agent = kube_agent(agent_config(build_parser().parse_args(args)), metrics, gpus=())
        assert not agent.enforce and agent.enforcement == KUBELET_STATIC
        said = [r.getMessage() for r in caplog.records if "cpuManagerPolicy: static" in r.getMessage()]
        assert len(said) == 1 and f"offers CPUs {offered.cpulist()}" in said[0], said
        assert metrics.registry.get_sample_value(
            "topolet_info", {"enforcement": KUBELET_STATIC, "nodename": node.name, "mode": "kubernetes",
                             "version": _version()}) == 1.0
        stop = threading.Event()
        thread = threading.Thread(target=agent.run, args=(stop,), daemon=True)
        thread.start()
        try:
            def available() -> int | None:
                zones = cpu_zones(node)
                return None if zones is None else sum(int(z[2]) for z in zones.values())

            wait_for(lambda: available() == len(offered) - 1, "the NRT to count the kubelet's CPU")
            zones = cpu_zones(node)
            assert zones is not None
            assert sum(int(z[1]) for z in zones.values()) == len(offered)  # allocatable: what it offers
            wait_for(lambda: node_events(node), "the Event on the Node")
            (event,) = node_events(node)
            assert event["reason"] == "KubeletCPUManagerStatic" and event["type"] == "Normal"
            assert "stands down" in event["note"]

            # The pod ends: its CPU is free again.
            kubelet.assignments, kubelet.cpu_ids = {}, {}
            wait_for(lambda: available() == len(offered), "the NRT to show the CPU free")
        finally:
            stop.set()
            thread.join(30)
            agent.api.close()
    assert thread.is_alive() is False
    assert not (tmp_path / "no-cgroup").exists()


def test_a_kubelet_restarted_with_static_stops_a_pinning_agent(node: KubeNode) -> None:
    folder = short_tmpdir()
    with PodResourcesStandIn(folder=folder) as none:
        agent = kube_agent(agent_config(build_parser().parse_args(agent_args(node, none.path))), Metrics(),
                           gpus=())
    assert agent.enforce and agent.enforcement == "on"
    try:
        # The kubelet comes back with static: a new socket, a new answer; the agent stops before it
        # writes another cpuset, saying why, and its restarted pod stands down.
        with PodResourcesStandIn(folder=folder, allocatable_cpus=[1]):
            with pytest.raises(ConfigError, match="restarted with it under a pinning agent"):
                agent.run(threading.Event())
    finally:
        agent.api.close()
    os.rmdir(folder)


def _node_cpus() -> list[int]:
    from agent.topology.discover import discover

    return sorted(discover("/").cpus)


def _version() -> str:
    from agent import __version__

    return __version__
