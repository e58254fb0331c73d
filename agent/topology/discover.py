"""Turn the C helper's raw scan into the `Topology` model, resolving sysfs's disagreements as hwloc does."""

from __future__ import annotations

from operator import itemgetter

from agent.topology.cpuset import CPUSet
from agent.topology.model import (
    Cache,
    Core,
    CPUInfo,
    CPUKind,
    Hugepages,
    NumaNode,
    Package,
    PCIDevice,
    Topology,
)
from agent.topology.raw import RawCache, RawCPU, RawNode, RawScan

TYPE_CHECKING = False
if TYPE_CHECKING:  # collections costs start-up time, and `discover` is timed as a whole process
    from collections.abc import Iterable


def discover(fsroot: str = "/") -> Topology:
    """Scan `fsroot` (the live machine, or an extracted sysfs dump) and build its topology."""
    from agent.topology import native

    return build_topology(native.scan(fsroot))


def build_topology(raw: RawScan) -> Topology:
    """Build the model from one raw scan; pure (no I/O)."""
    warnings: list[str] = [f"{e.code}: {e.path}" for e in raw.errors]
    online = _online_cpus(raw)
    by_id = {c.id: c for c in raw.cpus if c.id in online}
    packages = _packages(by_id, online)
    cores = _cores(by_id, online, packages)
    caches = _caches(by_id.values(), online)
    numa = _numa_nodes(raw, online, warnings)
    return Topology(
        cpus=online,
        offline=CPUSet(c.id for c in raw.cpus) - online,
        packages=packages,
        cores=cores,
        caches=caches,
        numa_nodes=numa,
        kinds=_kinds(raw, online),
        pci_devices=tuple(
            PCIDevice(p.address, p.class_code, p.vendor, p.device, p.numa_node,
                      (p.local_cpus or CPUSet()) & online)
            for p in raw.pci
        ),
        cpu_info=CPUInfo(raw.cpu_vendor, raw.cpu_family, raw.cpu_model, raw.cpu_model_name,
                         frozenset(raw.cpu_flags), raw.hypervisor, raw.arch),
        warnings=tuple(warnings),
    )


def _online_cpus(raw: RawScan) -> CPUSet:
    """Online CPUs that the kernel describes (a CPU folder exists for each)."""
    known = CPUSet(c.id for c in raw.cpus if c.online)
    if raw.online is not None:
        known &= raw.online
    return known


def _packages(by_id: dict[int, RawCPU], online: CPUSet) -> tuple[Package, ...]:
    """Packages from the package CPU lists (as hwloc does), ids from physical_package_id.

    The lists win over the ids: some kernels repeat one id across sockets (ia64) or give -1.
    Without lists, CPUs are grouped by id; without either, the machine has no package level.
    """
    onl = online.mask
    sets: dict[int, int] = {}  # package CPU mask -> the id its first CPU states
    by_pkg: dict[int, int] = {}
    for c in by_id.values():
        listed = c.package_cpus.mask & onl if c.package_cpus is not None else 0
        if listed:
            sets.setdefault(listed | 1 << c.id, c.package_id)
        elif c.package_id >= 0:
            by_pkg[c.package_id] = by_pkg.get(c.package_id, 0) | 1 << c.id
    for pid, mask in by_pkg.items():
        sets.setdefault(mask, pid)
    # overlapping lists (a CPU claimed by two packages) are bogus: keep the first claim of each CPU
    out: list[tuple[int, int]] = []
    taken = 0
    used_ids: set[int] = set()
    for mask in sorted(sets, key=lambda m: ((m & -m).bit_length(), m)):
        rest = mask & ~taken
        if not rest:
            continue
        taken |= rest
        pid = sets.get(rest, -1)
        if pid < 0 or pid in used_ids:
            pid = -1
        used_ids.add(pid)
        out.append((pid, rest))
    spare = max(used_ids, default=-1) + 1
    packages: list[Package] = []
    for pid, mask in out:
        if pid < 0:
            pid, spare = spare, spare + 1
        packages.append(Package(pid, CPUSet.from_mask(mask)))
    return tuple(packages)


def _cores(by_id: dict[int, RawCPU], online: CPUSet, packages: tuple[Package, ...]) -> tuple[Core, ...]:
    """Cores from thread siblings, split where siblings report different core ids."""
    pkg_of = {c: p.id for p in packages for c in p.cpus}
    onl = online.mask
    seen = 0
    out: list[Core] = []
    for cid in online:
        if seen >> cid & 1:
            continue
        c = by_id[cid]
        sib = (c.thread_siblings.mask if c.thread_siblings else 0) & onl & ~seen
        members = 1 << cid
        pkg = pkg_of.get(cid)
        rest = sib & ~members
        while rest:
            low = rest & -rest
            rest ^= low
            o = low.bit_length() - 1
            other = by_id.get(o)
            if other is not None and other.core_id == c.core_id and pkg_of.get(o) == pkg:
                members |= low
        seen |= members
        ts = c.thread_siblings  # usually exactly the core: share the scan's set
        cpus = ts if ts is not None and ts.mask == members else CPUSet.from_mask(members)
        out.append(Core(-1 if pkg is None else pkg, c.core_id, cpus))
    return tuple(out)  # ascending lowest CPU: built in CPU order, each core at its first CPU


