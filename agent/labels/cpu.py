"""The `cpu` feature source: NFD's `cpu-cpuid.*`, `cpu-hardware_multithreading` and `cpu-model.*`."""

from __future__ import annotations

from collections.abc import Iterator

from agent.labels.cpuid_names import (
    ARM_CPUINFO_TO_NFD,
    ARM_IMPLEMENTERS,
    KNOWN_VENDOR_NAMES,
    NFD_CPUID_BLACKLIST,
    VENDOR_UNKNOWN,
    X86_CPUINFO_TO_NFD,
    X86_VENDORS,
)
from agent.labels.registry import NFD_NAMESPACE, RawFeature, feature_source
from agent.topology.model import CPUInfo, Topology

_X86_ARCHES = frozenset({"x86", "x86_64", "amd64", "i386", "i486", "i586", "i686", "x86-64"})
_ARM_ARCHES = frozenset({"arm", "arm64", "aarch64"})
_X86_VENDOR_BY_STRIPPED = {k.strip(): v for k, v in X86_VENDORS.items()}
_VENDOR_BY_LOWER = {name.lower(): name for name in KNOWN_VENDOR_NAMES}


def nfd_vendor(vendor: str) -> str:
    """NFD's `cpu-model.vendor_id` for a /proc/cpuinfo vendor string or arm implementer code."""
    text = vendor.strip()
    if text in _X86_VENDOR_BY_STRIPPED:
        return _X86_VENDOR_BY_STRIPPED[text]
    if text.lower().startswith("0x"):
        try:
            return ARM_IMPLEMENTERS.get(int(text, 16), VENDOR_UNKNOWN)
        except ValueError:
            return VENDOR_UNKNOWN
    return _VENDOR_BY_LOWER.get(text.lower(), VENDOR_UNKNOWN)


def _flag_table(info: CPUInfo) -> dict[str, str]:
    arch = info.arch.strip().lower()
    if not arch and info.vendor.strip() in _X86_VENDOR_BY_STRIPPED:
        arch = "x86"  # no architecture given, but only x86 parts carry these vendor strings
    if arch in _X86_ARCHES:
        return X86_CPUINFO_TO_NFD
    if arch in _ARM_ARCHES or arch.startswith("armv"):
        return ARM_CPUINFO_TO_NFD
    return {}


def nfd_cpuid_names(info: CPUInfo) -> list[str]:
    """NFD's names for the CPU's flags that NFD labels by default, sorted."""
    table = _flag_table(info)
    names = {table[f.lower()] for f in info.flags if isinstance(f, str) and f.lower() in table}
    return sorted(names - NFD_CPUID_BLACKLIST)


@feature_source("cpu")
def cpu_features(topology: Topology) -> Iterator[RawFeature]:
    """cpuid flags, SMT, and the CPU model, named the way NFD's cpu source names them."""
    info = topology.cpu_info
    for name in nfd_cpuid_names(info):
        yield RawFeature(NFD_NAMESPACE, f"cpu-cpuid.{name}", True)
    if topology.cores:
        yield RawFeature(NFD_NAMESPACE, "cpu-hardware_multithreading", topology.threads_per_core > 1)
    yield RawFeature(NFD_NAMESPACE, "cpu-model.vendor_id", nfd_vendor(info.vendor))
    if info.family >= 0:
        yield RawFeature(NFD_NAMESPACE, "cpu-model.family", info.family)
    if info.model >= 0:
        yield RawFeature(NFD_NAMESPACE, "cpu-model.id", info.model)
    # NFD reports the hypervisor's vendor ("kvm", "vmware", ...) or "none"; the model only says
    # whether there is one, so only the bare-metal answer can be given faithfully.
    if not info.hypervisor:
        yield RawFeature(NFD_NAMESPACE, "cpu-model.hypervisor", "none")
