"""Admission through the real API server: `topolet controller` against the plain kube-scheduler, same pods.

`through_api(nodes, gangs, seed, rounds=1)` runs both placers `rounds` times (the order swapped every
round; the reported wall ratio is the median of the rounds'), each run on a fresh test cluster
(tests/controlplane/cluster.py: etcd, kube-apiserver, kube-controller-manager, kube-scheduler) holding
the same objects from `bench/admission_workload.py`: `nodes` Node objects and their NRTs (created
directly, no agent processes at this scale), the bound filler pods that hold the NRTs' allocations,
and `gangs` Indexed Jobs of single-numa-node pods:

- scheduler only: the Jobs are created unsuspended; the Job controller makes the pods and the
  scheduler binds them on node totals;
- with topolet: the Jobs are created suspended with `topolet.io/queue`; `topolet controller` admits
  them, the Job controller makes the gated pods, the controller pins each to its node and zone, and
  the scheduler binds them.

Wall time: from the first Job's creation until every pod is bound (or until binding stalls for
`STALL_S`, when some gangs wait: their pods are reported apart).  Alignment: the pods bound to each
node are replayed, in creation order and after that node's fillers, through `agent.alloc.allocate`
with single-numa-node on the node's topology (inside the zone the controller named, as the agent
does); the share that gets CPUs in one zone is "aligned".  "Gang on one node" is the share of bound
pods whose Job's pods all share one node: the controller pins those by the Job's pod template, with no
per-pod policy or patch, so the API server's share of the run depends on it.  NRTs are static here,
so the controller runs with a ledger timeout longer than the run (placements never show up in an NRT
without agents).
"""

from __future__ import annotations

import argparse
import copy
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import admission_workload as workload  # noqa: E402

from agent.admission.engine.model import Gang  # noqa: E402
from agent.admission.gangs.slots import pod_target  # noqa: E402
from agent.alloc.exclusive import allocate  # noqa: E402
from agent.alloc.request import Request  # noqa: E402
from agent.errors import AllocationError, KubeAPIError  # noqa: E402
from agent.kube.client import KubeClient, resource_path  # noqa: E402
from agent.topology.cpuset import CPUSet  # noqa: E402
from agent.topology.model import Topology  # noqa: E402
from tests.controlplane.cluster import (  # noqa: E402
    NRT_GROUP,
    NRT_PLURAL,
    NRT_VERSION,
    Cluster,
    start_cluster,
)
from tests.controlplane.harness import PROFILING_ENV  # noqa: E402

NAMESPACE = "bench"
FILLER_NAMESPACE = "filler"  # bench/admission_workload.py's filler pods live there
QUEUE = "bench"
# No bind for this long after every Job exists: the rest wait (not admitted, or unschedulable). Longer
# than the controller's default resync (30 s), so a slow pass is not taken for a stall.
STALL_S = 120.0
PROGRESS_S = 15.0  # a progress line this often while pods are being bound
WORKERS = 8  # parallel object writers while setting up and creating Jobs
KEEP_LOGS: Path | None = None  # --keep-logs: copy each cluster's component logs here
PROFILE: Path | None = None  # --profile: the API server's CPU profile of each run's first seconds, here
PROFILE_SECONDS = 30
LEDGER_TIMEOUT_S = 24 * 3600  # longer than any run: static NRTs never show the controller's placements


def _cpu_by_component() -> dict[str, float]:
    """CPU seconds (user + system) so far of this process and each cluster component it started,
    by component: where the wall time of a run goes on a machine with few cores."""
    me = psutil.Process()
    out: dict[str, float] = defaultdict(float)
    for proc in [me, *me.children(recursive=True)]:
        try:
            times, argv = proc.cpu_times(), proc.cmdline()
        except psutil.Error:
            continue
        name = Path(argv[0]).name if argv else proc.name()
        if proc.pid == me.pid:
            name = "bench (this process)"
        elif "controller" in argv[1:3]:
            name = "topolet controller"
        out[name] += times.user + times.system
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

    @property
    def aligned_share(self) -> float:
        return self.aligned / self.bound if self.bound else 1.0


