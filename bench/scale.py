#!/usr/bin/env python3
"""The admission controller at the largest scale Kubernetes runs: 5,000 nodes and 100,000 pods through a
real API server, topolet's controller against the plain scheduler in the same command; then the
placement engine alone at 65,000 nodes (issue 37).

The run is bench/admission_api.py's (`_run`: a fresh test cluster per arm, the bench's nodes played by
stand-in kubelets and agents that pin each bound pod and republish its node's NRT), with more pods:
beside the workload's filler pods (bound Guaranteed pods whose CPUs the NRTs count), each node gets
`--shared` small Burstable pods (100m CPU, 64Mi, no limits: the DaemonSet and sidecar pods every node
runs), bound at creation, in their own namespace, so that the cluster holds at least 100,000 pods before
the gang stream (`--gangs` Indexed Jobs) starts.  Per arm, as bench/admission_api.py prints them: pods
bound and aligned, gangs whole / partly bound, wall, CPU-seconds and peak RSS by component, and the API
requests per gang pod by verb and resource (the API server's own `apiserver_request_total`, every
client's).  In the controller's arm, besides:

- start -> first decision: a queued probe Job (2 pods of 4 CPUs) exists before the controller starts;
  the time from the controller's start (every collection listed cold, at full size) until it admits it;
- a kill -9 at full size: once every gang pod is bound, the controller is killed, a second probe Job is
  queued and a new controller started; the time until it admits the probe, whether the probe's pods were
  pinned in the zones it named (nothing booked twice: the new controller's view counts every pod the
  first one placed), whether any earlier Job's placement changed, and the new controller's peak RSS;
- the idle API requests per minute per node, for `--idle` seconds at full size once the run has settled
  (the controller's resyncs and watches, the Job controller's, the scheduler's).

Then `bench/admission.py --api-nodes 0 --nodes ENGINE_NODES --gangs ENGINE_GANGS` in a process of its own
(its peak RSS is the engine's, not this process's API objects).

Last line: `scale: 5000 nodes, N pods: controller peak RSS X MiB, start->first decision S s, aligned
100.0% vs plain P.P%, wall with controller / plain R.RR; engine 65000 nodes D/s p99 Q ms RSS G MiB`
(R.RR: the median over `--rounds`; CPU-seconds beside it in the table above).  Targets (issue 37):
X <= 512, S <= 60, R.RR <= 1.0, Q <= 50, G <= 2048.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import admission_api as api_bench  # noqa: E402
import admission_workload as workload  # noqa: E402
from admission_agents import NodeAgents  # noqa: E402
from admission_report import CONTROLLER, PLAIN, ApiRun, aligned_share, print_table, ratios  # noqa: E402
from apimetrics import per_minute_line, request_counts  # noqa: E402
from procstat import peak_rss_mib  # noqa: E402

from agent.admission.engine.model import Gang, PodSet, Resources  # noqa: E402
from agent.errors import KubeAPIError  # noqa: E402
from agent.kubeapi.client import KubeClient  # noqa: E402
from tests.controlplane.cluster import Cluster  # noqa: E402

SHARED_NAMESPACE = "shared"
PROBE = Gang(key="bench/probe", pod_sets=(PodSet(name="workers", count=2,
                                                  requests=Resources(cpu_milli=4000, memory=4 * workload.GIB),
                                                  numa_policy="single-numa-node"),))
PROBE_PODS = 2
WAIT_S = 600.0  # a probe not admitted in this long fails the run


def _shared_pod(node: str, k: int) -> dict[str, Any]:
    res = {"cpu": "100m", "memory": "64Mi"}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"ds-{node}-{k}", "labels": {"app": f"ds-{k}"}},
            "spec": {"nodeName": node, "automountServiceAccountToken": False,
                     "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                                     "resources": {"requests": res}}]}}


def _job_state(api: KubeClient) -> dict[str, Any]:
    """Each Job of the run (the probes left out): its annotations and pod template, what a second
    placement would change."""
    items = api.list(f"/apis/batch/v1/namespaces/{api_bench.NAMESPACE}/jobs")["items"]
    return {j["metadata"]["name"]: ((j["metadata"].get("annotations") or {}), j["spec"]["template"])
            for j in items if not j["metadata"]["name"].startswith("probe")}



class ScaleChecks:
    """bench/admission_api.py's `Extras` for this bench: the shared pods, the probes, the kill -9."""

    def __init__(self, objects: workload.Cluster, shared: int, idle_s: float) -> None:
        self.nodes = [n["metadata"]["name"] for n in objects.nodes]
        self.shared, self.idle_s = shared, idle_s
        self.first_decision_s: list[float] = []
        self.restart_s: list[float] = []
        self.controller_rss: list[float] = []
        self.problems: list[str] = []
        self._started = 0.0

    def before_start(self, cluster: Cluster, arm: api_bench.Arm) -> None:
        api = KubeClient(cluster.plane.client())
        try:
            api.create("/api/v1/namespaces", {"metadata": {"name": SHARED_NAMESPACE}})
        finally:
            api.close()
        local = threading.local()

        def create(pair: tuple[str, int]) -> None:
            if not hasattr(local, "api"):
                local.api = KubeClient(cluster.plane.client())
            local.api.create(f"/api/v1/namespaces/{SHARED_NAMESPACE}/pods", _shared_pod(*pair))

        t0 = time.monotonic()
        api_bench._parallel([(n, k) for n in self.nodes for k in range(self.shared)], create)  # noqa: SLF001
        made = len(self.nodes) * self.shared
        print(f"# {arm.name}: {made} shared pods made in {time.monotonic() - t0:.0f} s", flush=True)
        if arm.controller:
            self._queue_probe(cluster, "probe-start")
            self._started = time.monotonic()

    def _queue_probe(self, cluster: Cluster, name: str) -> None:
        api = KubeClient(cluster.plane.client())
        try:
            job = api_bench._job(PROBE, 0, queued=True)  # noqa: SLF001
            job["metadata"]["name"] = name
            api.create(f"/apis/batch/v1/namespaces/{api_bench.NAMESPACE}/jobs", job)
        finally:
            api.close()

    def _admitted_after(self, cluster: Cluster, name: str, since: float) -> float:
        """Seconds from `since` until Job `name` is admitted (unsuspended)."""
        api = KubeClient(cluster.plane.client())
        try:
            deadline = since + WAIT_S
            while time.monotonic() < deadline:
                try:
                    job = api.get(f"/apis/batch/v1/namespaces/{api_bench.NAMESPACE}/jobs/{name}")
                    if not job["spec"].get("suspend"):
                        return time.monotonic() - since
                except KubeAPIError:
                    pass
                time.sleep(0.1)
        finally:
            api.close()
        raise SystemExit(f"{name} was not admitted within {WAIT_S:.0f} s:\n{cluster.logs(3000)}")

    def controller_started(self, cluster: Cluster) -> int:
        took = self._admitted_after(cluster, "probe-start", self._started)
        self.first_decision_s.append(took)
        print(f"# {CONTROLLER}: start -> first decision {took:.1f} s (a probe Job queued before it started)",
              flush=True)
        return PROBE_PODS

    def after_run(self, cluster: Cluster, arm: api_bench.Arm, agents: NodeAgents) -> None:
        self._idle(cluster, arm)
        if not arm.controller:
            return
        api = KubeClient(cluster.plane.client())
        try:
            before = _job_state(api)
            first = cluster.controllers[-1]
            self.controller_rss.append(peak_rss_mib(first.popen.pid))
            os.kill(first.popen.pid, signal.SIGKILL)
            first.popen.wait()
            cluster.controllers.pop()
            self._queue_probe(cluster, "probe-restart")
            t0 = time.monotonic()
            second = cluster.start_controller(*api_bench.CONTROLLER_ARGS)
            took = self._admitted_after(cluster, "probe-restart", t0)
            self.restart_s.append(took)
            deadline = time.monotonic() + WAIT_S
            while time.monotonic() < deadline:
                placed = [p for p in agents.placements if "/probe-restart-" in p[0]]
                if len(placed) >= PROBE_PODS:
                    break
                time.sleep(0.2)
            unaligned = [p[0] for p in placed if not p[3]]
            changed = [name for name, state in _job_state(api).items() if before.get(name, state) != state]
            self.controller_rss.append(peak_rss_mib(second.popen.pid))
        finally:
            api.close()
        if len(placed) < PROBE_PODS or unaligned or changed:
            self.problems.append(f"after kill -9: {len(placed)}/{PROBE_PODS} probe pods pinned, unaligned "
                                 f"{unaligned}, Jobs placed again {changed[:5]}")
        print(f"# {CONTROLLER}: kill -9 at full size: decides again after {took:.1f} s; probe pods pinned "
              f"{len(placed)}/{PROBE_PODS}, {len(unaligned)} outside their zone; Jobs whose placement "
              f"changed {len(changed)}; the new controller's peak RSS {self.controller_rss[-1]:.0f} MiB",
              flush=True)

    def _idle(self, cluster: Cluster, arm: api_bench.Arm) -> None:
        if self.idle_s <= 0:
            return
        before = request_counts(cluster.plane)
        time.sleep(self.idle_s)
        print(per_minute_line(f"{arm.name} (idle {self.idle_s:.0f} s at full size)", before,
                              request_counts(cluster.plane), self.idle_s, len(self.nodes)), flush=True)


