"""The MIG applier against the stand-in NVML: convergence, safety, idempotence, crash recovery."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.gpu.applier import FAILED, PENDING, SUCCESS, Desired, MigApplier
from agent.gpu.planfile import FILENAME, read_plan_file
from tests.gpu.fake_nvml import FakeNVML, h100_node

MUTATING = {"nvmlDeviceSetMigMode", "nvmlDeviceCreateGpuInstanceWithPlacement", "nvmlGpuInstanceDestroy",
            "nvmlGpuInstanceCreateComputeInstance", "nvmlComputeInstanceDestroy"}


def node(gpus: int = 2, **kw: object) -> FakeNVML:
    nvml = h100_node(gpus, **kw)  # type: ignore[arg-type]
    nvml.nvmlInit()
    return nvml


def test_named_layout_on_every_gpu_and_reapply_does_nothing(tmp_path: Path) -> None:
    nvml = node(2)
    states: list[str] = []
    applier = MigApplier(nvml, tmp_path, on_state=states.append)
    result = applier.apply(Desired(layout="all-balanced"))
    assert result.state == SUCCESS, result.message
    for g in range(2):
        assert sorted(p for p, _, _ in nvml.layout(g)) == ["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"]
        assert all(len(gi.cis) == 1 for gi in nvml.gpus[g].gis.values())
    assert states == [PENDING, SUCCESS]
    assert applier.counters.created == 8
    nvml.calls.clear()
    again = applier.apply(Desired(layout="all-balanced"))
    assert again.state == SUCCESS and not MUTATING & set(nvml.calls)
    assert read_plan_file(tmp_path)["status"] == "done"  # type: ignore[index]


def test_never_destroys_an_instance_in_use(tmp_path: Path) -> None:
    nvml = node(1)
    busy = nvml.create_instance(0, "3g.40gb", 0)
    nvml.create_instance(0, "3g.40gb", 4)
    nvml.start_process(0, 4242, gi_id=busy, ci_id=0)
    result = MigApplier(nvml, tmp_path).apply(Desired(demand=(("1g.10gb", 3),)))
    assert result.state == SUCCESS, result.message
    # the busy 3g stays, the idle one makes room for three 1g (slice 7 takes no 1g)
    assert nvml.layout(0) == [("1g.10gb", 4, 1), ("1g.10gb", 5, 1), ("1g.10gb", 6, 1), ("3g.40gb", 0, 4)]
    assert "nvmlGpuInstanceDestroy" in nvml.calls
    # a demand that needs the busy instance gone is refused, and the busy instance survives
    result = MigApplier(nvml, tmp_path).apply(Desired(demand=(("7g.80gb", 1),)))
    assert result.state == FAILED and ("3g.40gb", 0, 4) in nvml.layout(0)


def test_pod_held_instances_count_as_in_use(tmp_path: Path) -> None:
    nvml = node(1)
    held = nvml.create_instance(0, "2g.20gb", 0)
    result = MigApplier(nvml, tmp_path).apply(Desired(demand=(("7g.80gb", 1),)), in_use={0: {held}})
    assert result.state == FAILED and "exceeds max" not in result.message
    assert nvml.layout(0) == [("2g.20gb", 0, 2)]


def test_infeasible_demand_fails_with_reason_and_changes_nothing(tmp_path: Path) -> None:
    nvml = node(1)
    nvml.create_instance(0, "1g.10gb", 3)
    nvml.calls.clear()
    states: list[str] = []
    result = MigApplier(nvml, tmp_path, on_state=states.append).apply(Desired(demand=(("3g.40gb", 3),)))
    assert result.state == FAILED
    assert result.message == "3g.40gb=3 exceeds max 2 per GPU on H100-80GB × 1"
    assert not MUTATING & set(nvml.calls) and states == [FAILED]
    assert result.labels() == {"topolet.io/mig.config.state": "failed"}


def test_enabling_mig_needs_permission(tmp_path: Path) -> None:
    nvml = node(1, mig=False)
    result = MigApplier(nvml, tmp_path).apply(Desired(layout="all-1g.10gb"))
    assert result.state == FAILED and "not allowed" in result.message
    assert nvml.gpus[0].mig_current == 0


def test_enabling_mig_refused_with_processes(tmp_path: Path) -> None:
    nvml = node(1, mig=False)
    nvml.start_process(0, 99)
    result = MigApplier(nvml, tmp_path, allow_mig_mode_change=True).apply(Desired(layout="all-1g.10gb"))
    assert result.state == FAILED and "processes" in result.message
    assert "nvmlDeviceSetMigMode" not in nvml.calls


def test_enable_then_create(tmp_path: Path) -> None:
    nvml = node(1, mig=False)
    applier = MigApplier(nvml, tmp_path, allow_mig_mode_change=True)
    result = applier.apply(Desired(layout="all-1g.10gb"))
    assert result.state == SUCCESS
    assert [s for _, s, _ in nvml.layout(0)] == list(range(7))
    assert applier.counters.as_metrics()["topolet_mig_mode_changes_total"] == 1


def test_mode_change_waiting_for_reset_is_pending(tmp_path: Path) -> None:
    nvml = node(1, mig=False, mig_change_needs_reset=True)
    applier = MigApplier(nvml, tmp_path, allow_mig_mode_change=True)
    assert applier.apply(Desired(layout="all-balanced")).state == PENDING
    assert applier.apply(Desired(layout="all-balanced")).state == PENDING  # no second SetMigMode
    assert nvml.calls.count("nvmlDeviceSetMigMode") == 1
    nvml.reset_gpu(0)
    assert applier.apply(Desired(layout="all-balanced")).state == SUCCESS


def test_disable_destroys_idle_instances_first(tmp_path: Path) -> None:
    nvml = node(1)
    nvml.create_instance(0, "4g.40gb", 0)
    result = MigApplier(nvml, tmp_path, allow_mig_mode_change=True).apply(Desired(layout="all-disabled"))
    assert result.state == SUCCESS, result.message
    assert nvml.layout(0) == [] and nvml.gpus[0].mig_current == 0


def test_nvml_error_mid_apply_is_failed_and_recorded(tmp_path: Path) -> None:
    # The "hardware" refuses 3g at slice 4 although our table allows it: creation fails.
    from agent.gpu.profiles import Placement

    nvml = h100_node(1, placement_overrides={"3g.40gb": (Placement(0, 4),)})
    nvml.nvmlInit()
    result = MigApplier(nvml, tmp_path).apply(Desired(demand=(("3g.40gb", 2),)))
    assert result.state == FAILED and result.message.startswith("NVML: ")
    assert read_plan_file(tmp_path)["status"] == "failed"  # type: ignore[index]


def test_resume_finishes_a_recorded_plan(tmp_path: Path) -> None:
    nvml = node(1)
    applier = MigApplier(nvml, tmp_path)
    assert applier.resume() is None
    # Simulate a crash after the first GPU instance was created and the plan recorded.
    applier.apply(Desired(demand=(("2g.20gb", 3),)))
    doc = json.loads((tmp_path / FILENAME).read_text())
    from agent.gpu.planfile import write_plan_file

    body = doc["body"]
    body["status"] = "in-progress"
    write_plan_file(tmp_path, body)
    gis = nvml.gpus[0].gis
    victim = next(iter(gis.values()))
    for ci in list(victim.cis.values()):
        nvml.nvmlComputeInstanceDestroy(ci.handle)
    nvml.nvmlGpuInstanceDestroy(victim.handle)
    assert len(nvml.layout(0)) == 2
    result = MigApplier(nvml, tmp_path).resume()
    assert result is not None and result.state == SUCCESS
    assert [p for p, _, _ in nvml.layout(0)] == ["2g.20gb"] * 3
    assert MigApplier(nvml, tmp_path).resume() is None


def test_corrupt_plan_file_reads_as_absent(tmp_path: Path) -> None:
    (tmp_path / FILENAME).write_text('{"version": 1, "body": {"status": "in-progress"}, "sha256": "x"}')
    assert read_plan_file(tmp_path) is None
    assert MigApplier(node(1), tmp_path).resume() is None


@pytest.mark.parametrize("layout", ["all-bogus", "all-5g.50gb"])
def test_unknown_layout_fails(tmp_path: Path, layout: str) -> None:
    result = MigApplier(node(1), tmp_path).apply(Desired(layout=layout))
    assert result.state == FAILED and "unknown MIG layout" in result.message
