"""The scan on synthetic trees with one defect each: the defect is reported by path, the rest holds."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from agent.errors import TopologyError
from agent.topology import native
from agent.topology.cpuset import CPUSet
from agent.topology.raw import RawScan

CPU = "sys/devices/system/cpu"
NODE = "sys/devices/system/node"
PCI_DEVICES = "sys/bus/pci/devices"


def write(root: Path, rel: str, text: str | bytes) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


def make_tree(root: Path, cpus: int = 4, nodes: int = 2) -> Path:
    """A healthy 1-package machine: 2 threads per core, one L2 per core, CPUs split over nodes."""
    write(root, f"{CPU}/possible", f"0-{cpus - 1}\n")
    write(root, f"{CPU}/present", f"0-{cpus - 1}\n")
    write(root, f"{CPU}/online", f"0-{cpus - 1}\n")
    write(root, f"{CPU}/offline", "\n")
    for c in range(cpus):
        core = c // 2
        sibs = f"{core * 2}-{core * 2 + 1}"
        t = f"{CPU}/cpu{c}/topology"
        write(root, f"{t}/physical_package_id", "0\n")
        write(root, f"{t}/core_id", f"{core}\n")
        write(root, f"{t}/thread_siblings_list", sibs + "\n")
        write(root, f"{t}/core_siblings_list", f"0-{cpus - 1}\n")
        idx = f"{CPU}/cpu{c}/cache/index0"
        write(root, f"{idx}/level", "2\n")
        write(root, f"{idx}/type", "Unified\n")
        write(root, f"{idx}/size", "1024K\n")
        write(root, f"{idx}/coherency_line_size", "64\n")
        write(root, f"{idx}/shared_cpu_list", sibs + "\n")
        if c:
            write(root, f"{CPU}/cpu{c}/online", "1\n")
    per = cpus // nodes
    for n in range(nodes):
        d = f"{NODE}/node{n}"
        write(root, f"{d}/cpulist", f"{n * per}-{n * per + per - 1}\n")
        write(root, f"{d}/meminfo", f"Node {n} MemTotal:  1048576 kB\nNode {n} MemFree:   524288 kB\n")
        write(root, f"{d}/distance", " ".join("10" if m == n else "20" for m in range(nodes)) + "\n")
        write(root, f"{d}/hugepages/hugepages-2048kB/nr_hugepages", "4\n")
        write(root, f"{d}/hugepages/hugepages-2048kB/free_hugepages", "3\n")
    write(root, "proc/cpuinfo", "processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 85\n"
          "model name\t: Test CPU\nflags\t\t: fpu sse2 avx2 hypervisor\n\n")
    write(root, "proc/meminfo", "MemTotal:        2097152 kB\nMemFree: 1 kB\n")
    return root


def by_id(scan: RawScan) -> dict[int, object]:
    return {c.id: c for c in scan.cpus}


def error_paths(scan: RawScan) -> dict[str, str]:
    return {e.path: e.code for e in scan.errors}


def test_healthy_tree(tmp_path: Path) -> None:
    s = native.scan(str(make_tree(tmp_path)))
    assert s.errors == ()
    assert [c.id for c in s.cpus] == [0, 1, 2, 3]
    assert s.possible == s.present == s.online == CPUSet([0, 1, 2, 3])
    assert s.offline == CPUSet()
    c3 = s.cpus[3]
    assert (c3.package_id, c3.core_id, c3.die_id) == (0, 1, -1)
    assert c3.thread_siblings == CPUSet([2, 3])
    assert c3.package_cpus == CPUSet(range(4))
    assert c3.die_cpus is None
    (cache,) = c3.caches
    assert (cache.level, cache.type, cache.size_bytes, cache.line_bytes, cache.id) == (
        2, "Unified", 1 << 20, 64, -1)
    assert cache.cpus == CPUSet([2, 3])
    assert [n.id for n in s.nodes] == [0, 1]
    n1 = s.nodes[1]
    assert n1.cpus == CPUSet([2, 3])
    assert (n1.mem_total_bytes, n1.mem_free_bytes) == (1 << 30, 1 << 29)
    assert n1.distances == (20, 10)
    assert [(h.size_bytes, h.total, h.free) for h in n1.hugepages] == [(2 << 20, 4, 3)]
    assert s.arch == "x86"
    assert (s.cpu_vendor, s.cpu_family, s.cpu_model, s.cpu_model_name) == ("GenuineIntel", 6, 85, "Test CPU")
    assert s.cpu_flags == ("avx2", "fpu", "hypervisor", "sse2")
    assert s.hypervisor
    assert s.mem_total_bytes == 2 << 30
    assert s.has_node_dir


def test_flags_come_from_the_dump_not_cpuid(tmp_path: Path) -> None:
    root = make_tree(tmp_path)
    write(root, "proc/cpuinfo", "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\n"
          "model\t\t: 1\nflags\t\t: fpu\n")
    s = native.scan(str(root))
    assert s.cpu_flags == ("fpu",)
    assert (s.cpu_vendor, s.cpu_family, s.cpu_model) == ("AuthenticAMD", 25, 1)
    assert not s.hypervisor


def test_threads_share_the_first_threads_facts(tmp_path: Path) -> None:
    """A thread whose siblings and core id agree with the core's first thread takes that thread's
    facts; one whose siblings or core id disagree is read on its own (AMD compute units)."""
    root = make_tree(tmp_path)
    write(root, f"{CPU}/cpu1/topology/core_id", "7\n")
    write(root, f"{CPU}/cpu3/topology/core_id", "9\n")
    write(root, f"{CPU}/cpu3/topology/thread_siblings_list", "3\n")
    write(root, f"{CPU}/cpu2/topology/core_siblings_list", "2-3\n")  # read by cpu2 only
    for parts in (1, 2):
        s = native.scan(str(root), parts=parts)
        assert not s.errors
        assert [c.core_id for c in s.cpus] == [0, 7, 1, 9]
        assert s.cpus[3].thread_siblings == CPUSet([3])
        assert s.cpus[1].package_cpus == CPUSet(range(4))  # read in full: its own file
        assert s.cpus[2].package_cpus == CPUSet([2, 3])


def test_unusable_core_id_of_a_sibling_is_reported(tmp_path: Path) -> None:
    """A sibling's core_id that cannot be parsed is an error by path, not a copy of the donor's."""
    root = make_tree(tmp_path)
    write(root, f"{CPU}/cpu1/topology/core_id", "x\n")
    s = native.scan(str(root), parts=1)
    assert s.cpus[1].core_id == -1
    assert f"{CPU}/cpu1/topology/core_id" in error_paths(s)


def test_trailing_nul_bytes(tmp_path: Path) -> None:
    root = make_tree(tmp_path)
    write(root, f"{NODE}/node0/cpulist", b"0-1\n\x00\x00\x00\x00")
    write(root, f"{CPU}/cpu2/topology/thread_siblings_list", b"2-3\x00")
    s = native.scan(str(root))
    assert s.errors == ()
    assert s.nodes[0].cpus == CPUSet([0, 1])
    assert s.cpus[2].thread_siblings == CPUSet([2, 3])


def test_mask_without_list(tmp_path: Path) -> None:
    root = make_tree(tmp_path)
    (root / f"{NODE}/node1/cpulist").unlink()
    write(root, f"{NODE}/node1/cpumap", "0000000c\n")
    (root / f"{CPU}/cpu1/topology/thread_siblings_list").unlink()
    write(root, f"{CPU}/cpu1/topology/thread_siblings", "00000000,00000003\n")
    (root / f"{CPU}/cpu1/cache/index0/shared_cpu_list").unlink()
    write(root, f"{CPU}/cpu1/cache/index0/shared_cpu_map", "3\n")
    s = native.scan(str(root))
    assert s.errors == ()
    assert s.nodes[1].cpus == CPUSet([2, 3])
    assert s.cpus[1].thread_siblings == CPUSet([0, 1])
    assert s.cpus[1].caches[0].cpus == CPUSet([0, 1])


def test_core_cpus_when_thread_siblings_missing(tmp_path: Path) -> None:
    root = make_tree(tmp_path)
    for c in range(4):
        (root / f"{CPU}/cpu{c}/topology/thread_siblings_list").unlink()
        write(root, f"{CPU}/cpu{c}/topology/core_cpus_list", f"{c}\n")
    s = native.scan(str(root))
    assert [c.thread_siblings for c in s.cpus] == [CPUSet([c]) for c in range(4)]


def test_missing_online_files(tmp_path: Path) -> None:
    root = make_tree(tmp_path)
    write(root, f"{CPU}/online", "0-1\n")
    (root / f"{CPU}/cpu1/online").unlink()  # falls back to cpu/online: listed
    (root / f"{CPU}/cpu3/online").unlink()  # falls back to cpu/online: not listed
    s = native.scan(str(root))
    assert [c.online for c in s.cpus] == [True, True, True, False]
    (root / f"{CPU}/online").unlink()
    s = native.scan(str(root))
    assert s.online is None
    assert s.cpus[3].online  # nothing says otherwise
    assert s.cpus[0].online  # cpu0 has no online file at all


def test_no_node_dir(tmp_path: Path) -> None:
    root = make_tree(tmp_path)
    for p in sorted((root / NODE).rglob("*"), key=lambda p: -len(p.parts)):
        p.rmdir() if p.is_dir() else p.unlink()
    (root / NODE).rmdir()
    s = native.scan(str(root))
    assert not s.has_node_dir
    assert s.nodes == ()
    assert len(s.cpus) == 4
    assert s.errors == ()


def test_sparse_ids(tmp_path: Path) -> None:
    root = make_tree(tmp_path, cpus=4, nodes=2)
    (root / f"{CPU}/cpu2").rename(root / f"{CPU}/cpu12")
    (root / f"{CPU}/cpu3").rename(root / f"{CPU}/cpu5")
    (root / f"{NODE}/node1").rename(root / f"{NODE}/node3")
    write(root, f"{CPU}/cpuidle/current_driver", "none\n")  # a cpu* folder that is not a CPU
    write(root, f"{NODE}/possible", "0,3\n")
    s = native.scan(str(root))
    assert [c.id for c in s.cpus] == [0, 1, 5, 12]
    assert [n.id for n in s.nodes] == [0, 3]


def test_offline_cpu_without_topology(tmp_path: Path) -> None:
    root = make_tree(tmp_path)
    write(root, f"{CPU}/cpu3/online", "0\n")
    write(root, f"{CPU}/online", "0-2\n")
    write(root, f"{CPU}/offline", "3\n")
    for p in sorted((root / f"{CPU}/cpu3").rglob("*"), key=lambda p: -len(p.parts)):
        if p.name != "online":
            p.rmdir() if p.is_dir() else p.unlink()
    s = native.scan(str(root))
    c3 = s.cpus[3]
    assert not c3.online and not c3.has_topology
    assert (c3.core_id, c3.package_id, c3.thread_siblings, c3.caches) == (-1, -1, None, ())
    assert s.offline == CPUSet([3])
    assert s.cpus[2].thread_siblings == CPUSet([2, 3])
    assert s.errors == ()


def test_dangling_symlink_attribute(tmp_path: Path) -> None:
    root = make_tree(tmp_path)
    target = root / f"{CPU}/cpu2/topology/core_id"
    target.unlink()
    target.symlink_to("no_such_file")
    s = native.scan(str(root))
    assert error_paths(s) == {f"{CPU}/cpu2/topology/core_id": "ELOOP"}
    assert s.cpus[2].core_id == -1
    assert s.cpus[2].package_id == 0
    assert s.cpus[0].core_id == 0


def test_self_referencing_symlinks(tmp_path: Path) -> None:
    root = make_tree(tmp_path)
    # live sysfs has node0/cpu0 -> ../../cpu/cpu0; some dumps have node0/cpu0 -> .
    (root / f"{NODE}/node0/cpu0").symlink_to(".")
    loop = root / f"{CPU}/cpu2/topology/core_siblings_list"
    loop.unlink()
    loop.symlink_to("core_siblings_list")
    (root / f"{CPU}/cpu7").symlink_to("cpu7")
    s = native.scan(str(root))
    errors = error_paths(s)
    assert errors[f"{CPU}/cpu2/topology/core_siblings_list"] == "ELOOP"
    assert f"{CPU}/cpu7" in errors
    assert [c.id for c in s.cpus] == [0, 1, 2, 3]
    assert s.cpus[2].package_cpus is None
    assert s.cpus[3].package_cpus == CPUSet(range(4))
    assert s.nodes[0].cpus == CPUSet([0, 1])


def test_directory_where_a_file_is_expected(tmp_path: Path) -> None:
    root = make_tree(tmp_path)
    p = root / f"{CPU}/cpu2/topology/physical_package_id"
    p.unlink()
    p.mkdir()
    s = native.scan(str(root))
    assert error_paths(s)[f"{CPU}/cpu2/topology/physical_package_id"] == "EISDIR"
    assert s.cpus[2].package_id == -1
    assert s.cpus[2].core_id == 1


def test_fifo_does_not_block_and_is_an_error(tmp_path: Path) -> None:
    root = make_tree(tmp_path)
    p = root / f"{NODE}/node1/meminfo"
    p.unlink()
    os.mkfifo(p)
    s = native.scan(str(root))
    assert f"{NODE}/node1/meminfo" in error_paths(s)
    assert s.nodes[1].mem_total_bytes == -1
    assert s.nodes[1].cpus == CPUSet([2, 3])


def test_empty_files(tmp_path: Path) -> None:
    root = make_tree(tmp_path)
    write(root, f"{CPU}/cpu2/topology/core_id", "")
    write(root, f"{CPU}/cpu0/cache/index0/size", "")
    write(root, f"{NODE}/node0/cpulist", "")  # an empty list is a fact: a CPU-less node
    s = native.scan(str(root))
    errors = error_paths(s)
    assert errors[f"{CPU}/cpu2/topology/core_id"] == "ENODATA"
    assert errors[f"{CPU}/cpu0/cache/index0/size"] == "ENODATA"
    assert s.cpus[2].core_id == -1
    assert s.cpus[0].caches[0].size_bytes == -1
    assert s.cpus[0].caches[0].level == 2
    assert s.nodes[0].cpus == CPUSet()
    assert len(errors) == 2


@pytest.mark.parametrize(
    ("rel", "text"),
    [
        (f"{CPU}/cpu2/topology/core_id", "zero\n"),
        (f"{CPU}/cpu2/topology/core_id", "1 2\n"),
        (f"{CPU}/cpu2/topology/core_id", "99999999999999999999999\n"),
        (f"{CPU}/cpu2/topology/thread_siblings_list", "0-x\n"),
        (f"{CPU}/cpu2/topology/thread_siblings_list", "3-1\n"),
        (f"{CPU}/cpu2/cache/index0/size", "lots\n"),
        (f"{NODE}/node1/distance", "10 twenty\n"),
        (f"{NODE}/node1/cpulist", "2-3-4\n"),
        (f"{NODE}/node1/meminfo", "nothing useful\n"),
    ],
)
def test_garbage_content(tmp_path: Path, rel: str, text: str) -> None:
    root = make_tree(tmp_path)
    write(root, rel, text)
    s = native.scan(str(root))
    assert error_paths(s).get(rel) in ("EINVAL", "ERANGE")
    assert len(s.cpus) == 4 and len(s.nodes) == 2
    assert s.cpus[3].thread_siblings == CPUSet([2, 3])
    assert s.nodes[0].cpus == CPUSet([0, 1])


def test_file_over_the_read_cap(tmp_path: Path) -> None:
    root = make_tree(tmp_path)
    write(root, f"{NODE}/node1/distance", "10 " * (3 << 20))
    s = native.scan(str(root))
    assert error_paths(s)[f"{NODE}/node1/distance"] == "EFBIG"
    assert s.nodes[1].distances == ()
    assert s.nodes[0].distances == (10, 20)


def test_missing_root_is_a_hard_error(tmp_path: Path) -> None:
    with pytest.raises(TopologyError) as err:
        native.scan(str(tmp_path / "absent"))
    assert err.value.path == str(tmp_path / "absent")


def test_missing_cpu_folder_is_a_hard_error(tmp_path: Path) -> None:
    write(tmp_path, "proc/cpuinfo", "processor : 0\n")
    with pytest.raises(TopologyError) as err:
        native.scan(str(tmp_path))
    assert err.value.path == os.path.join(str(tmp_path), CPU)


def test_root_that_is_a_file_is_a_hard_error(tmp_path: Path) -> None:
    f = write(tmp_path, "file", "x")
    with pytest.raises(TopologyError):
        native.scan(str(f))


def test_initiators_and_hybrid_kinds(tmp_path: Path) -> None:
    root = make_tree(tmp_path)
    (root / f"{NODE}/node1/access0/initiators").mkdir(parents=True)
    for k in (0, 2):
        (root / f"{NODE}/node1/access0/initiators/node{k}").symlink_to(f"../../../node{k}")
    write(root, f"{NODE}/node1/access0/initiators/read_latency", "100\n")
    write(root, "sys/devices/cpu_core/cpus", "0-1\n")
    write(root, "sys/devices/cpu_atom/cpus", "2-3\n")
    s = native.scan(str(root))
    assert s.nodes[1].initiators == (0, 2)
    assert s.nodes[0].initiators == ()
    assert s.kinds == (("cpu_core", CPUSet([0, 1])), ("cpu_atom", CPUSet([2, 3])))


# ---- PCI ------------------------------------------------------------------------------------


def pci_function(root: Path, rel_dir: str, cls: str = "0x030200", numa: str = "1") -> Path:
    d = root / rel_dir
    write(root, f"{rel_dir}/class", cls + "\n")
    write(root, f"{rel_dir}/vendor", "0x10de\n")
    write(root, f"{rel_dir}/device", "0x2330\n")
    write(root, f"{rel_dir}/numa_node", numa + "\n")
    write(root, f"{rel_dir}/local_cpulist", "2-3\n")
    return d


LinkMaker = Callable[[Path, str], str]


@pytest.mark.parametrize(
    "link_for",
    [
        pytest.param(lambda root, dev: f"../../../devices/pci0000:00/{dev}", id="relative"),
        # an absolute link in a dump means the dump's /sys, never the host's
        pytest.param(lambda root, dev: f"/sys/devices/pci0000:00/{dev}", id="absolute"),
    ],
)
def test_pci_links_resolve_inside_the_root(tmp_path: Path, link_for: LinkMaker) -> None:
    root = make_tree(tmp_path)
    dev = "0000:3b:00.0"
    pci_function(root, f"sys/devices/pci0000:00/{dev}")
    (root / PCI_DEVICES).mkdir(parents=True)
    (root / PCI_DEVICES / dev).symlink_to(link_for(root, dev))
    s = native.scan(str(root))
    assert s.errors == ()
    (p,) = s.pci
    assert (p.address, p.class_code, p.vendor, p.device, p.numa_node) == (dev, 0x030200, 0x10DE, 0x2330, 1)
    assert p.local_cpus == CPUSet([2, 3])


def test_pci_dangling_link_and_virtual_function(tmp_path: Path) -> None:
    root = make_tree(tmp_path)
    pf, vf = "0000:3b:00.0", "0000:3b:00.1"
    pci_function(root, f"sys/devices/pci0000:00/{pf}", cls="0x020000", numa="-1")
    vf_dir = pci_function(root, f"sys/devices/pci0000:00/{vf}", cls="0x020000")
    (vf_dir / "physfn").symlink_to(f"../{pf}")
    (root / PCI_DEVICES).mkdir(parents=True)
    for dev in (pf, vf):
        (root / PCI_DEVICES / dev).symlink_to(f"../../../devices/pci0000:00/{dev}")
    (root / PCI_DEVICES / "0000:00:1f.0").symlink_to("../../../devices/pci0000:00/0000:00:1f.0")
    (root / PCI_DEVICES / "0000:00:1f.1").symlink_to("0000:00:1f.1")
    s = native.scan(str(root))
    assert [p.address for p in s.pci] == [pf]
    assert s.pci[0].numa_node == -1
    errors = error_paths(s)
    assert f"{PCI_DEVICES}/0000:00:1f.0" in errors
    assert f"{PCI_DEVICES}/0000:00:1f.1" in errors
    assert len(s.cpus) == 4
