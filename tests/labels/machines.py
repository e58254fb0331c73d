"""Hand-built `Topology` values for the label tests (Linux-style CPU numbering: SMT siblings last)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from agent.topology.cpuset import CPUSet
from agent.topology.model import (
    Cache,
    Core,
    CPUInfo,
    CPUKind,
    NumaNode,
    Package,
    PCIDevice,
    Topology,
)


def cpu_info(flags: Iterable[str] = (), *, vendor: str = "GenuineIntel", family: int = 6,
             model: int = 143, hypervisor: bool = False, arch: str = "x86") -> CPUInfo:
    return CPUInfo(vendor, family, model, "Test CPU", frozenset(flags), hypervisor, arch)


def pci(class_code: int, vendor: int, address: str = "0000:00:00.0") -> PCIDevice:
    return PCIDevice(address, class_code, vendor, 0x1234, -1, CPUSet())


def machine(*, sockets: int = 1, cores_per_socket: int = 4, threads: int = 2,
            l3_per_socket: int = 1, memory_only_tiers: Sequence[str] = (),
            kinds: Sequence[tuple[str, int]] = (), info: CPUInfo | None = None,
            pci_devices: Sequence[PCIDevice] = ()) -> Topology:
    """A machine with one CPU-bearing NUMA node per socket, plus memory-only nodes of the given tiers.

    `kinds` is (name, number of cores) per kind, filled from core 0 upwards.
    """
    ncores = sockets * cores_per_socket
    core_cpus = [CPUSet(c + t * ncores for t in range(threads)) for c in range(ncores)]
    packages = tuple(
        Package(s, CPUSet().union(*core_cpus[s * cores_per_socket:(s + 1) * cores_per_socket]))
        for s in range(sockets))
    cores = tuple(Core(c // cores_per_socket, c % cores_per_socket, core_cpus[c]) for c in range(ncores))
    per_l3 = cores_per_socket // l3_per_socket
    caches = tuple(
        Cache(3, "Unified", 32 << 20, 64, CPUSet().union(*core_cpus[g * per_l3:(g + 1) * per_l3]))
        for g in range(sockets * l3_per_socket))
    nodes = [NumaNode(p.id, p.cpus, 64 << 30, 32 << 30, (), (), False, p.cpus, "DRAM")
             for p in packages]
    for i, tier in enumerate(memory_only_tiers):
        nodes.append(NumaNode(sockets + i, CPUSet(), 16 << 30, 16 << 30, (), (), True, CPUSet(), tier))
    cpu_kinds: list[CPUKind] = []
    start = 0
    for rank, (name, count) in enumerate(kinds):
        cpu_kinds.append(CPUKind(name, rank, CPUSet().union(*core_cpus[start:start + count])))
        start += count
    everything = CPUSet().union(*core_cpus)
    return Topology(
        cpus=everything, offline=CPUSet(), packages=packages, cores=cores, caches=caches,
        numa_nodes=tuple(nodes), kinds=tuple(cpu_kinds), pci_devices=tuple(pci_devices),
        cpu_info=info or cpu_info(),
    )


def empty_machine(info: CPUInfo | None = None) -> Topology:
    """A topology that knows nothing but the CPU model."""
    return Topology(cpus=CPUSet(), offline=CPUSet(), packages=(), cores=(), caches=(), numa_nodes=(),
                    kinds=(), pci_devices=(), cpu_info=info or cpu_info())
