#!/usr/bin/env python3
"""Peak memory of `topolet controller` and of a node's agent when a tenant fills the cluster with pods of
about 1 MB of container arguments (issue 37, item 4: the outside review's attack), beside the same with
none, in one run.

One test cluster of its own (tests/controlplane/cluster.py: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler) and two Nodes shaped like the 64-CPU dump `DUMP`, without
agents at first.  A hostile pod carries `--pod-bytes` of JSON, nearly all of it container arguments of
two characters each (`"ab",` is 5 bytes on the wire and a list slot plus a str object of about 59 bytes
once decoded: the most decoded memory per byte a tenant can send; one-character strings are shared
singletons in CPython).  Each fits the API server's limits: a request body of at most 3 MiB and an
etcd object of at most 1.5 MiB (its protobuf is smaller than its JSON).

1. The controller, clean: `topolet controller` started, its peak RSS (VmHWM) read once its first
   decision pass is counted (`topolet_admission_pass_duration_seconds_count`), then stopped.
2. `--pods` hostile pods in a tenant namespace, each with a scheduling gate of the tenant's own (no
   node, no CPU asked), then the controller as in 1: it lists every pod of the cluster at start.
3. An agent, clean: `topolet agent --enforcement off` for the first Node (no pod bound to it), its
   VmHWM read once its first pod list is counted (`topolet_pod_lists_total`), then stopped.
4. `--node-pods` hostile pods bound to the second Node (`spec.nodeName`), then its agent as in 3.
5. What dropping the bulk while decoding (`agent.kubeapi.bulk.drop_bulk`, the stores' object hook)
   costs on an ordinary page: `--page-pods` pods as a Deployment makes them, with a kubelet's status
   (bench/lists.py), listed in one page; its bytes decoded by `json.loads` plain and with the hook, in
   this process, alternately, the best of `DECODE_ROUNDS` each (the result freed after the clock
   stops), with Python's cyclic GC paused (as the controller's stores list: the hook's own cost; the
   last line's ratio) and running (as the agent lists: a decode that holds more objects runs more
   collections).

Last line: `hostile: controller peak RSS B MiB clean vs H MiB with N pods of S MB; agent peak RSS B MiB
clean vs H MiB with M on its node; decode of a P-pod page with/without the hook R`.

Needs the control plane build (tests/controlplane/build.sh).
Run: `.venv/bin/python bench/hostile.py [--pods 100] [--node-pods 15] [--pod-bytes 1000000]`.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import lists  # noqa: E402
from procstat import peak_rss_mib  # noqa: E402

from agent.errors import KubeAPIError  # noqa: E402
from agent.kubeapi.bulk import drop_bulk  # noqa: E402
from agent.kubeapi.client import KubeClient, resource_path  # noqa: E402
from tests.admission.test_controller import metric, scrape  # noqa: E402
from tests.conftest import extract_dump  # noqa: E402
from tests.controlplane.cluster import Cluster, SimNode, start_cluster  # noqa: E402
from tests.controlplane.harness import free_port  # noqa: E402

DUMP = "64fake-4n2s2ca2c2t"  # 64 CPUs in 4 NUMA nodes of 16
TENANT = "hostile-tenant"
GATE = "tenant.example.com/hold"  # a gate of the tenant's own: the pods stay unbound
ARG = "ab"  # two characters: `"ab",` on the wire
WRITERS = 4  # parallel creates (each body is about 1.2 MB as the client writes it)
READY_TIMEOUT_S = 600.0
DECODE_ROUNDS = 7


def hostile_pod(name: str, pod_bytes: int, node: str | None = None) -> dict[str, Any]:
    """A pod of about `pod_bytes` of JSON as the API server serves it: short container arguments."""
    spec: dict[str, Any] = {
        "restartPolicy": "Never", "automountServiceAccountToken": False,
        "containers": [{"name": "main", "image": "busybox", "command": ["sleep"],
                        "args": [ARG] * max(1, (pod_bytes - 1000) // (len(ARG) + 3))}]}
    if node is None:
        spec["schedulingGates"] = [{"name": GATE}]
    else:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def create_pods(api: Callable[[], KubeClient], count: int, pod_bytes: int, prefix: str,
                node: str | None = None) -> None:
    """`count` hostile pods in the tenant namespace, WRITERS at a time."""
    clients = [api() for _ in range(WRITERS)]
    collection = resource_path("", "v1", "pods", namespace=TENANT)

    def one(i: int) -> None:
        clients[i % WRITERS].create(collection, hostile_pod(f"{prefix}-{i:03d}", pod_bytes, node),
                                    timeout=(5.0, 120.0))

    try:
        with ThreadPoolExecutor(WRITERS) as pool:
            list(pool.map(one, range(count)))
    finally:
        for c in clients:
            c.close()



def wait_until(ready: Callable[[], bool], what: str, alive: Callable[[], bool]) -> float:
    """Poll `ready` every 0.2 s; seconds it took.  Fails when `alive` turns false or on the deadline."""
    began = time.monotonic()
    while not ready():
        if not alive():
            raise SystemExit(f"{what}: the process exited")
        if time.monotonic() - began > READY_TIMEOUT_S:
            raise SystemExit(f"{what}: not after {READY_TIMEOUT_S:.0f} s")
        time.sleep(0.2)
    return time.monotonic() - began


def controller_peak(cluster: Cluster) -> tuple[float, float]:
    """(peak RSS MiB, seconds to the first pass) of a fresh `topolet controller` after its first pass."""
    port = free_port()
    proc = cluster.start_controller("--listen", f"127.0.0.1:{port}", placement_policy=False)
    try:
        took = wait_until(lambda: metric(scrape(port)[1], "topolet_admission_pass_duration_seconds_count")
                          >= 1, "the controller's first pass", proc.running)
        return peak_rss_mib(proc.popen.pid), took
    finally:
        cluster.stop_controllers()


def agent_peak(cluster: Cluster, node: SimNode) -> tuple[float, float]:
    """(peak RSS MiB, seconds to the first pod list) of `node`'s agent, started now."""
    cluster.start_agent(node)
    agent = node.agent
    assert agent is not None

    def listed() -> bool:
        try:
            return node.metric("topolet_pod_lists_total") >= 1
        except (AssertionError, OSError):
            return False  # not serving yet

    try:
        took = wait_until(listed, f"the agent of {node.name}'s first pod list", agent.running)
        return peak_rss_mib(agent.popen.pid), took
    finally:
        agent.stop()
        node.agent = None


