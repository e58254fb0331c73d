#!/usr/bin/env python3
"""Training gangs through real Kueue in four arms: with the `topolet.io/topology-fit` check, Kueue alone,
Kueue's Topology Aware Scheduling, and a no-op check.

The arms run one after another on one fresh test cluster (tests/controlplane/cluster.py: etcd,
kube-apiserver, kube-controller-manager, kube-scheduler) with real Kueue v0.17.0 on it
(tests/controlplane/kueue.py) and the real operators the kinds need (tests/controlplane/operators.py:
JobSet v0.11.1, Kubeflow Trainer v2.2.0, the MPI operator v0.8.0, LeaderWorkerSet v0.8.0), cleaned
between arms: every gang object, child, pod and Workload deleted and gone, then the arm's Kueue objects
(queues, flavor, check, Topology), the controller stopped, the stand-in agents' NRTs back to what the
fillers alone hold.  Starting the cluster, Kueue and the operators takes most of a minute on 2 cores
(and the MPI operator may wait its turn on a lock another test session holds), so one start instead
of four makes the run shorter by minutes; the arms then differ only in what ran before them on the
same processes.  The order (Kueue alone, TAS, no-op check, topology-fit, then the no-op and
topology-fit pair again for each further `--rounds`, default 3) runs each topology-fit arm after its
no-op arm, and its controller and placement policy beside no other arm (the policy is deleted after
it).  The nodes are the same in every
arm: `--nodes` Node objects with their NRTs and the bound filler pods that hold the NRTs' allocations
(from `bench/admission_workload.py`, all labelled `BLOCK_LABEL`, one block), and `--gangs` gangs of
single-numa-node Guaranteed pods in Kueue's tas pod-count mix, each one object of a kind of `--kinds`
(bench/kueue_kinds.py: Indexed Job, JobSet, TrainJob, MPIJob, LeaderWorkerSet), created at once on a
LocalQueue whose ClusterQueue has quota for all of them (quota never holds a gang back here):

- Kueue + topology-fit: the ClusterQueue lists the AdmissionCheck `topology-fit`, decided by
  `topolet controller --kueue on`; the kueue component's placement policy pins each pod to the node
  and zone the check chose for its rank, and the scheduler binds it there;
- Kueue alone: Kueue admits on quota, the kube-scheduler binds the pods on node totals;
- Kueue TAS: the flavor names a Topology of levels `BLOCK_LABEL`, `topolet.io/rack`,
  `kubernetes.io/hostname`, and every pod set asks `kueue.x-k8s.io/podset-required-topology` at the
  block level (as Kueue's docs tell training users to); TAS assigns each pod a node on node totals,
  its ungater pins the pod there;
- Kueue + no-op check: `NoopCheck` (bench/kueue_workloads.py, in this process) answers the check
  Ready, with no podSetUpdates, the moment it sees it Pending: what Kueue's own flow costs any check
  (two more Workload status writes), so the ratio against it is what topolet's decision adds.

The nodes' kubelets and agents are bench/admission_agents.py's stand-ins in every arm: each bound pod
is pinned by the agent's allocator (inside the zone the check named, when it named one), reported
Running, and its node's NRT republished.

Per arm: gangs wholly admitted (every pod bound) and partly running (some pods bound, not all, when
the arm ends), gangs spread over several nodes, the pods bound and the share of them their node pinned
in one zone, admission latency p50/p99 (from just before the object's create call until a watch sees
its Workload Admitted) over the Workloads admitted in every arm, the arm's wall seconds (first create
until the last admission or bind) and the CPU seconds every process spent in them (this one included;
2 cores here), and the seconds of each of STEPS.  Last line: `workloads: aligned 100.0% with check vs
X.X% Kueue alone vs Y.Y% Kueue TAS; kinds K; p99 with/no-op check = Q.QQ`: the alignment over every
topology-fit round, and the median over rounds of the p99 ratio of a round's two arms (over the
Workloads admitted in both).  The p99 of 100 gangs is the slowest one's latency, which one busy
second on a 2-core machine moves by a fifth, so one round is not a figure: each round's ratio and
its CPU seconds ratio are printed before the last line (bench/kueue_report.py).

Equal work: the default 40 nodes and 100 gangs (320 pods) are sized so that every gang fits NUMA-wise on
the static NRTs (the bench replays the gangs through the engine in creation order first and says how
many fit; 110 gangs would leave 2 out), so the check need never answer Retry, while the nodes are full
enough that placing on node totals puts some pods where no zone holds them (at 60 gangs the
scheduler's spreading aligned every pod).  Quick run: `--nodes 20 --gangs 40`; one kind without the
operators: `--kinds job`; the smoke test's: `--nodes 2 --gangs 5` (one gang of each kind).  A gang
the check rejects (a pod set it cannot place pod by pod) counts as not admitted; the arm prints why.

Kueue runs as upstream's manager config has it (5 reconcilers each for Jobs and Workloads);
`--kueue-workers` changes that for every arm.  With `--keep-logs`, each arm's Kueue, operator,
controller and cluster logs are copied there (a folder per arm, `check-2` for round 2's), and
`workloads.json` holds each gang's step times (Unix seconds) to set beside the controller's log.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import admission_workload as workload  # noqa: E402
import kueue_kinds as kinds  # noqa: E402
from admission_agents import NodeAgents  # noqa: E402
from admission_api import FILLER_NAMESPACE, NAMESPACE, BindWatch, _parallel, _populate  # noqa: E402
from admission_report import cpu_by_component  # noqa: E402
from kueue_report import ARMS, PAIR, Arm, Run, report  # noqa: E402
from kueue_workloads import CHECK, NOOP_CONTROLLER, AdmitWatch, NoopCheck  # noqa: E402

from agent.admission.cluster.ledger import Ledger  # noqa: E402
from agent.admission.cluster.view import build_view  # noqa: E402
from agent.admission.engine.model import Placement  # noqa: E402
from agent.admission.engine.place import commit, place  # noqa: E402
from agent.errors import KubeAPIError  # noqa: E402
from agent.kubeapi.client import KubeClient  # noqa: E402
from agent.topology.model import Topology  # noqa: E402
from tests.controlplane.kueue import (  # noqa: E402
    DEFAULT_API_QPS,
    Kueue,
    KueueObjects,
    kueue_path,
    resource_flavor,
    start_kueue,
)
from tests.controlplane.operators import Operators, start_operators  # noqa: E402
from tests.kueue.test_check import POLICY, install_policy  # noqa: E402

# The reconcilers `--kueue-workers` sets (see daemonset/components/kueue/README.md, "Latency").
WORKER_KINDS = ("Job.batch", "Workload.kueue.x-k8s.io")
DEFAULT_WORKERS = 5
# No admission, rejection or bind for this long ends an arm (some gangs never get in): longer than the
# controller's ledger timeout (120 s) plus a Retry backoff step (up to 80 s by then), so that a gang told
# Retry while the ledger still counts slots the pods of admitted gangs hold is not taken for one.
STALL_S = 240.0
CLEAN_S = 180.0  # the most an arm's objects may take to go
PROGRESS_S = 15.0
BLOCK_LABEL = "bench.topolet.io/block"  # every node in block-0: the level TAS pod sets ask for
TOPOLOGY_LEVELS = (BLOCK_LABEL, workload.RACK_LABEL, "kubernetes.io/hostname")
QUEUE = "lq"
KEEP_LOGS: Path | None = None  # --keep-logs: copy each arm's logs here


def _wait(what: Any, done: Any, last: Any, start: float) -> None:
    """Until `done()`, or until `last()` (the monotonic time of the latest progress) is STALL_S old;
    `what()` says how far it got."""
    progress = time.monotonic()
    while not done():
        now = time.monotonic()
        if now - max(last(), start) > STALL_S:
            print(f"# {what()}: no progress for {STALL_S:.0f} s, stopped waiting", flush=True)
            return
        if now - progress >= PROGRESS_S:
            progress = now
            print(f"# {what()} after {now - start:.0f} s", flush=True)
        time.sleep(0.1)


def _queues(api: KubeClient, arm: Arm, cpus: int) -> KueueObjects:
    """The arm's flavor (with its Topology for TAS), check, ClusterQueue and LocalQueue."""
    objects = KueueObjects(api)
    flavor = resource_flavor("default")
    if arm.tas:
        objects.create({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Topology",
                        "metadata": {"name": "bench"},
                        "spec": {"levels": [{"nodeLabel": level} for level in TOPOLOGY_LEVELS]}})
        flavor = resource_flavor("default", {BLOCK_LABEL: "block-0"})
        flavor["spec"]["topologyName"] = "bench"
    objects.create(flavor)
    if arm.check == "topolet":
        install_policy(api)
        objects.admission_check(CHECK)
    elif arm.check == "noop":
        objects.admission_check(CHECK, NOOP_CONTROLLER)
        objects.set_check_active(CHECK, field_manager=NOOP_CONTROLLER)
    objects.cluster_queue("cq", "default", {"cpu": str(cpus), "memory": f"{cpus}Gi"},
                          admission_checks=[CHECK] if arm.check else [])
    objects.local_queue(NAMESPACE, QUEUE, "cq")
    return objects


