"""`topolet agent --mig-config`: the standalone agent keeps a MIG layout applied through the stand-in
NVML and reports it in the features.d labels and in /metrics' families.

No root needed: the cgroup root is a folder that is not one, so pinning is off and only MIG runs.
The node's topology is the HGX sysfs fixture; its NVML is a 2 × H100 stand-in.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

import agent.standalone.daemon as daemon_module
from agent.cli import build_parser
from agent.cli.commands import register_label_sources
from agent.cli.compose import standalone_config
from agent.config import StandaloneConfig
from agent.metrics.registry import Metrics
from agent.standalone.daemon import StandaloneAgent
from tests.gpu.fake_nvml import FakeNVML, h100_node
from tests.gpu.sysfs_fixture import build_hgx

CONFIG = "topolet.io/mig.config"
STATE = "topolet.io/mig.config.state"
MUTATING = {"nvmlDeviceSetMigMode", "nvmlDeviceCreateGpuInstanceWithPlacement", "nvmlGpuInstanceDestroy",
            "nvmlGpuInstanceCreateComputeInstance", "nvmlComputeInstanceDestroy"}


class Crash(BaseException):
    """The agent process dies here."""


@pytest.fixture(scope="module")
def hgx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_hgx(tmp_path_factory.mktemp("hgx"))


def agent_args(tmp_path: Path, fsroot: Path, *extra: str) -> StandaloneConfig:
    features = tmp_path / "features.d"
    features.mkdir(exist_ok=True)
    return standalone_config(build_parser().parse_args([
        "agent", "--fsroot", str(fsroot), "--state-dir", str(tmp_path / "state"),
        "--features-dir", str(features), "--cgroup-root", str(tmp_path / "not-a-cgroup"), *extra]))


def fake(gpus: int = 2, **kw: Any) -> FakeNVML:
    nvml = h100_node(gpus, **kw)
    nvml.nvmlInit()
    return nvml


def labels_file(tmp_path: Path) -> dict[str, str]:
    text = (tmp_path / "features.d" / "topolet").read_text()
    return dict(line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))


def sample(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def state_gauge(metrics: Metrics) -> dict[str, float | None]:
    return {s: sample(metrics, "topolet_mig_config_state", state=s) for s in ("pending", "success", "failed")}


def test_agent_applies_the_layout_labels_success_and_counts_creates(tmp_path: Path, hgx: Path) -> None:
    nvml = fake(2)
    seen_while_creating: list[str | None] = []
    create = nvml.nvmlDeviceCreateGpuInstanceWithPlacement

    def watching_create(*args: Any) -> Any:
        if not seen_while_creating:  # what a reader of features.d sees while the change runs
            seen_while_creating.append(labels_file(tmp_path).get(STATE))
        return create(*args)

    setattr(nvml, "nvmlDeviceCreateGpuInstanceWithPlacement", watching_create)  # noqa: B010
    register_label_sources()  # as the command line does before it starts an agent
    metrics = Metrics()
    agent = StandaloneAgent(agent_args(tmp_path, hgx, "--mig-config", "all-1g.10gb"), metrics, nvml=nvml)
    agent.reconcile()
    assert all(len(nvml.layout(g)) == 7 for g in range(2))
    labels = labels_file(tmp_path)
    assert labels[CONFIG] == "all-1g.10gb" and labels[STATE] == "success"
    assert "topolet.io/gpu.count" in labels  # the registered sources' labels are all still there
    assert seen_while_creating == ["pending"]
    created = sample(metrics, "topolet_mig_operations_total", op="gpu_instance_create", result="success")
    assert created == 14
    assert sample(metrics, "topolet_mig_operations_total", op="compute_instance_create",
                  result="success") == 14
    assert state_gauge(metrics) == {"pending": 0, "success": 1, "failed": 0}
    # The next pass finds the layout in place: no NVML change, no label rewrite.
    writes = sample(metrics, "topolet_label_writes_total")
    nvml.calls.clear()
    agent.reconcile()
    assert not MUTATING & set(nvml.calls)
    assert sample(metrics, "topolet_label_writes_total") == writes
    assert sample(metrics, "topolet_mig_operations_total", op="gpu_instance_create",
                  result="success") == 14


def test_in_use_instance_blocks_the_layout_failed_with_reason(tmp_path: Path, hgx: Path,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    nvml = fake(2)
    busy = nvml.create_instance(0, "3g.40gb", 4)
    nvml.start_process(0, 4242, gi_id=busy, ci_id=0)
    held = nvml.gpus[0].gis[busy]
    metrics = Metrics()
    agent = StandaloneAgent(agent_args(tmp_path, hgx, "--mig-config", "all-7g.80gb"), metrics, nvml=nvml)
    with caplog.at_level(logging.WARNING, logger="topolet.gpu.mig"):
        agent.reconcile()
        agent.reconcile()
    assert labels_file(tmp_path)[STATE] == "failed"
    assert state_gauge(metrics) == {"pending": 0, "success": 0, "failed": 1}
    reasons = [r.getMessage() for r in caplog.records if "failed" in r.getMessage()]
    assert len(reasons) == 1 and "GPU 0" in reasons[0] and "3g.40gb@4" in reasons[0]  # logged once
    assert nvml.gpus[0].gis[busy] is held and held.cis and nvml.layout(0) == [("3g.40gb", 4, 4)]
    assert not MUTATING & set(nvml.calls)
    # The job ends: the next pass applies the layout.
    nvml.stop_process(0, 4242)
    agent.reconcile()
    assert labels_file(tmp_path)[STATE] == "success"
    assert nvml.layout(0) == [("7g.80gb", 0, 8)]
    assert sample(metrics, "topolet_mig_operations_total", op="gpu_instance_destroy", result="success") == 1


@pytest.mark.parametrize(("extra", "needs_reset", "state"), [
    ((), False, "failed"),  # MIG off and not ours to turn on: the MIG manager's "failed"
    (("--allow-mig-mode-change",), True, "pending"),  # staged until a GPU reset
    (("--allow-mig-mode-change",), False, "success"),
])
def test_mig_mode_disabled(tmp_path: Path, hgx: Path, extra: tuple[str, ...], needs_reset: bool,
                           state: str) -> None:
    nvml = fake(2, mig=False, mig_change_needs_reset=needs_reset)
    metrics = Metrics()
    agent = StandaloneAgent(agent_args(tmp_path, hgx, "--mig-config", "all-balanced", *extra), metrics,
                            nvml=nvml)
    agent.reconcile()
    assert labels_file(tmp_path)[STATE] == state
    assert state_gauge(metrics)[state] == 1
    changes = sample(metrics, "topolet_mig_operations_total", op="mig_mode_change", result="success")
    assert changes == (2 if extra else 0)  # initialised: a series at 0 before the first change
    assert sample(metrics, "topolet_mig_mode_changes_total") == changes  # the applier's total, exported
    assert sample(metrics, "topolet_mig_apply_errors_total") == (1 if state == "failed" else 0)
    if needs_reset:
        for g in range(2):
            nvml.reset_gpu(g)
        agent.reconcile()
        assert labels_file(tmp_path)[STATE] == "success"
        assert state_gauge(metrics) == {"pending": 0, "success": 1, "failed": 0}


def test_agent_restarted_after_a_crash_midway_finishes_the_plan(tmp_path: Path, hgx: Path) -> None:
    nvml = fake(2)
    create = nvml.nvmlDeviceCreateGpuInstanceWithPlacement
    calls = 0

    def dying_create(*args: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 9:  # GPU 1's second instance
            raise Crash
        return create(*args)

    setattr(nvml, "nvmlDeviceCreateGpuInstanceWithPlacement", dying_create)  # noqa: B010
    args = agent_args(tmp_path, hgx, "--mig-config", "all-1g.10gb")
    with pytest.raises(Crash):
        StandaloneAgent(args, Metrics(), nvml=nvml).reconcile()
    delattr(nvml, "nvmlDeviceCreateGpuInstanceWithPlacement")  # the class's own again
    assert labels_file(tmp_path)[STATE] == "pending"  # what the dead agent left published
    metrics = Metrics()
    StandaloneAgent(args, metrics, nvml=nvml).reconcile()
    assert labels_file(tmp_path)[STATE] == "success"
    assert all(len(nvml.layout(g)) == 7 and all(len(gi.cis) == 1 for gi in nvml.gpus[g].gis.values())
               for g in range(2))
    assert sample(metrics, "topolet_mig_operations_total", op="gpu_instance_create", result="success") == 6


def test_no_mig_config_never_loads_nvml(tmp_path: Path, hgx: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_load() -> tuple[Any, str]:
        raise AssertionError("NVML loaded without --mig-config")

    monkeypatch.setattr(daemon_module, "load_nvml", no_load)
    metrics = Metrics()
    agent = StandaloneAgent(agent_args(tmp_path, hgx), metrics)
    agent.reconcile()
    assert agent.mig is None
    labels = labels_file(tmp_path)
    assert CONFIG not in labels and STATE not in labels
    assert state_gauge(metrics) == {"pending": None, "success": None, "failed": None}


def test_missing_nvml_library_is_logged_once_and_publishes_no_mig_state(
        tmp_path: Path, hgx: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    loads: list[int] = []

    def missing() -> tuple[Any, str]:
        loads.append(1)
        return None, "no NVML: NVML Shared Library Not Found"

    monkeypatch.setattr(daemon_module, "load_nvml", missing)
    with caplog.at_level(logging.INFO, logger="topolet.agent"):
        agent = StandaloneAgent(agent_args(tmp_path, hgx, "--mig-config", "all-1g.10gb"), Metrics())
        agent.reconcile()
        agent.reconcile()
    assert loads == [1] and agent.mig is None
    assert [r.getMessage() for r in caplog.records if "Library Not Found" in r.getMessage()] == [
        "MIG config all-1g.10gb not applied: no NVML: NVML Shared Library Not Found"]
    assert STATE not in labels_file(tmp_path)


def test_node_without_mig_capable_gpu_publishes_no_mig_state(tmp_path: Path, hgx: Path) -> None:
    nvml = FakeNVML()
    nvml.add_gpu("NVIDIA L40S", model=None, bus_id="00000000:18:00.0", pci_device_id=0x26B9,
                 memory_total=48 << 30, compute_capability=(8, 9))
    nvml.nvmlInit()
    metrics = Metrics()
    StandaloneAgent(agent_args(tmp_path, hgx, "--mig-config", "all-1g.10gb"), metrics, nvml=nvml).reconcile()
    labels = labels_file(tmp_path)
    assert CONFIG not in labels and STATE not in labels
    assert state_gauge(metrics) == {"pending": None, "success": None, "failed": None}
    assert nvml.calls == []


def test_gpu_held_whole_by_an_exec_keeps_its_mig_mode(tmp_path: Path, hgx: Path) -> None:
    from agent.enforce.state import Allocation, Owner, State
    from agent.enforce.state_file import StateFile
    from agent.topology.cpuset import CPUSet

    nvml = fake(2, mig=False)  # GPU 0's NVML bus id is 00000000:18:00.0
    args = agent_args(tmp_path, hgx, "--mig-config", "all-1g.10gb", "--allow-mig-mode-change")
    StateFile(args.state_dir).commit(State((Allocation(
        "job", CPUSet([2]), CPUSet(), "topolet/job", Owner(pid=100, start_time=7), "exec best-effort/any",
        1.0, ("0000:18:00.0",)),)))
    metrics = Metrics()
    agent = StandaloneAgent(args, metrics, nvml=nvml)
    agent.reconcile()
    assert labels_file(tmp_path)[STATE] == "failed"
    assert nvml.gpus[0].mig_pending == 0 and nvml.gpus[0].mig_current == 0
    assert agent.mig is not None and "held whole" in agent.mig.reason
    # Released: the next pass may enable it.
    state_file = StateFile(args.state_dir)
    state_file.commit(state_file.load().without("job"))
    agent.reconcile()
    assert labels_file(tmp_path)[STATE] == "success" and nvml.gpus[0].mig_current == 1


def test_unreadable_state_file_skips_the_mig_pass(tmp_path: Path, hgx: Path) -> None:
    nvml = fake(1, mig=False)
    args = agent_args(tmp_path, hgx, "--mig-config", "all-1g.10gb", "--allow-mig-mode-change")
    Path(args.state_dir).mkdir()
    (Path(args.state_dir) / "state.json").write_text("{not json")
    agent = StandaloneAgent(args, Metrics(), nvml=nvml)
    agent.reconcile()
    assert nvml.calls == [] and STATE not in labels_file(tmp_path)