def _parallel(items: list[Any], work: Any) -> None:
    with ThreadPoolExecutor(WORKERS) as pool:
        for _ in pool.map(work, items):
            pass


def _job(gang: Gang, index: int, *, queued: bool) -> dict[str, Any]:
    (ps,) = gang.pod_sets
    res = {"cpu": str(ps.requests.cpu_milli // 1000), "memory": str(ps.requests.memory)}
    meta: dict[str, Any] = {"name": f"gang-{index:05d}"}
    if queued:
        meta["labels"] = {"topolet.io/queue": QUEUE}
    return {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": meta,
        "spec": {"completionMode": "Indexed", "completions": ps.count, "parallelism": ps.count,
                 "suspend": queued, "backoffLimit": 0,
                 "template": {"metadata": {"annotations": {"topolet.io/numa-policy": ps.numa_policy}},
                              "spec": {"restartPolicy": "Never", "automountServiceAccountToken": False,
                                       "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                                                       "resources": {"requests": res, "limits": res}}]}}},
    }


def _populate(cluster: Cluster, objects: workload.Cluster) -> None:
    """Nodes (Ready, untainted), their NRTs owned by them, the filler pods bound to them."""
    local = threading.local()

    def api() -> KubeClient:
        if not hasattr(local, "api"):
            local.api = KubeClient(cluster.plane.client())
        return local.api  # type: ignore[no-any-return]

    def node(pair: tuple[dict[str, Any], dict[str, Any]]) -> None:
        obj, nrt = pair
        status = obj["status"]
        uid = cluster.create_node_object(obj["metadata"]["name"], status["capacity"], status["allocatable"],
                                         labels=obj["metadata"]["labels"], api=api())
        body = copy.deepcopy(nrt)
        for ref in body["metadata"].get("ownerReferences") or []:
            ref["uid"] = uid  # the generated uid is not the API's
        api().create(resource_path(NRT_GROUP, NRT_VERSION, NRT_PLURAL), body)

    def filler(pod: dict[str, Any]) -> None:
        body = {k: v for k, v in pod.items() if k != "status"}
        body["metadata"] = {"name": pod["metadata"]["name"]}
        body["spec"] = dict(pod["spec"], automountServiceAccountToken=False,
                            containers=[dict(c, image="registry.k8s.io/pause:3.10")
                                        for c in pod["spec"]["containers"]])
        api().create(f"/api/v1/namespaces/{FILLER_NAMESPACE}/pods", body)

    setup = KubeClient(cluster.plane.client())
    try:
        for ns in (NAMESPACE, FILLER_NAMESPACE):
            setup.create("/api/v1/namespaces", {"metadata": {"name": ns}})
        _parallel(list(zip(objects.nodes, objects.nrts, strict=True)), node)
        _parallel(objects.pods, filler)
        # The Job controller needs the namespace's default service account before it makes pods.
        deadline = time.monotonic() + 60
        while True:
            try:
                setup.get(f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/default")
                break
            except KubeAPIError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    finally:
        setup.close()


class BindWatch:
    """Counts the pods of NAMESPACE bound to a node, from a watch; notes when the last one was."""

    def __init__(self, cluster: Cluster) -> None:
        self.api = KubeClient(cluster.plane.client())
        self.bound: set[str] = set()
        self.last_bind = time.monotonic()
        self.last_created = time.monotonic()  # when the last pod appeared
        self._stop = threading.Event()
        self._stream: Any = None
        listed = self.api.list(f"/api/v1/namespaces/{NAMESPACE}/pods")
        self._rv = listed["metadata"]["resourceVersion"]
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with self.api.watch(f"/api/v1/namespaces/{NAMESPACE}/pods",
                                    {"resourceVersion": self._rv, "allowWatchBookmarks": True,
                                     "timeoutSeconds": 60}, timeout=(5.0, 90.0)) as stream:
                    self._stream = stream
                    for event in stream:
                        event = event or {}
                        obj = event.get("object") or {}
                        self._rv = (obj.get("metadata") or {}).get("resourceVersion", self._rv)
                        if event.get("type") == "ADDED":
                            self.last_created = time.monotonic()
                        if (obj.get("spec") or {}).get("nodeName"):
                            uid = obj["metadata"]["uid"]
                            if uid not in self.bound:
                                self.bound.add(uid)
                                self.last_bind = time.monotonic()
            except KubeAPIError:
                time.sleep(0.2)

    def close(self) -> None:
        self._stop.set()
        if self._stream is not None:
            self._stream.shutdown()
        self._thread.join(timeout=10)
        self.api.close()


def _gang_pods(cluster: Cluster) -> list[dict[str, Any]]:
    """The run's gang pods, as the API server has them now."""
    api = KubeClient(cluster.plane.client())
    try:
        pods: list[dict[str, Any]] = api.list(f"/api/v1/namespaces/{NAMESPACE}/pods")["items"]
    finally:
        api.close()
    return pods


def _on_one_node(cluster: Cluster) -> int:
    """How many bound gang pods share their node with every other pod of their Job (the controller
    pins such a gang by its Job's pod template: no per-pod policy or patch)."""
    jobs: dict[str, list[str]] = defaultdict(list)  # Job -> its pods' nodes
    for p in _gang_pods(cluster):
        jobs[(p["metadata"].get("labels") or {}).get("batch.kubernetes.io/job-name", "")].append(
            p["spec"].get("nodeName") or "")
    return sum(len(nodes) for nodes in jobs.values() if len(set(nodes)) == 1 and nodes[0])


def _replay(cluster: Cluster, objects: workload.Cluster, topos: list[tuple[str, Topology]]) -> int:
    """How many bound gang pods their node's allocator pins in one zone (see the module docstring)."""
    pods = _gang_pods(cluster)
    fillers: dict[str, list[int]] = defaultdict(list)
    for p in objects.pods:
        fillers[p["spec"]["nodeName"]].append(int(p["spec"]["containers"][0]["resources"]["requests"]["cpu"]))
    by_node: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for p in pods:
        if p["spec"].get("nodeName"):
            by_node[p["spec"]["nodeName"]].append(p)
    aligned = 0
    for name, bound in by_node.items():
        topo = topos[int(name.split("-")[1]) % len(topos)][1]
        free = topo.cpus
        for n in fillers[name]:  # the same allocations, in the same order, as the workload's fill
            free = free - allocate(topo, free, Request(cpus=n, numa_policy="single-numa-node"))
        bound.sort(key=lambda p: (p["metadata"]["creationTimestamp"], p["metadata"]["name"]))
        for p in bound:
            cpus = int(p["spec"]["containers"][0]["resources"]["requests"]["cpu"])
            target = pod_target(p)  # the zone annotation, or a one-node Job's placements entry
            near = frozenset((target.zone,)) if target is not None and target.zone is not None else None
            try:
                got: CPUSet = allocate(topo, free, Request(cpus=cpus, numa_policy="single-numa-node",
                                                           preferred_numa=near))
            except AllocationError:
                continue
            free = free - got
            aligned += 1
    return aligned


def _report_unbound(cluster: Cluster, want: int) -> None:
    """What holds the pods that never bound: a few of them, with the scheduler's last word."""
    api = KubeClient(cluster.plane.client())
    try:
        pods = api.list(f"/api/v1/namespaces/{NAMESPACE}/pods")["items"]
    finally:
        api.close()
    unbound = [p for p in pods if not p["spec"].get("nodeName")]
    print(f"# {len(pods)} of {want} pods exist, {len(unbound)} unbound; the first of them:")
    for p in unbound[:5]:
        why = [c.get("message", "") for c in p.get("status", {}).get("conditions") or []]
        print(f"#   {p['metadata']['name']}: gates {p['spec'].get('schedulingGates')}, node selector "
              f"{p['spec'].get('nodeSelector')}, annotations {p['metadata'].get('annotations')}, {why}")


def _profile_api_server(cluster: Cluster, name: str) -> threading.Thread:
    """Start taking the API server's CPU profile (pprof, PROFILE_SECONDS from now) into PROFILE; read it
    with `go tool pprof -top <kube-apiserver binary> <file>`."""
    assert PROFILE is not None
    dest = PROFILE / f"{name.replace(' ', '-')}-kube-apiserver.pprof"

    def take() -> None:
        api = KubeClient(cluster.plane.client())
        try:
            resp = api._send("GET", "/debug/pprof/profile", {"seconds": PROFILE_SECONDS}, None, None,  # noqa: SLF001
                             (5.0, PROFILE_SECONDS + 60.0), "API server CPU profile")
            try:
                dest.write_bytes(resp.data)
            finally:
                resp.release_conn()
            print(f"# {name}: API server CPU profile of the first {PROFILE_SECONDS} s in {dest}", flush=True)
        except KubeAPIError as exc:
            print(f"# {name}: no API server profile: {exc}", flush=True)
        finally:
            api.close()

    PROFILE.mkdir(parents=True, exist_ok=True)
    thread = threading.Thread(target=take, name="pprof", daemon=True)
    thread.start()
    return thread


def _run(name: str, workdir: Path, objects: workload.Cluster, topos: list[tuple[str, Topology]],
         stream: list[Gang], *, controller: bool) -> ApiRun:
    cluster = start_cluster(workdir)
    try:
        _populate(cluster, objects)
        if controller:
            cluster.start_controller("--ledger-timeout-seconds", str(LEDGER_TIMEOUT_S))
        want = sum(ps.count for g in stream for ps in g.pod_sets)
        watch = BindWatch(cluster)
        local = threading.local()

        def create(item: tuple[int, Gang]) -> None:
            if not hasattr(local, "api"):
                local.api = KubeClient(cluster.plane.client())
            local.api.create(f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs",
                             _job(item[1], item[0], queued=controller))

        try:
            profiler = _profile_api_server(cluster, name) if PROFILE is not None else None
            cpu_before = _cpu_by_component()
            start = time.monotonic()
            _parallel(list(enumerate(stream)), create)
            created = time.monotonic()
            progress = created
            while len(watch.bound) < want:
                now = time.monotonic()
                if now - max(watch.last_bind, created) > STALL_S:
                    break
                if not cluster.running():
                    raise SystemExit(f"a cluster component died:\n{cluster.logs()}")
                if now - progress >= PROGRESS_S:
                    progress = now
                    print(f"# {name}: {len(watch.bound)}/{want} pods bound after {now - start:.0f} s",
                          flush=True)
                time.sleep(0.1)
            bound = len(watch.bound)
            wall = (watch.last_bind if bound else time.monotonic()) - start
            if bound < want:
                _report_unbound(cluster, want)
            print(f"# {name}: Jobs created after {created - start:.1f} s, the last pod after "
                  f"{watch.last_created - start:.1f} s, the last bind after {wall:.1f} s", flush=True)
            used = {k: v - cpu_before.get(k, 0.0) for k, v in _cpu_by_component().items()}
            cpu_s = sum(used.values())
            print(f"# {name}: CPU seconds while binding: "
                  + ", ".join(f"{k} {v:.1f}" for k, v in sorted(used.items(), key=lambda kv: -kv[1])),
                  flush=True)
        finally:
            watch.close()
            if profiler is not None:
                profiler.join()
        aligned = _replay(cluster, objects, topos)
        return ApiRun(name, want, bound, wall, aligned, _on_one_node(cluster), cpu_s)
    except BaseException:
        print(cluster.logs(2000))
        raise
    finally:
        cluster.stop()
        if KEEP_LOGS is not None:  # the controller's per-pass timing lines, for profiling
            dest = KEEP_LOGS / workdir.name
            dest.mkdir(parents=True, exist_ok=True)
            for log in cluster.workdir.glob("*.log"):
                shutil.copy(log, dest / log.name)


def through_api(nodes: int = 1000, gangs: int = 3000, seed: int = 42, dumps: Path | None = None,
                rounds: int = 1) -> tuple[list[ApiRun], list[ApiRun]]:
    """`rounds` pairs of runs on fresh clusters with the same objects, the order swapped every round
    (so load that comes and goes on a shared machine does not always fall on the same placer); prints
    them side by side; (topolet runs, plain runs), round by round."""
    ours: list[ApiRun] = []
    plain: list[ApiRun] = []
    with tempfile.TemporaryDirectory(prefix="topolet-admission-api-") as tmp:
        topos = workload.topologies(dumps or Path(tmp) / "dumps")
        objects = workload.cluster(nodes, topos, seed)
        stream = workload.gangs(gangs, seed + 1)
        print(f"# through the API: {nodes} nodes, {len(objects.pods)} filler pods, {gangs} gangs "
              f"({sum(ps.count for g in stream for ps in g.pod_sets)} pods), {rounds} round(s)", flush=True)
        for r in range(rounds):
            order = (False, True) if r % 2 == 0 else (True, False)
            for controller in order:
                name = "topolet controller" if controller else "kube-scheduler only"
                run = _run(name, Path(tmp) / f"{'topolet' if controller else 'plain'}-{r}", objects, topos,
                           stream, controller=controller)
                (ours if controller else plain).append(run)
    print(f"{'placer':<24} {'round':>5} {'pods':>7} {'bound':>7} {'wall s':>8} {'aligned':>8} "
          f"{'gang on one node':>17}")
    for r in range(rounds):
        for run in (ours[r], plain[r]):
            share = run.one_node / run.bound * 100 if run.bound else 0.0
            print(f"{run.name:<24} {r + 1:>5} {run.pods:>7} {run.bound:>7} {run.wall_s:>8.1f} "
                  f"{run.aligned_share * 100:>7.1f}% {share:>16.1f}%")
    if rounds > 1:
        ratios = (f"{o.wall_s / p.wall_s:.2f}" for o, p in zip(ours, plain, strict=True))
        print("# wall ratio by round: " + ", ".join(ratios))
        # Both runs are CPU-bound on a small machine: the CPU they took is a second view of the same
        # comparison (on a shared VM it moves with the machine's speed too, less with steal time).
        cpu = [o.cpu_s / p.cpu_s for o, p in zip(ours, plain, strict=True) if p.cpu_s]
        if cpu:
            print("# CPU-seconds ratio by round: " + ", ".join(f"{c:.2f}" for c in cpu)
                  + f"; median {statistics.median(cpu):.2f}")
    return ours, plain


def last_line(ours: list[ApiRun], plain: list[ApiRun]) -> str:
    """The bench's required last line: the median of the rounds' wall ratios (after a warning line when
    a round's runs bound different counts)."""
    for o, p in zip(ours, plain, strict=True):
        if o.bound != p.bound:
            print(f"# WARNING: the runs bound different numbers of pods ({o.bound} with the controller, "
                  f"{p.bound} scheduler-only, {STALL_S:.0f} s without a bind ended a run): the wall ratio "
                  "compares unequal work")
    ratio = statistics.median(o.wall_s / p.wall_s if p.wall_s else float("nan")
                              for o, p in zip(ours, plain, strict=True))
    bound = sum(o.bound for o in ours)
    aligned = sum(o.aligned for o in ours) / bound if bound else 1.0
    plain_bound = sum(p.bound for p in plain)
    plain_aligned = sum(p.aligned for p in plain) / plain_bound if plain_bound else 1.0
    return (f"admission: {ours[0].bound} pods aligned {aligned * 100:.1f}% vs scheduler-only "
            f"{plain_aligned * 100:.1f}%; wall with controller / scheduler-only = {ratio:.2f}")


def main(argv: list[str] | None = None) -> int:
    global KEEP_LOGS, PROFILE, PROFILE_SECONDS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--gangs", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--rounds", type=int, default=3,
                        help="pairs of runs, the order swapped each round; the ratio is their median")
    parser.add_argument("--dumps", type=Path, default=None)
    parser.add_argument("--keep-logs", type=Path, default=None,
                        help="copy each run's component logs (the controller's timing lines) here")
    parser.add_argument("--profile-seconds", type=int, default=PROFILE_SECONDS,
                        help="how long each profile runs from the first Job's creation")
    parser.add_argument("--profile", type=Path, default=None,
                        help="the API server's CPU profile of each run's first --profile-seconds, here")
    args = parser.parse_args(argv)
    KEEP_LOGS, PROFILE, PROFILE_SECONDS = args.keep_logs, args.profile, args.profile_seconds
    if PROFILE is not None:
        os.environ[PROFILING_ENV] = "1"
    print(last_line(*through_api(args.nodes, args.gangs, args.seed, args.dumps, args.rounds)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