def _wait_active(objects: KueueObjects, arm: Arm) -> None:
    """Until the ClusterQueue is Active (with a check: once its controller set the check Active)."""
    deadline = time.monotonic() + 120
    while not any(c["type"] == "Active" and c["status"] == "True"
                  for c in objects.get("clusterqueues", "cq").get("status", {}).get("conditions") or []):
        if time.monotonic() > deadline:
            raise SystemExit(f"{arm.name}: the ClusterQueue never became Active")
        time.sleep(0.2)


def _gang_pods(api: KubeClient, stream: list[kinds.KindGang]) -> tuple[int, int, int]:
    """(gangs wholly bound, gangs partly bound, gangs wholly bound over several nodes), from the pods now."""
    nodes: dict[str, list[str]] = defaultdict(list)
    for pod in api.list(f"/api/v1/namespaces/{NAMESPACE}/pods")["items"]:
        if not pod["metadata"].get("deletionTimestamp"):
            nodes[kinds.gang_of(pod["metadata"]["name"])].append(pod["spec"].get("nodeName") or "")
    whole = partial = spread = 0
    for gang in stream:
        bound = [n for n in nodes.get(gang.name, ()) if n]
        whole += len(bound) >= gang.pods
        partial += 0 < len(bound) < gang.pods
        spread += len(bound) >= gang.pods and len(set(bound)) > 1
    return whole, partial, spread


