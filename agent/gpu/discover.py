"""GPU discovery: through NVML when the driver's library loads, else from the topology's PCI functions.

Both paths start from the one PCI scan (`Topology.pci_devices`, read by the C helper): it gives every
GPU's address, device id, NUMA node and local CPUs, so the two agree on everything both can see.
NVML adds UUIDs, MIG mode, links and exact memory; without it the NVIDIA driver's proc file
(`/proc/driver/nvidia/gpus/<address>/information`) still gives the UUID and the device minor.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

from agent.errors import TopologyError
from agent.gpu.model import GPU, GPUInventory, GPULink, NVSwitch, label_safe
from agent.gpu.products import (
    CLASS_3D,
    CLASS_BRIDGE_OTHER,
    CLASS_VGA,
    NVIDIA_VENDOR,
    PRODUCTS,
)
from agent.topology.cpuset import CPUSet
from agent.topology.model import PCIDevice, Topology

_ANCESTOR = {0: "internal", 10: "single", 20: "multiple", 30: "hostbridge", 40: "node", 50: "system"}
_DRIVER_GPUS = "proc/driver/nvidia/gpus"


def normalize_bus_id(bus_id: str | bytes) -> str:
    """NVML's "00000000:18:00.0" (or sysfs's form) as sysfs writes it: "0000:18:00.0"."""
    text = bus_id.decode() if isinstance(bus_id, bytes) else bus_id
    text = text.strip().lower()
    domain, sep, rest = text.partition(":")
    if not sep or rest.count(":") != 1:
        raise TopologyError(f"bad PCI bus id {text!r}")
    try:
        return f"{int(domain, 16):04x}:{rest}"
    except ValueError:
        raise TopologyError(f"bad PCI bus id {text!r}") from None


def _is_display(dev: PCIDevice) -> bool:
    return dev.class_code >> 8 in (CLASS_VGA, CLASS_3D)


def _hidden_vendor_gpus(topology: Topology, driver_root: Path | None) -> set[str]:
    """Display functions whose vendor file is missing that are NVIDIA's all the same.

    Two signs, each written only by NVIDIA's driver: its proc folder for the address (when a file
    system is at hand), or a GPU-memory NUMA node (coherent GPU memory on POWER9 or Grace) that the
    driver says the function owns.
    """
    unknown = {d.address for d in topology.pci_devices if d.vendor < 0 and _is_display(d)}
    found = {n.gpu_pci for n in topology.numa_nodes if n.gpu_pci} & unknown
    if driver_root is not None:
        found |= {a for a in unknown if (driver_root / _DRIVER_GPUS / a).is_dir()}
    return found


def _numa_node(topology: Topology, dev: PCIDevice) -> int:
    """The function's NUMA node; when sysfs does not say, the one CPU-bearing node holding all its
    local CPUs (single-socket kernels often write -1), else -1."""
    if dev.numa_node >= 0:
        return dev.numa_node
    if not dev.local_cpus:
        return -1
    holders = [n.id for n in topology.numa_nodes if not n.memory_only and dev.local_cpus <= n.cpus]
    return holders[0] if len(holders) == 1 else -1


def _driver_info(root: Path, address: str) -> dict[str, str]:
    """The driver's /proc/driver/nvidia/gpus/<address>/information as a dict ("" values omitted)."""
    try:
        text = (root / _DRIVER_GPUS / address / "information").read_text()
    except (OSError, UnicodeDecodeError):
        return {}
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and value.strip():
            out[key.strip()] = value.strip()
    return out


def nvidia_functions(topology: Topology, fsroot: str | os.PathLike[str] | None = None
                     ) -> tuple[tuple[PCIDevice, ...], tuple[PCIDevice, ...]]:
    """(GPU functions, NVSwitch functions) of NVIDIA among the topology's PCI devices, by address.

    GPUs are VGA or 3D controllers (class 0x0300/0x0302); NVSwitches are "other bridge" (0x0680)
    functions; audio and USB functions of consumer boards are neither.  `fsroot` lets the driver's
    proc folder vouch for a function whose vendor file is missing (see `_hidden_vendor_gpus`).
    """
    root = Path(fsroot) if fsroot is not None else None
    hidden = _hidden_vendor_gpus(topology, root)
    gpus: list[PCIDevice] = []
    switches: list[PCIDevice] = []
    for dev in sorted(topology.pci_devices, key=lambda d: d.address):
        if dev.vendor == NVIDIA_VENDOR and dev.class_code >> 8 == CLASS_BRIDGE_OTHER:
            switches.append(dev)
        elif _is_display(dev) and (dev.vendor == NVIDIA_VENDOR or dev.address in hidden):
            gpus.append(dev)
    return tuple(gpus), tuple(switches)


def _switches(topology: Topology, devices: Iterable[PCIDevice]) -> tuple[NVSwitch, ...]:
    return tuple(NVSwitch(normalize_bus_id(d.address), d.device, _numa_node(topology, d)) for d in devices)


