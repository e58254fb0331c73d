#!/usr/bin/env python3
"""Real node agents' API requests per node, idle and under pod churn, and what they make at 5,000 nodes.

Counted from the API server's own metrics (issue 37, item 6).

bench/scale.py's 5,000 nodes have stand-in agents; 5,000 agent processes do not fit this machine.  So
`--nodes` real `topolet agent` processes (tests/controlplane/cluster.py: each `--enforcement off` on a
Node shaped like the 64-CPU dump `DUMP`, with the DaemonSet's API-facing flags, `AGENT_ARGS`) run on a
test cluster of their own (etcd, kube-apiserver, kube-controller-manager, kube-scheduler and the
kubelets' stand-in, which reports a bound pod Running and finishes a deleted one), and are measured
per node.  Each agent asks the API server about its own node only (its pods by `spec.nodeName`, its
Node, its NRT), so its requests do not grow with the fleet; run at two sizes (`--nodes 5`, `--nodes
20`) to see the per-node figures hold.

Two arms on the same cluster, the same windows in each:
1. agents: the agents started, every one synced (its first pod list) and its NRT published, then
   `--settle` seconds quiet;
   - idle, `--idle` seconds: nothing changes;
   - churn, `--churn` seconds: `--pods-per-node` Guaranteed 1-CPU pods stand on every node (created
     before the window, pinned by the agents); every `--period` seconds each node gets a new one and
     loses its oldest (the nodes' turns spread over the period), so the agents pin, release and
     republish their NRTs;
2. baseline: the agents stopped, the same Nodes and kubelets' stand-in, the same two windows: what the
   control plane, the stand-in and this script's own pod writes cost without agents.

Each window: `apiserver_request_total`'s delta by verb and resource, per node per minute (bench/
apimetrics.py), the watches open (`apiserver_longrunning_requests`, verb WATCH: an idle window's median
of samples every `WATCH_SAMPLE_S`), and the
agents' own `topolet_api_writes_total` delta; the agents' share is the agents arm minus the baseline,
but for WATCH requests on resources the agents hold no watch on (the gauge says which they hold): those
renew the control plane's own watches, at random 5-10 minute timeouts, and are printed apart.
A watch is counted by `apiserver_request_total` when it ends: the agent asks `timeoutSeconds` 300
(agent/kubeapi/reflector.py), so an idle window shorter than 300 s sees its renewals or not by phase
(the agents start within seconds of each other); `--idle 300` counts each once.

Last line: `fleet: N agents, per node per minute idle R requests (W writes, H watches held), churn C
requests at P pod changes (X writes per pod change); 5000 agents: idle I/min, churn J/min, 5000*H = M
watches held` (the agents' share; churn at this script's churn rate per node).

Needs root and the control plane build (tests/controlplane/build.sh).
Run: `.venv/bin/python bench/fleet.py [--nodes 20] [--idle 60] [--churn 60] [--period 5]`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from apimetrics import Counts, delta, per_minute_line, request_counts, watches_held  # noqa: E402

from agent.errors import KubeAPIError  # noqa: E402
from agent.kubeapi.client import KubeClient, resource_path  # noqa: E402
from tests.conftest import extract_dump  # noqa: E402
from tests.controlplane.cluster import Cluster, SimNode, start_cluster  # noqa: E402
from tests.kube.kubelet_standin import wait_for  # noqa: E402

DUMP = "64fake-4n2s2ca2c2t"  # 64 CPUs in 4 NUMA nodes of 16
FLEET = 5000
NAMESPACE = "fleet"
RESERVED = "0"  # daemonset/agent.yaml's --reserved-cpus
# As daemonset/agent.yaml runs it (the label sink `auto` reads its Node every minute) and at the default
# reconcile period; later flags win over the test cluster's `--label-sink none --reconcile-seconds 1`.
AGENT_ARGS = ("--label-sink", "auto", "--numa-scope", "container", "--reconcile-seconds", "5")
SETTLE_S = 10.0  # default --settle: after start-up, a stop or a drain, before a window
READY_TIMEOUT_S = 300.0
WATCH_SAMPLE_S = 2.0  # the open watches are sampled this often in an idle window
SHOWN = 8  # verb/resource pairs of the agents' share printed per window


@dataclass(frozen=True)
class Window:
    """What one window cost: the API server's requests, the watches open (an idle window's median), the
    agents' writes."""

    name: str
    seconds: float
    requests: Counts
    watches: Counter[str]
    writes: float  # topolet_api_writes_total, summed over the running agents
    changes: int  # pods created + deleted in the window

    def per_node_minute(self, nodes: int) -> float:
        return sum(self.requests.values()) / (self.seconds / 60.0) / nodes


