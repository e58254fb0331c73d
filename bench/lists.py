"""A big collection listed through the real API server: one unpaged list against the paged list
(`KubeClient.list_paged`, `LIST_PAGE_SIZE` = 500 a page), as the controller's pod store lists every pod of
the cluster at start and after each 410 Gone.

Starts etcd + kube-apiserver (tests/controlplane/harness.py) and creates `--pods` pods (default 20,000) in
one namespace, each as a Deployment's pod looks once running: labels, annotations, a ReplicaSet owner, an
app container (ports, env, probes, a config volume, Guaranteed requests) and a sidecar, bound to one of
100 nodes, its status written as a kubelet writes it (Running, pod IP, conditions, container statuses);
the API server adds its defaults and managedFields.  Then each arm, in a fresh Python process of its own
so that peaks compare, relists the controller's pod store (`agent.admission.cluster.store.Reflector`)
once: `page_size=None` (one request, as before) and `page_size=500`.  Per arm: requests, the largest
single response body and all of them (MiB, as read off the socket), the relist's wall seconds and the
process's peak RSS growth during it (VmHWM after, less VmRSS before; the client, its imports and its TLS
connection set up before).  With `--rounds R` the arms alternate in order and each figure is the median.
Last line: `lists: N pods: largest response unpaged X MiB vs paged Y MiB; peak RSS during relist A MiB
vs B MiB; wall C s vs D s`.

Needs the control plane build (tests/controlplane/build.sh).
Run: `.venv/bin/python bench/lists.py [--pods 20000] [--rounds 1]`; quick: `... --pods 2000`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from procstat import peak_rss_mib, rss_mib  # noqa: E402

from agent.kubeapi.client import LIST_PAGE_SIZE, KubeClient, load_api_client, resource_path  # noqa: E402

NAMESPACE = "bench-lists"
NODES = 100
WRITERS = 16  # parallel create and status requests while filling the namespace
MIB = 1024 * 1024
ARMS = {"unpaged": None, "paged": LIST_PAGE_SIZE}
OWNER_UID = "6f1c2a4e-0b7d-4c1e-9a55-3d2f8e7b9c01"


def pod_body(i: int) -> dict[str, Any]:
    """The `i`th pod as a Deployment makes it (spec only: the API server drops a created pod's status)."""
    res = {"cpu": "2", "memory": "2Gi"}
    probe = {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 10, "timeoutSeconds": 2}
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": f"web-7d9f8b6c5d-{i:06d}",
            "labels": {"app.kubernetes.io/name": "web", "app.kubernetes.io/part-of": "shop",
                       "pod-template-hash": "7d9f8b6c5d", "tier": "frontend"},
            "annotations": {"kubectl.kubernetes.io/default-container": "app", "prometheus.io/scrape": "true",
                            "prometheus.io/port": "9090"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-7d9f8b6c5d",
                                 "uid": OWNER_UID, "controller": True, "blockOwnerDeletion": True}],
        },
        "spec": {
            "nodeName": f"node-{i % NODES:04d}",
            "automountServiceAccountToken": False,
            "containers": [
                {"name": "app", "image": "registry.example.com/shop/web:1.27.3",
                 "args": ["--listen=:8080", "--metrics=:9090", "--config=/etc/web/web.yaml"],
                 "ports": [{"name": "http", "containerPort": 8080},
                           {"name": "metrics", "containerPort": 9090}],
                 "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                         {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                         {"name": "LOG_LEVEL", "value": "info"}],
                 "resources": {"requests": res, "limits": res},
                 "readinessProbe": probe, "livenessProbe": {**probe, "failureThreshold": 6},
                 "volumeMounts": [{"name": "config", "mountPath": "/etc/web", "readOnly": True}]},
                {"name": "proxy", "image": "registry.example.com/mesh/proxy:2.4.1",
                 "args": ["--upstream=127.0.0.1:8080"],
                 "resources": {"requests": {"cpu": "100m", "memory": "128Mi"},
                               "limits": {"cpu": "100m", "memory": "128Mi"}}},
            ],
            "volumes": [{"name": "config", "configMap": {"name": "web-config"}}],
        },
    }


def pod_status(i: int) -> dict[str, Any]:
    """The status a kubelet writes for the `i`th pod once both its containers run."""
    at = "2026-01-05T10:00:00Z"
    conditions = [{"type": t, "status": "True", "lastTransitionTime": at}
                  for t in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady",
                            "PodScheduled")]
    containers = [{"name": name, "image": image, "imageID": f"{image}@sha256:{'ab' * 32}",
                   "containerID": f"containerd://{i:08x}{k:056x}", "ready": True, "started": True,
                   "restartCount": 0, "state": {"running": {"startedAt": at}}}
                  for k, (name, image) in enumerate((("app", "registry.example.com/shop/web:1.27.3"),
                                                     ("proxy", "registry.example.com/mesh/proxy:2.4.1")))]
    ip = f"10.{64 + i // 65536 % 64}.{i // 256 % 256}.{i % 256}"
    return {"status": {"phase": "Running", "hostIP": f"192.168.{i % NODES // 256}.{i % NODES % 256 + 1}",
                       "podIP": ip, "podIPs": [{"ip": ip}], "startTime": at, "qosClass": "Guaranteed",
                       "conditions": conditions, "containerStatuses": containers}}


