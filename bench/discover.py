#!/usr/bin/env python3
"""Discovery speed: topolet's native scan in-process vs `lstopo-no-graphics` on the same root.

For the five largest hwloc dumps (by CPU count) and for `/`, prints per root the median of the
in-process `discover()` (C scan + model build), the median of `lstopo-no-graphics --input ROOT -v -`
run as a process, their ratio, and the whole-process `topolet discover` time beside lstopo's so start-up
cost stays visible.  Ends with `discover speedup vs lstopo (worst root): X.XX` (in-process scan) and
`discover whole process vs lstopo on <largest dump>: X.XX` (topolet's process time over lstopo's on
the dump with the most CPUs, the 256-PU POWER7 one; the target is at most 1.25).

`--numa-scale` instead times discovery of synthetic trees with 1,000-3,000 memory-only NUMA nodes
beside the C scan alone of the same tree, and prints how each grows from the smallest tree
(linear growth is the node ratio: 2.00, 3.00).
"""

from __future__ import annotations

import argparse
import compileall
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from agent.topology import native  # noqa: E402
from agent.topology.discover import discover  # noqa: E402

DUMPS = REPO / "tests" / "data" / "hwloc" / "dumps"


def lstopo_reads(lstopo: str, root: Path) -> bool:
    """Whether lstopo accepts the root (it refuses dumps without a proc/ folder)."""
    p = subprocess.run([lstopo, "--input", str(root), "-v", "-"], capture_output=True, check=False)
    return p.returncode == 0


def extract_all(dest: Path, lstopo: str) -> list[tuple[int, str, Path]]:
    """(online CPU count, name, root) for every dump that both discovery and lstopo read (a dump already
    unpacked under `dest` is read where it is)."""
    found = []
    for tarball in sorted(DUMPS.glob("*.tar.bz2")):
        name = tarball.name[: -len(".tar.bz2")]
        out = dest / name
        if not out.exists():
            with tarfile.open(tarball) as tar:
                tar.extractall(out, filter="tar")
        roots = [p for p in out.iterdir() if p.is_dir()]
        if len(roots) != 1:
            continue
        if not lstopo_reads(lstopo, roots[0]):
            print(f"# skipped {name}: lstopo cannot read it, so there is nothing to compare")
            continue
        try:
            found.append((len(discover(str(roots[0])).cpus), name, roots[0]))
        except Exception:  # a dump this tool cannot read is not a benchmark subject
            continue
    return found


def timed_rounds(root: str, ls_argv: list[str], topolet_argv: list[str], rounds: int,
                 scans_per_round: int) -> tuple[float, float, float]:
    """Medians of (in-process discover, lstopo process, topolet process), measured interleaved.

    Each round runs all three back to back, so load from anything else on the machine falls on
    every column alike and the ratios stay comparable even when the absolute times move.
    """
    scans: list[float] = []
    refs: list[float] = []
    procs: list[float] = []
    for _ in range(rounds):
        for _ in range(scans_per_round):
            t0 = time.perf_counter()
            discover(root)
            scans.append(time.perf_counter() - t0)
        for argv, out in ((ls_argv, refs), (topolet_argv, procs)):
            t0 = time.perf_counter()
            subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
            out.append(time.perf_counter() - t0)
    return statistics.median(scans), statistics.median(refs), statistics.median(procs)


def memory_only_tree(root: Path, memory_only: int) -> Path:
    """Two CPU nodes of 2 CPUs and `memory_only` memory-only nodes (no distance table: linear input)."""
    cpu_dir = root / "sys/devices/system/cpu"
    node_dir = root / "sys/devices/system/node"
    cpu_dir.mkdir(parents=True)
    for name in ("possible", "present", "online"):
        (cpu_dir / name).write_text("0-3\n")
    for c in range(4):
        topo = cpu_dir / f"cpu{c}" / "topology"
        topo.mkdir(parents=True)
        (topo / "physical_package_id").write_text("0\n")
        (topo / "core_id").write_text(f"{c}\n")
        (topo / "thread_siblings_list").write_text(f"{c}\n")
    for n in range(2 + memory_only):
        d = node_dir / f"node{n}"
        d.mkdir(parents=True)
        (d / "cpulist").write_text(f"{2 * n}-{2 * n + 1}\n" if n < 2 else "\n")
        (d / "meminfo").write_text(f"Node {n} MemTotal:  1048576 kB\nNode {n} MemFree:  1 kB\n")
    (root / "proc").mkdir()
    (root / "proc/meminfo").write_text("MemTotal: 1 kB\n")
    return root


