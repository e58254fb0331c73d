#!/usr/bin/env python3
"""A decision pass's time and a fitting gang's wait with hundreds of gangs queued that fit the empty
cluster but not the current one (issue 37, item 4), beside the same with none waiting, in one run.

One test cluster of its own (tests/controlplane/cluster.py: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler) with `--nodes` Node objects, their NRTs and the bound filler
pods that hold them (bench/admission_workload.py), and `topolet controller` on one BestEffortFIFO
queue, resyncing every second (so passes run while nothing changes).  The not-now gangs are `--waiting`
Indexed Jobs of single-numa-node pods of 8 CPUs, as many pods as the cluster cannot take now and the
empty one can (the fewest such, found by the engine on the static view); the fitting gang is one pod
of 1 CPU.  The controller's own metrics give the passes: `_sum` and `_count` of
`topolet_admission_pass_duration_seconds` over a `--window` of seconds (mean pass time, passes run),
and `topolet_admission_refusals_reused_total`.

1. None waiting: the passes over the window, then the fitting gang's wait (from just before its
   create call until a poll sees the Job unsuspended, every 20 ms).
2. `--waiting` waiting: the Jobs created; once the controller's queue depth counts them all, the
   passes over the window, then a second fitting gang's wait.

Last line: `waiting: N gangs not now: pass mean X s vs Y s with none; a fitting gang admitted in A s
vs B s with none; refusals reused R`.  Quick run: `--nodes 20 --waiting 100 --window 5`.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import admission_workload as workload  # noqa: E402
from admission_api import NAMESPACE, QUEUE, _job, _parallel, _populate  # noqa: E402

from agent.admission.cluster.ledger import Ledger  # noqa: E402
from agent.admission.cluster.view import build_view  # noqa: E402
from agent.admission.engine.model import Gang, PodSet, Refusal, Resources  # noqa: E402
from agent.admission.engine.place import place  # noqa: E402
from agent.kubeapi.client import KubeClient  # noqa: E402
from tests.admission.test_controller import metric, scrape  # noqa: E402
from tests.controlplane.cluster import Cluster, start_cluster  # noqa: E402
from tests.controlplane.harness import free_port  # noqa: E402

FIT_INDEX = 90_000  # the fitting gangs' Job numbers, past any waiting one's
MEMORY = 1 << 30
NOT_NOW_CPUS = 8  # the waiting gangs' pods: a zone each, as training pods take


def pods(cpus: int, count: int = 1) -> Gang:
    return Gang("g", (PodSet("main", count, Resources(cpu_milli=cpus * 1000, memory=MEMORY),
                             numa_policy="single-numa-node"),))


def not_now(objects: workload.Cluster, cpus: int = NOT_NOW_CPUS) -> Gang:
    """The smallest gang of single-numa-node pods of `cpus` CPUs that the cluster cannot take now and
    the empty one can."""
    view, _ = build_view(objects.nodes, objects.nrts, objects.pods, Ledger(), 0.0)
    for count in range(1, 100_000):
        refused = place(view, pods(cpus, count))
        if isinstance(refused, Refusal):
            if refused.kind != "not-now":
                break
            return pods(cpus, count)
    raise SystemExit(f"no gang of {cpus}-CPU pods is refused now and fits the empty cluster")


class Passes:
    """The controller's pass histogram and reused refusals, read from its /metrics."""

    def __init__(self, port: int) -> None:
        self.port = port

    def read(self) -> tuple[float, float, float]:
        _, text = scrape(self.port)
        return (metric(text, "topolet_admission_pass_duration_seconds_sum"),
                metric(text, "topolet_admission_pass_duration_seconds_count"),
                metric(text, "topolet_admission_refusals_reused_total"))

    def over(self, seconds: float) -> tuple[float, int]:
        """(mean pass seconds, passes run) over the next `seconds`."""
        s0, n0, _ = self.read()
        time.sleep(seconds)
        s1, n1, _ = self.read()
        passes = int(n1 - n0)
        return ((s1 - s0) / passes if passes else float("nan")), passes

    def depth(self) -> float:
        _, text = scrape(self.port)
        return metric(text, f'topolet_admission_queue_depth{{queue="{QUEUE}"}}')


