"""The memory and pci sources against NFD's meaning and naming."""

from __future__ import annotations

import pytest

from agent.labels import build_labels
from agent.labels.pci import nfd_pci_label_name
from tests.labels.machines import machine, pci

NUMA = "feature.node.kubernetes.io/memory-numa"
NV = "feature.node.kubernetes.io/memory-nv.present"
PCI = "feature.node.kubernetes.io/pci-"


@pytest.mark.parametrize(("sockets", "tiers", "numa"), [
    (1, (), False),
    (2, (), True),
    (1, ("CXL",), True),   # memory-only nodes are NUMA nodes too
])
def test_memory_numa(sockets: int, tiers: tuple[str, ...], numa: bool) -> None:
    labels = build_labels(machine(sockets=sockets, memory_only_tiers=tiers))
    assert (labels.get(NUMA) == "true") is numa
    assert labels.get(NUMA) in (None, "true")


@pytest.mark.parametrize(("tiers", "present"), [((), False), (("HBM",), False), (("NVM",), True)])
def test_memory_nv_present(tiers: tuple[str, ...], present: bool) -> None:
    assert (NV in build_labels(machine(memory_only_tiers=tiers))) is present


@pytest.mark.parametrize(("class_code", "vendor", "name"), [
    (0x030000, 0x10DE, "pci-0300_10de.present"),   # VGA controller
    (0x030200, 0x10DE, "pci-0302_10de.present"),   # 3D controller (data-centre GPUs)
    (0x038000, 0x1002, "pci-0380_1002.present"),
    (0x0B4000, 0x8086, "pci-0b40_8086.present"),   # co-processor
    (0x120000, 0x1DA3, "pci-1200_1da3.present"),   # processing accelerator
    (0x120100, 0x8086, "pci-1201_8086.present"),
    (0x030000, 0x001A, "pci-0300_001a.present"),   # vendor keeps four digits
    (0x020000, 0x15B3, None),                      # network: not in NFD's default classes
    (0x0B4100, 0x8086, None),                      # 0b41 does not start with 0b40
    (0x010802, 0x144D, None),                      # NVMe
    (0x1000000, 0x10DE, None),                     # not a 24-bit class
    (-1, 0x10DE, None),
    (0x030000, 0x10000, None),
    (0x030000, -5, None),
])
def test_pci_label_names(class_code: int, vendor: int, name: str | None) -> None:
    assert nfd_pci_label_name(class_code, vendor) == name
    labels = build_labels(machine(pci_devices=[pci(class_code, vendor)]))
    assert {k.removeprefix("feature.node.kubernetes.io/") for k in labels if k.startswith(PCI)} == (
        {name} if name else set())


def test_pci_devices_of_one_class_and_vendor_give_one_label() -> None:
    devices = [pci(0x030200, 0x10DE, f"0000:{b:02x}:00.0") for b in range(8)]
    devices.append(pci(0x030000, 0x1A03, "0000:02:00.0"))
    labels = build_labels(machine(pci_devices=devices))
    assert sorted(k for k in labels if k.startswith(PCI)) == [
        PCI + "0300_1a03.present", PCI + "0302_10de.present"]
    assert all(labels[k] == "true" for k in labels if k.startswith(PCI))
