"""Benchmark the Kubernetes agent through a real API server (etcd + kube-apiserver from tests/controlplane).

Figures, each beside a reference measured in the same run:
- pod status Running → container cpuset written: p50/p99 over exclusive pods (created, pinned, deleted
  one by one) and over shared pods (each narrowed to the pool while one exclusive pod holds a CPU);
  reference: the API round trip of the status patch itself;
- API writes per allocation change (NRT applies / allocation changes; target 1) and per minute in
  steady state (target 0), from the agent's own `topolet_api_writes_total`;
- agent RSS with 500 pods on the node (target < 60 MiB); reference: the RSS of a bare interpreter that
  imports the same modules.

`--real-node` measures on a real node instead (tests/realnode/node.py: kubelet v1.37.2, containerd,
runc), side by side:
- container started (its process in the cgroup runc made) -> cpuset written, p50/p99 over Guaranteed
  pods created one by one, and the part of it after the pod's status says Running (the agent waits
  for that status: it names the container); reference: the kubelet's own pod creation -> Running
  (phase seen on a watch) for the same pods;
- the agent's memory: with the image built, the agent runs as the DaemonSet's pod (tests/realnode's
  overlay) and this is its container's cgroup memory (memory.current; usage_in_bytes on cgroup v1)
  against its 128Mi limit; without it, the RSS of a host-process agent;
- the agent image's size, from R1's `make image` (build/image/image.env), "n/a" before it is built.
Last line: `real node: started->pinned p99 X ms | agent memory Y MiB | image Z MiB`.

Needs root, a writable cpuset hierarchy and the control plane build (tests/controlplane/build.sh).
Run: `.venv/bin/python bench/kube.py [--exclusive 200 --shared 500 --steady-seconds 60]`;
a quick RSS probe (~30 s): `... bench/kube.py --exclusive 0 --shared 20 --steady-seconds 0`;
the real node (~2 min): `... bench/kube.py --real-node [--pods 30]`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from procstat import rss_mib  # noqa: E402

from agent.enforce.cgroup import CgroupLayout, detect_layout, read_cpuset  # noqa: E402
from agent.topology.cpuset import CPUSet  # noqa: E402
from tests.controlplane.harness import ControlPlane, build_binaries  # noqa: E402
from tests.kube.kubelet_standin import KubeNode, node_on, wait_for  # noqa: E402


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def wait_cpus(layout: CgroupLayout, rel: str, want: CPUSet, timeout: float = 30.0) -> float:
    """Poll the cgroup's cpuset.cpus until it is `want`; returns the monotonic time seen."""
    path = layout.file(rel, "cpus")
    deadline = time.monotonic() + timeout
    text = want.cpulist()
    while True:
        with open(path) as f:
            if f.read().strip() == text:
                return time.monotonic()
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {rel} to hold {text}")
        time.sleep(0.0005)


