"""Admission through the real API server: `topolet controller` against the plain kube-scheduler and
against the NUMA-aware peer (kube-scheduler with scheduler-plugins' NodeResourceTopologyMatch and
Coscheduling), same pods.

`through_api(nodes, gangs, seed, rounds=1, scopes=("pod",))` runs every placer `rounds` times (the
order rotated every round; the reported wall ratios are the medians of the rounds'), each run on a
fresh test cluster
(tests/controlplane/cluster.py: etcd, kube-apiserver, kube-controller-manager, kube-scheduler) holding
the same objects from `bench/admission_workload.py`: `nodes` Node objects and their NRTs, the
bound filler pods that hold the NRTs' allocations, and `gangs` Indexed Jobs of single-numa-node pods.
The nodes' kubelets and agents are played by `bench/admission_agents.py` in every arm: each bound pod
gets its CPUs from the agent's allocator, is reported Running, and its node's NRT is republished with
the new `available` and pod fingerprint.

- scheduler only: the Jobs are created unsuspended; the Job controller makes the pods and the
  scheduler binds them on node totals;
- with topolet: the Jobs are created suspended with `topolet.io/queue`; `topolet controller` admits
  them, the Job controller makes the gated pods, the controller pins each to its node and zone, and
  the scheduler binds them;
- NRT plugin (one run per NRT topologyManagerScope in `scopes`): a PodGroup per gang (`minMember` =
  its pods) and the Job unsuspended with its pods labelled into the group and handed to the peer's
  scheduler profile, which runs beside the cluster's own scheduler under its own service account and
  RBAC (`bench/admission_peer.py` says how it is set up).

Wall time: from the first Job's creation until every pod is bound (or until binding stalls for
`STALL_S`, when some gangs wait: their pods are reported apart). Gangs are counted wholly bound, or
partly bound at the end (some pods bound and holding resources while their siblings wait). CPU seconds
are per component (this process included) while binding; peak RSS (VmHWM) per component at the end,
among them topolet's controller and the peer scheduler. Alignment: the share of bound pods whose node's
stand-in agent pinned them inside one zone (single-numa-node, in the zone the controller named). "Gang
on one node" is the share of bound pods whose Job's pods all share one node: the controller pins those
by the Job's pod template, with no per-pod policy or patch, so the API server's share of the run depends
on it. The controller runs with its default ledger timeout: its placements show in the NRTs once the
stand-in agents publish them.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import admission_workload as workload  # noqa: E402
from admission_agents import NodeAgents  # noqa: E402
from admission_peer import (  # noqa: E402
    FILLER_SCHEDULER,
    SCOPES,
    PeerScheduler,
    build_peer,
    peer_objects,
    scope_list,
)
from admission_report import (  # noqa: E402
    CONTROLLER,
    PLAIN,
    STALL_S,
    ApiRun,
    counts_line,
    cpu_by_component,
    last_line,
    peak_rss_mib,
    print_table,
    timing_line,
    usage_line,
)
from apimetrics import delta, request_counts, requests_line  # noqa: E402

from agent.admission.engine.model import Gang  # noqa: E402
from agent.errors import KubeAPIError  # noqa: E402
from agent.kubeapi.client import KubeClient, resource_path  # noqa: E402
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
CONTROLLER_ARGS = ("--queue", f"{QUEUE}=BestEffortFIFO:{NAMESPACE}")
PROGRESS_S = 15.0  # a progress line this often while pods are being bound
WORKERS = 8  # parallel object writers while setting up and creating Jobs
KEEP_LOGS: Path | None = None  # --keep-logs: copy each cluster's component logs here
PROFILE: Path | None = None  # --profile: the API server's CPU profile of each run's first seconds, here
PROFILE_SECONDS = 30
PEER_V = 0  # --peer-v: the peer scheduler's klog verbosity (its logs kept with --keep-logs)


@dataclass(frozen=True)
class Arm:
    """One placer: the plain scheduler, topolet's controller, or the peer with NRTs of `scope`."""

    name: str
    controller: bool = False
    scope: str | None = None  # the NRT plugin's run, NRTs of this topologyManagerScope

    @property
    def key(self) -> str:
        return "topolet" if self.controller else f"nrt-{self.scope}" if self.scope else "plain"


def arms(scopes: tuple[str, ...] = ("pod",)) -> list[Arm]:
    """The placers of a round, in the first round's order: plain, topolet, then the peer per scope."""
    return [Arm(PLAIN), Arm(CONTROLLER, controller=True),
            *(Arm(f"NRT plugin, scope {s}", scope=s) for s in scopes)]


def _parallel(items: list[Any], work: Any) -> None:
    with ThreadPoolExecutor(WORKERS) as pool:
        for _ in pool.map(work, items):
            pass


def _job_name(index: int) -> str:
    return f"gang-{index:05d}"