def decode_cost(api: Callable[[], KubeClient], pods: int, node: str) -> tuple[int, dict[str, float]]:
    """(page bytes, best decode seconds by "plain"/"hook" and " gc" for the cyclic GC running) of a
    page of `pods` ordinary pods bound to `node` (one that exists: the pod garbage collector deletes
    the others), as the API server serves it."""
    kube = api()
    kube.create(resource_path("", "v1", "namespaces"), {"metadata": {"name": lists.NAMESPACE}})
    clients = [api() for _ in range(WRITERS)]
    collection = resource_path("", "v1", "pods", namespace=lists.NAMESPACE)

    def one(i: int) -> None:
        body = lists.pod_body(i)
        body["spec"]["nodeName"] = node
        made = clients[i % WRITERS].create(collection, body)
        clients[i % WRITERS].patch(f"{collection}/{made['metadata']['name']}/status", lists.pod_status(i),
                                   "application/merge-patch+json")

    with ThreadPoolExecutor(WRITERS) as pool:
        list(pool.map(one, range(pods)))
    for c in clients:
        c.close()
    page = kube.list(collection, {"limit": pods})
    kube.close()
    data = json.dumps(page, separators=(",", ":")).encode()
    best: dict[str, float] = {}
    for _ in range(DECODE_ROUNDS):
        for collect in (False, True):
            for name, hook in (("plain", None), ("hook", drop_bulk)):
                key = name + (" gc" if collect else "")
                gc.collect()
                if not collect:
                    gc.disable()
                began = time.perf_counter()
                decoded = json.loads(data, object_hook=hook)
                took = time.perf_counter() - began
                gc.enable()
                del decoded
                best[key] = min(best.get(key, took), took)
    return len(data), best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--pods", type=int, default=100,
                    help="gated hostile pods for the controller (default 100)")
    ap.add_argument("--node-pods", type=int, default=15,
                    help="hostile pods bound to the agent's node (default 15)")
    ap.add_argument("--pod-bytes", type=int, default=1_000_000,
                    help="JSON bytes of each hostile pod (default 1,000,000; the API server takes up to "
                         "about 1.5 MiB)")
    ap.add_argument("--page-pods", type=int, default=500,
                    help="ordinary pods in the page whose decode is timed with and without the hook "
                         "(default 500, the stores' page size)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="topolet-hostile-") as tmp:
        root = extract_dump(DUMP, Path(tmp) / "dumps")
        cluster = start_cluster(Path(tmp) / "stage")
        try:
            api = KubeClient(cluster.plane.client())
            clean = cluster.add_node("hostile-clean", root, agent=False)
            full = cluster.add_node("hostile-full", root, agent=False)
            api.create("/api/v1/namespaces", {"metadata": {"name": TENANT}})
            try:
                api.create(resource_path("", "v1", "serviceaccounts", namespace=TENANT),
                           {"metadata": {"name": "default"}})
            except KubeAPIError as exc:
                if exc.status != 409:  # the service account controller was first
                    raise
            ctl_clean, ctl_clean_s = controller_peak(cluster)
            began = time.monotonic()
            create_pods(lambda: KubeClient(cluster.plane.client()), args.pods, args.pod_bytes, "gated")
            print(f"# {args.pods} gated pods created in {time.monotonic() - began:.0f} s", flush=True)
            one = api.get(resource_path("", "v1", "pods", "gated-000", namespace=TENANT))
            served = len(json.dumps(one, separators=(",", ":")))
            ctl_full, ctl_full_s = controller_peak(cluster)
            agent_clean, agent_clean_s = agent_peak(cluster, clean)
            create_pods(lambda: KubeClient(cluster.plane.client()), args.node_pods, args.pod_bytes, "bound",
                        full.name)
            agent_full, agent_full_s = agent_peak(cluster, full)
            page_bytes, decode = decode_cost(lambda: KubeClient(cluster.plane.client()),
                                                      args.page_pods, clean.name)
            api.close()
        except BaseException:
            print(cluster.logs(3000), file=sys.stderr)
            raise
        finally:
            cluster.stop()
    mb = served / 1e6
    arguments = len(one["spec"]["containers"][0]["args"])
    print(f"# each hostile pod: {served:,} bytes of JSON as served ({arguments:,} arguments of {len(ARG)} "
          "characters)")
    print(f"{'process':<11} {'hostile pods':>12} {'peak RSS MiB':>13} {'ready s':>8}")
    for name, pods, peak, took in (("controller", 0, ctl_clean, ctl_clean_s),
                                   ("controller", args.pods, ctl_full, ctl_full_s),
                                   ("agent", 0, agent_clean, agent_clean_s),
                                   ("agent", args.node_pods, agent_full, agent_full_s)):
        print(f"{name:<11} {pods:>12} {peak:>13.1f} {took:>8.1f}")
    print(f"# a page of {args.page_pods} ordinary pods, {page_bytes / 1e6:.2f} MB, best of {DECODE_ROUNDS}: "
          f"json.loads {decode['plain'] * 1e3:.1f} ms, with the hook {decode['hook'] * 1e3:.1f} ms "
          "(GC paused); "
          f"{decode['plain gc'] * 1e3:.1f} ms vs {decode['hook gc'] * 1e3:.1f} ms (GC running)")
    print(f"hostile: controller peak RSS {ctl_clean:.0f} MiB clean vs {ctl_full:.0f} MiB with {args.pods} "
          f"pods of {mb:.2f} MB; agent peak RSS {agent_clean:.0f} MiB clean vs {agent_full:.0f} MiB with "
          f"{args.node_pods} on its node; decode of a {args.page_pods}-pod page with/without the hook "
          f"{decode['hook'] / decode['plain']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