@dataclass
class Stage:
    """The one cluster every arm runs on: Kueue, the operators, the nodes with their fillers."""

    kueue: Kueue
    operators: Operators | None
    objects: workload.Cluster
    topos: list[tuple[str, Topology]]

    @property
    def cluster(self) -> Any:
        return self.kueue.cluster

    def api(self) -> KubeClient:
        return KubeClient(self.cluster.plane.client())

    def logs(self) -> str:
        out = f"--- kueue ---\n{self.kueue.log_tail(2000)}\n{self.cluster.logs(2000)}"
        return out + (f"\n{self.operators.logs(2000)}" if self.operators is not None else "")

    def keep_logs(self, dest: Path) -> None:
        """Copy Kueue's, the operators', the controller's and the cluster's logs (so far) to `dest`."""
        dest.mkdir(parents=True, exist_ok=True)
        for log in [*self.cluster.workdir.glob("*.log"), self.kueue.workdir / "kueue.log",
                    *(self.kueue.workdir.parent / "operators").glob("*/*.log")]:
            if log.exists():
                shutil.copy(log, dest / log.name)

    def stop(self) -> None:
        if self.operators is not None:
            self.operators.stop()
        self.kueue.stop_all()


def stage(workdir: Path, objects: workload.Cluster, topos: list[tuple[str, Topology]],
          kind_names: tuple[str, ...], workers: int) -> Stage:
    """A fresh cluster with Kueue, the operators `kind_names` need, the nodes, NRTs and filler pods."""
    began = time.monotonic()
    kueue = start_kueue(workdir, concurrency={kind: workers for kind in WORKER_KINDS})
    up = f"cluster and Kueue up in {time.monotonic() - began:.0f} s"
    operators: Operators | None = None
    try:
        names = kinds.operators(kind_names)
        if names:
            operators = start_operators(kueue.cluster, workdir / "operators", names)
            up += f", operators {time.monotonic() - began:.0f} s (with any wait for the MPI operator's turn)"
        _populate(kueue.cluster, objects)
    except BaseException:
        print(f"--- kueue ---\n{kueue.log_tail(2000)}\n{kueue.cluster.logs(2000)}")
        if operators is not None:
            operators.stop()
        kueue.stop_all()
        raise
    print(f"# {up}, nodes {time.monotonic() - began:.0f} s", flush=True)
    return Stage(kueue, operators, objects, topos)


