"""Build PCI sysfs trees modelled on real 8-GPU HGX nodes (two NUMA nodes, four GPUs each)."""

from __future__ import annotations

from pathlib import Path

# (bus, NUMA node) for the eight GPUs: the layout of an HGX H100 board in a two-socket server.
HGX_GPUS = (("18", 0), ("2a", 0), ("3a", 0), ("5d", 0), ("9a", 1), ("ab", 1), ("ba", 1), ("db", 1))
NODE_CPUS = {0: "0-55,112-167", 1: "56-111,168-223"}
NVSWITCHES = (("05", 0), ("06", 0), ("85", 1), ("86", 1))


def pci_function(root: Path, address: str, *, vendor: int, device: int, pci_class: int,
                 numa: int, cpus: str) -> Path:
    dev = root / "sys/bus/pci/devices" / address
    dev.mkdir(parents=True)
    (dev / "vendor").write_text(f"0x{vendor:04x}\n")
    (dev / "device").write_text(f"0x{device:04x}\n")
    (dev / "class").write_text(f"0x{pci_class:06x}\n")
    (dev / "numa_node").write_text(f"{numa}\n")
    (dev / "local_cpulist").write_text(f"{cpus}\n")
    return dev


def build_hgx(root: Path, *, device: int = 0x2330, name: str = "NVIDIA H100 80GB HBM3",
              with_proc: bool = True, numa_known: bool = True) -> Path:
    """An 8-GPU node under `root`: GPUs, NVSwitches (class 0x0680), a NIC and a host bridge."""
    for i, (bus, node) in enumerate(HGX_GPUS):
        address = f"0000:{bus}:00.0"
        pci_function(root, address, vendor=0x10DE, device=device, pci_class=0x030200,
                     numa=node if numa_known else -1, cpus=NODE_CPUS[node])
        if with_proc:
            info = root / "proc/driver/nvidia/gpus" / address
            info.mkdir(parents=True)
            (info / "information").write_text(
                f"Model: \t\t {name}\nIRQ:   \t\t {300 + i}\nGPU UUID: \t GPU-{i:08x}-h100\n"
                f"Video BIOS: \t 96.00.89.00.01\nBus Type: \t PCIe\nDMA Size: \t 52 bits\n"
                f"Bus Location: \t {address}\nDevice Minor: \t {i}\nGPU Excluded:\t No\n")
    for bus, node in NVSWITCHES:
        pci_function(root, f"0000:{bus}:00.0", vendor=0x10DE, device=0x22A3, pci_class=0x068000,
                     numa=node, cpus=NODE_CPUS[node])
    pci_function(root, "0000:1a:00.0", vendor=0x15B3, device=0x1021, pci_class=0x020700, numa=0,
                 cpus=NODE_CPUS[0])
    pci_function(root, "0000:00:00.0", vendor=0x8086, device=0x09A2, pci_class=0x060000, numa=0,
                 cpus=NODE_CPUS[0])
    return root
