"""Whatever the topology says, `build_labels` yields only valid labels and no source fails."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from agent.api.validate import is_label_key, is_label_value
from agent.labels import build_label_set
from agent.topology.cpuset import CPUSet
from agent.topology.model import (
    Cache,
    Core,
    CPUInfo,
    CPUKind,
    NumaNode,
    Package,
    PCIDevice,
    Topology,
)
from tests.conftest import examples

_text = st.text(max_size=70)
_int = st.integers(min_value=-(2**40), max_value=2**40)
_cpus = st.builds(CPUSet, st.lists(st.integers(0, 63), max_size=8))
_flags = st.frozensets(st.one_of(_text, st.sampled_from(["avx2", "aes", "asimd", "sse4_2", "ht"])),
                       max_size=12)
_arch = st.one_of(_text, st.sampled_from(["x86", "arm", "power", "s390", ""]))

_info = st.builds(CPUInfo, vendor=_text, family=_int, model=_int, model_name=_text, flags=_flags,
                  hypervisor=st.booleans(), arch=_arch)
_node = st.builds(NumaNode, id=_int, cpus=_cpus, memory_bytes=_int, memory_free_bytes=_int,
                  hugepages=st.just(()), distances=st.lists(_int, max_size=4).map(tuple),
                  memory_only=st.booleans(), local_cpus=_cpus,
                  tier=st.one_of(_text, st.sampled_from(["DRAM", "HBM", "NVM", "CXL", "GPU", ""])))
_kind = st.builds(CPUKind, name=_text, rank=_int, cpus=_cpus)
_pci = st.builds(PCIDevice, address=_text, class_code=_int, vendor=_int, device=_int,
                 numa_node=_int, local_cpus=_cpus)
_topology = st.builds(
    Topology,
    cpus=_cpus, offline=_cpus,
    packages=st.lists(st.builds(Package, id=_int, cpus=_cpus), max_size=4).map(tuple),
    cores=st.lists(st.builds(Core, package_id=_int, core_id=_int, cpus=_cpus), max_size=6).map(tuple),
    caches=st.lists(st.builds(Cache, level=st.integers(-1, 4), type=_text, size_bytes=_int,
                              line_bytes=_int, cpus=_cpus), max_size=4).map(tuple),
    numa_nodes=st.lists(_node, max_size=5).map(tuple),
    kinds=st.lists(_kind, max_size=4).map(tuple),
    pci_devices=st.lists(_pci, max_size=6).map(tuple),
    cpu_info=_info,
)


@settings(max_examples=examples(200), deadline=None)
@given(_topology, st.booleans())
def test_any_topology_gives_valid_labels(topology: Topology, gfd: bool) -> None:
    result = build_label_set(topology, gfd_compat=gfd)
    assert result.failed_sources == ()
    for key, value in result.labels.items():
        assert is_label_key(key), key
        assert is_label_value(value), (key, value)
        assert key.split("/")[0] in ("feature.node.kubernetes.io", "topolet.io")
