#!/usr/bin/env python3
"""Standalone agent footprint: resident memory and idle CPU (millicores) over a quiet period.

Starts `topolet agent` (standalone, private state and features.d folders, a free port), lets it
settle, then samples /proc/PID/stat CPU ticks and VmRSS over `--seconds`.  Beside it, in the same run,
a reference: a bare Python interpreter idling on the same machine (its RSS and CPU), so the agent's
own cost is visible.  Targets (DESIGN.md): under 60 MiB RSS, under 5 millicores idle.
Needs root for the agent's cgroup work (without it the agent runs with pinning off).
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0, help="idle window measured")
    ap.add_argument("--settle", type=float, default=5.0, help="wait before measuring")
    ap.add_argument("--reconcile-seconds", type=float, default=5.0)
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
