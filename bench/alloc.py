#!/usr/bin/env python3
"""Exclusive-CPU allocation latency: `agent.alloc.allocate` vs a naive first-fit, same requests, same process.

Topologies: the two synthetic 2-socket, 384-thread machines of the design target (2 x 96 cores x 2
threads, 12 L3 groups per socket; one NUMA node per socket, and four), plus the largest hwloc dumps
read through `agent.topology.discover`.  On each, a seeded simulation of a busy node: requests of mixed
sizes, NUMA and SMT policies arrive and leave, so most requests see a partly used, fragmented free set.
Every request is timed through `allocate` and, right after, through first-fit (the lowest free CPUs,
no topology at all) as a reference for what the machine does in the same process.  Each is timed three
times and the best kept (other processes' scheduling noise is not the allocator's latency); the
single-shot p99 is printed beside it.

Prints one row per topology and ends with `allocation p99: X.XXX ms (worst topology)`.
"""

from __future__ import annotations

import argparse
import random
import re
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from agent.alloc.exclusive import allocate  # noqa: E402
from agent.alloc.index import build_index, index_of  # noqa: E402
from agent.alloc.request import Request  # noqa: E402
from agent.alloc.synthetic import synthetic_topology  # noqa: E402
from agent.errors import AllocationError  # noqa: E402
from agent.topology.cpuset import CPUSet  # noqa: E402
from agent.topology.model import Topology  # noqa: E402

DUMP_DIRS = (REPO / "tests" / "data" / "hwloc" / "dumps", Path("/work/shared/hwloc/dumps"))
SIZES = (1, 2, 2, 4, 4, 8, 8, 16, 16, 24, 32, 48, 64, 96)
REPEATS = 3
POLICIES = ("best-effort", "best-effort", "restricted", "single-numa-node", "spread")


def first_fit(free: CPUSet, request: Request) -> CPUSet:
    """The reference: the lowest free CPUs, blind to topology."""
    mask = free.mask & ~request.reserved.mask
    out = 0
    for _ in range(request.cpus):
        low = mask & -mask
        if not low:
            raise AllocationError("not enough free CPUs")
        out |= low
        mask ^= low
    return CPUSet.from_mask(out)


def workload(topo: Topology, count: int, seed: int) -> Iterator[tuple[CPUSet, Request]]:
    """(free set, request) pairs from a simulated node where allocations come and go."""
    rng = random.Random(seed)
    tpc = topo.threads_per_core
    free = topo.cpus
    held: list[CPUSet] = []
    scale = max(1, len(topo.cpus) // 384)
    for _ in range(count):
        # Release more often as the node fills, so it hovers around half to three-quarters busy.
        while held and (rng.random() < 0.35 or len(free) < len(topo.cpus) // 4):
            free = free | held.pop(rng.randrange(len(held)))
        smt = "full-cores" if rng.random() < 0.5 else "any"
        n = min(rng.choice(SIZES) * scale, len(topo.cpus))
        if smt == "full-cores":
            n = max(tpc, n - n % tpc)
        request = Request(cpus=n, numa_policy=rng.choice(POLICIES), smt=smt)
        yield free, request
        try:
            got = allocate(topo, free, request)
        except AllocationError:
            continue
        free = free - got
        held.append(got)


def percentile(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def measure(name: str, topo: Topology, count: int, seed: int) -> float:
    """Time both allocators over the workload, print the row, return our p99 in ms."""
    t0 = time.perf_counter()
    build_index(topo)
    index_ms = (time.perf_counter() - t0) * 1e3
    index_of(topo)  # warm the memo so the first request is not charged for it
    ours: list[float] = []
    single: list[float] = []
    naive: list[float] = []
    refused = 0
    for free, request in workload(topo, count, seed):
        times = []
        for _ in range(REPEATS):
            t0 = time.perf_counter()
            try:
                allocate(topo, free, request)
            except AllocationError:
                pass
            times.append((time.perf_counter() - t0) * 1e3)
        try:
            allocate(topo, free, request)
        except AllocationError:
            refused += 1
        reference = []
        for _ in range(REPEATS):
            t0 = time.perf_counter()
            try:
                first_fit(free, request)
            except AllocationError:
                pass
            reference.append((time.perf_counter() - t0) * 1e3)
        ours.append(min(times))
        single.append(times[0])
        naive.append(min(reference))
    ours.sort()
    single.sort()
    naive.sort()
    p50, p99 = percentile(ours, 0.50), percentile(ours, 0.99)
    n50, n99 = percentile(naive, 0.50), percentile(naive, 0.99)
    print(f"{name:<34} {len(topo.cpus):>5} {len(topo.numa_nodes):>4} {len(ours):>6} {refused:>6}"
          f" {p50:>8.3f} {p99:>8.3f} {percentile(single, 0.99):>8.3f} {n50:>8.3f} {n99:>8.3f}"
          f" {p99 / n99:>7.1f}x"
          f" {index_ms:>8.2f}")
    return p99


def largest_dumps(dest: Path, how_many: int) -> list[tuple[str, Topology]]:
    """The largest hwloc dumps (by the CPU count their names start with), discovered."""
    try:
        from agent.topology.discover import discover
    except ImportError as exc:
        print(f"# hwloc dumps skipped: discovery is not available ({exc})")
        return []
    folder = next((d for d in DUMP_DIRS if d.is_dir()), None)
    if folder is None:
        print("# hwloc dumps skipped: no dump folder found")
        return []

    def cpus_in_name(p: Path) -> int:
        m = re.match(r"(\d+)", p.name)
        return int(m.group(1)) if m else 0

    found: list[tuple[str, Topology]] = []
    for tarball in sorted(folder.glob("*.tar.bz2"), key=lambda p: (-cpus_in_name(p), p.name)):
        if len(found) == how_many:
            break
        name = tarball.name[: -len(".tar.bz2")]
        with tarfile.open(tarball) as tar:
            tar.extractall(dest / name, filter="tar")
        roots = [p for p in (dest / name).iterdir() if p.is_dir()]
        try:
            topo = discover(str(roots[0]))
        except Exception as exc:  # noqa: BLE001 - an unreadable dump is not a benchmark subject
            print(f"# {name} skipped: {exc}")
            continue
        found.append((name, topo))
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=2000, help="requests per topology")
    ap.add_argument("--dumps", type=int, default=3, help="how many of the largest hwloc dumps")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()

    subjects: list[tuple[str, Topology]] = [
        ("synthetic 2s x 1 NUMA, 384 threads", synthetic_topology(2, 1, 12, 8, 2)),
        ("synthetic 2s x 4 NUMA, 384 threads", synthetic_topology(2, 4, 3, 8, 2)),
    ]
    with tempfile.TemporaryDirectory(prefix="topolet-bench-") as tmp:
        subjects += [(f"hwloc {name}", topo) for name, topo in largest_dumps(Path(tmp), args.dumps)]
    print(f"{'topology':<34} {'cpus':>5} {'numa':>4} {'reqs':>6} {'refused':>6}"
          f" {'p50 ms':>8} {'p99 ms':>8} {'p99 1x':>8} {'ff p50':>8} {'ff p99':>8} {'p99/ff':>8}"
          f" {'index ms':>8}")
    worst = max(measure(name, topo, args.requests, args.seed) for name, topo in subjects)
    print("# ms per request, best of 3 runs; 'p99 1x' = single runs; ff = first-fit reference (lowest free")
    print("# CPUs, no topology) timed on the same requests; p99/ff = our p99 over first-fit's")
    print(f"allocation p99: {worst:.3f} ms (worst topology)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
