"""Regular synthetic topologies (sockets x NUMA nodes x L3 groups x cores x threads) for benches and tests."""

from __future__ import annotations

from collections.abc import Sequence

from agent.topology.cpuset import CPUSet
from agent.topology.model import Cache, Core, CPUInfo, NumaNode, Package, Topology

_LOCAL, _SAME_SOCKET, _REMOTE = 10, 12, 32


def synthetic_topology(sockets: int, numa_per_socket: int, l3_per_numa: int, cores_per_l3: int,
                       threads: int, cpu_ids: Sequence[int] | None = None,
                       l3_per_socket: bool = False) -> Topology:
    """A machine with that regular shape, numbered the way Linux numbers x86 CPUs.

    Thread t of core c (cores counted across the machine) is CPU `t * cores + c`, so siblings are a
    machine's worth of cores apart.  `cpu_ids`, when given, renames CPU i to `cpu_ids[i]`.
    `l3_per_socket` makes one L3 group per socket, shared by its NUMA nodes (sub-NUMA clustering).
    """
    for name, value in (("sockets", sockets), ("numa_per_socket", numa_per_socket),
                        ("l3_per_numa", l3_per_numa), ("cores_per_l3", cores_per_l3), ("threads", threads)):
        if value < 1:
            raise ValueError(f"{name} must be at least 1")
    n_cores = sockets * numa_per_socket * l3_per_numa * cores_per_l3
    if cpu_ids is None:
        cpu_ids = range(n_cores * threads)
    if len(cpu_ids) != n_cores * threads or len(set(cpu_ids)) != len(cpu_ids):
        raise ValueError("cpu_ids must name every CPU exactly once")

    def core_cpus(core: int) -> CPUSet:
        return CPUSet(cpu_ids[t * n_cores + core] for t in range(threads))

    packages: list[Package] = []
    cores: list[Core] = []
    caches: list[Cache] = []
    nodes: list[tuple[int, CPUSet]] = []
    core = 0
    for s in range(sockets):
        socket_cpus = CPUSet()
        for _ in range(numa_per_socket):
            node_cpus = CPUSet()
            for _ in range(l3_per_numa):
                l3 = CPUSet()
                for _ in range(cores_per_l3):
                    cpus = core_cpus(core)
                    cores.append(Core(package_id=s, core_id=core - s * (n_cores // sockets), cpus=cpus))
                    l3 |= cpus
                    core += 1
                if not l3_per_socket:
                    caches.append(Cache(level=3, type="Unified", size_bytes=32 << 20, line_bytes=64, cpus=l3))
                node_cpus |= l3
            nodes.append((s, node_cpus))
            socket_cpus |= node_cpus
        packages.append(Package(id=s, cpus=socket_cpus))
        if l3_per_socket:
            caches.append(Cache(level=3, type="Unified", size_bytes=96 << 20, line_bytes=64,
                                cpus=socket_cpus))

    def distance(a: int, b: int) -> int:
        if a == b:
            return _LOCAL
        return _SAME_SOCKET if nodes[a][0] == nodes[b][0] else _REMOTE

    numa_nodes = tuple(
        NumaNode(id=i, cpus=cpus, memory_bytes=64 << 30, memory_free_bytes=64 << 30, hugepages=(),
                 distances=tuple(distance(i, j) for j in range(len(nodes))), memory_only=False,
                 local_cpus=cpus, tier="DRAM")
        for i, (_, cpus) in enumerate(nodes))
    by_min = sorted(cores, key=lambda c: c.cpus.min())
    return Topology(
        cpus=CPUSet(cpu_ids), offline=CPUSet(), packages=tuple(packages), cores=tuple(by_min),
        caches=tuple(sorted(caches, key=lambda c: c.cpus.min())), numa_nodes=numa_nodes, kinds=(),
        pci_devices=(),
        cpu_info=CPUInfo(vendor="synthetic", family=0, model=0, model_name="synthetic", flags=frozenset(),
                         hypervisor=False, arch="x86_64"))
