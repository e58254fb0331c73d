#!/usr/bin/env python3
"""Standalone agent footprint: resident memory and idle CPU (millicores) over a quiet period.

Starts `topolet agent` (standalone, private state and features.d folders, a free port), lets it
settle, then samples /proc/PID/stat CPU ticks and VmRSS over `--seconds`.  Beside it, in the same run,
a reference: a bare Python interpreter idling on the same machine (its RSS and CPU), so the agent's
own cost is visible.  Targets (docs/design.md): under 60 MiB RSS, under 5 millicores idle.
Needs root for the agent's cgroup work (without it the agent runs with pinning off).

Then what an install weighs: the objects the chart renders with its default values (`helm template`,
the uninstall hook's apart), beside `kubectl kustomize daemonset/`'s, by kind; and each
architecture's image as `make image` / `IMAGE_ARCH=arm64 make image` left it (build/image*/image.env:
the compressed layers a node pulls, the unpacked root file system).  Helm and kubectl come from
tests/controlplane/build.sh's cache (built there when missing); `--no-install` leaves this part out.
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from procstat import cpu_seconds, rss_mib

REPO = Path(__file__).resolve().parent.parent
IMAGE_ENVS = {"amd64": REPO / "build" / "image" / "image.env",
              "arm64": REPO / "build" / "image-arm64" / "image.env"}
MIB = 1 << 20


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def measure(pids: list[int], seconds: float) -> list[tuple[float, float]]:
    """(RSS MiB at the end, millicores over the window) of each process, over one shared window."""
    c0, t0 = [cpu_seconds(p) for p in pids], time.monotonic()
    time.sleep(seconds)
    c1, t1 = [cpu_seconds(p) for p in pids], time.monotonic()
    return [(rss_mib(p), (b - a) / (t1 - t0) * 1000) for p, a, b in zip(pids, c0, c1, strict=True)]


def rendered_kinds(argv: list[str]) -> dict[str, int]:
    """Objects per kind in the YAML stream `argv` prints, Helm's hooks left out."""
    import yaml

    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=True, cwd=REPO)
    kinds: dict[str, int] = {}
    for doc in yaml.safe_load_all(done.stdout):
        if doc and "helm.sh/hook" not in (doc.get("metadata", {}).get("annotations") or {}):
            kinds[doc["kind"]] = kinds.get(doc["kind"], 0) + 1
    return kinds


def print_install() -> None:
    """The chart's rendered objects beside the kustomize base's, and each architecture's image size."""
    sys.path.insert(0, str(REPO))
    from tests.controlplane.harness import build_components

    tools = build_components("helm", "kubectl")
    # As on an API server that serves MutatingAdmissionPolicy v1, where the chart renders what the base has;
    # the chart refuses to render without an image, so it names the base's placeholder (tests/chart/helm.py).
    chart = rendered_kinds([str(tools["helm"]), "template", "topolet", "charts/topolet",
                            "--namespace", "topolet-system", "--set", "image.repository=topolet",
                            "--api-versions", "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy"])
    base = rendered_kinds([str(tools["kubectl"]), "kustomize", "daemonset"])
    print(f"install: chart (default values) {sum(chart.values())} objects, kustomize base "
          f"{sum(base.values())} (same run)")
    for kind in sorted(set(chart) | set(base)):
        print(f"  {kind:34} chart {chart.get(kind, 0):3}   base {base.get(kind, 0):3}")
    sizes = []
    for arch, path in IMAGE_ENVS.items():
        if not path.exists():
            print(f"image {arch}: not built (IMAGE_ARCH={arch} make image)")
            continue
        env = dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
        pulled, unpacked = int(env["IMAGE_COMPRESSED_BYTES"]) / MIB, int(env["IMAGE_UNPACKED_BYTES"]) / MIB
        print(f"image {arch}: {pulled:.1f} MiB compressed (pulled), {unpacked:.1f} MiB unpacked "
              f"({env['IMAGE_DIGEST'][:19]}...)")
        sizes.append(f"{arch} {pulled:.1f}/{unpacked:.1f}")
    print(f"install footprint: chart {sum(chart.values())} objects (base {sum(base.values())}); "
          f"image MiB compressed/unpacked: {', '.join(sizes) or 'none built'}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0, help="idle window measured")
    ap.add_argument("--settle", type=float, default=5.0, help="wait before measuring")
    ap.add_argument("--reconcile-seconds", type=float, default=5.0)
    ap.add_argument("--no-install", action="store_true",
                    help="leave out the chart's objects and the image sizes")
    a = ap.parse_args()
    topolet = str(Path(sys.executable).parent / "topolet")
    with tempfile.TemporaryDirectory() as tmp:
        agent = subprocess.Popen(
            [topolet, "agent", "--state-dir", f"{tmp}/state", "--features-dir", f"{tmp}/features.d",
             "--listen", f"127.0.0.1:{free_port()}", "--reconcile-seconds", str(a.reconcile_seconds)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(10**6)"])
        try:
            time.sleep(a.settle)
            (agent_rss, agent_mc), (ref_rss, ref_mc) = measure([agent.pid, idle.pid], a.seconds)
        finally:
            agent.terminate()
            idle.terminate()
            agent.wait()
            idle.wait()
    print(f"standalone agent, reconcile every {a.reconcile_seconds:g} s, measured over {a.seconds:g} s")
    print(f"  agent RSS        {agent_rss:6.1f} MiB   (target < 60 MiB; bare interpreter {ref_rss:.1f} MiB)")
    print(f"  agent idle CPU   {agent_mc:6.2f} millicores (target < 5; bare interpreter {ref_mc:.2f})")
    print(f"agent footprint: {agent_rss:.1f} MiB RSS, {agent_mc:.2f} millicores idle")
    if not a.no_install:
        print_install()
    return 0


if __name__ == "__main__":
    sys.exit(main())