def numa_scale(rounds: int) -> int:
    """Discovery vs the C scan alone on trees of growing memory-only node counts."""
    sizes = (1000, 2000, 3000)
    print(f"{'memory-only nodes':>18} {'scan ms':>9} {'discover ms':>12} {'scan growth':>12}"
          f" {'discover growth':>16}")
    base: tuple[float, float] | None = None
    with tempfile.TemporaryDirectory() as tmp:
        for n in sizes:
            root = str(memory_only_tree(Path(tmp) / str(n), n))
            scans: list[float] = []
            finds: list[float] = []
            for _ in range(rounds):
                t0 = time.perf_counter()
                native.scan(root)
                t1 = time.perf_counter()
                topo = discover(root)
                finds.append(time.perf_counter() - t1)
                scans.append(t1 - t0)
            assert len(topo.numa_nodes) == n + 2
            scan, find = statistics.median(scans), statistics.median(finds)
            base = base or (scan, find)
            print(f"{n:>18} {scan * 1e3:>9.2f} {find * 1e3:>12.2f} {scan / base[0]:>12.2f}"
                  f" {find / base[1]:>16.2f}")
    print(f"discover growth {sizes[-1]} vs {sizes[0]} memory-only nodes: {find / base[1]:.2f}"
          f" (scan alone {scan / base[0]:.2f}, linear {sizes[-1] / sizes[0]:.2f})")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=21, help="interleaved rounds per root (medians)")
    ap.add_argument("--scans-per-round", type=int, default=3, help="in-process scans per round")
    ap.add_argument("--numa-scale", action="store_true",
                    help="time discovery of trees with 1,000-3,000 memory-only NUMA nodes instead")
    ap.add_argument("--dumps", type=Path, default=None,
                    help="where to unpack the hwloc dumps (kept between runs); default: a temp folder")
    a = ap.parse_args()
    if a.numa_scale:
        return numa_scale(min(a.rounds, 5))
    lstopo = shutil.which("lstopo-no-graphics")
    if not lstopo:
        print("lstopo-no-graphics not found (apt-get install hwloc-nox)", file=sys.stderr)
        return 2
    # An installed topolet runs from compiled bytecode.  Under PYTHONDONTWRITEBYTECODE (set in the
    # dev environment) a module edited since its last compile is compiled again in every timed run.
    compileall.compile_dir(str(REPO / "agent"), quiet=1)
    topolet = str(Path(sys.executable).parent / "topolet")
    if not os.path.exists(topolet):
        topolet = shutil.which("topolet") or "topolet"
    with tempfile.TemporaryDirectory() as tmp:
        subjects = sorted(extract_all(a.dumps or Path(tmp), lstopo), reverse=True)[:5]
        roots = [(name, str(root), n) for n, name, root in subjects] + [("/", "/", len(discover("/").cpus))]
        print(f"{'root':<34} {'cpus':>5} {'scan ms':>9} {'lstopo ms':>10} {'speedup':>8}"
              f" {'topolet proc ms':>16} {'proc/lstopo':>11}")
        worst = float("inf")
        largest: tuple[str, float] | None = None  # the dump with the most CPUs comes first
        for name, root, ncpu in roots:
            ls_argv = [lstopo, "-v", "-"] if root == "/" else [lstopo, "--input", root, "-v", "-"]
            topolet_argv = [topolet, "discover", "--fsroot", root, "--format", "json"]
            scan, ref, proc = timed_rounds(root, ls_argv, topolet_argv, a.rounds, a.scans_per_round)
            speedup = ref / scan
            worst = min(worst, speedup)
            largest = largest or (name, proc / ref)
            print(f"{name:<34} {ncpu:>5} {scan * 1e3:>9.2f} {ref * 1e3:>10.2f} {speedup:>8.2f}"
                  f" {proc * 1e3:>16.2f} {proc / ref:>11.2f}")
    print(f"discover speedup vs lstopo (worst root): {worst:.2f}")
    if largest:
        print(f"discover whole process vs lstopo on {largest[0]}: {largest[1]:.2f} (target at most 1.25)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
