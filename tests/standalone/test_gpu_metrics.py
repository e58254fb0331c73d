"""`topolet_gpus{numa, state}` and `topolet_mig_devices{numa, profile, state}` on the standalone agent's
/metrics, scraped over HTTP from its real MetricsServer.

The node is the HGX sysfs fixture (four GPUs on each of two NUMA nodes) and its NVML the one GPU
stand-in (tests/gpu/fake_nvml.py).  No root needed: pinning is off (the cgroup root is a folder that is
not one), so the allocation `topolet exec --gpus 1` would record is made by the engine's own allocate
and state commit with its cgroup side off (`RecordingEngine`): CPUs and GPU in one commit to the agent's
state file, which the agent reads at each scrape — no reconcile runs in between.
"""

from __future__ import annotations

import os
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.alloc.request import Request
from agent.enforce.state import Owner
from agent.metrics.registry import Metrics
from agent.metrics.server import MetricsServer
from agent.pinning.recording import RecordingEngine
from agent.standalone.daemon import StandaloneAgent
from tests.gpu.fake_nvml import FakeNVML, h100_node
from tests.standalone.test_mig_agent import agent_args
from tests.standalone.test_mig_agent import hgx as hgx  # noqa: F401 - fixture

Series = dict[tuple[tuple[str, str], ...], float]




def fake(gpus: int, **kw: Any) -> FakeNVML:
    nvml = h100_node(gpus, **kw)
    nvml.nvmlInit()
    return nvml


@pytest.fixture
def serve() -> Iterator[Any]:
    servers: list[MetricsServer] = []

    def start(metrics: Metrics) -> str:
        server = MetricsServer(metrics, "127.0.0.1:0", lambda: (True, "ok"))
        server.start()
        servers.append(server)
        return f"http://127.0.0.1:{server.port}/metrics"

    yield start
    for server in servers:
        server.stop()


def scrape(url: str, family: str) -> Series:
    """`family`'s series in one scrape of `url`: {sorted label pairs: value}."""
    with urllib.request.urlopen(url, timeout=10) as answer:
        text = answer.read().decode()
    return {tuple(sorted(s.labels.items())): s.value
            for f in text_string_to_metric_families(text) if f.name == family for s in f.samples}


def gpus(numa: int, state: str) -> tuple[tuple[str, str], ...]:
    return (("numa", str(numa)), ("state", state))


def mig(numa: int, profile: str, state: str) -> tuple[tuple[str, str], ...]:
    return (("numa", str(numa)), ("profile", profile), ("state", state))


def test_whole_gpus_by_numa_node_free_then_one_allocated_without_a_reconcile(
        tmp_path: Path, hgx: Path, serve: Any) -> None:
    metrics = Metrics()
    agent = StandaloneAgent(agent_args(tmp_path, hgx), metrics, nvml=fake(8, mig=False))
    assert agent.engine is None  # pinning off here: GPUs are reported all the same
    url = serve(metrics)
    assert scrape(url, "topolet_gpus") == {gpus(0, "allocated"): 0, gpus(0, "free"): 4,
                                           gpus(1, "allocated"): 0, gpus(1, "free"): 4}
    assert scrape(url, "topolet_mig_devices") == {}  # no GPU in MIG mode

    # What `topolet exec --cpus 4 --gpus 1` records, into the state file the agent reads.
    engine = RecordingEngine(agent.topology, agent.state_file, gpus=agent.gpus)
    alloc = engine.allocate("exec-1", Request(4), Owner.of_process(os.getpid()), gpus=1,
                            cgroup="topolet/exec-1")  # named, so the engine creates no cgroup
    (address,) = alloc.gpus
    (numa,) = {g.numa_node for g in agent.gpus if g.pci_address == address}
    passes = metrics.registry.get_sample_value("topolet_reconcile_duration_seconds_count")
    taken = scrape(url, "topolet_gpus")
    assert taken[gpus(numa, "allocated")] == 1 and taken[gpus(numa, "free")] == 3
    assert taken[gpus(1 - numa, "allocated")] == 0 and taken[gpus(1 - numa, "free")] == 4
    assert metrics.registry.get_sample_value("topolet_reconcile_duration_seconds_count") == passes == 0

    engine.release("exec-1")
    assert scrape(url, "topolet_gpus")[gpus(numa, "free")] == 4


def test_a_gpu_in_mig_mode_is_not_a_whole_gpu_its_instances_are_counted_by_profile(
        tmp_path: Path, hgx: Path, serve: Any) -> None:
    # The four H100s of NUMA 0 in MIG mode with two 3g.40gb instances each, the four of NUMA 1 not
    # (so the layout cannot be applied there: the agent says "failed" and reads the instances anyway).
    nvml = fake(8)
    for index in range(4):
        for start in (0, 4):
            nvml.create_instance(index, "3g.40gb", start)
    for index in range(4, 8):
        nvml.gpus[index].mig_current = nvml.gpus[index].mig_pending = 0
    metrics = Metrics()
    agent = StandaloneAgent(agent_args(tmp_path, hgx, "--mig-config", "all-3g.40gb"), metrics, nvml=nvml)
    url = serve(metrics)
    assert scrape(url, "topolet_mig_devices") == {}  # instances unknown until NVML is read
    agent.reconcile()
    assert scrape(url, "topolet_gpus") == {gpus(1, "allocated"): 0, gpus(1, "free"): 4}
    assert scrape(url, "topolet_mig_devices") == {mig(0, "3g.40gb", "allocated"): 0,
                                                  mig(0, "3g.40gb", "free"): 8}
    # A job starts on one instance: NVML lists its process, and the next read counts it.
    busy = next(iter(nvml.gpus[0].gis))
    nvml.start_process(0, 4242, gi_id=busy, ci_id=0)
    agent.reconcile()
    assert scrape(url, "topolet_mig_devices") == {mig(0, "3g.40gb", "allocated"): 1,
                                                  mig(0, "3g.40gb", "free"): 7}