def _engine(nodes: int, gangs: int, dumps: Path) -> tuple[str, str]:
    """bench/admission.py's engine run in a process of its own: (its last line, the figures for ours)."""
    out = subprocess.run([sys.executable, str(REPO / "bench" / "admission.py"), "--api-nodes", "0",
                          "--nodes", str(nodes), "--gangs", str(gangs), "--dumps", str(dumps)],
                         capture_output=True, text=True, check=True).stdout
    print(out, end="", flush=True)
    last = out.strip().splitlines()[-1]
    m = re.search(r"admission engine: (\d+) decisions/s, p99 ([\d.]+) ms .*peak RSS (\d+) MiB", last)
    if m is None:
        raise SystemExit(f"bench/admission.py printed no figures: {last}")
    return last, f"engine {nodes} nodes {m[1]}/s p99 {m[2]} ms RSS {m[3]} MiB"



def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--shared", type=int, default=10, help="small Burstable pods bound to each node")
    parser.add_argument("--gangs", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=1, help="rounds of one run per arm, the order rotated")
    parser.add_argument("--idle", type=float, default=60.0,
                        help="seconds of idle API requests measured at full size after each run (0: none)")
    parser.add_argument("--engine-nodes", type=int, default=65000)
    parser.add_argument("--engine-gangs", type=int, default=15000)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--dumps", type=Path, default=None)
    parser.add_argument("--keep-logs", type=Path, default=None,
                        help="copy each run's component logs (the controller's timing lines) here")
    args = parser.parse_args(argv)
    api_bench.KEEP_LOGS = args.keep_logs
    with tempfile.TemporaryDirectory(prefix="topolet-scale-") as tmp:
        dumps = args.dumps or Path(tmp) / "dumps"
        topos = workload.topologies(dumps)
        objects = workload.cluster(args.nodes, topos, args.seed)
        stream = workload.gangs(args.gangs, args.seed + 1)
        gang_pods = sum(ps.count for g in stream for ps in g.pod_sets)
        pods = len(objects.pods) + args.nodes * args.shared + gang_pods
        print(f"# scale: {args.nodes} nodes, {len(objects.pods)} filler pods, {args.nodes * args.shared} "
              f"shared pods, {args.gangs} gangs: {pods} pods in all; {args.rounds} round(s)", flush=True)
        checks = ScaleChecks(objects, args.shared, args.idle)
        placers = [api_bench.Arm(PLAIN), api_bench.Arm(CONTROLLER, controller=True)]
        runs: dict[str, list[ApiRun]] = {a.name: [] for a in placers}
        for r in range(args.rounds):
            k = r % len(placers)
            for arm in placers[k:] + placers[:k]:
                runs[arm.name].append(api_bench._run(arm, Path(tmp) / f"{arm.key}-{r}", objects,  # noqa: SLF001
                                                     topos, stream, extras=checks))
        print_table(runs, args.rounds)
        _, engine = _engine(args.engine_nodes, args.engine_gangs, dumps)
    for problem in checks.problems:
        print(f"# PROBLEM: {problem}")
    ours, plain = runs[CONTROLLER], runs[PLAIN]
    ratio = statistics.median(ratios(runs, CONTROLLER, PLAIN, "wall_s"))
    rss = max([*checks.controller_rss, *(r.rss_mib.get(CONTROLLER, 0.0) for r in ours)])
    print(f"scale: {args.nodes} nodes, {pods} pods: controller peak RSS {rss:.0f} MiB, start->first decision "
          f"{max(checks.first_decision_s):.1f} s, aligned {aligned_share(ours) * 100:.1f}% vs plain "
          f"{aligned_share(plain) * 100:.1f}%, wall with controller / plain {ratio:.2f}; {engine}")
    return 1 if checks.problems else 0


if __name__ == "__main__":
    sys.exit(main())
