"""The GPU inventory model: immutable values for GPUs, NVSwitches and links between GPUs."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from agent.topology.cpuset import CPUSet


@dataclass(frozen=True, slots=True)
class GPU:
    """One physical GPU and its locality. Unknown numbers are -1, unknown text is ""."""

    index: int  # NVML index (PCI bus order)
    uuid: str  # "GPU-..."; "" when neither NVML nor the driver's proc file gives it
    name: str  # NVML product name, e.g. "NVIDIA H100 80GB HBM3"
    product: str  # `name` as a label value, e.g. "NVIDIA-H100-80GB-HBM3"
    memory_bytes: int  # NVML total; without NVML the board's nominal size
    pci_address: str  # "0000:18:00.0", lower case, 4-digit domain
    pci_device_id: int  # e.g. 0x2330; -1 when unknown
    numa_node: int  # -1 when the platform does not say
    local_cpus: CPUSet
    minor: int  # /dev/nvidiaN
    compute_capability: tuple[int, int] | None
    mig_capable: bool
    mig_mode_current: bool | None  # None when unknown (no NVML) or not MIG-capable
    mig_mode_pending: bool | None
    nvlinks_active: int = -1  # -1 when unknown


@dataclass(frozen=True, slots=True)
class NVSwitch:
    """An NVSwitch (PCI class 0x0680, NVIDIA): it carries GPU-to-GPU traffic, it is not a GPU."""

    pci_address: str
    pci_device_id: int
    numa_node: int


@dataclass(frozen=True, slots=True)
class GPULink:
    """How two GPUs reach each other: NVML's common PCI ancestor, and whether both have NVLink up."""

    a: int  # GPU index, a < b
    b: int
    common_ancestor: str  # "internal" | "single" | "multiple" | "hostbridge" | "node" | "system"
    nvlink: bool


@dataclass(frozen=True, slots=True)
class GPUInventory:
    """All GPUs of the node; `source` says how they were found ("nvml", "sysfs" or "none")."""

    gpus: tuple[GPU, ...]
    nvswitches: tuple[NVSwitch, ...] = ()
    links: tuple[GPULink, ...] = ()
    driver_version: str = ""
    cuda_version: str = ""  # "12.4"
    source: str = "none"
    note: str = ""  # why a richer source was not used, e.g. "no NVML: library not found"


def gpu_numa_nodes(gpus: Iterable[GPU], indices: Iterable[int]) -> frozenset[int]:
    """The NUMA nodes of the GPUs with these indices (unknown nodes left out): `preferred_numa`."""
    wanted = set(indices)
    return frozenset(g.numa_node for g in gpus if g.index in wanted and g.numa_node >= 0)


def label_safe(text: str) -> str:
    """Text as a label value: spaces become '-', other invalid characters '_', trimmed to 63."""
    out = "".join(ch if ch.isascii() and (ch.isalnum() or ch in "-_.") else ("-" if ch == " " else "_")
                  for ch in text.strip())
    out = out[:63].strip("-_.")
    return out
