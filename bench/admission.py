#!/usr/bin/env python3
"""Admission decisions: the placement engine against a plain best-fit placer, same gangs, same process.

In process (`in_process`): 5,000 nodes of up to 8 NUMA zones (hwloc dumps, partly filled; see
`bench/admission_workload.py`) and 15,000 gangs of 2/4/8 single-numa-node pods in Kueue's `tas`
mix.  The view is built once from the API dicts (`build_view`), then every gang is decided with
`agent.admission.engine.place.place` and, when placed, counted with `commit` (as one controller pass
would).  The reference runs the same gangs on the same nodes: a plain best-fit placer on node totals
(the tightest node whose free CPUs hold each pod, as a scheduler's MostAllocated scoring would),
all or nothing per gang.  It knows no zones, so beside its admitted count is the share of its pods
that some zone of their node could still hold when placed (pods the kubelet would refuse with
TopologyAffinityError otherwise).

The engine's decisions are each timed three times (`place` is pure) and the quickest kept, as
bench/alloc.py does: this machine is shared, and other processes' scheduling is not the engine's
latency; decisions/s is the decisions over the sum of those times (commits included).
Prints per placer: gangs admitted, decisions per second, p50/p99 decision latency, and the share of
placed pods a zone could hold, counted apart from the placer on the starting zone figures (for the
engine: its stated zone; tests/admission/test_replay.py checks the same against the agent's own
allocator on real machines).  The in-process part ends with
`admission engine: N decisions/s, p99 X.XX ms (5000 nodes, 15000 gangs), peak RSS G MiB` (the view
is built a part of the cluster at a time, `PART` nodes, so the peak is the engine's and not the
bench's API dicts').

Through the API (`bench/admission_api.py`, on fresh test clusters: real kube-apiserver,
kube-controller-manager, kube-scheduler): 1,000 nodes and 3,000 gangs as Indexed Jobs, the wall time
until every pod is bound with `topolet controller`, with the plain kube-scheduler and with the NRT
plugin peer (kube-scheduler + scheduler-plugins' NodeResourceTopologyMatch and Coscheduling,
`bench/admission_peer.py`), the share of bound pods their node can pin in one zone, and the gangs
wholly and partly bound.  The last line of the whole bench: `admission: N pods aligned 100.0% vs
scheduler-only X.X% vs NRT-plugin Y.Y%; wall with controller / scheduler-only = R.RR, / NRT-plugin = S.SS`.
The peer runs once per NRT topologyManagerScope (`--api-scopes`, both by default), each run many times
the others' wall: the default API part took 2 h 39 min on 2 cores (bench/admission_combine.py puts
rounds run in several sittings back together).
Quick run: `--nodes 500 --gangs 1500 --api-nodes 50 --api-gangs 150`; `--api-nodes 0` skips the API part.
"""

from __future__ import annotations

import argparse
import bisect
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import admission_workload as workload  # noqa: E402
from admission_peer import SCOPES, scope_list  # noqa: E402
from procstat import peak_rss_mib  # noqa: E402

from agent.admission.cluster.ledger import Ledger  # noqa: E402
from agent.admission.cluster.view import build_view  # noqa: E402
from agent.admission.engine.model import ClusterView, Gang, Placement  # noqa: E402
from agent.admission.engine.place import commit, place  # noqa: E402
from agent.topology.model import Topology  # noqa: E402


@dataclass(frozen=True)
class Figures:
    """One placer's run over the gang stream."""

    name: str
    admitted: int
    decisions: int
    seconds: float
    p50_ms: float
    p99_ms: float
    aligned: float  # share of placed pods some zone of their node could hold, 0-1
    first_p99_ms: float = 0.0  # p99 of each decision's first (single-shot) timing

    @property
    def rate(self) -> float:
        return self.decisions / self.seconds if self.seconds else 0.0


REPEATS = 3
PART = 5000  # nodes whose API dicts are made and read into the view at a time


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run_engine(view: ClusterView, gangs: list[Gang]) -> Figures:
    """Every gang through `place` (and `commit` when placed), timed one decision at a time."""
    first = view
    latencies: list[float] = []
    admitted = 0
    clock = time.perf_counter
    results: list[tuple[Gang, Placement]] = []
    single: list[float] = []
    for gang in gangs:
        times = []
        for _ in range(REPEATS):  # `place` is pure: the same decision again, the quickest kept
            t0 = clock()
            result = place(view, gang)
            times.append(clock() - t0)
        t0 = clock()
        if isinstance(result, Placement):
            view = commit(view, gang, result)
            admitted += 1
            results.append((gang, result))
        committed = clock() - t0
        latencies.append(min(times) + committed)
        single.append(times[0] + committed)
    return Figures("topolet engine", admitted, len(gangs), sum(latencies), percentile(latencies, 0.5) * 1e3,
                   percentile(latencies, 0.99) * 1e3, _aligned(first, results),
                   percentile(single, 0.99) * 1e3)


def _aligned(view: ClusterView, results: list[tuple[Gang, Placement]]) -> float:
    """Share of placed pods whose stated zone still had room for them, counted apart from the engine."""
    zones = {(n.name, z.numa): z.cpu_milli for n in view.nodes for z in n.zones}
    placed = aligned = 0
    for gang, placement in results:
        want = {ps.name: ps.requests.cpu_milli for ps in gang.pod_sets}
        for pod in placement.pods:
            placed += 1
            key = (pod.node, pod.zone if pod.zone is not None else -1)
            if zones.get(key, -1) >= want[pod.pod_set]:
                zones[key] -= want[pod.pod_set]
                aligned += 1
    return aligned / placed if placed else 1.0