def agent_writes(nodes: list[SimNode]) -> float:
    """`topolet_api_writes_total` summed over the nodes whose agent runs."""
    return sum(n.metric("topolet_api_writes_total") for n in nodes
               if n.agent is not None and n.agent.running())


def pod_body(name: str, node: str) -> dict[str, Any]:
    """A Guaranteed pod of one exclusive CPU, bound to `node`."""
    res = {"cpu": "1", "memory": "64Mi"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"nodeName": node, "restartPolicy": "Never", "automountServiceAccountToken": False,
                     "containers": [{"name": "c0", "image": "registry.k8s.io/pause:3.10",
                                     "resources": {"requests": res, "limits": res}}]}}


class Churn:
    """`per_node` Guaranteed pods on every node; each `period` s every node gets a new one and loses its
    oldest, the nodes' turns spread evenly over the period."""

    def __init__(self, api: KubeClient, nodes: list[str], per_node: int, period: float) -> None:
        self.api, self.nodes, self.per_node, self.period = api, nodes, per_node, period
        self.live: dict[str, deque[str]] = {n: deque() for n in nodes}
        self.serial = 0
        self.collection = resource_path("", "v1", "pods", namespace=NAMESPACE)

    def _create(self, node: str) -> None:
        self.serial += 1
        name = f"{node}-p{self.serial}"
        self.api.create(self.collection, pod_body(name, node))
        self.live[node].append(name)

    def _delete(self, node: str) -> None:
        name = self.live[node].popleft()
        try:
            self.api.request("DELETE", f"{self.collection}/{name}")
        except KubeAPIError as exc:
            if exc.status != 404:
                raise

    def fill(self) -> None:
        """Bring every node to `per_node` pods."""
        for node in self.nodes:
            while len(self.live[node]) < self.per_node:
                self._create(node)

    def run(self, seconds: float) -> int:
        """Replace pods for `seconds`; the pods created and deleted."""
        step = self.period / len(self.nodes)
        began = time.monotonic()
        end, due, turn, changes = began + seconds, began + step, 0, 0
        while True:
            now = time.monotonic()
            if now >= end:
                return changes
            if now < due:
                time.sleep(min(due - now, end - now))
                continue
            node = self.nodes[turn % len(self.nodes)]
            self._create(node)
            self._delete(node)
            changes += 2
            turn += 1
            due += step

    def drain(self) -> None:
        """Delete every pod and wait until none is left."""
        for node in self.nodes:
            while self.live[node]:
                self._delete(node)
        wait_for(lambda: not self.api.list(self.collection).get("items"), "the churn pods gone",
                 timeout=READY_TIMEOUT_S, interval=0.5)


def measure(cluster: Cluster, nodes: list[SimNode], name: str, seconds: float,
            work: Callable[[float], int] | None = None) -> Window:
    """One window of `seconds`: idle, or `work(seconds)` (the pod changes it made)."""
    before, writes = request_counts(cluster.plane), agent_writes(nodes)
    began = time.monotonic()
    samples: list[Counter[str]] = []
    if work is None:
        while (left := began + seconds - time.monotonic()) > 0:
            samples.append(watches_held(cluster.plane))
            time.sleep(min(WATCH_SAMPLE_S, left))
        changes = 0
    else:
        changes = work(seconds)
    took = time.monotonic() - began
    samples.append(watches_held(cluster.plane))
    after = request_counts(cluster.plane)
    # The median of each resource's count over the samples: a watch being renewed at one sample's
    # instant (ended, not yet started again) does not count as one fewer.
    watches = Counter({r: statistics.median_low([s.get(r, 0) for s in samples])
                       for r in set().union(*samples)})
    window = Window(name, took, delta(before, after), watches, agent_writes(nodes) - writes, changes)
    print(per_minute_line(f"{name} ({took:.0f} s, {changes} pod changes)", before, after, took, len(nodes)),
          flush=True)
    return window


