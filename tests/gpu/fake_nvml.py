"""The stand-in for `pynvml` — THE ONLY one in topolet's tests; nothing else imitates NVML.

A `FakeNVML` instance behaves like the pynvml module for the functions topolet calls: same names,
same arguments (ctypes arrays and `byref` counts included), the same ctypes structures and the same
`pynvml.NVMLError_*` exception classes with the driver's error codes.  It enforces what the driver
enforces: MIG mode (current vs pending; enabling needs a GPU with no processes), valid placements,
no overlapping GPU instances, per-profile instance limits and compute slices, compute instances
inside their GPU instance, and that instances with processes (or with compute instances, for GPU
instances) cannot be destroyed.  Profile facts come from `agent.gpu.profiles`; `profile_overrides`
lets a test give the "hardware" different facts from our table.
"""

from __future__ import annotations

import ctypes
import itertools
from dataclasses import dataclass, field
from typing import Any

import pynvml

from agent.gpu.profiles import GPUModel, Placement, Profile

NO_ID = 0xFFFFFFFF  # what NVML reports as gpuInstanceId/computeInstanceId outside MIG


def _err(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


def _deref(ref: Any) -> Any:
    """The object behind `byref(x)`, `pointer(x)` or `x` itself."""
    if hasattr(ref, "_obj"):
        return ref._obj
    if hasattr(ref, "contents"):
        return ref.contents
    return ref


@dataclass
class FakeProcess:
    pid: int
    gi_id: int = NO_ID
    ci_id: int = NO_ID
    used_memory: int = 1 << 30


@dataclass
class FakeCI:
    id: int
    profile_id: int
    slices: int
    handle: Any = None


@dataclass
class FakeGI:
    id: int
    profile: Profile
    placement: Placement
    cis: dict[int, FakeCI] = field(default_factory=dict)
    handle: Any = None


@dataclass
class FakeGPU:
    name: str
    uuid: str
    bus_id: str  # NVML form: "00000000:18:00.0"
    pci_device_id: int  # e.g. 0x2330
    minor: int
    memory_total: int
    compute_capability: tuple[int, int]
    model: GPUModel | None  # None: not MIG-capable
    mig_current: int = 0
    mig_pending: int = 0
    nvlinks: int = 0
    processes: list[FakeProcess] = field(default_factory=list)
    gis: dict[int, FakeGI] = field(default_factory=dict)
    handle: Any = None


class FakeNVML:
    """A pynvml stand-in holding a small machine; pass it wherever topolet takes an `nvml` module."""

    def __init__(self, *, library_missing: bool = False, mig_change_needs_reset: bool = False,
                 profile_overrides: dict[str, dict[str, Any]] | None = None,
                 placement_overrides: dict[str, tuple[Placement, ...]] | None = None) -> None:
        self.library_missing = library_missing
        self.mig_change_needs_reset = mig_change_needs_reset
        self.profile_overrides = profile_overrides or {}
        self.placement_overrides = placement_overrides or {}
        self.gpus: list[FakeGPU] = []
        self.initialized = 0
        self.calls: list[str] = []  # names of mutating calls, in order
        self._objects: dict[int, Any] = {}
        self._addresses = itertools.count(0x1000, 0x10)
        self.driver_version = "550.54.15"
        self.cuda_version = 12040
        self.ancestor: dict[tuple[int, int], int] = {}

    # --- everything pynvml exports that callers may use: constants, structures, error classes ---
    def __getattr__(self, name: str) -> Any:
        if name.startswith(("NVML", "c_nvml", "nvmlPciInfo")) and hasattr(pynvml, name):
            value = getattr(pynvml, name)
            if not callable(value) or isinstance(value, type):
                return value
        raise AttributeError(name)

    # --- building the machine (test side) ---
    def add_gpu(self, name: str, *, model: GPUModel | None, bus_id: str, pci_device_id: int,
                memory_total: int, compute_capability: tuple[int, int] = (9, 0),
                uuid: str = "", minor: int | None = None, mig: bool = False, nvlinks: int = 0) -> int:
        index = len(self.gpus)
        gpu = FakeGPU(name, uuid or f"GPU-{index:08x}-fake", bus_id, pci_device_id,
                      index if minor is None else minor, memory_total, compute_capability, model,
                      int(mig), int(mig), nvlinks)
        gpu.handle = self._handle(pynvml.c_nvmlDevice_t, gpu)
        self.gpus.append(gpu)
        return index

    def start_process(self, gpu: int, pid: int, gi_id: int = NO_ID, ci_id: int = NO_ID) -> None:
        self.gpus[gpu].processes.append(FakeProcess(pid, gi_id, ci_id))

    def stop_process(self, gpu: int, pid: int) -> None:
        self.gpus[gpu].processes = [p for p in self.gpus[gpu].processes if p.pid != pid]

    def reset_gpu(self, gpu: int) -> None:
        """A GPU reset: a pending MIG mode takes effect."""
        g = self.gpus[gpu]
        if g.processes:
            raise _err(pynvml.NVML_ERROR_IN_USE)
        g.mig_current = g.mig_pending
        g.gis.clear()

    def layout(self, gpu: int) -> list[tuple[str, int, int]]:
        """(profile name, start, size) of the GPU instances on `gpu`, ascending start."""
        return sorted((gi.profile.name, gi.placement.start, gi.placement.size)
                      for gi in self.gpus[gpu].gis.values())

    def create_instance(self, gpu: int, profile: str, start: int, with_ci: bool = True) -> int:
        """Create a GPU instance directly (a test's "existing state"); returns its GI id."""
        g = self.gpus[gpu]
        assert g.model is not None
        p = self._profile(g, g.model.profile(profile))
        gi = self._create_gi(g, p, Placement(start, p.memory_slices))
        if with_ci:
            self._create_ci(gi, p.ci_profile_id)
        return gi.id

    # --- internals ---
    def _handle(self, ctype: Any, obj: Any) -> Any:
        address = next(self._addresses)
        self._objects[address] = obj
        return ctypes.cast(ctypes.c_void_p(address), ctype)

    def _lookup(self, handle: Any, kind: type) -> Any:
        self._check_init()
        try:
            address = ctypes.cast(handle, ctypes.c_void_p).value
        except (TypeError, ctypes.ArgumentError):
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT) from None
        obj = self._objects.get(address or 0)
        if not isinstance(obj, kind):
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if isinstance(obj, FakeGI) and obj.handle is None:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)  # destroyed
        if isinstance(obj, FakeCI) and obj.handle is None:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return obj

    def _check_init(self) -> None:
        if not self.initialized:
            raise _err(pynvml.NVML_ERROR_UNINITIALIZED)

    def _profile(self, g: FakeGPU, p: Profile) -> Profile:
        """Our table's profile as this fake hardware has it (after a test's overrides)."""
        over = dict(self.profile_overrides.get(p.name, {}))
        if p.name in self.placement_overrides:
            over["placements"] = self.placement_overrides[p.name]
        if not over:
            return p
        from dataclasses import replace
        return replace(p, **over)

    def _mig_gpu(self, handle: Any) -> FakeGPU:
        g: FakeGPU = self._lookup(handle, FakeGPU)
        if g.model is None or not g.mig_current:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return g

    def _by_gi_id(self, g: FakeGPU, profile_id: int) -> Profile:
        assert g.model is not None
        for p in g.model.profiles:
            hp = self._profile(g, p)
            if hp.gi_profile_id == profile_id:
                return hp
        raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def _create_gi(self, g: FakeGPU, p: Profile, pl: Placement) -> FakeGI:
        if pl not in p.placements:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        used = 0
        compute = 0
        count = 0
        for gi in g.gis.values():
            used |= gi.placement.mask
            compute += gi.profile.compute_slices
            count += gi.profile.name == p.name
        if (used & pl.mask or count >= p.max_count
                or compute + p.compute_slices > 7):
            raise _err(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        gi_id = min(set(range(1, 64)) - set(g.gis))
        gi = FakeGI(gi_id, p, pl)
        gi.handle = self._handle(pynvml.c_nvmlGpuInstance_t, gi)
        g.gis[gi_id] = gi
        return gi

    def _create_ci(self, gi: FakeGI, ci_profile: int) -> FakeCI:
        slices = {0: 1, 1: 2, 2: 3, 3: 4, 4: 7}.get(ci_profile)
        if slices is None or slices > gi.profile.compute_slices:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if sum(c.slices for c in gi.cis.values()) + slices > gi.profile.compute_slices:
            raise _err(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        ci_id = min(set(range(0, 8)) - set(gi.cis))
        ci = FakeCI(ci_id, ci_profile, slices)
        ci.handle = self._handle(pynvml.c_nvmlComputeInstance_t, ci)
        gi.cis[ci_id] = ci
        return ci

    def _gpu_of_gi(self, gi: FakeGI) -> FakeGPU:
        return next(g for g in self.gpus if gi.id in g.gis and g.gis[gi.id] is gi)

    # --- the pynvml surface ---
    def nvmlInit(self) -> None:
        if self.library_missing:
            raise _err(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
        self.initialized += 1

    def nvmlShutdown(self) -> None:
        self._check_init()
        self.initialized -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._check_init()
        return self.driver_version

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._check_init()
        return self.cuda_version

    def nvmlDeviceGetCount(self) -> int:
        self._check_init()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        self._check_init()
        if not 0 <= index < len(self.gpus):
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self.gpus[index].handle

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return str(self._lookup(handle, FakeGPU).name)

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return str(self._lookup(handle, FakeGPU).uuid)

    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int:
        return int(self._lookup(handle, FakeGPU).minor)

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: Any = None) -> Any:
        g = self._lookup(handle, FakeGPU)
        return pynvml.c_nvmlMemory_t(total=g.memory_total, free=g.memory_total, used=0)

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        g = self._lookup(handle, FakeGPU)
        info = pynvml.nvmlPciInfo_t()
        info.busId = g.bus_id.encode()
        info.busIdLegacy = g.bus_id.encode()
        info.pciDeviceId = (g.pci_device_id << 16) | 0x10DE
        return info

    def nvmlDeviceGetCudaComputeCapability(self, handle: Any) -> tuple[int, int]:
        return tuple(self._lookup(handle, FakeGPU).compute_capability)  # type: ignore[return-value]

    def nvmlDeviceGetNvLinkState(self, handle: Any, link: int) -> int:
        g = self._lookup(handle, FakeGPU)
        if link >= g.nvlinks:
            code = pynvml.NVML_ERROR_NOT_SUPPORTED if g.nvlinks == 0 else pynvml.NVML_ERROR_INVALID_ARGUMENT
            raise _err(code)
        return pynvml.NVML_FEATURE_ENABLED

    def nvmlDeviceGetTopologyCommonAncestor(self, a: Any, b: Any) -> int:
        ga, gb = self._lookup(a, FakeGPU), self._lookup(b, FakeGPU)
        i, j = sorted((self.gpus.index(ga), self.gpus.index(gb)))
        return self.ancestor.get((i, j), pynvml.NVML_TOPOLOGY_SYSTEM)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        g = self._lookup(handle, FakeGPU)
        return [pynvml.nvmlFriendlyObject({"pid": p.pid, "usedGpuMemory": p.used_memory,
                                           "gpuInstanceId": p.gi_id, "computeInstanceId": p.ci_id})
                for p in g.processes]

    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:
        g = self._lookup(handle, FakeGPU)
        if g.model is None:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return [g.mig_current, g.mig_pending]

    def nvmlDeviceSetMigMode(self, handle: Any, mode: int) -> int:
        g = self._lookup(handle, FakeGPU)
        self.calls.append("nvmlDeviceSetMigMode")
        if g.model is None:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if mode not in (pynvml.NVML_DEVICE_MIG_DISABLE, pynvml.NVML_DEVICE_MIG_ENABLE):
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if g.processes or g.gis:
            raise _err(pynvml.NVML_ERROR_IN_USE)
        g.mig_pending = mode
        if not self.mig_change_needs_reset:
            g.mig_current = mode
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetGpuInstanceProfileInfo(self, handle: Any, profile: int, version: int = 2) -> Any:
        g = self._mig_gpu(handle)
        if not 0 <= profile < pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        assert g.model is not None
        try:
            p = self._profile(g, g.model.profile_by_nvml_id(profile))
        except KeyError:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED) from None
        info = pynvml.c_nvmlGpuInstanceProfileInfo_v2_t()
        info.id = p.gi_profile_id
        info.isP2pSupported = 0
        info.sliceCount = p.compute_slices
        info.instanceCount = p.max_count
        info.multiprocessorCount = p.multiprocessors
        info.copyEngineCount = p.compute_slices
        info.memorySizeMB = p.memory_mib
        info.name = f"MIG {p.name}".encode()
        return info

    def nvmlDeviceGetGpuInstancePossiblePlacements(self, handle: Any, profileId: int,
                                                    placementsRef: Any, countRef: Any) -> int:
        g = self._mig_gpu(handle)
        p = self._by_gi_id(g, profileId)
        count = _deref(countRef)
        if placementsRef is None:
            count.value = len(p.placements)
            return pynvml.NVML_SUCCESS
        if count.value < len(p.placements):
            count.value = len(p.placements)
            raise _err(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
        for i, pl in enumerate(p.placements):
            placementsRef[i].start = pl.start
            placementsRef[i].size = pl.size
        count.value = len(p.placements)
        return pynvml.NVML_SUCCESS

    def nvmlDeviceCreateGpuInstanceWithPlacement(self, handle: Any, profileId: int, placement: Any) -> Any:
        g = self._mig_gpu(handle)
        self.calls.append("nvmlDeviceCreateGpuInstanceWithPlacement")
        p = self._by_gi_id(g, profileId)
        pl = _deref(placement)
        return self._create_gi(g, p, Placement(int(pl.start), int(pl.size))).handle

    def nvmlDeviceGetGpuInstances(self, handle: Any, profileId: int, gpuInstancesRef: Any,
                                  countRef: Any) -> int:
        g = self._mig_gpu(handle)
        self._by_gi_id(g, profileId)
        found = [gi for _, gi in sorted(g.gis.items()) if gi.profile.gi_profile_id == profileId]
        count = _deref(countRef)
        if gpuInstancesRef is not None and len(gpuInstancesRef) < len(found):
            raise _err(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
        for i, gi in enumerate(found):
            if gpuInstancesRef is not None:
                gpuInstancesRef[i] = gi.handle
        count.value = len(found)
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetGpuInstanceById(self, handle: Any, gpuInstanceId: int) -> Any:
        g = self._mig_gpu(handle)
        if gpuInstanceId not in g.gis:
            raise _err(pynvml.NVML_ERROR_NOT_FOUND)
        return g.gis[gpuInstanceId].handle

    def nvmlGpuInstanceGetInfo(self, gpuInstance: Any) -> Any:
        gi = self._lookup(gpuInstance, FakeGI)
        info = pynvml.c_nvmlGpuInstanceInfo_t()
        info.device = self._gpu_of_gi(gi).handle
        info.id = gi.id
        info.profileId = gi.profile.gi_profile_id
        info.placement.start = gi.placement.start
        info.placement.size = gi.placement.size
        return info

    def nvmlGpuInstanceDestroy(self, gpuInstance: Any) -> int:
        gi = self._lookup(gpuInstance, FakeGI)
        self.calls.append("nvmlGpuInstanceDestroy")
        g = self._gpu_of_gi(gi)
        if gi.cis or any(p.gi_id == gi.id for p in g.processes):
            raise _err(pynvml.NVML_ERROR_IN_USE)
        del g.gis[gi.id]
        gi.handle = None
        return pynvml.NVML_SUCCESS

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(self, gpuInstance: Any, profile: int,
                                                     engProfile: int, version: int = 2) -> Any:
        gi = self._lookup(gpuInstance, FakeGI)
        slices = {0: 1, 1: 2, 2: 3, 3: 4, 4: 7}.get(profile)
        if slices is None or slices > gi.profile.compute_slices or engProfile != 0:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        info = pynvml.c_nvmlComputeInstanceProfileInfo_v2_t()
        info.id = profile
        info.sliceCount = slices
        info.instanceCount = gi.profile.compute_slices // slices
        info.multiprocessorCount = gi.profile.multiprocessors * slices // gi.profile.compute_slices
        return info

    def nvmlGpuInstanceCreateComputeInstance(self, gpuInstance: Any, profileId: int) -> Any:
        gi = self._lookup(gpuInstance, FakeGI)
        self.calls.append("nvmlGpuInstanceCreateComputeInstance")
        return self._create_ci(gi, profileId).handle

    def nvmlGpuInstanceGetComputeInstances(self, gpuInstance: Any, profileId: int,
                                           computeInstancesRef: Any, countRef: Any) -> int:
        gi = self._lookup(gpuInstance, FakeGI)
        found = [ci for _, ci in sorted(gi.cis.items()) if ci.profile_id == profileId]
        for i, ci in enumerate(found):
            if computeInstancesRef is not None:
                computeInstancesRef[i] = ci.handle
        _deref(countRef).value = len(found)
        return pynvml.NVML_SUCCESS

    def nvmlComputeInstanceDestroy(self, computeInstance: Any) -> int:
        ci = self._lookup(computeInstance, FakeCI)
        self.calls.append("nvmlComputeInstanceDestroy")
        for g in self.gpus:
            for gi in g.gis.values():
                if gi.cis.get(ci.id) is ci:
                    if any(p.gi_id == gi.id and p.ci_id == ci.id for p in g.processes):
                        raise _err(pynvml.NVML_ERROR_IN_USE)
                    del gi.cis[ci.id]
                    ci.handle = None
                    return pynvml.NVML_SUCCESS
        raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)


def h100_node(gpus: int = 8, *, mig: bool = True, **kwargs: Any) -> FakeNVML:
    """An HGX H100 node: `gpus` × "NVIDIA H100 80GB HBM3", the first half on NUMA 0 (see sysfs fixture)."""
    from agent.gpu.profiles import H100_80GB

    nvml = FakeNVML(**kwargs)
    for i, bus in enumerate(HGX_BUSES[:gpus]):
        nvml.add_gpu("NVIDIA H100 80GB HBM3", model=H100_80GB, bus_id=f"00000000:{bus}:00.0",
                     pci_device_id=0x2330, memory_total=85520809984, uuid=f"GPU-{i:08x}-h100",
                     mig=mig, nvlinks=18)
    return nvml


# PCI buses of the eight GPUs on an HGX board (four per socket), upper case as NVML prints them.
HGX_BUSES = ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB")
