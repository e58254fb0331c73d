"""GPU discovery from PCI sysfs fixtures and through the stand-in NVML; the two must agree."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.gpu.discover import discover_gpus, discover_nvml, discover_sysfs, normalize_bus_id
from agent.gpu.model import gpu_numa_nodes
from agent.topology.cpuset import CPUSet
from tests.gpu.fake_nvml import FakeNVML, h100_node
from tests.gpu.sysfs_fixture import HGX_GPUS, NODE_CPUS, build_hgx


def test_sysfs_finds_eight_gpus_on_two_numa_nodes(tmp_path: Path) -> None:
    inv = discover_sysfs(build_hgx(tmp_path))
    assert inv.source == "sysfs"
    assert [g.pci_address for g in inv.gpus] == [f"0000:{b}:00.0" for b, _ in HGX_GPUS]
    assert [g.numa_node for g in inv.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert inv.gpus[0].local_cpus == CPUSet([*range(0, 56), *range(112, 168)])
    assert inv.gpus[7].local_cpus == CPUSet.parse(NODE_CPUS[1])
    assert all(g.name == "NVIDIA H100 80GB HBM3" and g.mig_capable for g in inv.gpus)
    assert [g.minor for g in inv.gpus] == list(range(8))
    assert inv.gpus[3].uuid == "GPU-00000003-h100"
    assert inv.gpus[0].compute_capability == (9, 0)


def test_nvswitches_are_reported_apart(tmp_path: Path) -> None:
    inv = discover_sysfs(build_hgx(tmp_path))
    assert len(inv.nvswitches) == 4
    assert {s.pci_address for s in inv.nvswitches}.isdisjoint({g.pci_address for g in inv.gpus})
    assert [s.numa_node for s in inv.nvswitches] == [0, 0, 1, 1]


def test_without_driver_proc_files_product_comes_from_device_id(tmp_path: Path) -> None:
    inv = discover_sysfs(build_hgx(tmp_path, device=0x2335, with_proc=False))
    g = inv.gpus[0]
    assert g.name == "NVIDIA H200" and g.product == "NVIDIA-H200"
    assert g.uuid == "" and g.minor == -1
    assert g.memory_bytes == 143771 << 20


def test_unknown_numa_is_minus_one(tmp_path: Path) -> None:
    inv = discover_sysfs(build_hgx(tmp_path, numa_known=False))
    assert {g.numa_node for g in inv.gpus} == {-1}
    assert gpu_numa_nodes(inv.gpus, range(8)) == frozenset()


def test_no_pci_tree_gives_no_gpus(tmp_path: Path) -> None:
    inv = discover_sysfs(tmp_path)
    assert inv.gpus == () and "no " in inv.note


def test_missing_nvml_library_falls_back_to_sysfs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import pynvml

    fake = FakeNVML(library_missing=True)
    monkeypatch.setattr(pynvml, "nvmlInit", fake.nvmlInit)
    inv = discover_gpus(build_hgx(tmp_path))
    assert inv.source == "sysfs"
    assert inv.note.startswith("no NVML")
    assert len(inv.gpus) == 8


def test_nvml_and_sysfs_agree_on_the_same_gpus(tmp_path: Path) -> None:
    root = build_hgx(tmp_path)
    nvml = h100_node(8, mig=False)
    nvml.nvmlInit()
    via_nvml = discover_nvml(nvml, root)
    via_sysfs = discover_sysfs(root)
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


def test_gpu_numa_nodes_for_a_selection(tmp_path: Path) -> None:
    gpus = discover_sysfs(build_hgx(tmp_path)).gpus
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