def run(arm: Arm, on: Stage, stream: list[kinds.KindGang], round_: int = 1) -> Run:
    """One arm on the stage: its queues (and check), the gangs created at once, until every one is in;
    then the stage cleaned for the next arm."""
    cluster = on.cluster
    api = on.api()
    topos = on.topos
    agents = NodeAgents(cluster, on.objects, lambda node: topos[int(node.split("-")[1]) % len(topos)][1],
                        "pod", NAMESPACE, FILLER_NAMESPACE)
    try:
        agents.prime()  # the fillers Running, every NRT as they alone hold it
        queues = _queues(api, arm, sum(workload.gang_cpus(g.gang) for g in stream))
        noop = NoopCheck(on.api, NAMESPACE) if arm.check == "noop" else None
        if arm.check == "topolet":
            cluster.start_controller("--kueue", "on")
        _wait_active(queues, arm)
        agents.start()
        admits = AdmitWatch(on.api(), NAMESPACE)
        binds = BindWatch(cluster)
        created: dict[str, float] = {}
        local = threading.local()
        required = BLOCK_LABEL if arm.tas else None

        def create(gang: kinds.KindGang) -> None:
            if not hasattr(local, "api"):
                local.api = on.api()
            body = kinds.body(gang, QUEUE, required)
            created[gang.name] = time.monotonic()
            local.api.create(kinds.path(gang, NAMESPACE), body)

        def want() -> int:  # the pods of the gangs not rejected
            return sum(g.pods for g in stream if g.name not in admits.rejected)

        cpu_before = sum(cpu_by_component({}).values())
        start = time.monotonic()
        try:
            _parallel(stream, create)
            _wait(lambda: f"{arm.name}: {len(admits.admitted)}/{len(stream)} admitted, "
                          f"{len(admits.rejected)} rejected",
                  lambda: len(admits.admitted) + len(admits.rejected) >= len(stream), lambda: admits.last,
                  start)
            _wait(lambda: f"{arm.name}: {len(binds.bound)}/{want()} pods bound",
                  lambda: len(binds.bound) >= want(), lambda: binds.last_bind, start)
            end = max([binds.last_bind, *admits.admitted.values(), start])
            cpu_s = sum(cpu_by_component({}).values()) - cpu_before
        finally:
            admits.close()
            binds.close()
            if noop is not None:
                noop.close()
            cluster.stop_controllers()
        agents.settle(set(binds.bound))
        whole, partial, spread = _gang_pods(api, stream)
        if KEEP_LOGS is not None:
            _keep(on, arm.key if round_ == 1 else f"{arm.key}-{round_}", created, admits)
        latencies = {g: admits.admitted[g] - created[g] for g in admits.admitted if g in created}
        kind_of = {g.name: g.kind for g in stream}
        result = Run(arm, len(stream), latencies, _steps(created, admits, latencies), dict(admits.rejected),
                     {g.name: admits.said.get(g.name, "") for g in stream
                      if g.name not in admits.admitted and g.name not in admits.rejected},
                     sum(g.pods for g in stream), len(binds.bound), agents.aligned(), whole, partial, spread,
                     end - start, cpu_s, Counter(kind_of.get(kinds.gang_of(key.partition("/")[2]), "?")
                                                 for key, _, _, aligned in agents.placements if not aligned),
                     round_)
    except BaseException:
        print(on.logs())
        raise
    finally:
        agents.stop()
    try:
        _clean(api, queues, arm)
    finally:
        api.close()
    return result


