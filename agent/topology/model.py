"""The topology model: immutable values that every other part of topolet reads."""

from __future__ import annotations

from agent.topology.cpuset import CPUSet
from agent.topology.record import cached_property, record


@record
class Cache:
    level: int
    type: str  # "Data" | "Instruction" | "Unified"
    size_bytes: int  # 0 when unknown
    line_bytes: int  # 0 when unknown
    cpus: CPUSet


@record
class Core:
    """A physical core: its hardware threads (SMT siblings)."""

    package_id: int
    core_id: int  # the OS core id (unique only within a package, or a die)
    cpus: CPUSet


@record
class Package:
    """A socket."""

    id: int
    cpus: CPUSet


@record
class Hugepages:
    size_bytes: int
    total: int
    free: int


@record
class NumaNode:
    """A NUMA node; a memory-only node (CXL, HBM, GPU memory) has no CPUs and names `local_cpus`."""

    id: int
    cpus: CPUSet
    memory_bytes: int  # usable local memory (MemTotal), 0 when unknown
    memory_free_bytes: int
    hugepages: tuple[Hugepages, ...]
    distances: tuple[int, ...]  # aligned with Topology.numa_ids; empty when the node gives none
    memory_only: bool
    local_cpus: CPUSet  # equals `cpus` for CPU-bearing nodes
    tier: str  # "DRAM" | "HBM" | "NVM" | "CXL" | "GPU" | "" (unknown)
    gpu_pci: str = ""  # tier "GPU": the PCI address of the GPU whose memory this node is


@record
class CPUKind:
    """A class of cores on a hybrid part (performance/efficiency), ranked by `rank` (0 = fastest)."""

    name: str
    rank: int
    cpus: CPUSet


@record
class PCIDevice:
    address: str
    class_code: int
    vendor: int
    device: int
    numa_node: int  # -1 when unknown
    local_cpus: CPUSet


@record
class CPUInfo:
    vendor: str
    family: int
    model: int
    model_name: str
    flags: frozenset[str]
    hypervisor: bool
    arch: str


@record
class Topology:
    """The whole node. Lists are sorted (by id, or by lowest CPU) so equal machines compare equal."""

    cpus: CPUSet  # online CPUs, as hwloc shows them
    offline: CPUSet
    packages: tuple[Package, ...]
    cores: tuple[Core, ...]
    caches: tuple[Cache, ...]
    numa_nodes: tuple[NumaNode, ...]
    kinds: tuple[CPUKind, ...]
    pci_devices: tuple[PCIDevice, ...]
    cpu_info: CPUInfo
    warnings: tuple[str, ...] = ()

    @property
    def numa_ids(self) -> tuple[int, ...]:
        return tuple(n.id for n in self.numa_nodes)

    @cached_property
    def _numa_of_cpu(self) -> dict[int, int]:
        return {c: n.id for n in self.numa_nodes if not n.memory_only for c in n.cpus}

    @cached_property
    def _package_of_cpu(self) -> dict[int, int]:
        return {c: p.id for p in self.packages for c in p.cpus}

    @cached_property
    def _l3_of_cpu(self) -> dict[int, int]:
        """CPU → index of its L3 group (the last-level cache when no L3 exists)."""
        groups = self.l3_groups
        return {c: i for i, g in enumerate(groups) for c in g}

    @cached_property
    def _core_of_cpu(self) -> dict[int, int]:
        return {c: i for i, core in enumerate(self.cores) for c in core.cpus}

    @cached_property
    def l3_groups(self) -> tuple[CPUSet, ...]:
        """The CPU sets that share an L3 (or, without L3, the highest cache level present)."""
        levels = [c.level for c in self.caches if c.type in ("Unified", "Data")]
        if not levels:
            return (self.cpus,) if self.cpus else ()
        top = 3 if 3 in levels else max(levels)
        seen = sorted({c.cpus for c in self.caches if c.level == top and c.type != "Instruction"},
                      key=lambda s: s.min() if s else -1)
        return tuple(seen)

    def numa_of(self, cpu: int) -> int:
        """The NUMA node holding `cpu` (0 when the machine has no NUMA information)."""
        return self._numa_of_cpu.get(cpu, 0)

    def package_of(self, cpu: int) -> int:
        return self._package_of_cpu.get(cpu, 0)

    def l3_of(self, cpu: int) -> int:
        return self._l3_of_cpu.get(cpu, 0)

    def core_index_of(self, cpu: int) -> int:
        """Index into `cores` of the core holding `cpu`."""
        return self._core_of_cpu[cpu]

    @property
    def threads_per_core(self) -> int:
        return max((len(c.cpus) for c in self.cores), default=1)

    def node(self, numa_id: int) -> NumaNode:
        for n in self.numa_nodes:
            if n.id == numa_id:
                return n
        raise KeyError(numa_id)

    def distance(self, a: int, b: int) -> int:
        """NUMA distance from a to b (10 on the diagonal when the table is missing)."""
        ids = self.numa_ids
        row = self.node(a).distances
        if row and b in ids and len(row) == len(ids):
            return row[ids.index(b)]
        return 10 if a == b else 20
