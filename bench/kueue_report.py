"""bench/kueue.py's figures: the arms (`Arm`), one arm's run (`Run`) and the report of a whole run
(`report`), with the no-op and topology-fit pair's p99 ratio taken round by round (median over rounds).
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from dataclasses import dataclass

import kueue_kinds as kinds
from admission import percentile

# A Workload's way to Admitted, as the bench's watch sees it: quota reserved (Kueue's scheduler), our
# check's state Pending with that quota (Kueue's Workload controller adds it), Ready (us), Admitted
# (Kueue's Workload controller).  Without a check, Kueue's scheduler writes QuotaReserved and Admitted
# at once, so the later steps take no time.
STEPS = ("create->QuotaReserved", "->check Pending", "->check Ready", "->Admitted")


@dataclass(frozen=True)
class Arm:
    """One way through Kueue: `check` "" (none), "topolet" (topology-fit) or "noop"; `tas`: Kueue TAS."""

    name: str
    key: str  # its folder under --keep-logs
    check: str = ""
    tas: bool = False


WITH_CHECK = Arm("Kueue + topology-fit", "check", "topolet")
ALONE = Arm("Kueue alone", "alone")
TAS = Arm("Kueue TAS", "tas", tas=True)
NOOP = Arm("Kueue + no-op check", "noop", "noop")
# The order they run in: each once, then the no-op and topology-fit pair again for every further
# round (`--rounds`).
ARMS = (ALONE, TAS, NOOP, WITH_CHECK)
PAIR = (NOOP, WITH_CHECK)


@dataclass(frozen=True)
class Run:
    """One arm's figures."""

    arm: Arm
    gangs: int
    latencies: dict[str, float]  # seconds, per admitted gang
    steps: dict[str, tuple[float, ...]]  # seconds of each of STEPS, per admitted gang
    rejected: dict[str, str]  # gang -> the check's message
    waiting: dict[str, str]  # gang neither admitted nor rejected -> the check's latest state and message
    pods: int
    bound: int
    aligned: int
    whole: int  # gangs every pod of which is bound
    partial: int  # gangs some but not all pods of which are bound
    spread: int  # gangs wholly bound over more than one node
    wall_s: float
    cpu_s: float
    unaligned: Counter[str]  # pods pinned across zones, by kind
    round: int = 1  # which round of the no-op and topology-fit pair (the others run in round 1 only)

    @property
    def name(self) -> str:
        return self.arm.name if self.round == 1 and self.arm not in PAIR else f"{self.arm.name} #{self.round}"

    @property
    def aligned_share(self) -> float:
        return self.aligned / self.bound if self.bound else 1.0

    def p(self, q: float, among: set[str]) -> float:
        """The q-quantile of the admission latency over the gangs in `among`."""
        values = [v for k, v in self.latencies.items() if k in among]
        return percentile(values, q) if values else float("nan")


def _rows(runs: list[Run], every: set[str]) -> None:
    print(f"{'arm':<25} {'admitted':>9} {'whole':>9} {'partly':>6} {'spread':>6} {'p50 s':>6} {'p99 s':>6} "
          f"{'pods':>5} {'bound':>5} {'aligned':>7} {'wall s':>7} {'CPU s':>7}")
    for r in runs:
        print(f"{r.name:<25} {len(r.latencies):>4}/{r.gangs:<4} {r.whole:>4}/{r.gangs:<4} {r.partial:>6} "
              f"{r.spread:>6} {r.p(0.5, every):>6.2f} {r.p(0.99, every):>6.2f} {r.pods:>5} {r.bound:>5} "
              f"{r.aligned_share * 100:>6.1f}% {r.wall_s:>7.1f} {r.cpu_s:>7.1f}")
    print(f"# whole: gangs with every pod bound; partly: some pods bound, not all, at the end; spread: whole "
          f"gangs over several nodes; p50/p99 over the {len(every)} Workloads admitted in every arm; wall: "
          f"first create to last admission or bind, CPU: every process in it (2 cores)")
    print("# seconds per step, p50/p99:")
    for r in runs:
        cells = []
        for k, step in enumerate(STEPS):
            values = [r.steps[g][k] for g in every]
            p50, p99 = (percentile(values, 0.5), percentile(values, 0.99)) if values else (math.nan, math.nan)
            cells.append(f"{step} {p50:.2f}/{p99:.2f}")
        print(f"#   {r.name:<25} {', '.join(cells)}")


def _misses(runs: list[Run], stream: list[kinds.KindGang], kind_names: tuple[str, ...]) -> None:
    by_kind = Counter(g.kind for g in stream)
    for r in runs:
        missed = Counter(g.kind for g in stream if g.name not in r.latencies)
        if r.unaligned:
            print(f"# {r.name}: pods pinned across zones by kind: "
                  + ", ".join(f"{k} {r.unaligned[k]}" for k in kind_names if r.unaligned[k]))
        if missed:
            print(f"# {r.name}: not admitted by kind: "
                  + ", ".join(f"{k} {missed[k]}/{by_kind[k]}" for k in kind_names if missed[k]))
        for gang, message in sorted(r.rejected.items())[:3]:
            print(f"#   rejected {gang}: {message}")
        for gang, message in sorted(r.waiting.items())[:3]:
            print(f"#   still waiting {gang}: {message or 'no word from a check'}")


def over_noop(ours: Run, noop: Run) -> float:
    """p99 with the check / with the no-op check, over the Workloads admitted in both runs."""
    both = set(ours.latencies) & set(noop.latencies)
    return ours.p(0.99, both) / noop.p(0.99, both) if both else float("nan")


def report(runs: list[Run], stream: list[kinds.KindGang], kind_names: tuple[str, ...]) -> None:
    """The runs side by side (the topology-fit ones first), the steps, the rejections, each round's p99
    ratio and the last line: alignment over every topology-fit round, the ratio's median over rounds."""
    ours = [r for r in runs if r.arm == WITH_CHECK]
    noops = {r.round: r for r in runs if r.arm == NOOP}
    shown = ours + [r for r in runs if r.arm != WITH_CHECK]
    every = set.intersection(*(set(r.latencies) for r in runs))
    _rows(shown, every)
    _misses(shown, stream, kind_names)
    pairs = [(r, noops[r.round]) for r in ours if r.round in noops]
    ratios = [over_noop(r, noop) for r, noop in pairs]
    cells = []
    for r, noop in pairs:
        both = set(r.latencies) & set(noop.latencies)
        cells.append(f"{over_noop(r, noop):.2f} ({r.p(0.99, both):.2f} / {noop.p(0.99, both):.2f} s)")
    cpu = [f"{r.cpu_s / noop.cpu_s:.2f}" for r, noop in pairs if noop.cpu_s]
    print(f"# p99 with/no-op check by round: {', '.join(cells)}; CPU s with/no-op by round: {', '.join(cpu)}")
    median = statistics.median(ratios) if ratios else float("nan")
    aligned = sum(r.aligned for r in ours) / max(1, sum(r.bound for r in ours)) * 100
    alone = next(r for r in runs if r.arm == ALONE).aligned_share * 100
    tas = next(r for r in runs if r.arm == TAS).aligned_share * 100
    print(f"workloads: aligned {aligned:.1f}% with check vs {alone:.1f}% Kueue alone vs "
          f"{tas:.1f}% Kueue TAS; kinds {','.join(kind_names)}; p99 with/no-op check = {median:.2f}")
