"""Discovery of a synthetic tree with hundreds of memory-only NUMA nodes (CXL/HBM-style), end to end.

The timing of the same shape at 1,000-3,000 nodes is `bench/discover.py --numa-scale`; here the answer
is checked: every node kept, distance rows re-aligned after a dropped node, each local CPU set right.
"""

from __future__ import annotations

from pathlib import Path

from agent.topology.cpuset import CPUSet
from agent.topology.discover import discover
from tests.native.test_scan_malformed import NODE, make_tree, write

MEMORY_ONLY = 800
FIRST = 3  # nodes 0 and 1 carry CPUs 0-1 and 2-3; node 2 repeats node 1's CPUs (dropped)


def distance(i: int, j: int) -> int:
    """Memory-only node i is 15 from node 0 (i % 3 == 0), node 1 (i % 3 == 1) or both (tie)."""
    if i == j:
        return 10
    if i < FIRST and j < FIRST:
        return 20
    lo, hi = (i, j) if i < j else (j, i)
    if lo >= FIRST:
        return 30
    near = {0: (0,), 1: (1, 2), 2: (0, 1, 2)}[hi % 3]
    return 15 if lo in near else 25


def build(root: Path) -> Path:
    make_tree(root, cpus=4, nodes=2)
    total = FIRST + MEMORY_ONLY
    for i in range(total):
        d = f"{NODE}/node{i}"
        if i == 2:
            write(root, f"{d}/cpulist", "2-3\n")
        if i >= 2:
            write(root, f"{d}/meminfo", f"Node {i} MemTotal:  {i} kB\nNode {i} MemFree:  1 kB\n")
        write(root, f"{d}/distance", " ".join(str(distance(i, j)) for j in range(total)) + "\n")
    write(root, f"{NODE}/online", f"0-{total - 1}\n")
    return root


def test_hundreds_of_memory_only_nodes(tmp_path: Path) -> None:
    topo = discover(str(build(tmp_path)))
    kept = [0, 1, *range(FIRST, FIRST + MEMORY_ONLY)]
    assert topo.numa_ids == tuple(kept)
    assert any(w.startswith("NUMA node 2 repeats the CPUs of node 1") for w in topo.warnings)
    expected_local = {0: CPUSet([0, 1]), 1: CPUSet([2, 3]), 2: CPUSet()}
    for n in topo.numa_nodes:
        assert n.distances == tuple(distance(n.id, j) for j in kept), n.id
        if n.id < FIRST:
            assert not n.memory_only
            continue
        assert n.memory_only and n.memory_bytes == n.id << 10
        assert n.local_cpus == expected_local[n.id % 3], n.id
    assert topo.distance(FIRST, 0) == 15 and topo.distance(FIRST + 1, 0) == 25