def _job(gang: Gang, index: int, *, queued: bool) -> dict[str, Any]:
    (ps,) = gang.pod_sets
    res = {"cpu": str(ps.requests.cpu_milli // 1000), "memory": str(ps.requests.memory)}
    meta: dict[str, Any] = {"name": _job_name(index)}
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


def _populate(cluster: Cluster, objects: workload.Cluster, filler_scheduler: str | None = None) -> None:
    """Nodes (Ready, untainted), their NRTs owned by them, the filler pods bound to them (with
    `filler_scheduler` as their schedulerName when given)."""
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
        if filler_scheduler is not None:
            body["spec"]["schedulerName"] = filler_scheduler
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
        # pods bound before the run's clock (a bench's probe): counted, not timed
        self.bound.update(p["metadata"]["uid"] for p in listed["items"] if p["spec"].get("nodeName"))
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


def _nodes_by_job(cluster: Cluster) -> dict[str, list[str]]:
    """Job -> the nodes of its pods ("" for a pod not bound)."""
    jobs: dict[str, list[str]] = defaultdict(list)
    for p in _gang_pods(cluster):
        jobs[(p["metadata"].get("labels") or {}).get("batch.kubernetes.io/job-name", "")].append(
            p["spec"].get("nodeName") or "")
    return jobs


def _on_one_node(jobs: Mapping[str, list[str]]) -> int:
    """How many bound gang pods share their node with every other pod of their Job (the controller
    pins such a gang by its Job's pod template: no per-pod policy or patch)."""
    return sum(len(nodes) for nodes in jobs.values() if len(set(nodes)) == 1 and nodes[0])


def _gang_counts(jobs: Mapping[str, list[str]], stream: list[Gang]) -> tuple[int, int]:
    """(gangs wholly bound, gangs partly bound): a gang's pods that were never made count as unbound."""
    whole = partial = 0
    for index, gang in enumerate(stream):
        bound = sum(1 for node in jobs.get(_job_name(index), ()) if node)
        want = sum(ps.count for ps in gang.pod_sets)
        whole += bound == want
        partial += 0 < bound < want
    return whole, partial


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


class Extras(Protocol):
    """What a bench built on `_run` adds to each run (bench/scale.py): work before the placer starts,
    once the controller runs (pods it adds to the count), and once the run's pods are bound."""

    def before_start(self, cluster: Cluster, arm: Arm) -> None: ...

    def controller_started(self, cluster: Cluster) -> int: ...

    def after_run(self, cluster: Cluster, arm: Arm, agents: NodeAgents) -> None: ...


def _run(arm: Arm, workdir: Path, objects: workload.Cluster, topos: list[tuple[str, Topology]],
         stream: list[Gang], peer_binary: Path | None = None, extras: Extras | None = None) -> ApiRun:
    name = arm.name
    cluster = start_cluster(workdir)
    peer: PeerScheduler | None = None
    agents: NodeAgents | None = None
    profiler: threading.Thread | None = None
    try:
        _populate(cluster, objects, filler_scheduler=FILLER_SCHEDULER if arm.scope else None)
        agents = NodeAgents(cluster, objects, lambda node: topos[int(node.split("-")[1]) % len(topos)][1],
                            arm.scope or "pod", NAMESPACE, FILLER_NAMESPACE)
        agents.prime()
        if extras is not None:
            extras.before_start(cluster, arm)
        probes = 0
        if arm.controller:
            cluster.start_controller(*CONTROLLER_ARGS)
            if extras is not None:
                probes = extras.controller_started(cluster)
        if arm.scope:
            assert peer_binary is not None
            peer = PeerScheduler(cluster, peer_binary, verbosity=PEER_V)
            peer.start()
        labels = peer.labels if peer is not None else {}
        want = sum(ps.count for g in stream for ps in g.pod_sets) + probes
        agents.start()
        watch = BindWatch(cluster)
        local = threading.local()

        def create(item: tuple[int, Gang]) -> None:
            if not hasattr(local, "api"):
                local.api = KubeClient(cluster.plane.client())
            job = _job(item[1], item[0], queued=arm.controller)
            for path, body in (peer_objects(job, NAMESPACE) if peer is not None
                               else [(f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs", job)]):
                local.api.create(path, body)

        try:
            profiler = _profile_api_server(cluster, name) if PROFILE is not None else None
            cpu_before = cpu_by_component(labels)
            requests_before = request_counts(cluster.plane)
            start = time.monotonic()
            _parallel(list(enumerate(stream)), create)
            created = time.monotonic()
            progress = created
            while len(watch.bound) < want:
                now = time.monotonic()
                if now - max(watch.last_bind, created) > STALL_S:
                    break
                if not cluster.running() or (peer is not None and not peer.running()):
                    raise SystemExit(f"a cluster component died:\n{cluster.logs()}\n"
                                     f"{peer.log_tail() if peer else ''}")
                if now - progress >= PROGRESS_S:
                    progress = now
                    print(f"# {name}: {len(watch.bound)}/{want} pods bound after {now - start:.0f} s",
                          flush=True)
                time.sleep(0.1)
            bound = len(watch.bound)
            wall = (watch.last_bind if bound else time.monotonic()) - start
            if bound < want:
                _report_unbound(cluster, want)
            print(timing_line(name, created - start, watch.last_created - start, wall), flush=True)
            used = {k: v - cpu_before.get(k, 0.0) for k, v in cpu_by_component(labels).items()}
            requests = delta(requests_before, request_counts(cluster.plane))
            rss = peak_rss_mib(labels)
            print(usage_line(name, used, rss), flush=True)
            print(requests_line(name, requests, want), flush=True)
        finally:
            watch.close()
            if profiler is not None:
                profiler.join()
        agents.settle(set(watch.bound))
        aligned = agents.aligned()
        if agents.errors:
            print(f"# {name}: {len(agents.errors)} node-agent errors, the first: {agents.errors[:3]}",
                  flush=True)
        jobs = _nodes_by_job(cluster)
        whole, partial = _gang_counts(jobs, stream)
        run = ApiRun(name, want, bound, wall, aligned, _on_one_node(jobs), sum(used.values()),
                     len(stream), whole, partial, used, rss, dict(requests))
        print(counts_line(run), flush=True)
        if extras is not None:
            extras.after_run(cluster, arm, agents)
        return run
    except BaseException:
        print(cluster.logs(2000))
        if peer is not None:
            print(peer.log_tail(4000))
        raise
    finally:
        if agents is not None:
            agents.stop()
        if peer is not None:
            peer.stop()
        cluster.stop()
        if KEEP_LOGS is not None:  # the controller's timing lines, the peer's cache logs
            dest = KEEP_LOGS / workdir.name
            dest.mkdir(parents=True, exist_ok=True)
            for log in cluster.workdir.glob("*.log"):
                shutil.copy(log, dest / log.name)
            if agents is not None:  # each gang pod's node, pin time (time.time()) and alignment
                (dest / "placements.json").write_text(json.dumps(agents.placements, indent=0))


def through_api(nodes: int = 1000, gangs: int = 3000, seed: int = 42, dumps: Path | None = None,
                rounds: int = 1, scopes: tuple[str, ...] = ("pod",),
                first_round: int = 0) -> dict[str, list[ApiRun]]:
    """`rounds` rounds of one run per placer (`arms(scopes)`), each on a fresh cluster with the same
    objects, the order rotated every round (so load that comes and goes on a shared machine does not
    always fall on the same placer; `first_round`: the rotation of the first, so that an invocation can
    go on from an earlier one's rounds, see bench/admission_combine.py); prints them side by side;
    {placer: its runs, round by round}."""
    placers = arms(scopes)
    runs: dict[str, list[ApiRun]] = {a.name: [] for a in placers}
    peer_binary = build_peer() if scopes else None
    with tempfile.TemporaryDirectory(prefix="topolet-admission-api-") as tmp:
        topos = workload.topologies(dumps or Path(tmp) / "dumps")
        objects = {s: workload.cluster(nodes, topos, seed, scope=s) for s in {"pod", *scopes}}
        stream = workload.gangs(gangs, seed + 1)
        print(f"# through the API: {nodes} nodes, {len(objects['pod'].pods)} filler pods, {gangs} gangs "
              f"({sum(ps.count for g in stream for ps in g.pod_sets)} pods), {rounds} round(s), placers: "
              + ", ".join(runs), flush=True)
        for r in range(first_round, first_round + rounds):
            k = r % len(placers)
            for arm in placers[k:] + placers[:k]:
                runs[arm.name].append(_run(arm, Path(tmp) / f"{arm.key}-{r}", objects[arm.scope or "pod"],
                                           topos, stream, peer_binary))
    print_table(runs, rounds)
    return runs


def main(argv: list[str] | None = None) -> int:
    global KEEP_LOGS, PROFILE, PROFILE_SECONDS, PEER_V
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--gangs", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds of one run per placer, the order rotated each round; ratios are medians")
    parser.add_argument("--scopes", type=scope_list, default=SCOPES,
                        help="NRT topologyManagerScopes to run the NRT plugin with, one run each "
                             "(pod,container; none: no peer run)")
    parser.add_argument("--dumps", type=Path, default=None)
    parser.add_argument("--keep-logs", type=Path, default=None,
                        help="copy each run's component logs (the controller's timing lines) here")
    parser.add_argument("--profile-seconds", type=int, default=PROFILE_SECONDS,
                        help="how long each profile runs from the first Job's creation")
    parser.add_argument("--profile", type=Path, default=None,
                        help="the API server's CPU profile of each run's first --profile-seconds, here")
    parser.add_argument("--first-round", type=int, default=0,
                        help="go on from this many rounds of an earlier invocation (the order's rotation)")
    parser.add_argument("--peer-v", type=int, default=0,
                        help="the peer scheduler's log verbosity (2: its reserve cache's reserves and "
                             "flushes; with --keep-logs, to see why a pod it placed was not aligned)")
    args = parser.parse_args(argv)
    KEEP_LOGS, PROFILE, PROFILE_SECONDS = args.keep_logs, args.profile, args.profile_seconds
    PEER_V = args.peer_v
    if PROFILE is not None:
        os.environ[PROFILING_ENV] = "1"
    print(last_line(through_api(args.nodes, args.gangs, args.seed, args.dumps, args.rounds, args.scopes,
                                args.first_round)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