def run_best_fit(view: ClusterView, gangs: list[Gang]) -> Figures:
    """The reference: each pod on the tightest node by free CPU, all or nothing, zones ignored."""
    free = [n.free.cpu_milli for n in view.nodes]
    pods_left = [n.free_pods for n in view.nodes]
    zones = [[z.cpu_milli for z in n.zones] for n in view.nodes]
    keys = sorted((f, i) for i, f in enumerate(free))
    latencies: list[float] = []
    admitted = placed = aligned = 0
    clock = time.perf_counter
    start = clock()
    for gang in gangs:
        t0 = clock()
        taken: list[tuple[int, int]] = []
        ok = True
        for ps in gang.pod_sets:
            want = ps.requests.cpu_milli
            for _ in range(ps.count):
                pos = bisect.bisect_left(keys, (want, -1))
                while pos < len(keys) and pods_left[keys[pos][1]] < 1:
                    pos += 1
                if pos == len(keys):
                    ok = False
                    break
                f, i = keys.pop(pos)
                free[i] = f - want
                pods_left[i] -= 1
                bisect.insort(keys, (free[i], i))
                taken.append((i, want))
            if not ok:
                break
        if ok:
            admitted += 1
            for i, want in taken:  # would the node's agent find one zone for it?
                placed += 1
                fit = next((p for p, z in enumerate(zones[i]) if z >= want), None)
                if fit is not None:
                    zones[i][fit] -= want
                    aligned += 1
        else:
            for i, want in reversed(taken):
                keys.remove((free[i], i))
                free[i] += want
                pods_left[i] += 1
                bisect.insort(keys, (free[i], i))
        latencies.append(clock() - t0)
    total = clock() - start
    return Figures("best fit (node totals)", admitted, len(gangs), total, percentile(latencies, 0.5) * 1e3,
                   percentile(latencies, 0.99) * 1e3, aligned / placed if placed else 1.0)


def _view(nodes: int, topos: list[tuple[str, Topology]], seed: int) -> tuple[ClusterView, dict[str, str]]:
    """The cluster's view, built `PART` nodes at a time: the API dicts of 65,000 nodes and their
    600,000 filler pods would hold GiBs the engine never reads, and the process's RSS would show them."""
    parts: list[ClusterView] = []
    left_out: dict[str, str] = {}
    for objects in workload.cluster_parts(nodes, topos, seed, size=PART):
        view, out = build_view(objects.nodes, objects.nrts, objects.pods, Ledger(), 0.0)
        parts.append(view)
        left_out.update(out)
        del objects
    return ClusterView(nodes=tuple(n for v in parts for n in v.nodes),
                       empty=tuple(n for v in parts for n in v.empty)), left_out



def in_process(nodes: int = 5000, gangs: int = 15000, seed: int = 42, dumps: Path | None = None) -> Figures:
    """The in-process run: build the cluster, decide every gang with the engine and the reference,
    print both side by side, and return the engine's figures."""
    with tempfile.TemporaryDirectory(prefix="topolet-admission-") as tmp:
        t0 = time.perf_counter()
        topos = workload.topologies(dumps or Path(tmp))
        stream = workload.gangs(gangs, seed + 1)
        view, left_out = _view(nodes, topos, seed)
        zones = sum(len(n.zones) for n in view.nodes)
        print(f"# cluster: {len(view.nodes)} nodes ({len(left_out)} left out), {zones} zones, "
              f"{sum(n.free.cpu_milli for n in view.nodes) // 1000} free CPUs; "
              f"{len(stream)} gangs asking {sum(workload.gang_cpus(g) for g in stream)} CPUs "
              f"(set up in {time.perf_counter() - t0:.1f} s)")
    ours = run_engine(view, stream)
    ref = run_best_fit(view, stream)
    print(f"{'placer':<24} {'admitted':>9} {'decisions/s':>12} {'p50 ms':>8} {'p99 ms':>8} "
          f"{'aligned':>8} {'single-shot p99 ms':>19}")
    for f in (ours, ref):
        shot = f"{f.first_p99_ms:>19.3f}" if f.first_p99_ms else f"{'-':>19}"
        print(f"{f.name:<24} {f.admitted:>9} {f.rate:>12.0f} {f.p50_ms:>8.3f} {f.p99_ms:>8.3f} "
              f"{f.aligned * 100:>7.1f}% {shot}")
    return ours


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--gangs", type=int, default=15000)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--dumps", type=Path, default=None,
                        help="where to unpack the hwloc dumps (kept between runs); default: a temp folder")
    parser.add_argument("--api-nodes", type=int, default=1000, help="nodes through the API (0: skip it)")
    parser.add_argument("--api-gangs", type=int, default=3000, help="gangs through the API")
    parser.add_argument("--api-rounds", type=int, default=3,
                        help="rounds of one run per placer through the API (order rotated; median ratios)")
    parser.add_argument("--api-scopes", type=scope_list, default=SCOPES,
                        help="NRT topologyManagerScopes to run the NRT plugin with (pod,container; none)")
    args = parser.parse_args(argv)
    ours = in_process(args.nodes, args.gangs, args.seed, args.dumps)
    print(f"admission engine: {ours.rate:.0f} decisions/s, p99 {ours.p99_ms:.2f} ms "
          f"({args.nodes} nodes, {args.gangs} gangs), peak RSS {peak_rss_mib():.0f} MiB", flush=True)
    if args.api_nodes > 0:
        from admission_api import last_line, through_api

        print(last_line(through_api(args.api_nodes, args.api_gangs, args.seed, args.dumps, args.api_rounds,
                                    args.api_scopes)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
