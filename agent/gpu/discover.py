"""GPU discovery: through NVML when the driver's library loads, else from PCI sysfs under an fs root.

Either way every GPU carries the NUMA node and local CPUs that sysfs gives for its PCI function, so
the two paths agree on everything both can see (NVML adds UUIDs, MIG mode, links and exact memory).
"""

from __future__ import annotations

import os
from collections.abc import Callable
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

CPUListParser = Callable[[str], CPUSet]

_ANCESTOR = {0: "internal", 10: "single", 20: "multiple", 30: "hostbridge", 40: "node", 50: "system"}


def normalize_bus_id(bus_id: str | bytes) -> str:
    """NVML's "00000000:18:00.0" (or sysfs's form) as sysfs writes it: "0000:18:00.0"."""
    text = bus_id.decode() if isinstance(bus_id, bytes) else bus_id
    text = text.strip().lower()
    domain, sep, rest = text.partition(":")
    if not sep or rest.count(":") != 1:
        raise TopologyError(f"bad PCI bus id {text!r}")
    return f"{int(domain, 16):04x}:{rest}"


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _hex(path: Path) -> int:
    text = _read(path)
    if text is None:
        return -1
    try:
        return int(text, 16)
    except ValueError:
        raise TopologyError("not a hex number", str(path)) from None


def _locality(dev: Path, parse: CPUListParser) -> tuple[int, CPUSet]:
    numa_text = _read(dev / "numa_node")
    try:
        numa = int(numa_text) if numa_text is not None else -1
    except ValueError:
        raise TopologyError("bad numa_node", str(dev / "numa_node")) from None
    cpus_text = _read(dev / "local_cpulist")
    return max(numa, -1), (parse(cpus_text) if cpus_text else CPUSet())


def _driver_info(root: Path, address: str) -> dict[str, str]:
    """The driver's /proc/driver/nvidia/gpus/<address>/information as a dict ("" values omitted)."""
    text = _read(root / "proc/driver/nvidia/gpus" / address / "information")
    out: dict[str, str] = {}
    for line in (text or "").splitlines():
        key, sep, value = line.partition(":")
        if sep and value.strip():
            out[key.strip()] = value.strip()
    return out


def discover_sysfs(root: str | os.PathLike[str] = "/", *, parse_cpulist: CPUListParser = CPUSet.parse
                   ) -> GPUInventory:
    """GPUs and NVSwitches from `<root>/sys/bus/pci/devices`; indices follow PCI bus order as NVML's do."""
    base = Path(root)
    devices = base / "sys/bus/pci/devices"
    gpus: list[GPU] = []
    switches: list[NVSwitch] = []
    try:
        entries = sorted(devices.iterdir(), key=lambda p: p.name)
    except FileNotFoundError:
        return GPUInventory((), source="sysfs", note=f"no {devices}")
    for dev in entries:
        if _hex(dev / "vendor") != NVIDIA_VENDOR:
            continue
        pci_class = _hex(dev / "class") >> 8
        device_id = _hex(dev / "device")
        address = normalize_bus_id(dev.name)
        if pci_class == CLASS_BRIDGE_OTHER:
            numa, _ = _locality(dev, parse_cpulist)
            switches.append(NVSwitch(address, device_id, numa))
            continue
        if pci_class not in (CLASS_VGA, CLASS_3D):
            continue  # audio functions, USB-C controllers on consumer boards
        numa, cpus = _locality(dev, parse_cpulist)
        product = PRODUCTS.get(device_id)
        info = _driver_info(base, address)
        name = info.get("Model") or (product.name if product else f"NVIDIA 10de:{device_id:04x}")
        minor_text = info.get("Device Minor", "")
        gpus.append(GPU(
            index=len(gpus),
            uuid=info.get("GPU UUID", ""),
            name=name,
            product=label_safe(name),
            memory_bytes=product.memory_mib << 20 if product else 0,
            pci_address=address,
            pci_device_id=device_id,
            numa_node=numa,
            local_cpus=cpus,
            minor=int(minor_text) if minor_text.isdigit() else -1,
            compute_capability=product.compute_capability if product else None,
            mig_capable=product.mig_capable if product else False,
            mig_mode_current=None,
            mig_mode_pending=None,
        ))
    return GPUInventory(tuple(gpus), tuple(switches), source="sysfs")


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


def discover_nvml(nvml: Any, root: str | os.PathLike[str] = "/", *,
                  parse_cpulist: CPUListParser = CPUSet.parse) -> GPUInventory:
    """GPUs through an initialised NVML module (pynvml or a stand-in); locality from sysfs."""
    base = Path(root)
    gpus: list[GPU] = []
    handles: list[Any] = []
    for index in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        handles.append(handle)
        name = _text(nvml.nvmlDeviceGetName(handle))
        pci = nvml.nvmlDeviceGetPciInfo(handle)
        address = normalize_bus_id(pci.busId)
        numa, cpus = _locality(base / "sys/bus/pci/devices" / address, parse_cpulist)
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
            numa_node=numa,
            local_cpus=cpus,
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
    switches = discover_sysfs(base, parse_cpulist=parse_cpulist).nvswitches
    return GPUInventory(tuple(gpus), switches, tuple(links), driver, f"{cuda // 1000}.{cuda % 1000 // 10}",
                        source="nvml")


def discover_gpus(root: str | os.PathLike[str] = "/", *, nvml: Any = None,
                  parse_cpulist: CPUListParser = CPUSet.parse) -> GPUInventory:
    """NVML when it loads (or `nvml` is given, already initialised), else PCI sysfs under `root`."""
    if nvml is not None:
        return discover_nvml(nvml, root, parse_cpulist=parse_cpulist)
    loaded, note = load_nvml()
    if loaded is None:
        return replace(discover_sysfs(root, parse_cpulist=parse_cpulist), note=note)
    try:
        return discover_nvml(loaded, root, parse_cpulist=parse_cpulist)
    finally:
        loaded.nvmlShutdown()
