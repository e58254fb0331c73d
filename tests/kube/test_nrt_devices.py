"""GPUs the device plugin hands out count as taken in the NodeResourceTopology: the ids the kubelet's
pod-resources API reports (the stand-in's) against a hand-built GPU inventory, in the pure builder
and in the agent on a real API server — written when the assignment changes, and only then.  grpc
stays unloaded on a node without GPUs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from agent.cli import build_parser
from agent.cli.compose import agent_config, kube_agent
from agent.enforce.state import State
from agent.kube.kubelet.podresources.client import Device
from agent.kube.kubelet.podresources.locality import is_mig_device_id, kubelet_gpus
from agent.kube.kubelet.resources import Kubelet
from agent.kube.publish.nrt_build import build_nrt
from agent.metrics.registry import Metrics
from tests.conftest import REPO
from tests.kube.kubelet_standin import KubeNode, kube_node, wait_for
from tests.kube.podresources_standin import PodResourcesStandIn, short_tmpdir
from tests.kube.test_nrt import TWO_SOCKETS_AND_CXL, gpu, resources, zones_by_name

__all__ = ["kube_node"]

GPUS = (gpu(0, 0, address="0000:18:00.0"), gpu(1, 0, address="0000:3b:00.0"),
        gpu(2, 1, address="0000:86:00.0"), gpu(3, 1, address="0000:af:00.0", mig=True))
UUID = [g.uuid for g in GPUS]


@pytest.mark.parametrize(("ids", "expected"), [
    ((), set()),
    ((UUID[0],), {"0000:18:00.0"}),
    ((UUID[2].upper(),), {"0000:86:00.0"}),
    (("1",), {"0000:3b:00.0"}),
    ((f"{UUID[1]}::4", f"{UUID[1]}::5"), {"0000:3b:00.0"}),  # time-slicing replicas of one GPU
    # MIG devices are not whole GPUs; ids of GPUs this inventory lacks name nothing.
    ((f"MIG-{UUID[3]}/1/0", "3:0", "MIG-4f1e2d3c-0000-5000-8000-000000000001"), set()),
    (("GPU-ffffffff-0000-0000-0000-000000000000", "9", "junk"), set()),
])
def test_kubelet_gpus(ids: tuple[str, ...], expected: set[str]) -> None:
    assert kubelet_gpus(ids, GPUS) == expected


@pytest.mark.parametrize(("device_id", "mig"), [
    ("GPU-8c1b", False), ("0", False), ("GPU-8c1b::2", False),
    ("MIG-GPU-8c1b/1/0", True), ("MIG-3e1f", True), ("0:3", True), ("0:3::1", True),
])
def test_mig_device_ids(device_id: str, mig: bool) -> None:
    assert is_mig_device_id(device_id) is mig


def test_builder_takes_assigned_gpus_with_those_held_in_state() -> None:
    free = zones_by_name(build_nrt(("w", "u"), TWO_SOCKETS_AND_CXL, State(), (), GPUS))
    taken = zones_by_name(build_nrt(("w", "u"), TWO_SOCKETS_AND_CXL, State(), (), GPUS,
                                    kubelet_gpus([UUID[0], "2"], GPUS)))
    assert resources(free["node-0"])["nvidia.com/gpu"] == ("2", "2", "2")
    assert resources(taken["node-0"])["nvidia.com/gpu"] == ("2", "2", "1")
    # GPU 3 is in MIG mode: it offers its instances, never itself; GPU 2 is the only whole one there.
    assert resources(free["node-1"])["nvidia.com/gpu"] == ("1", "1", "1")
    assert resources(taken["node-1"])["nvidia.com/gpu"] == ("1", "1", "0")
    assert resources(taken["node-0"])["cpu"] == resources(free["node-0"])["cpu"]


def test_a_kubelet_that_stops_answering_leaves_its_gpus_taken() -> None:
    # "No answer" is not "nothing handed out": read so, the NRT would show the GPUs free until the
    # kubelet answered again, with a write each way (a List timing out on a loaded node does it).
    folder = short_tmpdir()
    assigned = {("ns", "train", "c0"): [Device("nvidia.com/gpu", (UUID[1],), frozenset({0}))]}
    kubelet = Kubelet(os.path.join(folder, "kubelet.sock"), GPUS[:2])
    with PodResourcesStandIn(assigned, folder=folder):
        assert kubelet.refresh_devices() and kubelet.answered is True
        assert kubelet.assigned_gpus == {"0000:3b:00.0"} and kubelet.gpu_ids == (UUID[1],)
    # Its socket gone (a kubelet restarting), then answering garbage: the last answer stands.
    assert not kubelet.refresh_devices() and kubelet.answered is None
    with PodResourcesStandIn(assigned, folder=folder, mode="garbage"):
        assert not kubelet.refresh_devices() and kubelet.answered is False
    assert kubelet.assigned_gpus == {"0000:3b:00.0"} and kubelet.gpu_ids == (UUID[1],)
    os.rmdir(folder)


# ---- the agent ---------------------------------------------------------------------------------

def agent_args(node: KubeNode, socket: str) -> list[str]:
    return ["agent", "--mode", "kubernetes", "--kubeconfig", str(node.tmp / "agent.kubeconfig"),
            "--node-name", node.name, "--state-dir", node.state_dir,
            "--features-dir", str(node.tmp / "features.d"), "--cgroup-root", node.root,
            "--listen", "127.0.0.1:0", "--label-sink", "none", "--reconcile-seconds", "0.3",
            "--pod-resources-socket", socket]


@pytest.fixture
def node(kube_node: KubeNode, monkeypatch: pytest.MonkeyPatch) -> KubeNode:
    monkeypatch.setenv("POD_NAMESPACE", kube_node.namespace)
    return kube_node


def gpus_available(node: KubeNode) -> int | None:
    obj = node.nrt()
    if obj is None:
        return None
    return sum(int(r["available"]) for z in obj["zones"] for r in z.get("resources", [])
               if r["name"] == "nvidia.com/gpu")


def nrt_writes(metrics: Metrics) -> float:
    return metrics.registry.get_sample_value("topolet_api_writes_total", {"kind": "nrt"}) or 0.0


def reconciles(metrics: Metrics) -> float:
    return metrics.registry.get_sample_value("topolet_reconcile_duration_seconds_count") or 0.0


@pytest.fixture
def kubelet() -> Iterator[PodResourcesStandIn]:
    with PodResourcesStandIn() as s:
        yield s


def test_agent_counts_gpus_the_kubelet_assigned(node: KubeNode, kubelet: PodResourcesStandIn) -> None:
    # Two whole GPUs on NUMA node 0 (this machine's only node); the kubelet gives one to a pod.
    inventory = GPUS[:2]
    kubelet.assignments = {(node.namespace, "train", "c0"): [
        Device("nvidia.com/gpu", (UUID[1],), frozenset({0}))]}
    metrics = Metrics()
    agent = kube_agent(agent_config(build_parser().parse_args(agent_args(node, kubelet.path))), metrics,
                       gpus=inventory)
    stop = threading.Event()
    thread = threading.Thread(target=agent.run, args=(stop,), daemon=True)
    thread.start()
    try:
        wait_for(lambda: gpus_available(node) == 1, "the NRT to count the assigned GPU")
        assert "List" in kubelet.calls

        # The server shows an apply a moment before the publisher counts it, so the count is read
        # only after reconciles have gone by since (read at once, it could miss the last write: the
        # flake seen on a loaded machine, where the "extra" write was that one, counted late).
        passes = reconciles(metrics)
        wait_for(lambda: reconciles(metrics) >= passes + 2, "reconciles after the NRT showed the GPU")
        # Nothing changes: reconciles go by and the NRT is not written again.
        writes, passes = nrt_writes(metrics), reconciles(metrics)
        wait_for(lambda: reconciles(metrics) >= passes + 3, "three more reconciles")
        assert nrt_writes(metrics) == writes

        # The pod ends: its GPU is free again, in one more write.
        kubelet.assignments = {}
        wait_for(lambda: gpus_available(node) == 2, "the NRT to show the GPU free")
        # The server shows the apply a moment before the publisher counts it: wait for the count,
        # then let reconciles go by to see that it stays at one write.
        wait_for(lambda: nrt_writes(metrics) >= writes + 1, "the write to be counted")
        passes = reconciles(metrics)
        wait_for(lambda: reconciles(metrics) >= passes + 2, "two more reconciles")
        assert nrt_writes(metrics) == writes + 1

        # Another pod takes both, one of them as two time-slicing replicas.
        kubelet.assignments = {(node.namespace, "infer", "c0"): [
            Device("nvidia.com/gpu", (f"{UUID[0]}::0", f"{UUID[0]}::1", "1"), frozenset())]}
        wait_for(lambda: gpus_available(node) == 0, "the NRT to show both GPUs taken")
    finally:
        stop.set()
        thread.join(30)
        agent.api.close()


SCRIPT = """
import json, sys
from agent.cli import build_parser
from agent.cli.compose import agent_config, kube_agent
from agent.metrics.registry import Metrics
agent = kube_agent(agent_config(build_parser().parse_args(json.loads(sys.argv[1]))), Metrics(), gpus=())
ok = agent.run_once()
print(json.dumps({"ok": ok, "grpc": "grpc" in sys.modules}))
"""


def test_no_gpus_no_grpc(node: KubeNode, kubelet: PodResourcesStandIn) -> None:
    # A node without GPUs, with the kubelet's socket there: one full pass loads no grpc.  The one
    # pod-resources call is the CPU-manager question (is the kubelet's policy static?), asked once at
    # start from a child process; nothing asks for devices.
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(agent_args(node, kubelet.path))],
                         capture_output=True, text=True, env=env, cwd=REPO, timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {"ok": True, "grpc": False}
    assert kubelet.calls == ["GetAllocatableResources"]
