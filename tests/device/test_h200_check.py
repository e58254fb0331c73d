"""The H200 check's comparison logic, run against the stand-in NVML (a real H200 is not needed)."""

from __future__ import annotations

import io

from agent.gpu.profiles import H200_141GB, Placement
from tests.device.h200_check import run
from tests.gpu.fake_nvml import FakeNVML

MUTATING = {"nvmlDeviceSetMigMode", "nvmlDeviceCreateGpuInstanceWithPlacement", "nvmlGpuInstanceDestroy",
            "nvmlGpuInstanceCreateComputeInstance", "nvmlComputeInstanceDestroy"}


def h200(**kw: object) -> FakeNVML:
    nvml = FakeNVML(**kw)  # type: ignore[arg-type]
    nvml.add_gpu("NVIDIA H200", model=H200_141GB, bus_id="00000000:18:00.0", pci_device_id=0x2335,
                 memory_total=150754820096, mig=True)
    return nvml


def test_matching_hardware_passes_read_only() -> None:
    nvml, out = h200(), io.StringIO()
    assert run(nvml, 0, "", out) == 0
    assert "0 differences" in out.getvalue() and "DIFF" not in out.getvalue()
    assert not MUTATING & set(nvml.calls) and nvml.initialized == 0


def test_differences_fail() -> None:
    nvml = h200(profile_overrides={"1g.18gb": {"memory_mib": 16384}},
                placement_overrides={"3g.71gb": (Placement(0, 4),)})
    out = io.StringIO()
    assert run(nvml, 0, "", out) == 1
    text = out.getvalue()
    assert "DIFF 1g.18gb      memory_mib" in text and "DIFF 3g.71gb      placements" in text
    assert "2 differences" in text


def test_mig_disabled_reports_not_supported() -> None:
    nvml = FakeNVML()
    nvml.add_gpu("NVIDIA H200", model=H200_141GB, bus_id="00000000:18:00.0", pci_device_id=0x2335,
                 memory_total=150754820096, mig=False)
    out = io.StringIO()
    assert run(nvml, 0, "", out) == 3
    assert "NOT_SUPPORTED" in out.getvalue() and "MIG mode is disabled" in out.getvalue()
    assert nvml.gpus[0].mig_current == 0 and not MUTATING & set(nvml.calls)


def test_no_nvml() -> None:
    out = io.StringIO()
    assert run(FakeNVML(library_missing=True), 0, "", out) == 2
    assert "NVML unavailable" in out.getvalue()
