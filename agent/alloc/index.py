"""`TopologyIndex`: the topology flattened into int masks and small lists, built once per topology."""

from __future__ import annotations

import weakref
from dataclasses import dataclass

from agent.topology.model import Topology


@dataclass(frozen=True, slots=True)
class TopologyIndex:
    """Cores grouped into cells (one NUMA node x package x L3 group), everything as bitmasks.

    Cores are ordered by cell and then by lowest CPU, so each cell owns a contiguous range of core
    indices; cells are ordered by (NUMA, package, L3).  NUMA, package and L3 are positions in
    `numa_ids`, `package_ids` and `l3_masks`, not OS ids.
    """

    cpus_mask: int  # every CPU the allocator may ever hand out (online, inside some core)
    numa_ids: tuple[int, ...]  # OS ids of CPU-bearing NUMA nodes
    numa_masks: tuple[int, ...]
    numa_cells: tuple[tuple[int, ...], ...]
    numa_packages: tuple[int, ...]  # per NUMA node: bit p set when it has CPUs in package p
    distance: tuple[tuple[int, ...], ...]  # NUMA positions -> distance
    package_ids: tuple[int, ...]
    package_masks: tuple[int, ...]
    l3_masks: tuple[int, ...]
    core_masks: tuple[int, ...]
    core_sizes: tuple[int, ...]
    cell_package: tuple[int, ...]
    cell_l3: tuple[int, ...]
    cell_masks: tuple[int, ...]
    cell_cores: tuple[range, ...]
    numa_l3s: tuple[int, ...]  # per NUMA node: bit g set when it has CPUs in L3 group g
    threads_per_core: int
    l3_spans_numa: bool  # whether some L3 group has CPUs in more than one NUMA node


_MEMO: dict[int, tuple[weakref.ref[Topology], TopologyIndex]] = {}


def index_of(topology: Topology) -> TopologyIndex:
    """The index of `topology`, built on first use and kept while the topology lives."""
    key = id(topology)
    hit = _MEMO.get(key)
    if hit is not None and hit[0]() is topology:
        return hit[1]
    built = build_index(topology)

    def forget(_ref: weakref.ref[Topology]) -> None:
        _MEMO.pop(key, None)

    # The callback drops the entry when the topology is collected, so a recycled id() never
    # returns another topology's index (the identity check above guards the window in between).
    _MEMO[key] = (weakref.ref(topology, forget), built)
    return built


def build_index(topology: Topology) -> TopologyIndex:
    """Flatten `topology` into a `TopologyIndex` (no caching)."""
    online = topology.cpus.mask

    core_sets: list[int] = []
    covered = 0
    for core in topology.cores:
        m = core.cpus.mask & online & ~covered
        if m:
            core_sets.append(m)
            covered |= m
    # A CPU no core claims still exists: give it a core of its own rather than lose it.
    rest = online & ~covered
    while rest:
        low = rest & -rest
        core_sets.append(low)
        rest ^= low
    cpus_mask = covered | (online & ~covered)

    nodes = [n for n in topology.numa_nodes if not n.memory_only and n.cpus.mask & cpus_mask]
    if nodes:
        numa_ids = [n.id for n in nodes]
        numa_masks = [n.cpus.mask & cpus_mask for n in nodes]
    else:
        numa_ids, numa_masks = [0], [cpus_mask]

    packages = [p for p in topology.packages if p.cpus.mask & cpus_mask]
    if packages:
        package_ids = [p.id for p in packages]
        package_masks = [p.cpus.mask & cpus_mask for p in packages]
    else:
        package_ids, package_masks = [0], [cpus_mask]

    l3_masks = [g.mask & cpus_mask for g in topology.l3_groups if g.mask & cpus_mask] or [cpus_mask]

    def position(masks: list[int], cpu_bit: int) -> int:
        for i, m in enumerate(masks):
            if m & cpu_bit:
                return i
        return 0  # a CPU outside every group joins the first one; only broken inputs get here

    keyed: list[tuple[tuple[int, int, int], int, int]] = []
    for m in core_sets:
        low = m & -m
        cell = (position(numa_masks, low), position(package_masks, low), position(l3_masks, low))
        keyed.append((cell, low.bit_length() - 1, m))
    keyed.sort()

    cells: list[tuple[int, int, int]] = []
    cell_cores: list[range] = []
    cell_masks: list[int] = []
    core_masks: list[int] = []
    start = 0
    for i, (cell, _, m) in enumerate(keyed):
        if not cells or cells[-1] != cell:
            if cells:
                cell_cores.append(range(start, i))
            cells.append(cell)
            cell_masks.append(0)
            start = i
        cell_masks[-1] |= m
        core_masks.append(m)
    if cells:
        cell_cores.append(range(start, len(keyed)))

    numa_cells = tuple(tuple(c for c, cell in enumerate(cells) if cell[0] == i) for i in range(len(numa_ids)))
    numa_packages = tuple(
        sum({1 << cells[c][1] for c in numa_cells[i]}) for i in range(len(numa_ids)))
    numa_l3s = tuple(sum({1 << cells[c][2] for c in numa_cells[i]}) for i in range(len(numa_ids)))
    l3_spans_numa = any(sum(1 for bits in numa_l3s if bits >> g & 1) > 1 for g in range(len(l3_masks)))
    known = set(topology.numa_ids)
    distance = tuple(
        tuple(topology.distance(a, b) if a in known and b in known else (10 if a == b else 20)
              for b in numa_ids)
        for a in numa_ids)
    core_sizes = tuple(m.bit_count() for m in core_masks)
    return TopologyIndex(
        cpus_mask=cpus_mask,
        numa_ids=tuple(numa_ids),
        numa_masks=tuple(numa_masks),
        numa_cells=numa_cells,
        numa_packages=numa_packages,
        distance=distance,
        package_ids=tuple(package_ids),
        package_masks=tuple(package_masks),
        l3_masks=tuple(l3_masks),
        core_masks=tuple(core_masks),
        core_sizes=core_sizes,
        cell_package=tuple(c[1] for c in cells),
        cell_l3=tuple(c[2] for c in cells),
        cell_masks=tuple(cell_masks),
        cell_cores=tuple(cell_cores),
        numa_l3s=numa_l3s,
        threads_per_core=max(core_sizes, default=1),
        l3_spans_numa=l3_spans_numa,
    )
