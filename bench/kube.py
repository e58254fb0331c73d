"""Benchmark the Kubernetes agent through a real API server (etcd + kube-apiserver from tests/controlplane).

Figures, each beside a reference measured in the same run:
- pod status Running → container cpuset written: p50/p99 over exclusive pods (created, pinned, deleted
  one by one) and over shared pods (each narrowed to the pool while one exclusive pod holds a CPU);
  reference: the API round trip of the status patch itself;
- API writes per allocation change (NRT applies / allocation changes; target 1) and per minute in
  steady state (target 0), from the agent's own `topolet_api_writes_total`;
- agent RSS with 500 pods on the node (target < 60 MiB); reference: the RSS of a bare interpreter that
  imports the same modules.

`--real-node` measures on real nodes instead (tests/realnode/node.py: kubelet v1.37.2, runc), three
arms one after the other (bench/realnode_arms.py): the agent on the pod-cgroup route (containerd
1.6), the agent on the NRI route (containerd 2.4.2, `--route nri --nri-socket <node's>`) and, as the
anchor, the kubelet's static CPU manager without topolet.  Each runs `--pods` Guaranteed 1-CPU pods
one at a time (some with memory binding, one with a second container) and a Burstable pod beside every
`--burstable-every`th, and reads each container's first instruction from its log:
- first instruction pinned N/N: every container saw its allocation (agent state / cpu_manager_state),
  every Burstable pod saw no exclusive CPU;
- created -> Running p50/p99 per arm (phase seen on a watch), and its p99 with topolet over static's;
- created -> pinned p50/p99 (a cgroup under the pod first seen holding the allocation);
- the agent's memory (host process RSS at the end of each route's arm; the larger is printed);
- the agent image's size, from `make image` (build/image/image.env), "n/a" before it is built.
Last line: `real node: first instruction pinned N/N nri, N/N pod-cgroup (kubelet static N/N) |
created->Running p99 with/static R.RR | create->pinned p99 X ms | agent memory Y MiB | image Z MiB`
(a figure per route, `R.RR nri, R.RR pod-cgroup`, where the routes' differ); exit 1 on any miss.

Needs root, a writable cpuset hierarchy and the control plane build (tests/controlplane/build.sh).
Run: `.venv/bin/python bench/kube.py [--exclusive 200 --shared 500 --steady-seconds 60]`;
a quick RSS probe (~30 s): `... bench/kube.py --exclusive 0 --shared 20 --steady-seconds 0`;
the real nodes (~45 s per arm for 10 pods): `... bench/kube.py --real-node [--pods 30]`.
"""

from __future__ import annotations

import argparse
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
    ap.add_argument("--pods", type=int, default=30, help="--real-node: Guaranteed pods per arm, default 30")
    ap.add_argument("--arms", default="pod-cgroup,nri,static",
                    help="--real-node: which arms to run, comma-separated (default all three; the last line "
                         "needs all three)")
    ap.add_argument("--burstable-every", type=int, default=5,
                    help="--real-node: a Burstable pod beside every Nth Guaranteed pod, default 5")
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


def real_node_main(args: argparse.Namespace) -> int:
    """The --real-node figures: a test cluster and, one after the other, the three arms of
    bench/realnode_arms.py (the agent on the pod-cgroup route, on the NRI route, the kubelet's static
    CPU manager), each a real node of its own."""
    from realnode_arms import NRI, STATIC, run_arms

    from tests.controlplane.cluster import start_cluster
    from tests.realnode.node import find_parts, image_env

    env = image_env()
    work = Path(tempfile.mkdtemp(prefix="topolet-bench-realnode-"))
    cluster = start_cluster(work)
    try:
        results = run_arms(cluster, find_parts(), args.pods, args.burstable_every,
                           arms=tuple(a for a in args.arms.split(",") if a),
                           agent_args=("--reconcile-seconds", "5", *args.agent_arg), rss=rss_mib)
    finally:
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)  # the cluster's etcd data and logs
    ms = 1e3

    def p99(vals: list[float]) -> str:
        return f"{pct(vals, 0.99) * ms:.1f}" if vals else "n/a"

    print(f"topolet real-node bench: kubelet v1.37.2 + runc, {args.pods} Guaranteed pods per arm "
          f"(one at a time), a Burstable pod every {args.burstable_every}")
    for r in results.values():
        runtime = "containerd 2.4.2 (NRI)" if r.arm == NRI else "containerd 1.6"
        who = "kubelet static CPU manager" if r.arm == STATIC else f"agent --route {r.arm} (host process)"
        print(f"  {r.arm:10s} {who}, {runtime}: first instruction pinned {r.pinned}/{r.guaranteed}, "
              f"Burstable clean {r.burstable_clean}/{r.burstable}")
        if r.running_s:
            print(f"    created -> Running  p50 {statistics.median(r.running_s) * ms:8.1f} ms  "
                  f"p99 {p99(r.running_s):>8s} ms  (n={len(r.running_s)})")
        if r.pinned_s:
            print(f"    created -> pinned   p50 {statistics.median(r.pinned_s) * ms:8.1f} ms  "
                  f"p99 {p99(r.pinned_s):>8s} ms  (n={len(r.pinned_s)})")
        if r.agent_mib is not None:
            print(f"    agent RSS at the end: {r.agent_mib:.1f} MiB (limit {AGENT_MEMORY_LIMIT_MIB} Mi)")
        for miss in r.misses[:10]:
            print(f"    miss: {miss}")
        if len(r.misses) > 10:
            print(f"    ... {len(r.misses) - 10} more misses")
    print(f"  image: {image_mib(env)} MiB unpacked (build/image/image.env)")
    print(last_line(results, image_mib(env)))
    return 0 if all(r.pinned == r.guaranteed and r.burstable_clean == r.burstable
                    for r in results.values()) else 1


def last_line(results: dict[str, Any], image: str) -> str:
    """The issue's last line: `real node: first instruction pinned N/N nri, N/N pod-cgroup (kubelet
    static N/N) | created->Running p99 with/static R.RR | create->pinned p99 X ms | agent memory Y MiB
    | image Z MiB` (a figure per route where the two routes' differ)."""
    from realnode_arms import NRI, POD_CGROUP, STATIC

    routes = [a for a in (NRI, POD_CGROUP) if a in results]
    static = results.get(STATIC)

    def per_route(fmt: Any) -> str:
        vals = {a: fmt(results[a]) for a in routes}
        if len(set(vals.values())) == 1:
            return str(next(iter(vals.values())))
        return ", ".join(f"{v} {a}" for a, v in vals.items())

    def ratio(r: Any) -> str:
        if static is None or not static.running_s or not r.running_s:
            return "n/a"
        return f"{pct(r.running_s, 0.99) / pct(static.running_s, 0.99):.2f}"

    def pinned_ms(r: Any) -> str:
        return f"{pct(r.pinned_s, 0.99) * 1e3:.1f} ms" if r.pinned_s else "n/a"

    counts = ", ".join(f"{results[a].pinned}/{results[a].guaranteed} {a}" for a in routes)
    anchor = f" (kubelet static {static.pinned}/{static.guaranteed})" if static is not None else ""
    memory = max((r.agent_mib for r in results.values() if r.agent_mib is not None), default=None)
    return (f"real node: first instruction pinned {counts}{anchor} | created->Running p99 with/static "
            f"{per_route(ratio)} | create->pinned p99 {per_route(pinned_ms)} | agent memory "
            f"{f'{memory:.0f}' if memory is not None else 'n/a'} MiB | image {image} MiB")


if __name__ == "__main__":
    sys.exit(main())