def _steps(created: dict[str, float], admits: AdmitWatch, among: dict[str, float]
           ) -> dict[str, tuple[float, ...]]:
    """The seconds of each of STEPS, per gang of `among`."""
    out: dict[str, tuple[float, ...]] = {}
    for g in among:
        reserved = admits.reserved.get(g, admits.admitted[g])
        # Without a check (or a state the watch missed between two events): no time on that step.
        pending = admits.pending.get(g, reserved)
        ready = admits.ready.get(g, pending)
        out[g] = (reserved - created[g], pending - reserved, ready - pending, admits.admitted[g] - ready)
    return out


def _keep(on: Stage, key: str, created: dict[str, float], admits: AdmitWatch) -> None:
    """The logs so far, and each gang's step times (Unix seconds) to set beside them, under
    KEEP_LOGS/`key`."""
    assert KEEP_LOGS is not None
    dest = KEEP_LOGS / key
    on.keep_logs(dest)
    wall = time.time() - time.monotonic()
    steps = (("reserved", admits.reserved), ("pending", admits.pending), ("ready", admits.ready),
             ("admitted", admits.admitted))
    (dest / "workloads.json").write_text(json.dumps({
        g: {"created": created[g] + wall, **{step: seen[g] + wall for step, seen in steps if g in seen}}
        for g in admits.admitted if g in created}, indent=1))


def _clean(api: KubeClient, queues: KueueObjects, arm: Arm) -> None:
    """Leave the stage as the arm found it: every gang object, child, pod and Workload of NAMESPACE gone
    (pods deleted at once: no kubelet is there to confirm), then the arm's Kueue objects."""
    deadline = time.monotonic() + CLEAN_S
    namespaced = [*kinds.collections(NAMESPACE), f"/apis/apps/v1/namespaces/{NAMESPACE}/statefulsets",
                  f"/api/v1/namespaces/{NAMESPACE}/pods", kueue_path("workloads", namespace=NAMESPACE)]
    left = _delete_until_gone(api, namespaced, deadline)
    queues.delete_created()
    cluster_scoped = ("clusterqueues", "resourceflavors", "admissionchecks", "topologies")
    kueue_objects = [kueue_path("localqueues", namespace=NAMESPACE), *(kueue_path(p) for p in cluster_scoped)]
    left += _delete_until_gone(api, kueue_objects, deadline)
    if arm.check == "topolet":  # the next round's no-op arm creates its pods without our policy
        for doc in yaml.safe_load_all(POLICY.read_text()):
            plural = {"MutatingAdmissionPolicy": "mutatingadmissionpolicies",
                      "MutatingAdmissionPolicyBinding": "mutatingadmissionpolicybindings"}[doc["kind"]]
            path = f"/apis/admissionregistration.k8s.io/v1/{plural}"
            try:
                api.request("DELETE", f"{path}/{doc['metadata']['name']}")
            except KubeAPIError as exc:
                if exc.status != 404:
                    raise
    if left:
        raise SystemExit(f"{arm.name}: {len(left)} objects still there {CLEAN_S:.0f} s after the arm: "
                         f"{', '.join(left[:10])}")


def _delete_until_gone(api: KubeClient, collections: list[str], deadline: float) -> list[str]:
    """Delete every object of `collections` (in that order, again each second) until they are empty or
    `deadline` passes; what is left."""
    while True:
        left = []
        for path in collections:
            try:
                items = api.list(path).get("items") or []
                if items:
                    left += [f"{path}/{i['metadata']['name']}" for i in items]
                    api.request("DELETE", path, query={"gracePeriodSeconds": 0,
                                                       "propagationPolicy": "Background"})
            except KubeAPIError as exc:
                if exc.status != 404:  # a kind no operator serves here
                    raise
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(1.0)


