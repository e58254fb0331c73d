"""GPU discovery from the one PCI scan (sysfs fixtures and a real dump) and through the stand-in NVML."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from agent.gpu.discover import discover_gpus, discover_nvml, gpus_from_topology, normalize_bus_id
from agent.gpu.model import GPUInventory, gpu_numa_nodes
from agent.topology.cpuset import CPUSet
from agent.topology.discover import discover
from agent.topology.model import Topology
from tests.gpu.fake_nvml import FakeNVML, h100_node
from tests.gpu.sysfs_fixture import HGX_GPUS, NODE_CPUS, build_hgx, cpu_tree, pci_function


def scanned(root: Path) -> Topology:
    """The topology the C helper's scan builds for a fixture root."""
    return discover(str(root))


def inventory(root: Path, **kw: object) -> GPUInventory:
    return gpus_from_topology(scanned(build_hgx(root, **kw)), root)  # type: ignore[arg-type]


@pytest.mark.parametrize("links", [True, False], ids=["symlinked", "plain-folders"])
def test_finds_eight_gpus_on_two_numa_nodes(tmp_path: Path, links: bool) -> None:
    inv = inventory(tmp_path, links=links)
    assert inv.source == "sysfs"
    assert [g.pci_address for g in inv.gpus] == [f"0000:{b}:00.0" for b, _ in HGX_GPUS]
    assert [g.index for g in inv.gpus] == list(range(8))
    assert [g.numa_node for g in inv.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert inv.gpus[0].local_cpus == CPUSet([*range(0, 56), *range(112, 168)])
    assert inv.gpus[7].local_cpus == CPUSet.parse(NODE_CPUS[1])
    assert all(g.name == "NVIDIA H100 80GB HBM3" and g.mig_capable for g in inv.gpus)
    assert [g.minor for g in inv.gpus] == list(range(8))
    assert inv.gpus[3].uuid == "GPU-00000003-h100"
    assert inv.gpus[0].compute_capability == (9, 0)


def test_nvswitches_and_audio_functions_are_not_gpus(hgx_root: Path, hgx_topology: Topology) -> None:
    inv = gpus_from_topology(hgx_topology, hgx_root)
    assert len(inv.nvswitches) == 4
    assert {s.pci_address for s in inv.nvswitches}.isdisjoint({g.pci_address for g in inv.gpus})
    assert [s.numa_node for s in inv.nvswitches] == [0, 0, 1, 1]
    assert "0000:18:00.1" not in {g.pci_address for g in inv.gpus}


def test_without_a_file_system_nothing_is_read(hgx_topology: Topology) -> None:
    inv = gpus_from_topology(hgx_topology)  # labels from a dump: the topology alone
    assert len(inv.gpus) == 8 and all(g.uuid == "" and g.minor == -1 for g in inv.gpus)
    assert inv.gpus[0].name == "NVIDIA H100 80GB HBM3"  # from the device-id table


def test_without_driver_proc_files_product_comes_from_device_id(tmp_path: Path) -> None:
    g = inventory(tmp_path, device=0x2335, with_proc=False).gpus[0]
    assert g.name == "NVIDIA H200" and g.product == "NVIDIA-H200"
    assert g.uuid == "" and g.minor == -1
    assert g.memory_bytes == 143771 << 20


def test_unlisted_device_id_keeps_its_id_in_the_name(tmp_path: Path) -> None:
    g = inventory(tmp_path, device=0x1EB8, with_proc=False).gpus[0]
    assert g.name == "NVIDIA 10de:1eb8" and g.memory_bytes == 0 and not g.mig_capable


@pytest.mark.parametrize(("numa", "want"), [
    ("known", [0, 0, 0, 0, 1, 1, 1, 1]),
    ("minus-one", [0, 0, 0, 0, 1, 1, 1, 1]),  # the node whose CPUs hold the local CPUs
    ("spanning", [-1] * 8),  # local CPUs on both sockets: no node to name
])
def test_numa_node_when_sysfs_does_not_say(tmp_path: Path, numa: str, want: list[int]) -> None:
    inv = inventory(tmp_path, numa=numa)
    assert [g.numa_node for g in inv.gpus] == want
    if numa == "spanning":
        assert gpu_numa_nodes(inv.gpus, range(8)) == frozenset()


def test_no_pci_tree_gives_no_gpus(tmp_path: Path) -> None:
    inv = gpus_from_topology(scanned(cpu_tree(tmp_path, cores_per_socket=2)), tmp_path)
    assert inv.gpus == () and inv.nvswitches == ()


def test_hidden_vendor_is_vouched_for_by_the_driver_folder(tmp_path: Path) -> None:
    cpu_tree(tmp_path, cores_per_socket=2)
    pci_function(tmp_path, "0000:18:00.0", vendor=None, device=0x2330, pci_class=0x030200, numa=0,
                 cpus="0-1,4-5")
    pci_function(tmp_path, "0000:19:00.0", vendor=None, device=0x1234, pci_class=0x030000, numa=0,
                 cpus="0-1,4-5")  # someone else's display: no driver folder
    (tmp_path / "proc/driver/nvidia/gpus/0000:18:00.0").mkdir(parents=True)
    topo = scanned(tmp_path)
    assert [g.pci_address for g in gpus_from_topology(topo, tmp_path).gpus] == ["0000:18:00.0"]
    assert gpus_from_topology(topo).gpus == ()  # without the file system, nothing vouches for it


def test_power9_dump_with_gpu_memory_nodes(dump_root: Callable[[str], Path]) -> None:
    """hwloc's POWER9 + V100 dump: class-only PCI files (no vendor, no numa_node), six GPU-memory nodes."""
    root = dump_root("nvidiagpunumanodes")
    topo = scanned(root)
    for inv in (gpus_from_topology(topo, root), gpus_from_topology(topo)):
        assert [g.pci_address for g in inv.gpus] == [
            "0004:05:00.0", "0004:06:00.0", "0006:00:00.0", "0007:00:00.0", "0035:04:00.0", "0035:05:00.0"]
        # numa_node files are absent: the node comes from the local CPUs (0-15 → node 0, 88-103 → 8)
        assert [g.numa_node for g in inv.gpus] == [0, 0, 0, 8, 8, 8]
        assert inv.gpus[0].name == "NVIDIA GPU"


def test_missing_nvml_library_falls_back_to_the_pci_scan(hgx_topology: Topology,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import pynvml

    fake = FakeNVML(library_missing=True)
    monkeypatch.setattr(pynvml, "nvmlInit", fake.nvmlInit)
    inv = discover_gpus(hgx_topology, "/")  # the live root: NVML is tried, and its library is missing
    assert inv.source == "sysfs"
    assert inv.note.startswith("no NVML")
    assert len(inv.gpus) == 8


def test_a_dump_never_asks_nvml(hgx_root: Path, hgx_topology: Topology,
                                monkeypatch: pytest.MonkeyPatch) -> None:
    import pynvml

    def refuse() -> None:
        raise AssertionError("NVML asked about a dump")

    monkeypatch.setattr(pynvml, "nvmlInit", refuse)
    inv = discover_gpus(hgx_topology, hgx_root)
    assert inv.source == "sysfs" and len(inv.gpus) == 8 and inv.gpus[0].uuid.startswith("GPU-")


def test_nvml_and_sysfs_agree_on_the_same_gpus(hgx_root: Path, hgx_topology: Topology) -> None:
    root, topo = hgx_root, hgx_topology
    nvml = h100_node(8, mig=False)
    nvml.nvmlInit()
    via_nvml = discover_nvml(nvml, topo)
    via_sysfs = gpus_from_topology(topo, root)
    assert via_nvml.source == "nvml"
    fields = ("index", "uuid", "name", "product", "pci_address", "pci_device_id", "numa_node", "local_cpus",
              "minor", "compute_capability", "mig_capable")
    for a, b in zip(via_nvml.gpus, via_sysfs.gpus, strict=True):
        for f in fields:
            assert getattr(a, f) == getattr(b, f), f
    assert via_nvml.nvswitches == via_sysfs.nvswitches
    # NVML knows what sysfs cannot: MIG mode, links, versions.
    assert via_nvml.gpus[0].mig_mode_current is False and via_sysfs.gpus[0].mig_mode_current is None
    assert via_nvml.gpus[0].nvlinks_active == 18
    assert len(via_nvml.links) == 28 and all(link.nvlink for link in via_nvml.links)
    assert via_nvml.cuda_version == "12.4" and via_nvml.driver_version == "550.54.15"


def test_gpu_numa_nodes_for_a_selection(hgx_topology: Topology) -> None:
    gpus = gpus_from_topology(hgx_topology).gpus
    assert gpu_numa_nodes(gpus, [0, 1]) == frozenset({0})
    assert gpu_numa_nodes(gpus, [3, 4]) == frozenset({0, 1})
    assert gpu_numa_nodes(gpus, []) == frozenset()


@pytest.mark.parametrize(("raw", "want"), [
    ("00000000:3B:00.0", "0000:3b:00.0"),
    (b"00000000:DB:00.0", "0000:db:00.0"),
    ("0000:18:00.0", "0000:18:00.0"),
])
def test_bus_ids_normalize_to_sysfs_form(raw: str | bytes, want: str) -> None:
    assert normalize_bus_id(raw) == want


@pytest.mark.parametrize("raw", ["18:00.0", "zz:18:00.0", "0000:18:00:0.0", ""])
def test_bad_bus_ids_are_refused(raw: str) -> None:
    from agent.errors import TopologyError

    with pytest.raises(TopologyError):
        normalize_bus_id(raw)