def gpus_from_topology(topology: Topology, fsroot: str | os.PathLike[str] | None = None) -> GPUInventory:
    """GPUs and NVSwitches from the topology's PCI scan; indices follow PCI bus order as NVML's do.

    With `fsroot`, the NVIDIA driver's proc file adds the name, UUID and device minor; without it
    (labels built from a dump) nothing is read and names come from the device-id table.
    """
    gpu_devs, switch_devs = nvidia_functions(topology, fsroot)
    root = Path(fsroot) if fsroot is not None else None
    gpus: list[GPU] = []
    for dev in gpu_devs:
        address = normalize_bus_id(dev.address)
        product = PRODUCTS.get(dev.device)
        info = _driver_info(root, address) if root is not None else {}
        fallback = f"NVIDIA 10de:{dev.device:04x}" if dev.device >= 0 else "NVIDIA GPU"
        name = info.get("Model") or (product.name if product else fallback)
        minor_text = info.get("Device Minor", "")
        gpus.append(GPU(
            index=len(gpus),
            uuid=info.get("GPU UUID", ""),
            name=name,
            product=label_safe(name),
            memory_bytes=product.memory_mib << 20 if product else 0,
            pci_address=address,
            pci_device_id=dev.device,
            numa_node=_numa_node(topology, dev),
            local_cpus=dev.local_cpus,
            minor=int(minor_text) if minor_text.isdigit() else -1,
            compute_capability=product.compute_capability if product else None,
            mig_capable=product.mig_capable if product else False,
            mig_mode_current=None,
            mig_mode_pending=None,
        ))
    return GPUInventory(tuple(gpus), _switches(topology, switch_devs), source="sysfs")


def load_nvml() -> tuple[Any, str]:
    """Import pynvml and initialise it: (module, "") or (None, why not). Missing NVML is normal."""
    try:
        import pynvml
    except ImportError:
        return None, "no NVML: pynvml is not installed"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return None, f"no NVML: {exc}"
    return pynvml, ""


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _mig_mode(nvml: Any, handle: Any) -> tuple[bool, bool | None, bool | None]:
    try:
        current, pending = nvml.nvmlDeviceGetMigMode(handle)
    except nvml.NVMLError_NotSupported:
        return False, None, None
    return True, bool(current), bool(pending)


def _nvlinks_active(nvml: Any, handle: Any) -> int:
    active = 0
    for link in range(int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18))):
        try:
            active += 1 if nvml.nvmlDeviceGetNvLinkState(handle, link) else 0
        except nvml.NVMLError:
            # Links past the last one (or no NVLink at all) answer NOT_SUPPORTED/INVALID_ARGUMENT.
            break
    return active


def discover_nvml(nvml: Any, topology: Topology) -> GPUInventory:
    """GPUs through an initialised NVML module (pynvml or a stand-in); locality from the PCI scan."""
    by_address = {normalize_bus_id(d.address): d for d in topology.pci_devices}
    gpus: list[GPU] = []
    handles: list[Any] = []
    for index in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        handles.append(handle)
        name = _text(nvml.nvmlDeviceGetName(handle))
        pci = nvml.nvmlDeviceGetPciInfo(handle)
        address = normalize_bus_id(pci.busId)
        dev = by_address.get(address)
        mig_capable, current, pending = _mig_mode(nvml, handle)
        try:
            major, minor_cc = nvml.nvmlDeviceGetCudaComputeCapability(handle)
            cc: tuple[int, int] | None = (int(major), int(minor_cc))
        except nvml.NVMLError:
            cc = None
        try:
            minor = int(nvml.nvmlDeviceGetMinorNumber(handle))
        except nvml.NVMLError:
            minor = -1
        gpus.append(GPU(
            index=index,
            uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
            name=name,
            product=label_safe(name),
            memory_bytes=int(nvml.nvmlDeviceGetMemoryInfo(handle).total),
            pci_address=address,
            pci_device_id=(int(pci.pciDeviceId) >> 16) & 0xFFFF,
            numa_node=_numa_node(topology, dev) if dev is not None else -1,
            local_cpus=dev.local_cpus if dev is not None else CPUSet(),
            minor=minor,
            compute_capability=cc,
            mig_capable=mig_capable,
            mig_mode_current=current,
            mig_mode_pending=pending,
            nvlinks_active=_nvlinks_active(nvml, handle),
        ))
    links: list[GPULink] = []
    for a in range(len(handles)):
        for b in range(a + 1, len(handles)):
            try:
                level = int(nvml.nvmlDeviceGetTopologyCommonAncestor(handles[a], handles[b]))
            except nvml.NVMLError:
                continue
            links.append(GPULink(a, b, _ANCESTOR.get(level, str(level)),
                                 gpus[a].nvlinks_active > 0 and gpus[b].nvlinks_active > 0))
    driver = _text(nvml.nvmlSystemGetDriverVersion())
    cuda = int(nvml.nvmlSystemGetCudaDriverVersion())
    switches = _switches(topology, nvidia_functions(topology)[1])
    return GPUInventory(tuple(gpus), switches, tuple(links), driver, f"{cuda // 1000}.{cuda % 1000 // 10}",
                        source="nvml")


def discover_gpus(topology: Topology, fsroot: str | os.PathLike[str] = "/", *, nvml: Any = None
                  ) -> GPUInventory:
    """NVML when it loads (or `nvml` is given, already initialised), else the topology's PCI scan.

    NVML describes the running machine, so a dump (`fsroot` other than "/") never asks it.
    """
    if nvml is not None:
        return discover_nvml(nvml, topology)
    if os.path.realpath(fsroot) != "/":
        return replace(gpus_from_topology(topology, fsroot), note="no NVML: reading a file-system dump")
    loaded, note = load_nvml()
    if loaded is None:
        return replace(gpus_from_topology(topology, fsroot), note=note)
    try:
        return discover_nvml(loaded, topology)
    finally:
        loaded.nvmlShutdown()