def _fit(objects: workload.Cluster, stream: list[kinds.KindGang]) -> int:
    """How many of the gangs the engine places on the static NRTs, one after another in creation order."""
    view, _ = build_view(objects.nodes, objects.nrts, objects.pods, Ledger(), 0.0)
    fit = 0
    for gang in stream:
        result = place(view, gang.gang)
        if isinstance(result, Placement):
            view = commit(view, gang.gang, result)
            fit += 1
    return fit


def _kinds(text: str) -> tuple[str, ...]:
    names = tuple(k.strip() for k in text.split(",") if k.strip())
    unknown = [k for k in names if k not in kinds.KINDS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"kinds are some of {','.join(kinds.KINDS)}, not {text!r}")
    return tuple(dict.fromkeys(names))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--nodes", type=int, default=40, help="Node objects with NRTs (default 40)")
    parser.add_argument("--gangs", type=int, default=100,
                        help="gangs queued (default 100: every one fits on the default 40 nodes)")
    parser.add_argument("--kinds", type=_kinds, default=kinds.KINDS,
                        help=f"the gangs' kinds, taken in turn (default {','.join(kinds.KINDS)})")
    parser.add_argument("--seed", type=int, default=42, help="workload seed (default 42)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds of the no-op and topology-fit pair (default 3; the last line's p99 "
                             "ratio is their median)")
    parser.add_argument("--dumps", type=Path, default=None, help="where the hwloc dumps are extracted")
    parser.add_argument("--kueue-workers", type=int, default=DEFAULT_WORKERS,
                        help=f"Kueue's Job and Workload reconcilers, every arm (default {DEFAULT_WORKERS}, "
                             "as upstream's manager config)")
    parser.add_argument("--keep-logs", type=Path, default=None,
                        help="copy each arm's Kueue, operator, controller and cluster logs here, and each "
                             "gang's step times (workloads.json)")
    args = parser.parse_args(argv)
    global KEEP_LOGS
    KEEP_LOGS = args.keep_logs
    kind_names: tuple[str, ...] = args.kinds
    with tempfile.TemporaryDirectory(prefix="topolet-kueue-") as tmp:
        topos = workload.topologies(args.dumps or Path(tmp) / "dumps")
        objects = workload.cluster(args.nodes, topos, args.seed)
        for node in objects.nodes:
            node["metadata"]["labels"][BLOCK_LABEL] = "block-0"
        stream = kinds.gangs(args.gangs, args.seed + 1, kind_names)
        mix = Counter(g.kind for g in stream)
        print(f"# through Kueue: {args.nodes} nodes, {len(objects.pods)} filler pods, {len(stream)} gangs "
              f"({sum(g.pods for g in stream)} pods; " + ", ".join(f"{k} {mix[k]}" for k in kind_names) + ")",
              flush=True)
        fit = _fit(objects, stream)
        print(f"# {fit}/{len(stream)} gangs fit NUMA-wise on the static NRTs in creation order"
              + ("" if fit == len(stream) else ": the check will answer Retry to the rest"), flush=True)
        print(f"# Kueue in every arm: client qps {DEFAULT_API_QPS}, {args.kueue_workers} workers each for "
              f"{', '.join(WORKER_KINDS)}; operators {', '.join(kinds.operators(kind_names)) or 'none'}",
              flush=True)
        on = stage(Path(tmp) / "stage", objects, topos, kind_names, args.kueue_workers)
        runs: list[Run] = []
        order = [(arm, 1) for arm in ARMS] + [(arm, k) for k in range(2, args.rounds + 1) for arm in PAIR]
        try:
            for arm, round_ in order:
                started = time.monotonic()
                runs.append(run(arm, on, stream, round_))
                print(f"# {runs[-1].name}: done in {time.monotonic() - started:.0f} s, the stage cleaned "
                      "after it", flush=True)
        finally:
            on.stop()
    report(runs, stream, kind_names)
    return 0


if __name__ == "__main__":
    sys.exit(main())
