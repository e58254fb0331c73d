"""The `topology` feature source: topolet's own labels, under `topolet.io/`.

Sockets, cores, threads per core, NUMA nodes, L3 groups, and on hybrid parts or tiered memory the
kinds and tiers (each capped at `MAX_GROUPS`).  A count the model does not know is left out, never
published as 0.  The label table: agent/labels/README.md.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from agent.api.validate import normalize_label_text
from agent.labels.registry import TOPOLET_NAMESPACE, RawFeature, feature_source
from agent.topology.model import Topology

MAX_GROUPS = 8
TIER_SEPARATOR = "-"


def _tier_name(tier: str) -> str:
    # The separator may not appear inside a tier name, so the joined list reads back unambiguously.
    name = normalize_label_text(tier).replace(TIER_SEPARATOR, "_")
    return name or "unknown"


def _kind_name(name: str, rank: int) -> str:
    return normalize_label_text(name) or f"rank{rank}"


@feature_source("topology")
def topology_features(topology: Topology) -> Iterator[RawFeature]:
    """Socket, core, thread, NUMA, L3, hybrid-kind and memory-tier counts."""
    ns = TOPOLET_NAMESPACE
    if topology.packages:
        yield RawFeature(ns, "cpu.sockets", len(topology.packages))
    if topology.cores:
        yield RawFeature(ns, "cpu.cores", len(topology.cores))
        yield RawFeature(ns, "cpu.threads-per-core", topology.threads_per_core)
    if topology.numa_nodes:
        yield RawFeature(ns, "numa.nodes", len(topology.numa_nodes))
        yield RawFeature(ns, "numa.cpu-nodes", sum(1 for n in topology.numa_nodes if n.cpus))
    if topology.l3_groups:
        yield RawFeature(ns, "cache.l3-groups", len(topology.l3_groups))

    if len(topology.kinds) > 1:
        yield RawFeature(ns, "cpu.kinds", len(topology.kinds))
        ranked = sorted(topology.kinds, key=lambda k: (k.rank, k.name))[:MAX_GROUPS]
        for kind in ranked:
            yield RawFeature(ns, f"cpu.kind-{_kind_name(kind.name, kind.rank)}.count", len(kind.cpus))

    tiers = Counter(_tier_name(n.tier) for n in topology.numa_nodes if n.memory_only)
    if tiers:
        names = sorted(tiers)[:MAX_GROUPS]
        yield RawFeature(ns, "memory.tiers", TIER_SEPARATOR.join(names))
        for name in names:
            yield RawFeature(ns, f"memory.tier-{name}.nodes", tiers[name])
