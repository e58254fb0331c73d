"""MigReconciler and the applier's crash recovery against the stand-in NVML.

A crash is a `Crash` (a BaseException, so neither the applier nor the reconciler catches it, as with
a SIGKILL) raised at a kill point: right after the plan file is written, or inside an NVML call
midway through the creates.  A fresh applier/reconciler over the same state folder is the restart.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import agent.gpu.applier as applier_module
from agent.gpu.applier import FAILED, PENDING, SUCCESS, Desired, MigApplier
from agent.gpu.planfile import read_plan_file, write_plan_file
from agent.gpu.reconcile import CONFIG_LABEL, MigReconciler, mig_labels
from tests.gpu.fake_nvml import FakeNVML, h100_node

MUTATING = {"nvmlDeviceSetMigMode", "nvmlDeviceCreateGpuInstanceWithPlacement", "nvmlGpuInstanceDestroy",
            "nvmlGpuInstanceCreateComputeInstance", "nvmlComputeInstanceDestroy"}
STATE_KEY = "topolet.io/mig.config.state"


class Crash(BaseException):
    """The process dies here."""


def node(gpus: int = 2, **kw: Any) -> FakeNVML:
    nvml = h100_node(gpus, **kw)
    nvml.nvmlInit()
    return nvml


def crash_on_call(nvml: FakeNVML, name: str, nth: int) -> Callable[[], None]:
    """Make the `nth` call of NVML function `name` crash before it acts; returns the undo."""
    real = getattr(nvml, name)
    calls = itertools.count(1)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if next(calls) == nth:
            raise Crash(name)
        return real(*args, **kwargs)

    setattr(nvml, name, wrapper)
    return lambda: delattr(nvml, name)


def crash_after_plan_written(monkeypatch: pytest.MonkeyPatch) -> None:
    """Kill point: the in-progress plan is on disk, no NVML change has been made yet."""

    def write_then_crash(state_dir: Any, body: dict[str, Any]) -> Path:
        path = write_plan_file(state_dir, body)
        if body.get("status") == "in-progress":
            raise Crash("after plan write")
        return path

    monkeypatch.setattr(applier_module, "write_plan_file", write_then_crash)


def one_ci_each(nvml: FakeNVML, gpu: int) -> bool:
    return all(len(gi.cis) == 1 for gi in nvml.gpus[gpu].gis.values())


def mutations(nvml: FakeNVML) -> list[str]:
    return [c for c in nvml.calls if c in MUTATING]


class Ops:
    """Collects `on_operation` reports."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def __call__(self, op: str, result: str) -> None:
        self.seen.append((op, result))

    def count(self, op: str, result: str = "success") -> int:
        return self.seen.count((op, result))


# --- reconcile ---

def test_named_layout_reaches_success_and_a_second_pass_changes_nothing(tmp_path: Path) -> None:
    nvml = node(2)
    ops, states = Ops(), list[str]()
    rec = MigReconciler(nvml, tmp_path, allow_mig_mode_change=False, on_state=states.append,
                        on_operation=ops)
    assert rec.reconcile("all-1g.10gb") == SUCCESS
    for g in range(2):
        assert [(p, s) for p, s, _ in nvml.layout(g)] == [("1g.10gb", s) for s in range(7)]
        assert one_ci_each(nvml, g)
    assert states == [PENDING, SUCCESS]
    assert ops.count("gpu_instance_create") == 14 and ops.count("compute_instance_create") == 14
    assert rec.labels() == {CONFIG_LABEL: "all-1g.10gb", STATE_KEY: SUCCESS}
    nvml.calls.clear()
    assert rec.reconcile("all-1g.10gb") == SUCCESS
    assert mutations(nvml) == [] and len(ops.seen) == 28


