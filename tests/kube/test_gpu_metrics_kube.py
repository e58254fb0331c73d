"""`topolet_gpus{numa, state}` and `topolet_mig_devices{numa, profile, state}` from the in-cluster agent,
scraped over HTTP: a pod the kubelet hands a whole GPU and a MIG device shows them allocated in the
next scrape, with no reconcile in between (the agent re-reads the kubelet after every pod change).

The agent runs in this process on a real API server, without enforcement, on the 64-CPU dump; NVML is
the stand-in (tests/gpu/fake_nvml.py) with three H100s, two in MIG mode, and the kubelet's pod-resources
socket its gRPC stand-in.  The inventory is hand-built: GPU 0 on NUMA 0 and GPU 1 on NUMA 1 in MIG
mode, GPU 2 on NUMA 1 a whole GPU.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from agent.cli.compose import kube_agent
from agent.kube.kubelet.podresources.client import Device
from agent.metrics.registry import Metrics
from agent.metrics.server import MetricsServer
from tests.gpu.fake_nvml import h100_node
from tests.kube.kubelet_standin import wait_for
from tests.kube.podresources_standin import PodResourcesStandIn
from tests.kube.test_enforcement_off import DumpNode, dump_node
from tests.kube.test_nrt import gpu
from tests.kube.test_nrt_mig import three_instances
from tests.standalone.test_gpu_metrics import gpus, mig, scrape

__all__ = ["dump_node"]

GPUS = (gpu(0, 0, address="0000:18:00.0", mig=True), gpu(1, 1, address="0000:3b:00.0", mig=True),
        gpu(2, 1, address="0000:86:00.0"))


def test_a_pods_gpu_and_mig_device_are_allocated_in_the_next_scrape(
        dump_node: DumpNode, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    node = dump_node
    monkeypatch.setenv("POD_NAMESPACE", node.namespace)
    nvml: Any = h100_node(3)
    nvml.gpus[2].mig_current = nvml.gpus[2].mig_pending = 0  # GPU 2: not in MIG mode
    first = three_instances(nvml)
    with PodResourcesStandIn() as kubelet:
        args = node.in_process_args(kubelet.path, 3600)
        metrics = Metrics()
        agent = kube_agent(args, metrics, nvml=nvml, gpus=GPUS)
        server = MetricsServer(metrics, "127.0.0.1:0", lambda: (True, "ok"))
        server.start()
        url = f"http://127.0.0.1:{server.port}/metrics"
        stop = threading.Event()
        thread = threading.Thread(target=agent.run, args=(stop,), daemon=True)
        thread.start()
        try:
            idle = {mig(0, "1g.10gb", "allocated"): 0, mig(0, "1g.10gb", "free"): 2,
                    mig(1, "3g.40gb", "allocated"): 0, mig(1, "3g.40gb", "free"): 1}
            wait_for(lambda: scrape(url, "topolet_mig_devices") == idle, "the MIG instances by profile")
            # GPUs 0 and 1 are in MIG mode: not whole GPUs.
            assert scrape(url, "topolet_gpus") == {gpus(1, "allocated"): 0, gpus(1, "free"): 1}
            passes = metrics.registry.get_sample_value("topolet_reconcile_duration_seconds_count")
            assert passes == 1  # the first pass; the next is an hour away

            kubelet.assignments = {(node.namespace, "train", "c0"): [
                Device("nvidia.com/gpu", ("2",), frozenset({1})),
                Device("nvidia.com/mig-1g.10gb", (f"MIG-GPU-00000000-h100/{first}/0",), frozenset({0}))]}
            node.create_running_pod("train", None)  # a pod change: the agent asks the kubelet again
            wait_for(lambda: scrape(url, "topolet_gpus") == {gpus(1, "allocated"): 1, gpus(1, "free"): 0},
                     "the whole GPU the kubelet handed out, allocated")
            assert scrape(url, "topolet_mig_devices") == {
                **idle, mig(0, "1g.10gb", "allocated"): 1, mig(0, "1g.10gb", "free"): 1}
            assert metrics.registry.get_sample_value("topolet_reconcile_duration_seconds_count") == passes
        finally:
            stop.set()
            thread.join(30)
            server.stop()
            agent.api.close()
