#!/usr/bin/env python3
"""Kueue with and without the `topolet.io/topology-fit` check: the same gangs through real Kueue, twice.

Each run gets a fresh test cluster (tests/controlplane/cluster.py: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler) with real Kueue v0.17.0 on it (tests/controlplane/kueue.py:
its manager, webhooks and batch/Job integration).  Both runs hold the same objects from
`bench/admission_workload.py`: `--nodes` Node objects with their NRTs and the bound filler pods that
hold the NRTs' allocations (as bench/admission_api.py sets them up; no agent processes at this
scale), and `--gangs` Indexed Jobs of single-numa-node pods in Kueue's tas pod-count mix, queued on
a LocalQueue whose ClusterQueue has quota for all of them (quota never holds a gang back here, so
what differs is only the check):

- without the check: Kueue admits on quota, the kube-scheduler binds the pods on node totals;
- with the check: the ClusterQueue also lists the AdmissionCheck `topology-fit`, and
  `topolet controller --kueue on` decides it; the kueue component's placement policy pins each pod
  to the node and zone the check chose, and the scheduler binds it there.

Per run: admission latency per Workload (from just before its Job's create call until a watch sees
the Workload's Admitted condition true), p50 and p99 over the Workloads admitted in both runs (so
the two figures cover the same gangs; the count is printed), and the p50 and p99 seconds of each step
(STEPS: create -> QuotaReserved -> our check Pending -> Ready -> Admitted, as the same watch sees
them) to show where the check's time goes; the pods bound; and the share of bound pods their node
pinned in one zone.  The nodes' kubelets and agents are bench/admission_agents.py's stand-ins, as in
bench/admission_api.py: each bound pod is pinned by the agent's allocator (inside the zone the check
named, when it named one), reported Running, and its node's NRT republished, so the controller runs
with its default ledger timeout.

A third run puts a no-op check in topolet's place (`NoopCheck`, in this process: Ready, with no
podSetUpdates, the moment its watch sees the check Pending), so the figure beside Kueue alone is what
Kueue's own flow costs any admission check (two more Workload status writes) and the ratio against it
is what topolet's decision adds.

Last line: `kueue: aligned 100.0% with check vs X.X% without; admission p99 with/without = R.RR,
with/no-op check = Q.QQ`.
Equal work: the default 40 nodes and 80 gangs are sized so that every gang fits NUMA-wise on the
static NRTs (the engine places 100 of these gangs in creation order, so Kueue's order of quota
reservation does not matter), as bench/admission_api.py sizes its 1000/3000: the check never has to
answer Retry and both runs admit every Workload.  The bench replays the gangs through the engine on
the static NRTs first and says how many fit.  About three gangs per node (`--gangs 120`) leave some
gangs that never fit with the check (Retry until the run stalls), so the latency compares unequal
work there.  A larger queue at the same two gangs per node: `--nodes 150 --gangs 300` (all fit).
Quick run: `--nodes 20 --gangs 40`.

Kueue runs as upstream's manager config has it in both runs (5 reconcilers each for Jobs and
Workloads); `--kueue-workers` changes that for both.  With `--keep-logs`, `workloads.json` holds each
Workload's step times (Unix seconds) to set beside the controller's log, whose decision lines say
how long each Workload waited for us ("due N s ago, written in M s").
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import admission_workload as workload  # noqa: E402
from admission import percentile  # noqa: E402
from admission_agents import NodeAgents  # noqa: E402
from admission_api import FILLER_NAMESPACE, NAMESPACE, BindWatch, _job, _parallel, _populate  # noqa: E402

from agent.admission.cluster.ledger import Ledger  # noqa: E402
from agent.admission.cluster.view import build_view  # noqa: E402
from agent.admission.engine.model import Gang, Placement  # noqa: E402
from agent.admission.engine.place import commit, place  # noqa: E402
from agent.errors import KubeAPIError  # noqa: E402
from agent.kubeapi.client import KubeClient  # noqa: E402
from agent.topology.model import Topology  # noqa: E402
from tests.controlplane.kueue import (  # noqa: E402
    DEFAULT_API_QPS,
    QUEUE_LABEL,
    KueueObjects,
    kueue_path,
    start_kueue,
)
from tests.kueue.test_check import install_policy  # noqa: E402

CHECK = "topology-fit"
# A Workload's way to Admitted, as the bench's watch sees it: quota reserved (Kueue's scheduler), our
# check's state Pending with that quota (Kueue's Workload controller adds it), Ready (us), Admitted
# (Kueue's Workload controller).  Without the check, Kueue's scheduler writes QuotaReserved and
# Admitted at once, so the later steps take no time.
STEPS = ("create->QuotaReserved", "->check Pending", "->check Ready", "->Admitted")
# The reconcilers `--kueue-workers` sets: the Job reconciler makes each Job's Workload and unsuspends
# it; the Workload reconciler adds the checks' Pending states and, once every check is Ready, writes
# Admitted.  Each of those writes waits a round trip through the API server and Kueue's webhook, so
# their rate is at most the workers over that round trip; but more Workload workers also race Kueue's
# scheduler more often (its Pending-state update conflicts with the quota reservation, and the retries
# wait in controller-runtime's default rate limiter, 10/s after a burst of 100).  The default is
# upstream's manager config: the bench tunes nothing.
WORKER_KINDS = ("Job.batch", "Workload.kueue.x-k8s.io")
DEFAULT_WORKERS = 5
STALL_S = 120.0  # no admission or bind for this long ends a run (some gangs never get in)
PROGRESS_S = 15.0
KEEP_LOGS: Path | None = None  # --keep-logs: copy each run's logs here


@dataclass(frozen=True)
class Run:
    """One run through Kueue."""

    name: str
    workloads: int
    admitted: int
    latencies: dict[str, float]  # seconds, per admitted Workload, by its Job's name
    steps: dict[str, tuple[float, ...]]  # seconds of each of STEPS
    pods: int
    bound: int
    aligned: int

    @property
    def aligned_share(self) -> float:
        return self.aligned / self.bound if self.bound else 1.0

    def p(self, q: float, among: set[str]) -> float:
        """The q-quantile of the admission latency over the Workloads in `among`."""
        values = [v for k, v in self.latencies.items() if k in among]
        return percentile(values, q) if values else float("nan")


class AdmitWatch:
    """When each Workload of NAMESPACE was first seen with QuotaReserved, with it and our check
    Pending, with our check Ready and Admitted (monotonic), by its Job's name."""

    def __init__(self, api: KubeClient) -> None:
        self.api = api
        self.admitted: dict[str, float] = {}
        self.reserved: dict[str, float] = {}
        self.pending: dict[str, float] = {}
        self.ready: dict[str, float] = {}
        self.last = time.monotonic()
        self._stop = threading.Event()
        self._stream: Any = None
        self._rv = api.list(kueue_path("workloads", namespace=NAMESPACE))["metadata"]["resourceVersion"]
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with self.api.watch(kueue_path("workloads", namespace=NAMESPACE),
                                    {"resourceVersion": self._rv, "allowWatchBookmarks": True,
                                     "timeoutSeconds": 60}, timeout=(5.0, 90.0)) as stream:
                    self._stream = stream
                    for event in stream:
                        obj = (event or {}).get("object") or {}
                        self._rv = (obj.get("metadata") or {}).get("resourceVersion", self._rv)
                        owners = (obj.get("metadata") or {}).get("ownerReferences") or []
                        status = obj.get("status") or {}
                        true = {c.get("type") for c in status.get("conditions") or []
                                if c.get("status") == "True"}
                        if not owners:
                            continue
                        now, job = time.monotonic(), owners[0]["name"]
                        states = {a.get("name"): a.get("state") for a in status.get("admissionChecks") or []}
                        if "QuotaReserved" in true:
                            self.reserved.setdefault(job, now)
                            if states.get(CHECK) == "Pending":
                                self.pending.setdefault(job, now)
                        if states.get(CHECK) == "Ready":
                            self.ready.setdefault(job, now)
                        if "Admitted" in true:
                            self.admitted.setdefault(job, now)
                            self.last = now
            except KubeAPIError:
                time.sleep(0.2)

    def close(self) -> None:
        self._stop.set()
        if self._stream is not None:
            self._stream.shutdown()


