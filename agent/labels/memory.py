"""The `memory` feature source: NFD's `memory-numa` and `memory-nv.present`."""

from __future__ import annotations

from collections.abc import Iterator

from agent.labels.registry import NFD_NAMESPACE, RawFeature, feature_source
from agent.topology.model import Topology


@feature_source("memory")
def memory_features(topology: Topology) -> Iterator[RawFeature]:
    """NUMA and persistent memory presence, with NFD's meaning.

    `memory-numa`: more than one NUMA node, memory-only nodes included (NFD counts the node
    folders the kernel shows).  `memory-nv.present`: NFD checks for any NVDIMM on the nd bus; the
    model only sees NVDIMMs onlined as a NUMA node of tier "NVM", so this can miss NVDIMMs used
    only as block devices (fsdax/sector mode) but never claims one that is absent.
    """
    if len(topology.numa_nodes) > 1:
        yield RawFeature(NFD_NAMESPACE, "memory-numa", True)
    if any(n.tier == "NVM" for n in topology.numa_nodes):
        yield RawFeature(NFD_NAMESPACE, "memory-nv.present", True)
