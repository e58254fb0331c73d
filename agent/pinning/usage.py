"""CPUs per NUMA node by state (exclusive, shared, reserved): `topolet status` and `topolet_cpus`.

Pure: a state on a topology, read from the state file by whoever asks (the engine's `usage()`, or
`topolet status` without an engine), so a scrape's thread never takes the state lock.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from agent.enforce.state import State
from agent.topology.cpuset import CPUSet
from agent.topology.model import Topology


@dataclass(frozen=True, slots=True)
class NodeUsage:
    """CPUs per NUMA node by state, for `topolet status` and the `topolet_cpus` metric."""

    numa: int
    total: CPUSet
    reserved: CPUSet
    exclusive: CPUSet
    shared: CPUSet  # the pool (free for exclusive use, except reserved CPUs)


def usage_of(topology: Topology, allowed: CPUSet, state: State) -> list[NodeUsage]:
    """Per-NUMA CPU usage of a state on a topology (CPU-bearing nodes only)."""
    exclusive = state.allocated()
    out = []
    for node in topology.numa_nodes:
        if node.memory_only:
            continue
        total = node.cpus & allowed
        out.append(NodeUsage(node.id, total, total & state.reserved, total & exclusive,
                             total - exclusive))
    return out


def cpu_rows(usage: Iterable[NodeUsage]) -> Iterator[tuple[int, str, int]]:
    """(numa, state, count) rows of `topolet_cpus`: shared counts the pool less reserved CPUs."""
    for u in usage:
        yield u.numa, "exclusive", len(u.exclusive)
        yield u.numa, "shared", len(u.shared - u.reserved)
        yield u.numa, "reserved", len(u.reserved)