NOOP_CONTROLLER = "bench.topolet.io/noop"


class NoopCheck:
    """An admission check controller that decides nothing: it sets CHECK Ready, with no podSetUpdates,
    the moment its watch sees a Workload of NAMESPACE with quota reserved and CHECK Pending, from a small
    writer pool (as topolet's check writes off its watch).  What Kueue's own flow costs any check."""

    def __init__(self, api_factory: Any, writers: int = 4) -> None:
        self._api = api_factory()
        self._local = threading.local()
        self._factory = api_factory
        self._pool = ThreadPoolExecutor(writers, thread_name_prefix="noop-check")
        self._done: set[str] = set()  # Workloads answered (or being answered)
        self._done_lock = threading.Lock()
        self._stop = threading.Event()
        self._rv = self._api.list(kueue_path("workloads", namespace=NAMESPACE))["metadata"]["resourceVersion"]
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _write(self, name: str) -> None:
        if not hasattr(self._local, "api"):
            self._local.api = self._factory()
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        body = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
                "metadata": {"name": name, "namespace": NAMESPACE},
                "status": {"admissionChecks": [{"name": CHECK, "state": "Ready", "message": "no-op",
                                                "lastTransitionTime": now}]}}
        try:
            self._local.api.apply(kueue_path("workloads", name, namespace=NAMESPACE, subresource="status"),
                                  body, NOOP_CONTROLLER)
        except KubeAPIError as exc:  # seen again on its next event
            with self._done_lock:
                self._done.discard(name)
            print(f"# no-op check: {name}: {exc}", flush=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with self._api.watch(kueue_path("workloads", namespace=NAMESPACE),
                                     {"resourceVersion": self._rv, "allowWatchBookmarks": True,
                                      "timeoutSeconds": 60}, timeout=(5.0, 90.0)) as stream:
                    for event in stream:
                        obj = (event or {}).get("object") or {}
                        meta = obj.get("metadata") or {}
                        self._rv = meta.get("resourceVersion", self._rv)
                        status = obj.get("status") or {}
                        reserved = any(c.get("type") == "QuotaReserved" and c.get("status") == "True"
                                       for c in status.get("conditions") or [])
                        states = {a.get("name"): a.get("state") for a in status.get("admissionChecks") or []}
                        name = meta.get("name")
                        if reserved and states.get(CHECK) == "Pending" and name:
                            with self._done_lock:
                                if name in self._done:
                                    continue
                                self._done.add(name)
                            self._pool.submit(self._write, name)
                        if self._stop.is_set():
                            return
            except KubeAPIError:
                if self._stop.is_set():
                    return
                time.sleep(0.2)

    def close(self) -> None:
        self._stop.set()
        self._pool.shutdown(wait=False, cancel_futures=True)


def _wait(what: str, done: Any, last: Any, start: float) -> None:
    """Until `done()`, or until `last()` (the monotonic time of the latest progress) is STALL_S old."""
    progress = time.monotonic()
    while not done():
        now = time.monotonic()
        if now - max(last(), start) > STALL_S:
            print(f"# {what}: no progress for {STALL_S:.0f} s, stopped waiting", flush=True)
            return
        if now - progress >= PROGRESS_S:
            progress = now
            print(f"# {what} after {now - start:.0f} s", flush=True)
        time.sleep(0.1)


def run(name: str, workdir: Path, objects: workload.Cluster, topos: list[tuple[str, Topology]],
        stream: list[Gang], *, check: str, workers: int) -> Run:
    """One run: `check` is "" (Kueue alone), "topolet" (topology-fit) or "noop" (NoopCheck)."""
    kueue = start_kueue(workdir, concurrency={kind: workers for kind in WORKER_KINDS})
    cluster = kueue.cluster
    api = KubeClient(cluster.plane.client())
    agents: NodeAgents | None = None
    try:
        _populate(cluster, objects)
        # The nodes' kubelets and agents, as in bench/admission_api.py: each bound pod pinned, reported
        # Running and its node's NRT republished, so the controller's ledger settles (default timeout).
        agents = NodeAgents(cluster, objects, lambda node: topos[int(node.split("-")[1]) % len(topos)][1],
                            "pod", NAMESPACE, FILLER_NAMESPACE)
        agents.prime()
        kueue_objects = KueueObjects(api)
        kueue_objects.resource_flavor("default")
        noop: NoopCheck | None = None
        if check == "topolet":
            install_policy(api)
            kueue_objects.admission_check(CHECK)
            cluster.start_controller("--kueue", "on")
        elif check == "noop":
            kueue_objects.admission_check(CHECK, NOOP_CONTROLLER)
            kueue_objects.set_check_active(CHECK, field_manager=NOOP_CONTROLLER)
            noop = NoopCheck(lambda: KubeClient(cluster.plane.client()))
        cpus = sum(workload.gang_cpus(g) for g in stream)
        kueue_objects.cluster_queue("cq", "default", {"cpu": str(cpus), "memory": f"{cpus}Gi"},
                                    admission_checks=[CHECK] if check else [])
        kueue_objects.local_queue(NAMESPACE, "lq", "cq")

        def cq_active() -> bool:
            cq = kueue_objects.get("clusterqueues", "cq")
            return any(c["type"] == "Active" and c["status"] == "True"
                       for c in cq.get("status", {}).get("conditions") or [])

        deadline = time.monotonic() + 120
        while not cq_active():
            if time.monotonic() > deadline:
                raise SystemExit(f"{name}: the ClusterQueue never became Active\n{kueue.log_tail()}")
            time.sleep(0.2)

        agents.start()
        admits = AdmitWatch(KubeClient(cluster.plane.client()))
        binds = BindWatch(cluster)
        created: dict[str, float] = {}
        local = threading.local()

        def create(item: tuple[int, Gang]) -> None:
            if not hasattr(local, "api"):
                local.api = KubeClient(cluster.plane.client())
            body = _job(item[1], item[0], queued=False)
            body["metadata"]["labels"] = {QUEUE_LABEL: "lq"}
            body["spec"]["suspend"] = True
            created[body["metadata"]["name"]] = time.monotonic()
            local.api.create(f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs", body)

        want = sum(ps.count for g in stream for ps in g.pod_sets)
        try:
            start = time.monotonic()
            _parallel(list(enumerate(stream)), create)
            _wait(f"{name}: {len(admits.admitted)}/{len(stream)} Workloads admitted",
                  lambda: len(admits.admitted) >= len(stream), lambda: admits.last, start)
            _wait(f"{name}: {len(binds.bound)}/{want} pods bound",
                  lambda: len(binds.bound) >= want, lambda: binds.last_bind, start)
        finally:
            admits.close()
            binds.close()
            if noop is not None:
                noop.close()
        latencies = {j: admits.admitted[j] - created[j] for j in admits.admitted if j in created}
        steps: dict[str, tuple[float, ...]] = {}
        for j in latencies:
            reserved = admits.reserved.get(j, admits.admitted[j])
            # Without the check (or a state the watch missed between two events): no time on that step.
            pending = admits.pending.get(j, reserved)
            ready = admits.ready.get(j, pending)
            steps[j] = (reserved - created[j], pending - reserved, ready - pending,
                        admits.admitted[j] - ready)
        if KEEP_LOGS is not None:  # each Workload's times (Unix seconds), to set beside the logs
            wall = time.time() - time.monotonic()
            dest = KEEP_LOGS / workdir.name
            dest.mkdir(parents=True, exist_ok=True)
            (dest / "workloads.json").write_text(json.dumps({
                j: {"created": created[j] + wall, **{step: seen[j] + wall for step, seen in (
                    ("reserved", admits.reserved), ("pending", admits.pending), ("ready", admits.ready),
                    ("admitted", admits.admitted)) if j in seen}} for j in latencies}, indent=1))
        agents.settle(set(binds.bound))
        aligned = agents.aligned()
        return Run(name, len(stream), len(latencies), latencies, steps, want, len(binds.bound), aligned)
    except BaseException:
        print(f"--- kueue ---\n{kueue.log_tail(2000)}\n{cluster.logs(2000)}")
        raise
    finally:
        api.close()
        if agents is not None:
            agents.stop()
        kueue.stop_all()
        if KEEP_LOGS is not None:  # Kueue's and the controller's logs, for profiling
            dest = KEEP_LOGS / workdir.name
            dest.mkdir(parents=True, exist_ok=True)
            for log in [*cluster.workdir.glob("*.log"), kueue.workdir / "kueue.log"]:
                if log.exists():
                    shutil.copy(log, dest / log.name)


def _fit(objects: workload.Cluster, stream: list[Gang]) -> int:
    """How many of the gangs the engine places on the static NRTs, one after another in creation order."""
    view, _ = build_view(objects.nodes, objects.nrts, objects.pods, Ledger(), 0.0)
    fit = 0
    for gang in stream:
        result = place(view, gang)
        if isinstance(result, Placement):
            view = commit(view, gang, result)
            fit += 1
    return fit


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--nodes", type=int, default=40, help="Node objects with NRTs (default 40)")
    parser.add_argument("--gangs", type=int, default=80,
                        help="Indexed Jobs queued (default 80: every one fits on the default 40 nodes)")
    parser.add_argument("--seed", type=int, default=42, help="workload seed (default 42)")
    parser.add_argument("--dumps", type=Path, default=None, help="where the hwloc dumps are extracted")
    parser.add_argument("--kueue-workers", type=int, default=DEFAULT_WORKERS,
                        help=f"Kueue's Job and Workload reconcilers, both runs (default {DEFAULT_WORKERS}, "
                             "as upstream's manager config)")
    parser.add_argument("--keep-logs", type=Path, default=None,
                        help="copy each run's Kueue, controller and cluster logs here, and each "
                             "Workload's step times (workloads.json)")
    args = parser.parse_args(argv)
    global KEEP_LOGS
    KEEP_LOGS = args.keep_logs
    with tempfile.TemporaryDirectory(prefix="topolet-kueue-") as tmp:
        topos = workload.topologies(args.dumps or Path(tmp) / "dumps")
        objects = workload.cluster(args.nodes, topos, args.seed)
        stream = workload.gangs(args.gangs, args.seed + 1)
        print(f"# through Kueue: {args.nodes} nodes, {len(objects.pods)} filler pods, {args.gangs} gangs "
              f"({sum(ps.count for g in stream for ps in g.pod_sets)} pods)", flush=True)
        fit = _fit(objects, stream)
        print(f"# {fit}/{len(stream)} gangs fit NUMA-wise on the static NRTs in creation order"
              + ("" if fit == len(stream) else ": the check will answer Retry to the rest"), flush=True)
        print(f"# Kueue in both runs: client qps {DEFAULT_API_QPS}, {args.kueue_workers} workers each for "
              f"{', '.join(WORKER_KINDS)}", flush=True)
        plain = run("Kueue alone", Path(tmp) / "plain", objects, topos, stream, check="",
                    workers=args.kueue_workers)
        noop = run("Kueue + no-op check", Path(tmp) / "noop", objects, topos, stream, check="noop",
                   workers=args.kueue_workers)
        ours = run("Kueue + topology-fit", Path(tmp) / "check", objects, topos, stream, check="topolet",
                   workers=args.kueue_workers)
    print(f"{'run':<22} {'admitted':>9} {'p50 s':>7} {'p99 s':>7} {'pods':>6} {'bound':>6} {'aligned':>8}")
    both = set(ours.latencies) & set(plain.latencies) & set(noop.latencies)
    for r in (ours, noop, plain):
        print(f"{r.name:<22} {r.admitted:>4}/{r.workloads:<4} {r.p(0.5, both):>7.2f} {r.p(0.99, both):>7.2f} "
              f"{r.pods:>6} {r.bound:>6} {r.aligned_share * 100:>7.1f}%")
    print(f"# latency over the {len(both)} Workloads admitted in both runs; seconds per step, p50/p99:")
    for r in (ours, noop, plain):
        cells = []
        for k, step in enumerate(STEPS):
            values = [r.steps[j][k] for j in both]
            p50, p99 = (percentile(values, 0.5), percentile(values, 0.99)) if values else (math.nan, math.nan)
            cells.append(f"{step} {p50:.2f}/{p99:.2f}")
        print(f"#   {r.name:<22} {', '.join(cells)}")
    if ours.admitted != plain.admitted or len(both) != len(stream):
        print(f"# WARNING: {ours.admitted} Workloads admitted with the check, {plain.admitted} without, "
              f"{len(both)} in both, of {len(stream)}")
    ratio = ours.p(0.99, both) / plain.p(0.99, both) if both else float("nan")
    over_noop = ours.p(0.99, both) / noop.p(0.99, both) if both else float("nan")
    print(f"kueue: aligned {ours.aligned_share * 100:.1f}% with check vs {plain.aligned_share * 100:.1f}% "
          f"without; admission p99 with/without = {ratio:.2f}, with/no-op check = {over_noop:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
