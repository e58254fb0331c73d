"""NVML's MIG state as it is now: each MIG-capable GPU's mode, processes and GPU instances.

Public API: `read_live(nvml, in_use) -> [LiveGPU]`, every GPU of a known model that supports MIG,
with its GPU instances by (profile, start) when in MIG mode (an instance is in use when a process
runs on it or `in_use`, {GPU index: {GPU-instance id}}, names it); `compute_instances(nvml, gi)`, the
compute instances inside one GPU instance; `profile_info(nvml, handle, profile)`, NVML's record of a
GPU-instance profile.  Reads only: the applier (`agent.gpu.applier`) acts on what they return, and
the NRT's MIG inventory (`agent.gpu.capacity.read_mig_inventory`) reports it.

`nvml` is the pynvml module or a stand-in with the same functions; nothing here imports pynvml.
"""

from __future__ import annotations

import ctypes
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from agent.errors import TopologyError
from agent.gpu.discover import normalize_bus_id
from agent.gpu.planner import ExistingInstance
from agent.gpu.profiles import GPUModel, Profile, resolve_model


@dataclass
class LiveGPU:
    """One GPU as NVML reported it; the applier updates it as it acts."""

    index: int
    handle: Any
    uuid: str
    pci_address: str  # "0000:18:00.0", as the state file records GPUs held whole
    model: GPUModel
    mig_current: bool
    mig_pending: bool
    processes: list[Any]
    gis: dict[tuple[str, int], tuple[Any, ExistingInstance]] = field(default_factory=dict)
    no_ci: set[tuple[str, int]] = field(default_factory=set)  # GPU instances without a compute instance


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def read_live(nvml: Any, in_use: Mapping[int, Collection[int]]) -> list[LiveGPU]:
    """Every MIG-capable GPU of a known model, its instances read when in MIG mode."""
    out: list[LiveGPU] = []
    for index in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        model = resolve_model(_text(nvml.nvmlDeviceGetName(handle)))
        if model is None:
            continue
        try:
            current, pending = nvml.nvmlDeviceGetMigMode(handle)
        except nvml.NVMLError_NotSupported:
            continue
        processes = list(nvml.nvmlDeviceGetComputeRunningProcesses(handle))
        try:
            address = normalize_bus_id(nvml.nvmlDeviceGetPciInfo(handle).busId)
        except TopologyError:
            address = ""
        live = LiveGPU(index, handle, _text(nvml.nvmlDeviceGetUUID(handle)), address, model,
                       bool(current), bool(pending), processes)
        if live.mig_current:
            _read_instances(nvml, live, set(in_use.get(index, ())))
        out.append(live)
    return out


def profile_info(nvml: Any, handle: Any, p: Profile) -> Any:
    """NVML's GPU-instance profile info of `p` on the GPU `handle` names."""
    return nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, p.nvml_id)


def _read_instances(nvml: Any, live: LiveGPU, in_use_ids: set[int]) -> None:
    busy = {int(p.gpuInstanceId) for p in live.processes} | in_use_ids
    for p in live.model.profiles:
        try:
            info = profile_info(nvml, live.handle, p)
        except nvml.NVMLError_NotSupported:
            continue
        array = (nvml.c_nvmlGpuInstance_t * max(int(info.instanceCount), 1))()
        count = ctypes.c_uint(0)
        nvml.nvmlDeviceGetGpuInstances(live.handle, info.id, array, ctypes.byref(count))
        for i in range(count.value):
            gi = array[i]
            gi_info = nvml.nvmlGpuInstanceGetInfo(gi)
            inst = ExistingInstance(p.name, int(gi_info.placement.start), int(gi_info.placement.size),
                                    int(gi_info.id) in busy, int(gi_info.id))
            live.gis[(p.name, inst.start)] = (gi, inst)
            if not compute_instances(nvml, gi):
                live.no_ci.add((p.name, inst.start))


def compute_instances(nvml: Any, gi: Any) -> list[Any]:
    """Handles of every compute instance inside GPU instance `gi`."""
    found: list[Any] = []
    for ci_profile in range(int(nvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT)):
        try:
            ci_info = nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                gi, ci_profile, nvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
        except nvml.NVMLError_NotSupported:
            continue
        array = (nvml.c_nvmlComputeInstance_t * max(int(ci_info.instanceCount), 1))()
        count = ctypes.c_uint(0)
        nvml.nvmlGpuInstanceGetComputeInstances(gi, ci_info.id, array, ctypes.byref(count))
        found.extend(array[i] for i in range(count.value))
    return found
