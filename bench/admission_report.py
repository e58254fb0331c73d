"""The admission API bench's figures (bench/admission_api.py): CPU seconds and peak RSS by component,
one `ApiRun` per placer and round, the table of them, the medians by placer, and the last line."""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from admission_peer import LABEL as PEER
from procstat import peak_rss_mib as process_peak_mib

CONTROLLER = "topolet controller"
PLAIN = "kube-scheduler only"
# No bind for this long after every Job exists: the rest wait (not admitted, or unschedulable). Longer
# than the controller's default resync (30 s), so a slow pass is not taken for a stall.
STALL_S = 120.0


def _components(labels: Mapping[str, str]) -> list[tuple[str, psutil.Process]]:
    """This process and each cluster component it started, named (`labels`: binary path -> name, for
    binaries named alike, as the peer's kube-scheduler)."""
    me = psutil.Process()
    out = []
    for proc in [me, *me.children(recursive=True)]:
        try:
            argv = proc.cmdline()
            name = labels.get(argv[0], Path(argv[0]).name) if argv else proc.name()
        except psutil.Error:
            continue
        if proc.pid == me.pid:
            name = "bench (this process)"
        elif "controller" in argv[1:3]:
            name = CONTROLLER
        out.append((name, proc))
    return out


def cpu_by_component(labels: Mapping[str, str]) -> dict[str, float]:
    """CPU seconds (user + system) so far by component: where the wall time of a run goes on a
    machine with few cores."""
    out: dict[str, float] = defaultdict(float)
    for name, proc in _components(labels):
        try:
            times = proc.cpu_times()
        except psutil.Error:
            continue
        out[name] += times.user + times.system
    return out


def peak_rss_mib(labels: Mapping[str, str]) -> dict[str, float]:
    """The peak resident set (VmHWM) so far by component, MiB (the largest process of a name)."""
    out: dict[str, float] = {}
    for name, proc in _components(labels):
        peak = process_peak_mib(proc.pid)
        if peak:  # 0: the process is gone
            out[name] = max(out.get(name, 0.0), peak)
    return out


@dataclass(frozen=True)
class ApiRun:
    """One placer's run through the API."""

    name: str
    pods: int  # gang pods asked for
    bound: int
    wall_s: float  # first Job created → last pod bound
    aligned: int  # bound pods their node can pin in one zone
    one_node: int = 0  # bound pods whose whole gang is on one node
    cpu_s: float = 0.0  # CPU seconds of every component and this process while binding
    gangs: int = 0
    whole: int = 0  # gangs every pod of which is bound
    partial: int = 0  # gangs with some pods bound and some not, at the end
    cpu: dict[str, float] = field(default_factory=dict)  # cpu_s by component
    rss_mib: dict[str, float] = field(default_factory=dict)  # peak RSS by component at the end
    requests: dict[tuple[str, str], int] = field(default_factory=dict)  # API requests by (verb, resource)

    @property
    def aligned_share(self) -> float:
        return self.aligned / self.bound if self.bound else 1.0


def timing_line(name: str, created_s: float, last_pod_s: float, wall_s: float) -> str:
    """A run's first line once binding ends (bench/admission_combine.py reads it back, so the wall to the
    millisecond: a small run binds within a tenth of a second)."""
    return (f"# {name}: Jobs created after {created_s:.1f} s, the last pod after {last_pod_s:.1f} s, "
            f"the last bind after {wall_s:.3f} s")


def usage_line(name: str, cpu: Mapping[str, float], rss: Mapping[str, float]) -> str:
    """CPU seconds while binding and peak RSS, by component (read back by bench/admission_combine.py)."""
    return (f"# {name}: CPU seconds while binding: "
            + ", ".join(f"{k} {v:.1f}" for k, v in sorted(cpu.items(), key=lambda kv: -kv[1]))
            + "; peak RSS MiB: " + ", ".join(f"{k} {v:.0f}" for k, v in sorted(rss.items())))


def counts_line(run: ApiRun) -> str:
    """A run's last line: pods bound, aligned and in a gang on one node, gangs whole and partly bound
    (read back likewise)."""
    return (f"# {run.name}: {run.bound}/{run.pods} pods bound, {run.aligned} aligned, {run.one_node} in a "
            f"gang on one node; gangs {run.whole}/{run.gangs} wholly bound, {run.partial} partly")