@pytest.mark.parametrize("config", ["", None])
def test_no_config_is_no_state_and_no_nvml_call(tmp_path: Path, config: str | None) -> None:
    nvml = node(1)
    nvml.initialized = 0  # any NVML call would now raise: none may happen
    rec = MigReconciler(nvml, tmp_path, allow_mig_mode_change=True)
    assert rec.reconcile(config or "") is None
    assert rec.labels() == {} and nvml.calls == []


def test_node_without_mig_capable_gpu_is_not_managed(tmp_path: Path) -> None:
    nvml = FakeNVML()
    nvml.add_gpu("NVIDIA L4", model=None, bus_id="00000000:18:00.0", pci_device_id=0x27B8,
                 memory_total=24 << 30, compute_capability=(8, 9))
    nvml.nvmlInit()
    rec = MigReconciler(nvml, tmp_path, allow_mig_mode_change=True)
    assert rec.reconcile("all-1g.10gb") is None
    assert rec.labels() == {} and nvml.calls == []


def test_instance_in_use_blocks_a_conflicting_layout(tmp_path: Path) -> None:
    nvml = node(2)
    busy = nvml.create_instance(0, "3g.40gb", 0)
    nvml.create_instance(1, "3g.40gb", 0)
    nvml.start_process(0, 4242, gi_id=busy, ci_id=0)
    before = {g: nvml.layout(g) for g in range(2)}
    rec = MigReconciler(nvml, tmp_path, allow_mig_mode_change=False)
    assert rec.reconcile("all-7g.80gb") == FAILED
    assert "in-use" in rec.reason and "3g.40gb@0" in rec.reason
    assert mutations(nvml) == []  # the plan fails as a whole: the idle GPU is not half-changed
    assert {g: nvml.layout(g) for g in range(2)} == before
    assert nvml.gpus[0].gis[busy].cis and rec.labels()[STATE_KEY] == FAILED


def test_instance_in_use_that_fits_the_layout_is_kept(tmp_path: Path) -> None:
    nvml = node(1)
    busy = nvml.create_instance(0, "1g.10gb", 3)
    nvml.start_process(0, 7, gi_id=busy, ci_id=0)
    held = nvml.gpus[0].gis[busy]
    assert MigReconciler(nvml, tmp_path, allow_mig_mode_change=False).reconcile("all-1g.10gb") == SUCCESS
    assert nvml.gpus[0].gis[busy] is held and len(nvml.layout(0)) == 7


@pytest.mark.parametrize(("allow", "processes", "needs_reset", "state", "reason", "enabled"), [
    (False, False, False, FAILED, "not allowed", [0, 0]),
    # Only the GPU with no processes changes mode.
    (True, True, False, FAILED, "GPU 1: 1 processes running", [1, 0]),
    (True, False, True, PENDING, "GPU 0, 1: MIG mode change waits for a GPU reset", [1, 1]),
    (True, False, False, SUCCESS, "operations", [1, 1]),
])
def test_mig_mode_disabled(tmp_path: Path, allow: bool, processes: bool, needs_reset: bool,
                           state: str, reason: str, enabled: list[int]) -> None:
    nvml = node(2, mig=False, mig_change_needs_reset=needs_reset)
    if processes:
        nvml.start_process(1, 99)
    rec = MigReconciler(nvml, tmp_path, allow_mig_mode_change=allow)
    assert rec.reconcile("all-balanced") == state
    assert reason in rec.reason
    assert [g.mig_pending for g in nvml.gpus] == enabled
    assert nvml.calls.count("nvmlDeviceSetMigMode") == sum(enabled)
    assert (nvml.layout(0) != []) == (state == SUCCESS)


def test_pending_mode_change_on_every_gpu_then_success_after_resets(tmp_path: Path) -> None:
    nvml = node(2, mig=False, mig_change_needs_reset=True)
    rec = MigReconciler(nvml, tmp_path, allow_mig_mode_change=True)
    assert rec.reconcile("all-balanced") == PENDING
    assert [g.mig_pending for g in nvml.gpus] == [1, 1]
    assert rec.reconcile("all-balanced") == PENDING
    assert nvml.calls.count("nvmlDeviceSetMigMode") == 2
    nvml.reset_gpu(0)
    assert rec.reconcile("all-balanced") == PENDING  # GPU 1 still waits
    nvml.reset_gpu(1)
    assert rec.reconcile("all-balanced") == SUCCESS