def run_arm(cluster: Cluster, nodes: list[SimNode], churn: Churn, arm: str,
            args: argparse.Namespace) -> tuple[Window, Window]:
    """The idle and the churn window of one arm."""
    idle = measure(cluster, nodes, f"{arm} idle", args.idle)
    churn.fill()
    time.sleep(args.settle)
    busy = measure(cluster, nodes, f"{arm} churn", args.churn, churn.run)
    churn.drain()
    time.sleep(args.settle)
    return idle, busy


def start_agents(cluster: Cluster, nodes: list[SimNode]) -> float:
    """Start every node's agent; seconds until each has listed its pods and published its NRT."""
    began = time.monotonic()
    for node in nodes:
        cluster.start_agent(node, *AGENT_ARGS)

    def ready(node: SimNode) -> bool:
        if node.agent is None or not node.agent.running():
            raise SystemExit(f"the agent of {node.name} exited:\n{node.log_text()[-3000:]}")
        try:  # this process's own first list and NRT write (the Node's first agent may have written one)
            return (node.metric("topolet_pod_lists_total") >= 1
                    and node.metric("topolet_api_writes_total", kind="nrt") >= 1)
        except (AssertionError, OSError):
            return False  # not serving yet

    for node in nodes:
        wait_for(lambda n=node: ready(n), f"the agent of {node.name} synced", timeout=READY_TIMEOUT_S,
                 interval=0.5)
    return time.monotonic() - began


def stop_agents(nodes: list[SimNode]) -> None:
    for node in nodes:
        if node.agent is not None:
            node.agent.stop()


def share(agents: Window, base: Window, nodes: int, watched: set[str]) -> tuple[float, float, str]:
    """The agents' requests per node per minute (agents arm minus baseline): (the share, the difference
    in WATCH requests on resources the agents hold no watch on, the pairs that make the share).

    The second is left out of the first: such a WATCH request renews a watch of the control plane's
    (kube-controller-manager's and kube-scheduler's informers, each ended by the server after a random
    5 to 10 minutes), so the two arms differ there only by when those renewals fall."""
    pairs: dict[tuple[str, str], float] = {}
    for key in set(agents.requests) | set(base.requests):
        pairs[key] = (agents.requests.get(key, 0) / agents.seconds
                      - base.requests.get(key, 0) / base.seconds) * 60.0 / nodes
    renewals = {k for k in pairs if k[0] == "WATCH" and k[1] not in watched}
    total = round(sum(v for k, v in pairs.items() if k not in renewals), 3) + 0.0  # never "-0.000"
    noise = round(sum(pairs[k] for k in renewals), 3) + 0.0
    ranked = sorted(((v, k) for k, v in pairs.items() if abs(v) >= 0.0005 and k not in renewals),
                    key=lambda p: -abs(p[0]))
    parts = [f"{verb} {resource} {v:+.3f}" for v, (verb, resource) in ranked[:SHOWN]]
    return total, noise, ", ".join(parts) or "none"