def reference_rss() -> float:
    code = ("import agent.kube.daemon, kubernetes.client, agent.topology.discover, agent.labels;"
            "print(open('/proc/self/status').read().split('VmRSS:')[1].split()[0])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return int(out.stdout.strip()) / 1024


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--exclusive", type=int, default=200)
    ap.add_argument("--shared", type=int, default=500)
    ap.add_argument("--steady-seconds", type=float, default=60.0)
    ap.add_argument("--agent-arg", action="append", default=[],
                    help="extra `topolet agent` argument, repeatable: --agent-arg=--pod-resources-socket=")
    ap.add_argument("--real-node", action="store_true",
                    help="measure on a real kubelet + containerd + runc node (tests/realnode) instead")
    ap.add_argument("--pods", type=int, default=30, help="--real-node: Guaranteed pods to time, default 30")
    args = ap.parse_args()
    if args.real_node:
        return real_node_main(args)

    work = Path(tempfile.mkdtemp(prefix="topolet-bench-kube-"))
    plane = ControlPlane(build_binaries(), work / "cp")
    plane.start()
    try:
        with node_on(plane, detect_layout(), work, "topolet-bench-kube") as node:
            return run(node, args)
    finally:
        plane.stop()


def run(node: KubeNode, args: argparse.Namespace) -> int:
    """The measurements, on a node whose agent this starts."""
    layout, ns = node.layout, node.namespace
    agent = node.start_agent(*args.agent_arg, reconcile_seconds=5.0)
    wait_for(lambda: node.metrics_port() is not None and node.nrt() is not None, "the agent's first NRT")
    everything = read_cpuset(layout, "", effective=True)[0]
    g1 = {"cpu": "1", "memory": "64Mi"}

    patch_rtt: list[float] = []
    excl: list[float] = []
    nrt_before = node.metric("topolet_api_writes_total")
    changes = 0
    for i in range(args.exclusive):
        node.create_pod(f"x{i}", **g1)
        pod = node.kubelet.start_pod(ns, f"x{i}", report=False)
        t0 = time.monotonic()
        node.kubelet.report(pod)
        t1 = time.monotonic()
        patch_rtt.append(t1 - t0)
        c = pod.containers["c0"]
        seen = wait_cpus_len1(layout, c.cgroup)
        excl.append(seen - t1)
        node.kubelet.delete_pod(pod)
        changes += 2  # one allocation, one release
    if changes:
        wait_for(lambda: node.nrt_available_cpus() == len(everything), "the last release in the NRT")
        time.sleep(1.0)
    nrt_writes = node.metric("topolet_api_writes_total") - nrt_before if changes else 0.0

    anchor = node.run_pod("anchor", **g1)
    held = CPUSet.parse(wait_for(lambda: _single(layout, anchor.containers["c0"].cgroup), "anchor pin"))
    pool = everything - held
    shared: list[float] = []
    for i in range(args.shared):
        node.create_pod(f"s{i}", cpu="10m", memory="8Mi", limits=False)
        pod = node.kubelet.start_pod(ns, f"s{i}", report=False)
        t0 = time.monotonic()
        node.kubelet.report(pod)
        t1 = time.monotonic()
        patch_rtt.append(t1 - t0)
        shared.append(wait_cpus(layout, pod.containers["c0"].cgroup, pool) - t1)
    pods = args.shared + 1
    time.sleep(2.0)
    rss = rss_mib(agent.pid)
    before = node.metric("topolet_api_writes_total")
    time.sleep(args.steady_seconds)
    steady = (node.metric("topolet_api_writes_total") - before) * 60.0 / max(args.steady_seconds, 1e-9)
    ref_rss = reference_rss()

    print(f"topolet kube bench on {len(everything)} CPUs, node {node.name}")
    print(f"  reference: pod status patch round trip  p50 {statistics.median(patch_rtt) * 1e3:7.2f} ms"
          f"  p99 {pct(patch_rtt, 0.99) * 1e3:7.2f} ms  (n={len(patch_rtt)})")
    for name, vals in (("exclusive", excl), ("shared", shared), ("all", excl + shared)):
        if not vals:
            continue
        print(f"  Running -> cpuset written, {name:9s}   p50 {statistics.median(vals) * 1e3:7.2f} ms"
              f"  p99 {pct(vals, 0.99) * 1e3:7.2f} ms  (n={len(vals)}; target p99 < 100 ms)")
    if changes:
        print(f"  API writes per allocation change: {nrt_writes / changes:.2f}"
              f"  ({nrt_writes:.0f} writes / {changes} changes; target 1)")
    if args.steady_seconds > 0:
        print(f"  API writes per minute, steady state: {steady:.2f}"
              f"  (over {args.steady_seconds:.0f} s; target 0)")
    print(f"  agent RSS with {pods} pods: {rss:.1f} MiB  (target < 60 MiB; reference: interpreter"
          f" with the same imports {ref_rss:.1f} MiB)")
    return 0


def _single(layout: CgroupLayout, rel: str) -> str | None:
    with open(layout.file(rel, "cpus")) as f:
        text = f.read().strip()
    return text if text and len(CPUSet.parse(text)) == 1 else None


def wait_cpus_len1(layout: CgroupLayout, rel: str, timeout: float = 30.0) -> float:
    """Poll until the cgroup holds exactly one CPU (an exclusive pin); returns the time seen."""
    deadline = time.monotonic() + timeout
    while _single(layout, rel) is None:
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {rel} to be pinned")
        time.sleep(0.0005)
    return time.monotonic()


AGENT_MEMORY_LIMIT_MIB = 128  # daemonset/agent.yaml's memory limit


def image_mib(env: dict[str, str]) -> str:
    """The agent image's unpacked size from `make image` (build/image/image.env), or "n/a"."""
    size = env.get("IMAGE_UNPACKED_BYTES", "")
    return f"{int(size) / 2**20:.0f}" if size.isdigit() else "n/a"


class PodTimes:
    """When each pod (by name) was first seen Running, from a watch on a thread."""

    def __init__(self, api: object, namespace: str) -> None:
        import threading

        self.api = api
        self.namespace = namespace
        self.running: dict[str, float] = {}
        self._stop = threading.Event()
        self._stream: object = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from agent.errors import KubeAPIError

        api: Any = self.api
        while not self._stop.is_set():
            try:
                with api.watch(f"/api/v1/namespaces/{self.namespace}/pods", {"timeoutSeconds": 60},
                               timeout=(5.0, 90.0)) as stream:
                    self._stream = stream
                    for event in stream:
                        if self._stop.is_set():
                            return
                        obj = (event or {}).get("object") or {}
                        name = obj.get("metadata", {}).get("name")
                        if (obj.get("status") or {}).get("phase") == "Running" and name not in self.running:
                            self.running[name] = time.monotonic()
            except KubeAPIError:
                time.sleep(0.2)

    def stop(self) -> None:
        self._stop.set()
        stream: Any = self._stream
        if stream is not None:
            stream.shutdown()


def started_to_pinned(pod_dir: Path, timeout: float = 60.0) -> tuple[float, float]:
    """Poll a pod's cgroup until a container in it runs on one CPU: (when its process was first seen
    in its cgroup, when its cpuset was first seen narrowed)."""
    started: dict[str, float] = {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            children = [e for e in os.scandir(pod_dir) if e.is_dir()]
        except FileNotFoundError:
            children = []
        for child in children:
            try:
                with open(os.path.join(child.path, "cgroup.procs")) as f:
                    if child.name not in started and f.read().strip():
                        started[child.name] = time.monotonic()
                with open(os.path.join(child.path, "cpuset.cpus")) as f:
                    text = f.read().strip()
            except FileNotFoundError:
                continue
            if child.name in started and text and len(CPUSet.parse(text)) == 1:
                return started[child.name], time.monotonic()
        time.sleep(0.0005)
    raise SystemExit(f"timed out waiting for a pinned container under {pod_dir}")


def real_node_main(args: argparse.Namespace) -> int:
    """The --real-node figures: a test cluster, a real node on it, the agent on that node (the
    DaemonSet's pod from `make image`'s image when it is built, else a host process)."""
    from tests.controlplane.cluster import start_cluster
    from tests.realnode.node import DaemonSetAgent, NodeAgent, RealNode, find_parts, guaranteed_pod, image_env

    env = image_env()
    work = Path(tempfile.mkdtemp(prefix="topolet-bench-realnode-"))
    cluster = start_cluster(work)
    node = RealNode(cluster, find_parts())
    host_agent = NodeAgent(node, "--reconcile-seconds", "5", *args.agent_arg)
    daemonset = DaemonSetAgent(node, env) if env and not args.agent_arg else None

    def available() -> int:
        obj = cluster.nrt(node.name) or {}
        return sum(int(r["available"]) for z in obj.get("zones") or [] for r in z.get("resources") or []
                   if r["name"] == "cpu")

    try:
        node.start()
        if daemonset is not None:
            daemonset.start()
        else:
            proc = host_agent.start()
        wait_for(lambda: cluster.nrt(node.name) is not None, "the agent's first NRT")
        total = int(wait_for(available, "the NRT's available CPUs"))
        with node.api() as api:
            times = PodTimes(api, "default")
            pinned: list[float] = []
            running: list[float] = []
            after_running: list[float] = []  # the agent's own share: the status it waits for -> pinned
            try:
                for i in range(args.pods):
                    name = f"bench-{i}"
                    made = api.create("/api/v1/namespaces/default/pods", guaranteed_pod(name, node.name))
                    created = time.monotonic()
                    pod_dir = node.cpuset_root / "kubepods" / f"pod{made['metadata']['uid']}"
                    t_started, t_pinned = started_to_pinned(pod_dir)
                    pinned.append(t_pinned - t_started)
                    wait_for(lambda n=name: n in times.running, f"{name} Running")
                    running.append(times.running[name] - created)
                    after_running.append(t_pinned - times.running[name])
                    api.request("DELETE", f"/api/v1/namespaces/default/pods/{name}")
                    wait_for(lambda d=pod_dir: not d.exists(), f"{name}'s cgroup removed", timeout=90)
                    wait_for(lambda: available() == total, f"{name}'s CPU released in the NRT")
            finally:
                times.stop()
        if daemonset is not None:
            memory = daemonset.memory_bytes() / 2**20
            what = "agent container's cgroup memory (memory.current / v1 usage_in_bytes)"
        else:
            memory = rss_mib(proc.popen.pid)
            what = "agent memory (host process RSS; no image built)"
    finally:
        if daemonset is not None:
            daemonset.stop()
        host_agent.stop()
        node.stop()
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)  # the cluster's etcd data and logs
    image = image_mib(env)
    ms = 1e3
    print(f"topolet real-node bench: kubelet v1.37.2 + containerd + runc, node {node.name}, {args.pods} pods,"
          f" agent {'as the DaemonSet pod' if daemonset is not None else 'as a host process'}")
    print(f"  reference: kubelet pod created -> Running   p50 {statistics.median(running) * ms:8.2f} ms"
          f"  p99 {pct(running, 0.99) * ms:8.2f} ms  (n={len(running)})")
    print(f"  container started -> cpuset written         p50 {statistics.median(pinned) * ms:8.2f} ms"
          f"  p99 {pct(pinned, 0.99) * ms:8.2f} ms  (n={len(pinned)}; target p99 < 100 ms)")
    print(f"    of which status Running (on a watch) -> cpuset written"
          f"  p50 {statistics.median(after_running) * ms:8.2f} ms"
          f"  p99 {pct(after_running, 0.99) * ms:8.2f} ms  (the rest: the kubelet reporting the start)")
    print(f"  {what}: {memory:.1f} MiB  (limit {AGENT_MEMORY_LIMIT_MIB} Mi)")
    print(f"  image: {image} MiB unpacked (build/image/image.env)")
    print(f"real node: started->pinned p99 {pct(pinned, 0.99) * ms:.1f} ms | agent memory {memory:.0f} MiB"
          f" | image {image} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
