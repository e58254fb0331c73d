"""Data-center NVIDIA GPUs by PCI device id, for discovery without NVML.

Origins: device ids from the PCI ID Repository (pci-ids.ucw.cz, vendor 10de) cross-checked with
NVIDIA's gpu-admin-tools `devid_names.py` (0x2330/0x2331 H100, 0x2335/0x233b H200) and go-nvml's
mock configs (0x20b0 A100-SXM4-40GB, 0x20b2 A100-SXM4-80GB, 0x20f1 A100-PCIE-40GB, 0x20b5 A100 80GB
PCIe, 0x2330 H100 80GB HBM3).  Names are what NVML reports (nvmlDeviceGetName) so both discovery
paths agree; memory is the board's nominal size in MiB (NVML's total is slightly different).
"""

from __future__ import annotations

from dataclasses import dataclass

NVIDIA_VENDOR = 0x10DE
CLASS_VGA = 0x0300
CLASS_3D = 0x0302
CLASS_BRIDGE_OTHER = 0x0680  # NVSwitch


@dataclass(frozen=True, slots=True)
class Product:
    name: str
    memory_mib: int
    compute_capability: tuple[int, int]
    mig_capable: bool


PRODUCTS: dict[int, Product] = {
    0x20B0: Product("NVIDIA A100-SXM4-40GB", 40960, (8, 0), True),
    0x20B2: Product("NVIDIA A100-SXM4-80GB", 81920, (8, 0), True),
    0x20B5: Product("NVIDIA A100 80GB PCIe", 81920, (8, 0), True),
    0x20F1: Product("NVIDIA A100-PCIE-40GB", 40960, (8, 0), True),
    0x20B7: Product("NVIDIA A30", 24576, (8, 0), True),
    0x2330: Product("NVIDIA H100 80GB HBM3", 81920, (9, 0), True),
    0x2331: Product("NVIDIA H100 PCIe", 81920, (9, 0), True),
    0x2321: Product("NVIDIA H100 NVL", 95830, (9, 0), True),
    0x2335: Product("NVIDIA H200", 143771, (9, 0), True),
    0x233B: Product("NVIDIA H200 NVL", 143771, (9, 0), True),
    0x26B5: Product("NVIDIA L40", 46068, (8, 9), False),
    0x26B9: Product("NVIDIA L40S", 46068, (8, 9), False),
    0x27B8: Product("NVIDIA L4", 23034, (8, 9), False),
}


def family(compute_capability: tuple[int, int] | None) -> str:
    """Architecture family from the compute capability (the names GPU Feature Discovery uses)."""
    if compute_capability is None:
        return "undefined"
    major, minor = compute_capability
    if major == 8:
        return "ada-lovelace" if minor >= 9 else "ampere"
    return {3: "kepler", 5: "maxwell", 6: "pascal", 7: "volta" if minor < 5 else "turing",
            9: "hopper", 10: "blackwell", 12: "blackwell"}.get(major, "undefined")