def ratios(runs: Mapping[str, list[ApiRun]], top: str, bottom: str, attr: str) -> list[float]:
    """top / bottom of `attr`, round by round, over the rounds both ran."""
    return [getattr(o, attr) / getattr(p, attr) if getattr(p, attr) else float("nan")
            for o, p in zip(runs[top], runs[bottom], strict=False)]


def print_table(runs: Mapping[str, list[ApiRun]], rounds: int) -> None:
    """Every run, round by round (a placer with fewer runs, as a peer scope run in fewer rounds by
    bench/admission_combine.py, is left out of the rounds it missed), then the medians."""
    print(f"{'placer':<26} {'round':>5} {'pods':>6} {'bound':>6} {'wall s':>7} {'aligned':>8} "
          f"{'one node':>9} {'gangs whole':>11} {'partly':>6} {'CPU s':>7}  peak RSS MiB")
    for r in range(rounds):
        for name, mine in runs.items():
            if r >= len(mine):
                continue
            run = mine[r]
            share = run.one_node / run.bound * 100 if run.bound else 0.0
            rss = ", ".join(f"{k} {v:.0f}" for k, v in sorted(run.rss_mib.items())
                            if k in (CONTROLLER, PEER))
            print(f"{name:<26} {r + 1:>5} {run.pods:>6} {run.bound:>6} {run.wall_s:>7.1f} "
                  f"{run.aligned_share * 100:>7.1f}% {share:>8.1f}% {run.whole:>5}/{run.gangs:<5} "
                  f"{run.partial:>6} {run.cpu_s:>7.1f}  {rss or '-'}")
    for name, mine in runs.items():  # the median CPU seconds of each component over the rounds
        parts = {k for run in mine for k in run.cpu}
        med = {k: statistics.median(run.cpu.get(k, 0.0) for run in mine) for k in parts}
        by = ", ".join(f"{k} {v:.1f}" for k, v in sorted(med.items(), key=lambda kv: -kv[1]))
        print(f"# {name}: median wall {statistics.median(r.wall_s for r in mine):.1f} s; "
              f"median CPU s by component: {by}")
    for other in (n for n in runs if n != CONTROLLER):
        wall = ratios(runs, CONTROLLER, other, "wall_s")
        cpu = ratios(runs, CONTROLLER, other, "cpu_s")
        print(f"# controller / {other}: wall ratio by round " + ", ".join(f"{w:.2f}" for w in wall)
              + f" (median {statistics.median(wall):.2f}); CPU-seconds ratio by round "
              + ", ".join(f"{c:.2f}" for c in cpu) + f" (median {statistics.median(cpu):.2f})")


def aligned_share(mine: list[ApiRun]) -> float:
    """The share of bound pods aligned over `mine`, 0-1 (1 when none bound)."""
    bound = sum(r.bound for r in mine)
    return sum(r.aligned for r in mine) / bound if bound else 1.0


def last_line(runs: Mapping[str, list[ApiRun]]) -> str:
    """The bench's required last line: alignment over all rounds and the medians of the rounds' wall
    ratios, against the plain scheduler and the first peer run (after a warning line when a round's
    runs bound different counts or left a gang partly bound)."""
    ours = runs[CONTROLLER]
    peer = next((n for n in runs if n not in (CONTROLLER, PLAIN)), None)
    for r, o in enumerate(ours):
        for name, mine in runs.items():
            if r >= len(mine):
                continue
            if mine[r].bound != o.bound:
                print(f"# WARNING: round {r + 1}: {name} bound {mine[r].bound} pods, the controller "
                      f"{o.bound} ({STALL_S:.0f} s without a bind ended a run): the wall ratio compares "
                      "unequal work")
            if mine[r].partial:
                print(f"# WARNING: round {r + 1}: {name} left {mine[r].partial} gangs partly bound")
    line = (f"admission: {ours[0].bound} pods aligned {aligned_share(ours) * 100:.1f}% vs scheduler-only "
            f"{aligned_share(runs[PLAIN]) * 100:.1f}%")
    if peer is not None:
        line += f" vs NRT-plugin {aligned_share(runs[peer]) * 100:.1f}%"
    plain = statistics.median(ratios(runs, CONTROLLER, PLAIN, "wall_s"))
    line += f"; wall with controller / scheduler-only = {plain:.2f}"
    if peer is not None:
        line += f", / NRT-plugin = {statistics.median(ratios(runs, CONTROLLER, peer, 'wall_s')):.2f}"
    return line