def _caches(cpus: Iterable[RawCPU], online: CPUSet) -> tuple[Cache, ...]:
    onl = online.mask
    found: dict[tuple[int, str, int], RawCache] = {}
    for c in cpus:
        bit = 1 << c.id
        for rc in c.caches:
            if rc.level <= 0:
                continue
            if rc.cpus:
                shared = rc.cpus.mask
            else:
                # an empty or missing sharing map (seen on ia64): hwloc takes the core's threads
                shared = c.thread_siblings.mask if c.thread_siblings else 0
            key = (rc.level, rc.type, (shared | bit) & onl)
            if key not in found:
                found[key] = rc
    caches: list[tuple[tuple[int, str, int], Cache]] = []
    for (level, kind, mask), rc in found.items():
        # the scan's set when it is exactly the cache's (the usual case) rather than a new one
        members = rc.cpus if rc.cpus is not None and rc.cpus.mask == mask else CPUSet.from_mask(mask)
        kind = kind or "Unified"
        cache = Cache(level, kind, max(rc.size_bytes, 0), max(rc.line_bytes, 0), members)
        caches.append(((level, kind, (mask & -mask).bit_length()), cache))
    caches.sort(key=lambda kc: kc[0])  # level, type, lowest CPU
    return tuple(cache for _, cache in caches)


def _numa_nodes(raw: RawScan, online: CPUSet, warnings: list[str]) -> tuple[NumaNode, ...]:
    """NUMA nodes; a CPU-bearing node whose CPUs repeat an earlier node's is a BIOS bug and dropped.

    Linear in the size of the input (the distance table): machines with thousands of memory-only
    nodes (CXL, HBM, GPU memory) exist, so nothing here looks a node up by scanning a list.
    """
    if not raw.nodes:
        return (NumaNode(0, online, max(raw.mem_total_bytes, 0), 0, (), (10,), False, online, ""),)
    empty = CPUSet()
    kept: list[tuple[int, RawNode, CPUSet]] = []  # (position in the scan, node, its online CPUs)
    seen: dict[CPUSet, int] = {}
    for pos, n in enumerate(raw.nodes):
        cpus = n.cpus & online if n.cpus else empty
        if cpus and cpus in seen:
            warnings.append(f"NUMA node {n.id} repeats the CPUs of node {seen[cpus]}; ignored")
            continue
        if cpus:
            seen[cpus] = n.id
        kept.append((pos, n, cpus))
    width = len(raw.nodes)
    # a row is written over every node of the scan: keep the columns of the kept nodes
    columns = None if len(kept) == width else itemgetter(*(pos for pos, _, _ in kept))
    # (column in a full row, CPUs) of each CPU-bearing node, and the CPUs of each node by id
    cpu_columns = [(pos, cpus) for pos, _, cpus in kept if cpus]
    cpus_of = {n.id: cpus for _, n, cpus in kept}
    gpu_owner = dict(raw.gpu_memory_nodes)
    pci_cpus = {p.address: p.local_cpus for p in raw.pci}
    out: list[NumaNode] = []
    for _, n, cpus in kept:
        row = n.distances
        if len(row) != width:
            distances: tuple[int, ...] = ()
        elif columns is None:
            distances = row
        else:
            picked = columns(row)
            distances = picked if isinstance(picked, tuple) else (picked,)
        tier = "GPU" if n.id in gpu_owner else ""
        if cpus:
            local = cpus
        elif n.id in gpu_owner:
            local = (pci_cpus.get(gpu_owner[n.id]) or empty) & online
        else:
            local = _nearest_cpus(n, width, cpu_columns, cpus_of)
        out.append(NumaNode(
            id=n.id,
            cpus=cpus,
            memory_bytes=max(n.mem_total_bytes, 0),
            memory_free_bytes=max(n.mem_free_bytes, 0),
            hugepages=tuple(Hugepages(h.size_bytes, h.total, h.free) for h in n.hugepages),
            distances=distances,
            memory_only=not cpus,
            local_cpus=local,
            tier=tier,
            gpu_pci=gpu_owner.get(n.id, ""),
        ))
    return tuple(out)


def _nearest_cpus(node: RawNode, width: int, cpu_columns: list[tuple[int, CPUSet]],
                  cpus_of: dict[int, CPUSet]) -> CPUSet:
    """The CPUs a memory-only node is closest to: HMAT initiators, else the one nearest CPU-bearing node.

    `cpu_columns` holds each kept CPU-bearing node's column in a `width`-wide distance row.  A tie
    between CPU-bearing nodes leaves the node attached to the whole machine (no local CPUs), as hwloc
    does.
    """
    if node.initiators:
        return CPUSet().union(*(cpus_of.get(i) or CPUSet() for i in node.initiators))
    row = node.distances
    if len(row) == width and cpu_columns:
        best = min(row[pos] for pos, _ in cpu_columns)
        winners = [cpus for pos, cpus in cpu_columns if row[pos] == best]
        if len(winners) == 1:
            return winners[0]
    return CPUSet()


def _kinds(raw: RawScan, online: CPUSet) -> tuple[CPUKind, ...]:
    """Core kinds of a hybrid part, fastest first (rank 0).

    Intel names its kinds through the `cpu_core` (performance) and `cpu_atom` (efficiency) PMUs; other
    parts (Arm big.LITTLE, AMD with dense cores) only differ in `cpu_capacity`, else in maximum
    frequency, and get kinds named after that value.  A part whose CPUs are all alike has no kinds.
    """
    named = [(name, cpus & online) for name, cpus in raw.kinds if cpus & online]
    if named:
        return tuple(CPUKind(name, rank, cpus) for rank, (name, cpus) in enumerate(named))
    for attr, prefix in (("capacity", "capacity-"), ("max_freq_khz", "max-khz-")):
        groups: dict[int, int] = {}
        for c in raw.cpus:
            value = getattr(c, attr)
            if value > 0 and c.id in online:
                groups[value] = groups.get(value, 0) | 1 << c.id
        if len(groups) > 1:
            ordered = sorted(groups.items(), key=lambda kv: -kv[0])
            return tuple(CPUKind(f"{prefix}{value}", rank, CPUSet.from_mask(mask))
                         for rank, (value, mask) in enumerate(ordered))
    return ()