def watch_share(agents: Window, base: Window, nodes: int) -> tuple[float, str]:
    """Watches the agents hold per node (agents arm minus baseline, in the idle windows)."""
    diff = {r: agents.watches.get(r, 0) - base.watches.get(r, 0)
            for r in set(agents.watches) | set(base.watches)}
    parts = [f"{r} {n / nodes:+.2f}" for r, n in sorted(diff.items()) if n]
    return sum(diff.values()) / nodes, ", ".join(parts) or "none"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--nodes", type=int, default=20, help="nodes, each with a real agent (default 20)")
    ap.add_argument("--idle", type=float, default=60.0,
                    help="seconds of each idle window (default 60; 300, the agents' watch timeout, counts "
                         "every watch renewal once)")
    ap.add_argument("--churn", type=float, default=60.0, help="seconds of each churn window (default 60)")
    ap.add_argument("--period", type=float, default=5.0,
                    help="seconds between pod replacements on each node under churn (default 5: one pod "
                         "created and one deleted per node every 5 s)")
    ap.add_argument("--pods-per-node", type=int, default=2,
                    help="Guaranteed pods standing on each node under churn (default 2)")
    ap.add_argument("--settle", type=float, default=SETTLE_S,
                    help=f"seconds of quiet after the agents' start-up, a stop or a drain, before a window "
                         f"(default {SETTLE_S:.0f})")
    args = ap.parse_args(argv)
    if args.nodes < 1 or args.idle <= 0 or args.churn <= 0 or args.period <= 0 or args.pods_per_node < 1 \
            or args.settle < 0:
        ap.error("--nodes and --pods-per-node must be at least 1, the windows and --period positive, "
                 "--settle not negative")
    with tempfile.TemporaryDirectory(prefix="topolet-fleet-") as tmp:
        root = extract_dump(DUMP, Path(tmp) / "dumps")
        cluster = start_cluster(Path(tmp) / "stage")
        api = KubeClient(cluster.plane.client())
        try:
            api.create("/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
            # Nodes with agents (so the kubelets' stand-in serves them), stopped at once: their agents
            # start together below, with the DaemonSet's flags.
            nodes = [cluster.add_node(f"fleet-{i:04d}", root, reserved_cpus=RESERVED)
                     for i in range(args.nodes)]
            stop_agents(nodes)
            for node in nodes:  # the next agent appends to it: its /metrics port must be the only one
                (node.workdir / "agent.log").unlink(missing_ok=True)
            churn = Churn(api, [n.name for n in nodes], args.pods_per_node, args.period)
            ready_s = start_agents(cluster, nodes)
            print(f"# {args.nodes} agents synced and their NRTs published in {ready_s:.1f} s", flush=True)
            time.sleep(args.settle)
            agents_idle, agents_churn = run_arm(cluster, nodes, churn, "agents", args)
            stop_agents(nodes)
            time.sleep(args.settle)
            base_idle, base_churn = run_arm(cluster, nodes, churn, "baseline", args)
        except BaseException:
            print(cluster.logs(3000), file=sys.stderr)
            raise
        finally:
            api.close()
            cluster.stop()
    k = args.nodes
    held, held_parts = watch_share(agents_idle, base_idle, k)
    watched = {r for r in agents_idle.watches if agents_idle.watches[r] > base_idle.watches.get(r, 0)}
    idle, idle_noise, idle_parts = share(agents_idle, base_idle, k, watched)
    busy, busy_noise, busy_parts = share(agents_churn, base_churn, k, watched)
    idle_writes = agents_idle.writes / (agents_idle.seconds / 60.0) / k
    per_change = agents_churn.writes / max(agents_churn.changes, 1)
    rate = agents_churn.changes / (agents_churn.seconds / 60.0) / k
    print(f"# {k} nodes; per node per minute: {'window':<7} {'agents arm':>10} {'baseline':>9} "
          f"{'agents share':>12} {'control plane watch renewals':>28}")
    for name, a, b, d, n in (("idle", agents_idle, base_idle, idle, idle_noise),
                             ("churn", agents_churn, base_churn, busy, busy_noise)):
        print(f"#   {name:<7} {a.per_node_minute(k):>10.3f} {b.per_node_minute(k):>9.3f} {d:>12.3f} "
              f"{n:>+28.3f}")
    print(f"# agents' share idle: {idle_parts}")
    print(f"# agents' share churn ({rate:.1f} pod changes per node per minute): {busy_parts}; "
          f"{busy / max(rate, 1e-9):.2f} requests per pod change")
    print(f"# watches held per node: {held_parts} (agents arm {sum(agents_idle.watches.values())}, "
          f"baseline {sum(base_idle.watches.values())} in all)")
    print(f"# agents' own writes (topolet_api_writes_total): idle {idle_writes:.3f} per node per minute; "
          f"churn {agents_churn.writes:.0f} for {agents_churn.changes} pod changes")
    print(f"fleet: {k} agents, per node per minute idle {idle:.3f} requests ({idle_writes:.3f} writes, "
          f"{held:.2f} watches held), churn {busy:.3f} requests at {rate:.1f} pod changes "
          f"({per_change:.2f} writes per pod change); {FLEET} agents: idle {idle * FLEET:.0f}/min, "
          f"churn {busy * FLEET:.0f}/min, {FLEET}*{held:.2f} = {held * FLEET:.0f} watches held")
    return 0


if __name__ == "__main__":
    sys.exit(main())
