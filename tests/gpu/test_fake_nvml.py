"""The stand-in NVML enforces the driver's rules with the driver's error codes."""

from __future__ import annotations

import ctypes

import pynvml
import pytest

from tests.gpu.fake_nvml import h100_node


def setup() -> tuple[object, object]:
    nvml = h100_node(1)
    nvml.nvmlInit()
    return nvml, nvml.nvmlDeviceGetHandleByIndex(0)


def create(nvml: object, h: object, profile_enum: int, start: int, size: int) -> object:
    info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(h, profile_enum)  # type: ignore[attr-defined]
    pl = pynvml.c_nvmlGpuInstancePlacement_t(start, size)
    return nvml.nvmlDeviceCreateGpuInstanceWithPlacement(h, info.id, ctypes.byref(pl))  # type: ignore[attr-defined]


def test_uninitialized() -> None:
    nvml = h100_node(1)
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        nvml.nvmlDeviceGetCount()


def test_placement_rules() -> None:
    nvml, h = setup()
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        create(nvml, h, pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE, 2, 4)  # not a placement
    create(nvml, h, pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE, 0, 4)
    with pytest.raises(pynvml.NVMLError_InsufficientResources):
        create(nvml, h, pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE, 2, 2)  # overlaps
    with pytest.raises(pynvml.NVMLError_InsufficientResources):
        create(nvml, h, pynvml.NVML_GPU_INSTANCE_PROFILE_4_SLICE, 0, 4)


def test_in_use_cannot_be_destroyed_and_mode_cannot_change() -> None:
    nvml, h = setup()
    gi = create(nvml, h, pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE, 0, 1)
    ci = nvml.nvmlGpuInstanceCreateComputeInstance(gi, 0)  # type: ignore[attr-defined]
    with pytest.raises(pynvml.NVMLError_InUse):
        nvml.nvmlGpuInstanceDestroy(gi)  # type: ignore[attr-defined]
    gi_id = nvml.nvmlGpuInstanceGetInfo(gi).id  # type: ignore[attr-defined]
    nvml.start_process(0, 7, gi_id=gi_id, ci_id=0)  # type: ignore[attr-defined]
    with pytest.raises(pynvml.NVMLError_InUse):
        nvml.nvmlComputeInstanceDestroy(ci)  # type: ignore[attr-defined]
    with pytest.raises(pynvml.NVMLError_InUse):
        nvml.nvmlDeviceSetMigMode(h, pynvml.NVML_DEVICE_MIG_DISABLE)  # type: ignore[attr-defined]


def test_mig_disabled_and_non_mig_gpu() -> None:
    nvml = h100_node(1, mig=False)
    nvml.nvmlInit()
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetGpuInstanceProfileInfo(h, 0)
    nvml.add_gpu("NVIDIA L4", model=None, bus_id="00000000:99:00.0", pci_device_id=0x27B8, memory_total=1)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetMigMode(nvml.nvmlDeviceGetHandleByIndex(1))


def test_possible_placements_count_then_fill() -> None:
    nvml, h = setup()
    info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(h, pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE)  # type: ignore[attr-defined]
    count = ctypes.c_uint(0)
    nvml.nvmlDeviceGetGpuInstancePossiblePlacements(h, info.id, None, ctypes.byref(count))  # type: ignore[attr-defined]
    arr = (pynvml.c_nvmlGpuInstancePlacement_t * count.value)()
    nvml.nvmlDeviceGetGpuInstancePossiblePlacements(h, info.id, arr, ctypes.byref(count))  # type: ignore[attr-defined]
    assert [(p.start, p.size) for p in arr] == [(0, 2), (2, 2), (4, 2)]