def test_unknown_layout_is_failed_with_the_known_names(tmp_path: Path) -> None:
    rec = MigReconciler(node(1), tmp_path, allow_mig_mode_change=False)
    assert rec.reconcile("all-9g.90gb") == FAILED
    assert "unknown MIG layout" in rec.reason and "all-1g.10gb" in rec.reason


def test_unexpected_error_is_failed_not_raised(tmp_path: Path) -> None:
    nvml = node(1)

    def broken(handle: Any) -> Any:
        raise RuntimeError("driver went away in a way NVML does not describe")

    nvml.nvmlDeviceGetComputeRunningProcesses = broken  # type: ignore[method-assign]
    rec = MigReconciler(nvml, tmp_path, allow_mig_mode_change=False)
    assert rec.reconcile("all-1g.10gb") == FAILED
    assert "RuntimeError" in rec.reason


def test_mig_labels_go_through_the_builder() -> None:
    assert mig_labels("all-1g.10gb", SUCCESS) == {CONFIG_LABEL: "all-1g.10gb", STATE_KEY: SUCCESS}
    assert mig_labels("", SUCCESS) == {} and mig_labels("all-1g.10gb", None) == {}
    # A value that is not a label value is normalized by the builder, never published as is.
    assert mig_labels("my layout!", FAILED)[CONFIG_LABEL] == "my_layout"


# --- crash recovery: finish ---

