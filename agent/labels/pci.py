"""The `pci` feature source: NFD's `pci-<class>_<vendor>.present` for its default device classes.

NFD (source/pci/utils.go, pci.go) reads a device's class as the first four hex digits of the
24-bit class code (class and subclass, programming interface dropped), labels a device when that
string starts with one of `deviceClassWhitelist` (default "03" display, "0b40" co-processor,
"12" processing accelerator), and names it by `deviceLabelFields` (default class, vendor): e.g.
`pci-0302_10de.present`.  Hex is lower-case, as sysfs writes it, and the vendor has four digits.
"""

from __future__ import annotations

from collections.abc import Iterator

from agent.labels.registry import NFD_NAMESPACE, RawFeature, feature_source
from agent.topology.model import Topology

NFD_PCI_CLASS_WHITELIST: tuple[str, ...] = ("03", "0b40", "12")


def nfd_pci_label_name(class_code: int, vendor: int) -> str | None:
    """NFD's device label name for one function, or None when NFD would not label it."""
    if not (0 <= class_code <= 0xFFFFFF and 0 <= vendor <= 0xFFFF):
        return None
    device_class = f"{class_code >> 8:04x}"
    if not device_class.startswith(NFD_PCI_CLASS_WHITELIST):
        return None
    return f"pci-{device_class}_{vendor:04x}.present"


@feature_source("pci")
def pci_features(topology: Topology) -> Iterator[RawFeature]:
    """One feature per distinct (class, vendor) among the whitelisted classes, sorted."""
    names = {nfd_pci_label_name(d.class_code, d.vendor) for d in topology.pci_devices}
    for name in sorted(n for n in names if n is not None):
        yield RawFeature(NFD_NAMESPACE, name, True)
