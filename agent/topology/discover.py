"""Turn the C helper's raw scan into the `Topology` model, resolving sysfs's disagreements as hwloc does."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

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
from agent.topology.raw import RawCPU, RawNode, RawScan


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


def _sorted_sets(sets: Iterable[CPUSet]) -> list[CPUSet]:
    return sorted({s for s in sets if s}, key=lambda s: (s.min(), s.mask))


def _packages(by_id: dict[int, RawCPU], online: CPUSet) -> tuple[Package, ...]:
    """Packages from the package CPU lists (as hwloc does), ids from physical_package_id.

    The lists win over the ids: some kernels repeat one id across sockets (ia64) or give -1.
    Without lists, CPUs are grouped by id; without either, the machine has no package level.
    """
    sets: dict[CPUSet, int] = {}
    by_pkg: dict[int, set[int]] = defaultdict(set)
    for c in by_id.values():
        if c.package_cpus is not None and c.package_cpus & online:
            s = (c.package_cpus & online) | CPUSet([c.id])
            sets.setdefault(s, c.package_id)
        elif c.package_id >= 0:
            by_pkg[c.package_id].add(c.id)
    for pid, ids in by_pkg.items():
        sets.setdefault(CPUSet(ids), pid)
    ordered = _sorted_sets(sets)
    # overlapping lists (a CPU claimed by two packages) are bogus: keep the first claim of each CPU
    out: list[Package] = []
    taken = CPUSet()
    used_ids: set[int] = set()
    for s in ordered:
        s -= taken
        if not s:
            continue
        taken |= s
        pid = sets.get(s, -1)
        if pid < 0 or pid in used_ids:
            pid = -1
        used_ids.add(pid)
        out.append(Package(pid, s))
    spare = max(used_ids, default=-1) + 1
    fixed: list[Package] = []
    for p in out:
        if p.id < 0:
            fixed.append(Package(spare, p.cpus))
            spare += 1
        else:
            fixed.append(p)
    return tuple(fixed)


def _cores(by_id: dict[int, RawCPU], online: CPUSet, packages: tuple[Package, ...]) -> tuple[Core, ...]:
    """Cores from thread siblings, split where siblings report different core ids."""
    pkg_of = {c: p.id for p in packages for c in p.cpus}
    seen = CPUSet()
    out: list[Core] = []
    for cid in online:
        if cid in seen:
            continue
        c = by_id[cid]
        sib = (c.thread_siblings or CPUSet([cid])) & online
        members = CPUSet(
            o for o in sib
            if o in by_id and by_id[o].core_id == c.core_id and pkg_of.get(o) == pkg_of.get(cid)
        ) | CPUSet([cid])
        members -= seen
        seen |= members
        out.append(Core(pkg_of.get(cid, -1), c.core_id, members))
    return tuple(sorted(out, key=lambda k: k.cpus.min()))


def _caches(cpus: Iterable[RawCPU], online: CPUSet) -> tuple[Cache, ...]:
    found: dict[tuple[int, str, CPUSet], Cache] = {}
    for c in cpus:
        for rc in c.caches:
            if rc.level <= 0:
                continue
            shared = rc.cpus if rc.cpus else None
            if shared is None:
                # an empty or missing sharing map (seen on ia64): hwloc takes the core's threads
                shared = c.thread_siblings or CPUSet([c.id])
            shared = (shared | CPUSet([c.id])) & online
            key = (rc.level, rc.type, shared)
            if key not in found:
                found[key] = Cache(rc.level, rc.type or "Unified", max(rc.size_bytes, 0),
                                   max(rc.line_bytes, 0), shared)
    return tuple(sorted(found.values(), key=lambda k: (k.level, k.type, k.cpus.min())))


def _numa_nodes(raw: RawScan, online: CPUSet, warnings: list[str]) -> tuple[NumaNode, ...]:
    """NUMA nodes; a CPU-bearing node whose CPUs repeat an earlier node's is a BIOS bug and dropped."""
    if not raw.nodes:
        return (NumaNode(0, online, max(raw.mem_total_bytes, 0), 0, (), (10,), False, online, ""),)
    nodes: list[RawNode] = []
    seen: dict[CPUSet, int] = {}
    for n in raw.nodes:
        cpus = (n.cpus or CPUSet()) & online
        if cpus and cpus in seen:
            warnings.append(f"NUMA node {n.id} repeats the CPUs of node {seen[cpus]}; ignored")
            continue
        if cpus:
            seen[cpus] = n.id
        nodes.append(n)
    all_ids = [n.id for n in raw.nodes]
    ids = [n.id for n in nodes]
    gpu_owner = dict(raw.gpu_memory_nodes)
    pci_cpus = {p.address: p.local_cpus for p in raw.pci}
    out: list[NumaNode] = []
    for n in nodes:
        cpus = (n.cpus or CPUSet()) & online
        row = n.distances
        distances = tuple(row[all_ids.index(i)] for i in ids) if len(row) == len(all_ids) else ()
        tier = "GPU" if n.id in gpu_owner else ""
        if cpus:
            local = cpus
        elif n.id in gpu_owner:
            local = (pci_cpus.get(gpu_owner[n.id]) or CPUSet()) & online
        else:
            local = _nearest_cpus(n, nodes, all_ids, online)
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
        ))
    return tuple(out)


def _nearest_cpus(node: RawNode, nodes: list[RawNode], all_ids: list[int], online: CPUSet) -> CPUSet:
    """The CPUs a memory-only node is closest to: HMAT initiators, else the one nearest CPU-bearing node.

    A tie between CPU-bearing nodes leaves the node attached to the whole machine (no local CPUs), as
    hwloc does.
    """
    cpu_nodes = {n.id: (n.cpus or CPUSet()) & online for n in nodes}
    if node.initiators:
        return CPUSet().union(*(cpu_nodes.get(i, CPUSet()) for i in node.initiators))
    if len(node.distances) == len(all_ids):
        cands = [(d, i) for d, i in zip(node.distances, all_ids, strict=True) if cpu_nodes.get(i)]
        if cands:
            best = min(d for d, _ in cands)
            winners = [i for d, i in cands if d == best]
            if len(winners) == 1:
                return cpu_nodes[winners[0]]
    return CPUSet()


def _kinds(raw: RawScan, online: CPUSet) -> tuple[CPUKind, ...]:
    return tuple(CPUKind(name, rank, cpus & online) for rank, (name, cpus) in enumerate(raw.kinds))
