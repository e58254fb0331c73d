#!/usr/bin/env python3
"""Writes a sysfs/procfs root shaped like a 4-socket Opteron 6200 (Bulldozer family) machine.

No shared dump shows AMD compute units, so this one is built from the kernel's documented rules
(Documentation/admin-guide/cputopology.rst and Documentation/ABI/stable/sysfs-devices-system-cpu):
`thread_siblings` is the kernel's map of cpuX's hardware threads "within the same core", and
`core_id` is the platform's own core number.  On Bulldozer-family parts the kernel puts both cores
of a compute unit in `thread_siblings` while each keeps its own `core_id` (that is the shape hwloc
splits into two single-thread cores).  Layout (Opteron 6276-like): 4 packages of 2 dies, a NUMA
node per die, 4 compute units per die, 2 single-thread cores per compute unit: 64 CPUs.  Per core
a 16 KiB L1d; per compute unit a 64 KiB L1i and a 2 MiB L2; per die a 6 MiB L3.  core_id counts
0-7 within each die, as those kernels numbered cores of multi-node packages.

Usage: amd_compute_units.py ROOT   (or import and call build(root)).
"""

from __future__ import annotations

import sys
from pathlib import Path

PACKAGES = 4
DIES_PER_PACKAGE = 2
UNITS_PER_DIE = 4
CORES_PER_UNIT = 2
CORES_PER_DIE = UNITS_PER_DIE * CORES_PER_UNIT
CPUS_PER_PACKAGE = DIES_PER_PACKAGE * CORES_PER_DIE
NCPUS = PACKAGES * CPUS_PER_PACKAGE
NNODES = PACKAGES * DIES_PER_PACKAGE
NODE_MEM_KB = 16 * 1024 * 1024

CPU = "sys/devices/system/cpu"
NODE = "sys/devices/system/node"


def _span(first: int, count: int) -> str:
    return f"{first}-{first + count - 1}" if count > 1 else str(first)


def _mask(cpus: range) -> str:
    """The kernel's cpumask text: 32-bit hex words, highest first, comma separated."""
    bits = 0
    for c in cpus:
        bits |= 1 << c
    words = [(bits >> (32 * i)) & 0xFFFFFFFF for i in range((NCPUS + 31) // 32)]
    return ",".join(f"{w:08x}" for w in reversed(words))


def _write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _cache(root: Path, cpu: int, index: int, level: int, kind: str, size: str, sharers: range) -> None:
    d = f"{CPU}/cpu{cpu}/cache/index{index}"
    _write(root, f"{d}/level", f"{level}\n")
    _write(root, f"{d}/type", f"{kind}\n")
    _write(root, f"{d}/size", f"{size}\n")
    _write(root, f"{d}/coherency_line_size", "64\n")
    _write(root, f"{d}/shared_cpu_list", _span(sharers.start, len(sharers)) + "\n")
    _write(root, f"{d}/shared_cpu_map", _mask(sharers) + "\n")


def build(root: Path) -> Path:
    """Write the machine under root and return root."""
    every = _span(0, NCPUS) + "\n"
    for name in ("possible", "present", "online"):
        _write(root, f"{CPU}/{name}", every)
    _write(root, f"{CPU}/offline", "\n")
    cpuinfo = []
    for cpu in range(NCPUS):
        pkg, die = cpu // CPUS_PER_PACKAGE, cpu // CORES_PER_DIE
        unit = range(cpu - cpu % CORES_PER_UNIT, cpu - cpu % CORES_PER_UNIT + CORES_PER_UNIT)
        package = range(pkg * CPUS_PER_PACKAGE, (pkg + 1) * CPUS_PER_PACKAGE)
        die_cpus = range(die * CORES_PER_DIE, (die + 1) * CORES_PER_DIE)
        t = f"{CPU}/cpu{cpu}/topology"
        _write(root, f"{t}/physical_package_id", f"{pkg}\n")
        _write(root, f"{t}/core_id", f"{cpu % CORES_PER_DIE}\n")
        _write(root, f"{t}/thread_siblings_list", _span(unit.start, len(unit)) + "\n")
        _write(root, f"{t}/thread_siblings", _mask(unit) + "\n")
        _write(root, f"{t}/core_siblings_list", _span(package.start, len(package)) + "\n")
        _write(root, f"{t}/core_siblings", _mask(package) + "\n")
        if cpu:
            _write(root, f"{CPU}/cpu{cpu}/online", "1\n")
        _cache(root, cpu, 0, 1, "Data", "16K", range(cpu, cpu + 1))
        _cache(root, cpu, 1, 1, "Instruction", "64K", unit)
        _cache(root, cpu, 2, 2, "Unified", "2048K", unit)
        _cache(root, cpu, 3, 3, "Unified", "6144K", die_cpus)
        cpuinfo.append(
            f"processor\t: {cpu}\nvendor_id\t: AuthenticAMD\ncpu family\t: 21\nmodel\t\t: 1\n"
            f"model name\t: AMD Opteron(TM) Processor 6276\nphysical id\t: {pkg}\n"
            f"siblings\t: {CPUS_PER_PACKAGE}\ncore id\t\t: {cpu % CORES_PER_DIE}\n"
            f"cpu cores\t: {CORES_PER_DIE}\napicid\t\t: {32 + 2 * cpu}\n"
            "flags\t\t: fpu sse sse2 ht syscall lm sse3 ssse3 sse4_1 sse4_2 avx xop fma4 topoext\n\n"
        )
    _write(root, "proc/cpuinfo", "".join(cpuinfo))
    # hwloc-gather-topology's record of uname: hwloc reads the architecture from it, and applies
    # its compute-unit rule only on x86
    _write(root, "proc/hwloc-nofile-info",
           "OSName: Linux\nOSRelease: 3.10.0\nArchitecture: x86_64\n"
           f"FallbackNbProcessors: {NCPUS}\nPageSize: 4096\n")
    _write(root, "proc/meminfo", f"MemTotal:       {NNODES * NODE_MEM_KB} kB\nMemFree:        {NODE_MEM_KB} kB\n")
    _write(root, f"{NODE}/possible", _span(0, NNODES) + "\n")
    _write(root, f"{NODE}/online", _span(0, NNODES) + "\n")
    for node in range(NNODES):
        d = f"{NODE}/node{node}"
        cpus = range(node * CORES_PER_DIE, (node + 1) * CORES_PER_DIE)
        _write(root, f"{d}/cpulist", _span(cpus.start, len(cpus)) + "\n")
        _write(root, f"{d}/cpumap", _mask(cpus) + "\n")
        _write(root, f"{d}/meminfo",
               f"Node {node} MemTotal:       {NODE_MEM_KB} kB\nNode {node} MemFree:        {NODE_MEM_KB // 2} kB\n")
        # the two dies of a package are closer to each other than to other packages' dies
        dist = ["10" if m == node else "16" if m // DIES_PER_PACKAGE == node // DIES_PER_PACKAGE else "22"
                for m in range(NNODES)]
        _write(root, f"{d}/distance", " ".join(dist) + "\n")
    return root


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__.splitlines()[-1])
    build(Path(sys.argv[1]))
