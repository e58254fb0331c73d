"""Benchmark the Kubernetes agent through a real API server (etcd + kube-apiserver from tests/controlplane).

Figures, each beside a reference measured in the same run:
- pod status Running → container cpuset written: p50/p99 over exclusive pods (created, pinned, deleted
  one by one) and over shared pods (each narrowed to the pool while one exclusive pod holds a CPU);
  reference: the API round trip of the status patch itself;
- API writes per allocation change (NRT applies / allocation changes; target 1) and per minute in
  steady state (target 0), from the agent's own `topolet_api_writes_total`;
- agent RSS with 500 pods on the node (target < 60 MiB); reference: the RSS of a bare interpreter that
  imports the same modules.

Needs root, a writable cpuset hierarchy and the control plane build (tests/controlplane/build.sh).
Run: `.venv/bin/python bench/kube.py [--exclusive 200 --shared 500 --steady-seconds 60]`;
a quick RSS probe (~30 s): `... bench/kube.py --exclusive 0 --shared 20 --steady-seconds 0`.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

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
    args = ap.parse_args()

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


if __name__ == "__main__":
    sys.exit(main())