def fill(kube: KubeClient, pods: int) -> None:
    """The namespace and its service account, then `pods` pods, each created and given its status."""
    kube.create(resource_path("", "v1", "namespaces"), {"metadata": {"name": NAMESPACE}})
    kube.create(resource_path("", "v1", "serviceaccounts", namespace=NAMESPACE),
                {"metadata": {"name": "default"}})
    collection = resource_path("", "v1", "pods", namespace=NAMESPACE)

    def one(i: int) -> None:
        made = kube.create(collection, pod_body(i))
        kube.patch(f"{collection}/{made['metadata']['name']}/status", pod_status(i),
                   "application/merge-patch+json")

    with ThreadPoolExecutor(WRITERS) as pool:
        list(pool.map(one, range(pods)))


def arm(name: str, kubeconfig: str) -> dict[str, Any]:
    """One arm, in this (fresh) process: the pod store's relist with the arm's page size."""
    from agent.admission.cluster.store import Reflector as Store
    from tests.kube.list_meter import ListMeter

    kube = ListMeter(load_api_client(kubeconfig))
    path = resource_path("", "v1", "pods")
    kube.list(path, {"limit": 1})  # the connection, TLS and the client's code paths, before the baseline
    kube.lists.clear()
    store = Store(kube, path, "pods", threading.Event())
    store.page_size = ARMS[name]
    before = rss_mib(os.getpid())
    began = time.perf_counter()
    store.relist()
    wall = time.perf_counter() - began
    peak = peak_rss_mib()
    held = len(store.snapshot())
    return {"arm": name, "pods": held, "requests": len(kube.lists), "largest_mib": kube.largest / MIB,
            "total_mib": sum(size for _, size in kube.lists) / MIB, "wall_s": wall,
            "rss_growth_mib": peak - before}



def run_arm(name: str, kubeconfig: Path) -> dict[str, Any]:
    out = subprocess.run([sys.executable, __file__, "--arm", name, "--kubeconfig", str(kubeconfig)],
                         capture_output=True, text=True, cwd=REPO)
    if out.returncode != 0:
        raise SystemExit(f"arm {name} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(out.stdout.splitlines()[-1])
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pods", type=int, default=20_000, help="pods to create and list, default 20,000")
    ap.add_argument("--rounds", type=int, default=1, help="each arm this many times, alternating; medians")
    ap.add_argument("--arm", choices=sorted(ARMS), help=argparse.SUPPRESS)  # one arm, in a child process
    ap.add_argument("--kubeconfig", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.arm:
        print(json.dumps(arm(args.arm, args.kubeconfig)))
        return 0

    from tests.controlplane.harness import ControlPlane, build_binaries

    work = Path(tempfile.mkdtemp(prefix="topolet-bench-lists-"))
    plane = ControlPlane(build_binaries(), work / "cp")
    plane.start()
    try:
        kube = KubeClient(plane.client())
        began = time.monotonic()
        fill(kube, args.pods)
        print(f"created {args.pods} pods in {time.monotonic() - began:.1f} s", flush=True)
        results: dict[str, list[dict[str, Any]]] = {name: [] for name in ARMS}
        for r in range(args.rounds):
            for name in (list(ARMS) if r % 2 == 0 else list(reversed(ARMS))):
                res = run_arm(name, plane.kubeconfig)
                if res["pods"] != args.pods:
                    raise SystemExit(f"arm {name} listed {res['pods']} pods of {args.pods}")
                results[name].append(res)
    finally:
        plane.stop()

    def median(name: str, key: str) -> float:
        return float(statistics.median(res[key] for res in results[name]))

    print(f"{'arm':<8} {'requests':>8} {'largest MiB':>12} {'all MiB':>8} {'wall s':>7} "
          f"{'RSS growth MiB':>15}")
    for name in ARMS:
        print(f"{name:<8} {median(name, 'requests'):>8.0f} {median(name, 'largest_mib'):>12.2f} "
              f"{median(name, 'total_mib'):>8.1f} {median(name, 'wall_s'):>7.2f} "
              f"{median(name, 'rss_growth_mib'):>15.1f}")
    print(f"lists: {args.pods} pods: largest response unpaged {median('unpaged', 'largest_mib'):.2f} MiB vs "
          f"paged {median('paged', 'largest_mib'):.2f} MiB; peak RSS during relist "
          f"{median('unpaged', 'rss_growth_mib'):.1f} MiB vs {median('paged', 'rss_growth_mib'):.1f} MiB; "
          f"wall {median('unpaged', 'wall_s'):.2f} s vs {median('paged', 'wall_s'):.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
