#!/usr/bin/env python3
"""Request → affinity-applied latency of exclusive pinning on this machine, two ways, side by side.

* in-process: `PinningEngine.allocate` + `join` (this process into the allocation's cgroup) +
  `set_affinity`, timed together; then `release` (not timed).  This is the engine's own cost: state
  lock, state commit (fsync), cgroup writes.
* whole-process: `topolet exec --cpus 1 -- date +%s%N`, from just before the launcher is started to
  the timestamp the command prints (when it runs, pinned): interpreter start, imports, discovery,
  the same engine work, and the command's own exec.  The launcher's own figure (run_exec start →
  affinity applied, from its event journal) is printed beside it.

References from the same run: a bare `os.sched_setaffinity` (what the kernel alone costs), `date`
started the same way without topolet, and `python -c pass` (an interpreter start, the floor under
any Python launcher).  Needs root and a writable cpuset hierarchy; works in a private cgroup
(`topolet-bench-<pid>`) and a temporary state folder, both removed at the end.

Ends with `pin latency p99: X ms`, the in-process figure.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from agent.alloc.request import Request  # noqa: E402
from agent.enforce.cgroup import (  # noqa: E402
    CgroupLayout,
    create_cgroup,
    detect_layout,
    list_children,
    move_pid,
    read_cpuset,
    read_procs,
)
from agent.enforce.state import Owner  # noqa: E402
from agent.enforce.state_file import StateFile  # noqa: E402
from agent.errors import TopoletError  # noqa: E402
from agent.pinning.engine import PinningEngine  # noqa: E402
from agent.standalone.journal import JOURNAL_NAME  # noqa: E402
from agent.topology.cpuset import CPUSet  # noqa: E402
from agent.topology.discover import discover  # noqa: E402
from agent.topology.native import set_affinity  # noqa: E402


def percentile(samples: list[float], q: float) -> float:
    """The nearest-rank percentile `q` (0-100) of `samples`."""
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def timed(n: int, once: Callable[[], float]) -> list[float]:
    """`n` samples (seconds) of `once`, which returns the latency it measured."""
    return [once() for _ in range(n)]


def in_process(engine: PinningEngine, n: int) -> list[float]:
    """allocate + join + set_affinity of this process, then release (untimed)."""
    me = os.getpid()
    owner = Owner.of_process(me)
    everything = engine.allowed
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        alloc = engine.allocate(f"bench-{me}-{i}", Request(1), owner)
        engine.join(alloc, me)
        set_affinity(0, alloc.cpus)
        out.append(time.perf_counter() - t0)
        engine.release(alloc.id, leaving_pid=me)
        set_affinity(0, everything)
    return out


def bare_setaffinity(cpus: CPUSet, n: int) -> list[float]:
    """`os.sched_setaffinity` to one CPU and back (the pin timed, the unpin not)."""
    one, every = {min(cpus)}, set(cpus)
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        os.sched_setaffinity(0, one)
        out.append(time.perf_counter() - t0)
        os.sched_setaffinity(0, every)
    return out


def until_runs(argv: list[str], env: dict[str, str]) -> float:
    """Seconds from starting `argv` (which ends by running `date +%s%N`) to the stamp it prints."""
    t0 = time.time_ns()
    result = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:3])}... failed ({result.returncode}): {result.stderr.strip()}")
    return (int(result.stdout.split()[-1]) - t0) / 1e9


def whole_run(argv: list[str]) -> float:
    """Seconds from start to exit of `argv`."""
    t0 = time.perf_counter()
    subprocess.run(argv, check=True)
    return time.perf_counter() - t0


def topolet_bin() -> str:
    exe = Path(sys.executable).parent / "topolet"
    return str(exe) if exe.exists() else "topolet"


def private_root() -> tuple[CgroupLayout, str]:
    """A private cpuset cgroup with every CPU and memory node: (the system layout, its name)."""
    if os.geteuid() != 0:
        raise SystemExit("bench/pin.py: needs root (it writes cgroups)")
    try:
        system = detect_layout()
    except TopoletError as exc:
        raise SystemExit(f"bench/pin.py: {exc}") from exc
    cpus, mems = read_cpuset(system, "", effective=True)
    name = f"topolet-bench-{os.getpid()}"
    create_cgroup(system, name, cpus=cpus, mems=mems)
    return system, name


def remove_tree(layout: CgroupLayout, rel: str) -> None:
    for child in list_children(layout, rel):
        remove_tree(layout, child)
    for pid in read_procs(layout, rel):
        move_pid(layout, "", pid)  # only this process ever stays behind
    for _ in range(100):
        try:
            os.rmdir(layout.abspath(rel))
            return
        except OSError:
            time.sleep(0.01)


def row(name: str, samples: list[float], ref: list[float] | None = None) -> str:
    p50, p99 = percentile(samples, 50) * 1e3, percentile(samples, 99) * 1e3
    ratio = ""
    if ref:
        r50, r99 = p50 / (percentile(ref, 50) * 1e3), p99 / (percentile(ref, 99) * 1e3)
        ratio = f"  {r50:8.1f}x p50 {r99:8.1f}x p99"
    return f"{name:<44} {p50:10.3f} {p99:10.3f}{ratio}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=200, help="allocations per measurement (default 200)")
    args = ap.parse_args()
    system, name = private_root()
    root = system.abspath(name)
    try:
        with tempfile.TemporaryDirectory(prefix="topolet-bench-") as state_dir:
            topo = discover("/")
            engine = PinningEngine(topo, detect_layout(root), StateFile(state_dir))
            if len(engine.allowed) < 2:
                raise SystemExit("bench/pin.py: needs at least 2 CPUs (one stays shared)")
            env = {**os.environ, "PYTHONPATH": str(REPO)}
            date = ["date", "+%s%N"]
            exec_argv = [topolet_bin(), "exec", "--cpus", "1", "--state-dir", state_dir,
                         "--cgroup-root", root, "--", *date]
            inproc = in_process(engine, args.n)
            setaff = bare_setaffinity(engine.allowed, args.n)
            whole = timed(args.n, lambda: until_runs(exec_argv, env))
            with open(os.path.join(state_dir, JOURNAL_NAME)) as f:
                launcher = [float(json.loads(line)["latency_seconds"]) for line in f
                            if json.loads(line).get("result") == "success"]
            bare_date = timed(args.n, lambda: until_runs(date, env))
            py = timed(args.n, lambda: whole_run([sys.executable, "-c", "pass"]))
            left = [a.id for a in engine.state_file.load().allocations]
            left += [c for c in list_children(engine.layout, engine.layout.parent)
                     if c != engine.layout.shared_path]
            if left:
                raise SystemExit(f"bench/pin.py: left behind: {left}")
    finally:
        remove_tree(system, name)

    print(f"pin latency on {len(engine.allowed)} CPUs, {args.n} allocations each"
          f" (cgroup v{system.version}, {os.uname().release})")
    print(f"{'':<44} {'p50 ms':>10} {'p99 ms':>10}  ratio to the reference below it")
    print(row("in-process allocate+join+set_affinity", inproc, setaff))
    print(row("  reference: bare os.sched_setaffinity", setaff))
    print(row("topolet exec --cpus 1 -- date: until it runs", whole, bare_date))
    print(row("  reference: date started bare: until it runs", bare_date))
    print(row("  launcher's own run_exec → affinity applied", launcher))
    print(row("  reference: python -c pass, start to exit", py))
    print(f"topolet exec until the command runs is {percentile(whole, 50) / percentile(py, 50):.1f}x"
          " a bare interpreter start (p50)")
    print("the line below is the in-process figure (allocate + join + set_affinity)")
    print(f"pin latency p99: {percentile(inproc, 99) * 1e3:.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