def wait_admitted(api: KubeClient, index: int, timeout: float) -> float:
    """Seconds from the fitting gang's create until its Job is unsuspended."""
    path = f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs"
    body = _job(pods(1), index, queued=True)
    started = time.monotonic()
    api.create(path, body)
    while time.monotonic() - started < timeout:
        job = api.get(f"{path}/{body['metadata']['name']}")
        if job["spec"].get("suspend") is False:
            return time.monotonic() - started
        time.sleep(0.02)
    raise SystemExit(f"the fitting gang {body['metadata']['name']} was not admitted in {timeout:.0f} s")


def run(cluster: Cluster, objects: workload.Cluster, waiting: int, window: float) -> dict[str, Any]:
    api = KubeClient(cluster.plane.client())
    port = free_port()
    cluster.start_controller("--queue", f"{QUEUE}=BestEffortFIFO:{NAMESPACE}", "--resync-seconds", "1",
                             "--listen", f"127.0.0.1:{port}", placement_policy=False)
    passes = Passes(port)
    deadline = time.monotonic() + 60
    while True:
        try:
            passes.read()
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    time.sleep(2.0)  # the first passes, on the cold lists
    out: dict[str, Any] = {}
    out["pass_none"], out["passes_none"] = passes.over(window)
    out["fit_none"] = wait_admitted(api, FIT_INDEX, 120)
    waits = not_now(objects)
    (shape,) = waits.pod_sets
    print(f"# not-now gangs: {shape.count} single-numa-node pods of {NOT_NOW_CPUS} CPUs each (the fewest the "
          "cluster cannot take now and the empty one can)", flush=True)
    local = threading.local()

    def create(index: int) -> None:
        if not hasattr(local, "api"):
            local.api = KubeClient(cluster.plane.client())
        body = _job(waits, index, queued=True)
        local.api.create(f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs", body)

    began = time.monotonic()
    _parallel(list(range(waiting)), create)
    print(f"# {waiting} not-now Jobs created in {time.monotonic() - began:.0f} s", flush=True)
    deadline = time.monotonic() + 600
    while passes.depth() < waiting:
        if time.monotonic() > deadline:
            raise SystemExit(f"the controller's queue depth is {passes.depth():.0f} of {waiting} after 600 s")
        time.sleep(0.5)
    print(f"# every one queued after {time.monotonic() - began:.0f} s", flush=True)
    reused_before = passes.read()[2]
    out["pass_waiting"], out["passes_waiting"] = passes.over(window)
    out["fit_waiting"] = wait_admitted(api, FIT_INDEX + 1, 600)
    out["reused"] = passes.read()[2] - reused_before
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--nodes", type=int, default=100, help="Node objects with NRTs (default 100)")
    parser.add_argument("--waiting", type=int, default=600, help="not-now gangs queued (default 600)")
    parser.add_argument("--window", type=float, default=15.0,
                        help="seconds over which passes are measured (default 15)")
    parser.add_argument("--seed", type=int, default=42, help="workload seed (default 42)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="topolet-waiting-") as tmp:
        topos = workload.topologies(Path(tmp) / "dumps")
        objects = workload.cluster(args.nodes, topos, args.seed)
        cluster = start_cluster(Path(tmp) / "stage")
        try:
            _populate(cluster, objects)
            out = run(cluster, objects, args.waiting, args.window)
        except BaseException:
            print(cluster.logs(2000))
            raise
        finally:
            cluster.stop()
    print(f"{'queued':<22} {'pass mean s':>11} {'passes':>6} {'fitting gang s':>14}")
    print(f"{'none waiting':<22} {out['pass_none']:>11.3f} {out['passes_none']:>6} {out['fit_none']:>14.2f}")
    print(f"{f'{args.waiting} not now':<22} {out['pass_waiting']:>11.3f} {out['passes_waiting']:>6} "
          f"{out['fit_waiting']:>14.2f}")
    print(f"waiting: {args.waiting} gangs not now: pass mean {out['pass_waiting']:.3f} s vs "
          f"{out['pass_none']:.3f} s with none; a fitting gang admitted in {out['fit_waiting']:.2f} s vs "
          f"{out['fit_none']:.2f} s with none; refusals reused {out['reused']:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