def test_crash_after_plan_write_then_restart_finishes(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = node(2)
    crash_after_plan_written(monkeypatch)
    with pytest.raises(Crash):
        MigReconciler(nvml, tmp_path, allow_mig_mode_change=False).reconcile("all-1g.10gb")
    monkeypatch.undo()
    assert mutations(nvml) == [] and read_plan_file(tmp_path)["status"] == "in-progress"  # type: ignore[index]
    applier = MigApplier(nvml, tmp_path)
    result = applier.resume()
    assert result is not None and result.state == SUCCESS and "finished" in result.message
    assert applier.counters.created == 14
    assert all(len(nvml.layout(g)) == 7 and one_ci_each(nvml, g) for g in range(2))
    assert read_plan_file(tmp_path)["status"] == "done"  # type: ignore[index]
    nvml.calls.clear()
    assert MigReconciler(nvml, tmp_path, allow_mig_mode_change=False).reconcile("all-1g.10gb") == SUCCESS
    assert mutations(nvml) == []


@pytest.mark.parametrize(("call", "nth", "made"), [
    ("nvmlDeviceCreateGpuInstanceWithPlacement", 4, 3),  # three whole instances made, then the crash
    ("nvmlGpuInstanceCreateComputeInstance", 3, 3),  # the third GPU instance has no compute instance
])
def test_crash_midway_through_creates_then_restart_finishes(tmp_path: Path, call: str, nth: int,
                                                             made: int) -> None:
    nvml = node(2)
    undo = crash_on_call(nvml, call, nth)
    with pytest.raises(Crash):
        MigReconciler(nvml, tmp_path, allow_mig_mode_change=False).reconcile("all-1g.10gb")
    undo()
    assert len(nvml.layout(0)) == made and nvml.layout(1) == []
    ops = Ops()
    applier = MigApplier(nvml, tmp_path, on_operation=ops)
    result = applier.resume()
    assert result is not None and result.state == SUCCESS, result and result.message
    assert all(len(nvml.layout(g)) == 7 and one_ci_each(nvml, g) for g in range(2))
    # Nothing made twice: only what was missing was created.
    assert ops.count("gpu_instance_create") == 14 - made
    assert ops.count("compute_instance_create") == 14 - made + (call.endswith("ComputeInstance"))
    assert ops.count("gpu_instance_destroy") == 0


def test_crash_during_destroys_then_restart_finishes(tmp_path: Path) -> None:
    nvml = node(1)
    for start in (0, 4):
        nvml.create_instance(0, "3g.40gb", start)
    # Between the compute-instance destroy and its GPU instance's destroy.
    undo = crash_on_call(nvml, "nvmlGpuInstanceDestroy", 1)
    with pytest.raises(Crash):
        MigReconciler(nvml, tmp_path, allow_mig_mode_change=False).reconcile("all-7g.80gb")
    undo()
    assert [len(gi.cis) for gi in nvml.gpus[0].gis.values()] == [0, 1]
    result = MigApplier(nvml, tmp_path).resume()
    assert result is not None and result.state == SUCCESS
    assert nvml.layout(0) == [("7g.80gb", 0, 8)] and one_ci_each(nvml, 0)


# --- crash recovery: roll back ---

def test_crash_after_plan_write_and_a_destroy_target_turns_busy_rolls_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = node(1)
    first = nvml.create_instance(0, "3g.40gb", 0)
    nvml.create_instance(0, "3g.40gb", 4)
    crash_after_plan_written(monkeypatch)
    with pytest.raises(Crash):
        MigReconciler(nvml, tmp_path, allow_mig_mode_change=False).reconcile("all-7g.80gb")
    monkeypatch.undo()
    nvml.start_process(0, 31, gi_id=first, ci_id=0)  # a job lands on an instance the plan destroys
    before = nvml.layout(0)
    result = MigApplier(nvml, tmp_path).resume()
    assert result is not None and result.state == FAILED
    assert "is in use" in result.message and "rolled back" in result.message
    assert nvml.layout(0) == before and mutations(nvml) == []
    assert read_plan_file(tmp_path)["status"] == "rolled-back"  # type: ignore[index]
    assert MigApplier(nvml, tmp_path).resume() is None
    # The layout itself still cannot hold while the job runs: failed, with the reason, and untouched.
    rec = MigReconciler(nvml, tmp_path, allow_mig_mode_change=False)
    assert rec.reconcile("all-7g.80gb") == FAILED and "in-use" in rec.reason
    assert nvml.layout(0) == before


def _interrupted_repartition(tmp_path: Path) -> tuple[FakeNVML, int]:
    """3g@0 + 3g@4 → all-1g, killed before the fourth 1g; a job then runs on the 1g at slice 1 and
    another tool puts a 2g at slice 4.  Returns the stand-in and the busy instance's id."""
    nvml = node(1)
    for start in (0, 4):
        nvml.create_instance(0, "3g.40gb", start)
    undo = crash_on_call(nvml, "nvmlDeviceCreateGpuInstanceWithPlacement", 4)
    with pytest.raises(Crash):
        MigReconciler(nvml, tmp_path, allow_mig_mode_change=False).reconcile("all-1g.10gb")
    undo()
    assert [(p, s) for p, s, _ in nvml.layout(0)] == [("1g.10gb", 0), ("1g.10gb", 1), ("1g.10gb", 2)]
    busy = next(i for i, gi in nvml.gpus[0].gis.items() if gi.placement.start == 1)
    nvml.start_process(0, 77, gi_id=busy, ci_id=0)
    nvml.create_instance(0, "2g.20gb", 4)
    nvml.calls.clear()
    return nvml, busy


def test_crash_midway_through_creates_and_a_foreign_instance_rolls_back(tmp_path: Path) -> None:
    nvml, busy = _interrupted_repartition(tmp_path)
    held = nvml.gpus[0].gis[busy]
    result = MigApplier(nvml, tmp_path).resume()
    assert result is not None and result.state == FAILED
    assert "2g.20gb@4 is not part of the recorded plan" in result.message
    # The idle instances the plan made are gone; the busy one stays; neither 3g fits back.
    assert nvml.layout(0) == [("1g.10gb", 1, 1), ("2g.20gb", 4, 2)]
    assert nvml.gpus[0].gis[busy] is held and held.cis
    assert "2 created instance(s) destroyed, 0 destroyed instance(s) restored" in result.message
    assert "kept (in use)" in result.message and "not restored" in result.message
    assert read_plan_file(tmp_path)["status"] == "rolled-back"  # type: ignore[index]


def test_rollback_restores_what_the_plan_destroyed_when_the_slots_are_free(tmp_path: Path) -> None:
    nvml, busy = _interrupted_repartition(tmp_path)
    nvml.stop_process(0, 77)
    result = MigApplier(nvml, tmp_path).resume()
    assert result is not None and result.state == FAILED
    # 3g@0 comes back over the three 1g it made room for; 3g@4 cannot (the foreign 2g holds slice 4).
    assert nvml.layout(0) == [("2g.20gb", 4, 2), ("3g.40gb", 0, 4)]
    assert one_ci_each(nvml, 0)
    assert "3 created instance(s) destroyed, 1 destroyed instance(s) restored" in result.message


def test_crash_during_rollback_resumes_the_rollback(tmp_path: Path) -> None:
    nvml, busy = _interrupted_repartition(tmp_path)
    undo = crash_on_call(nvml, "nvmlGpuInstanceDestroy", 1)
    with pytest.raises(Crash):
        MigApplier(nvml, tmp_path).resume()
    undo()
    assert read_plan_file(tmp_path)["status"] == "rolling-back"  # type: ignore[index]
    nvml.stop_process(0, 77)  # now finishing would be possible again: a rollback under way goes on
    result = MigApplier(nvml, tmp_path).resume()
    assert result is not None and result.state == FAILED and "not part of the recorded plan" in result.message
    assert nvml.layout(0) == [("2g.20gb", 4, 2), ("3g.40gb", 0, 4)]
    assert MigApplier(nvml, tmp_path).resume() is None


def test_recorded_plan_for_another_layout_is_finished_then_the_asked_layout_applied(tmp_path: Path) -> None:
    nvml = node(1)
    undo = crash_on_call(nvml, "nvmlDeviceCreateGpuInstanceWithPlacement", 2)
    with pytest.raises(Crash):
        MigReconciler(nvml, tmp_path, allow_mig_mode_change=False).reconcile("all-2g.20gb")
    undo()
    rec = MigReconciler(nvml, tmp_path, allow_mig_mode_change=False)
    assert rec.reconcile("all-3g.40gb") == SUCCESS
    assert nvml.layout(0) == [("3g.40gb", 0, 4), ("3g.40gb", 4, 4)] and one_ci_each(nvml, 0)
    assert read_plan_file(tmp_path)["desired"] == Desired(layout="all-3g.40gb").to_json()  # type: ignore[index]


def test_malformed_recorded_plan_is_failed_not_raised(tmp_path: Path) -> None:
    write_plan_file(tmp_path, {"status": "in-progress", "desired": {"layout": "all-1g.10gb"},
                               "gpus": [{"index": 0, "create": "nonsense"}]})
    nvml = node(1)
    result = MigApplier(nvml, tmp_path).resume()
    assert result is not None and result.state == FAILED and "malformed" in result.message
    assert mutations(nvml) == []
    assert MigReconciler(nvml, tmp_path, allow_mig_mode_change=False).reconcile("all-1g.10gb") == SUCCESS


@pytest.mark.parametrize("held", ["GPU-00000001-h100", "0000:2a:00.0"])
def test_gpu_held_whole_keeps_its_mig_mode(tmp_path: Path, held: str) -> None:
    nvml = node(2, mig=False)
    rec = MigReconciler(nvml, tmp_path, allow_mig_mode_change=True)
    assert rec.reconcile("all-1g.10gb", held_gpus={held}) == FAILED
    assert "GPU 1: held whole by an allocation" in rec.reason
    assert nvml.gpus[1].mig_pending == 0
