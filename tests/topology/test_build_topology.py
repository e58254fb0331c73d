"""The hwloc-compatible resolution rules of `build_topology`, one synthetic raw scan per row."""

from __future__ import annotations

from agent.topology.cpuset import CPUSet
from agent.topology.discover import build_topology
from agent.topology.raw import RawCache, RawCPU, RawNode, RawPCI, RawScan
from agent.topology.record import replace


def cpu(i: int, pkg: int = 0, core: int | None = None, siblings: str | None = None,
        package_cpus: str | None = None, caches: tuple[RawCache, ...] = (), online: bool = True) -> RawCPU:
    return RawCPU(
        id=i, online=online, has_topology=True, package_id=pkg, die_id=-1, cluster_id=-1,
        core_id=i if core is None else core, book_id=-1, drawer_id=-1,
        thread_siblings=CPUSet.parse(siblings) if siblings is not None else CPUSet([i]),
        package_cpus=CPUSet.parse(package_cpus) if package_cpus is not None else None,
        die_cpus=None, cluster_cpus=None, book_siblings=None, drawer_siblings=None,
        capacity=-1, max_freq_khz=-1, caches=caches,
    )


def node(i: int, cpus: str, distances: tuple[int, ...] = (), initiators: tuple[int, ...] = ()) -> RawNode:
    return RawNode(i, CPUSet.parse(cpus), 1 << 30, 1 << 29, (), distances, initiators)


def scan(cpus: list[RawCPU], nodes: list[RawNode] = (), **kw: object) -> RawScan:  # type: ignore[assignment]
    base = RawScan(
        root="/x", possible=None, present=None, online=None, offline=None, cpus=tuple(cpus),
        has_node_dir=bool(nodes), nodes=tuple(nodes), kinds=(), cpu_flags=(), cpu_vendor="",
        cpu_family=-1, cpu_model=-1, cpu_model_name="", hypervisor=False, arch="x86",
        mem_total_bytes=8 << 30, pci=(), errors=(),
    )
    return replace(base, **kw)


def test_package_lists_win_over_repeated_ids():
    # ia64 kernels repeat physical_package_id 0 for CPUs whose package lists say they are apart
    t = build_topology(scan([cpu(0, 0, package_cpus="0"), cpu(1, 0, package_cpus="1")]))
    assert [p.cpus for p in t.packages] == [CPUSet([0]), CPUSet([1])]


def test_package_ids_group_cpus_when_lists_are_missing():
    t = build_topology(scan([cpu(0, 0), cpu(1, 1), cpu(2, 0), cpu(3, 1)]))
    assert {p.id: p.cpus for p in t.packages} == {0: CPUSet([0, 2]), 1: CPUSet([1, 3])}


def test_compute_unit_siblings_with_distinct_core_ids_are_separate_cores():
    t = build_topology(scan([cpu(0, core=0, siblings="0-1"), cpu(1, core=1, siblings="0-1")]))
    assert [c.cpus for c in t.cores] == [CPUSet([0]), CPUSet([1])]


def test_smt_siblings_with_one_core_id_form_one_core():
    t = build_topology(scan([cpu(0, core=0, siblings="0-1"), cpu(1, core=0, siblings="0-1")]))
    assert [c.cpus for c in t.cores] == [CPUSet([0, 1])]


def test_empty_cache_map_falls_back_to_the_cores_threads():
    l3 = RawCache(3, "Unified", 1 << 20, 64, -1, CPUSet())
    t = build_topology(scan([cpu(0, core=0, siblings="0-1", caches=(l3,)),
                             cpu(1, core=0, siblings="0-1", caches=(l3,))]))
    assert t.l3_groups == (CPUSet([0, 1]),)


def test_offline_cpus_are_left_out():
    t = build_topology(scan([cpu(0), cpu(1, online=False), cpu(2)], online=CPUSet([0, 2])))
    assert t.cpus == CPUSet([0, 2])
    assert t.offline == CPUSet([1])


def test_duplicate_numa_cpusets_keep_the_first_node():
    t = build_topology(scan([cpu(0), cpu(1)], [node(0, "0-1", (10, 10)), node(1, "0-1", (10, 10))]))
    assert t.numa_ids == (0,)
    assert any("repeats the CPUs" in w for w in t.warnings)


def test_memory_only_node_takes_its_hmat_initiators():
    t = build_topology(scan([cpu(0), cpu(1)], [
        node(0, "0", (10, 20, 20)), node(1, "1", (20, 10, 20)), node(2, "", (20, 20, 10), initiators=(1,)),
    ]))
    far = t.node(2)
    assert far.memory_only and far.local_cpus == CPUSet([1])


def test_memory_only_node_takes_the_single_nearest_cpu_node():
    t = build_topology(scan([cpu(0), cpu(1)], [
        node(0, "0", (10, 20, 17)), node(1, "1", (20, 10, 30)), node(2, "", (17, 30, 10)),
    ]))
    assert t.node(2).local_cpus == CPUSet([0])


def test_memory_only_node_equidistant_from_all_stays_at_machine_level():
    t = build_topology(scan([cpu(0), cpu(1)], [
        node(0, "0", (10, 20, 14)), node(1, "1", (20, 10, 14)), node(2, "", (14, 14, 10)),
    ]))
    assert t.node(2).local_cpus == CPUSet()


def test_gpu_memory_node_follows_its_gpus_pci_locality():
    gpu = RawPCI("0004:05:00.0", 0x030200, 0x10DE, 0x1DB5, -1, CPUSet([1]))
    t = build_topology(scan([cpu(0), cpu(1)], [
        node(0, "0", (10, 40, 80)), node(1, "1", (40, 10, 80)), node(255, "", (80, 80, 10)),
    ], pci=(gpu,), gpu_memory_nodes=((255, "0004:05:00.0"),)))
    n = t.node(255)
    assert n.tier == "GPU" and n.local_cpus == CPUSet([1])


def test_no_node_folder_gives_one_node_with_all_cpus():
    t = build_topology(scan([cpu(0), cpu(1)]))
    assert t.numa_ids == (0,)
    assert t.node(0).cpus == CPUSet([0, 1])
    assert t.node(0).memory_bytes == 8 << 30


def test_hybrid_kinds_come_from_the_core_and_atom_pmus():
    t = build_topology(scan([cpu(0), cpu(1), cpu(2)],
                            kinds=(("cpu_core", CPUSet([0, 1])), ("cpu_atom", CPUSet([2])))))
    assert [(k.name, k.rank, k.cpus) for k in t.kinds] == [
        ("cpu_core", 0, CPUSet([0, 1])), ("cpu_atom", 1, CPUSet([2]))]


def test_kinds_from_cpu_capacity_rank_the_biggest_first():
    cpus = [replace(cpu(i), capacity=cap) for i, cap in enumerate((446, 446, 1024, 1024))]
    t = build_topology(scan(cpus))
    assert [(k.name, k.cpus) for k in t.kinds] == [
        ("capacity-1024", CPUSet([2, 3])), ("capacity-446", CPUSet([0, 1]))]


def test_kinds_fall_back_to_max_frequency_and_alike_cpus_have_none():
    fast_slow = [replace(cpu(i), max_freq_khz=f) for i, f in enumerate((3_000_000, 2_000_000))]
    assert [k.name for k in build_topology(scan(fast_slow)).kinds] == ["max-khz-3000000", "max-khz-2000000"]
    alike = [replace(cpu(i), capacity=1024, max_freq_khz=3_000_000) for i in range(2)]
    assert build_topology(scan(alike)).kinds == ()
