"""The `topology` feature source: topolet's own labels, under `topolet.io/`.

| label                                   | value                                               |
|-----------------------------------------|-----------------------------------------------------|
| `topolet.io/cpu.sockets`                | packages                                            |
| `topolet.io/cpu.cores`                  | physical cores                                      |
| `topolet.io/cpu.threads-per-core`       | most hardware threads on one core                   |
| `topolet.io/numa.nodes`                 | NUMA nodes, memory-only ones included               |
| `topolet.io/numa.cpu-nodes`             | NUMA nodes that have CPUs                           |
| `topolet.io/cache.l3-groups`            | groups of CPUs sharing an L3 (or last-level cache)  |
| `topolet.io/cpu.kinds`                  | core kinds, only on hybrid parts (two or more)      |
| `topolet.io/cpu.kind-<kind>.count`      | CPUs of that kind, hybrid parts only                |
| `topolet.io/memory.tiers`               | tiers of memory-only nodes, sorted, joined by "-"   |
| `topolet.io/memory.tier-<tier>.nodes`   | memory-only nodes of that tier                      |

Counts that the model does not know (no packages, no cores, no NUMA nodes) are left out rather
than published as 0.  Kinds and tiers are capped at `MAX_GROUPS` each, so a node never carries
more than 6 + 2 * (1 + MAX_GROUPS) topolet labels.  A tier the model leaves blank is "unknown".
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
