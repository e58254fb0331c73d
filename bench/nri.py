#!/usr/bin/env python3
"""NRI CreateContainer answer latency: topolet's plugin (agent.nri) vs NRI's own Go stub, same runtime.

The runtime is NRI's pkg/adaptation v0.12.3 over ttrpc v1.2.9 (what containerd v2.4.2 embeds), built
by tests/nri/runtime/build.sh; it times each CreateContainer round trip as containerd would see it
(request out, plugin's answer in and merged).  Three plugins answer the same requests in turn:
topolet's with a cpuset adjustment (the shape of the agent's answer), topolet's with a no-op handler
(the protocol layer alone), and the reference, NRI's Go stub (pkg/stub) with the same cpuset
adjustment.  NRI's plugin timeout is 2 s; the agent's budget is p99 under 10 ms.

Usage: bench/nri.py [--creates N] [--rounds R]   (needs go; the first run builds the runtime)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from agent.nri import api_pb2  # noqa: E402
from agent.nri.plugin import Handler, Plugin, cpuset_adjustment  # noqa: E402
from tests.nri.goruntime import GoRuntime, build_runtime, start_reference_plugin  # noqa: E402


class CpusetHandler(Handler):
    """The same answer as the Go reference plugin: cpuset CPUs 2-3, memory node 0."""

    def create_container(
        self, pod: api_pb2.PodSandbox, container: api_pb2.Container,
    ) -> tuple[api_pb2.ContainerAdjustment | None, Sequence[api_pb2.ContainerUpdate]]:
        return cpuset_adjustment("2-3", "0"), ()


class NoopHandler(Handler):
    """Answers every CreateContainer with no adjustment."""


def timed_run(binary: str, creates: int, handler: Handler | None) -> dict[str, Any]:
    """One runtime process, one plugin (ours with `handler`, or the Go reference when None)."""
    with tempfile.TemporaryDirectory(prefix="nri-bench-") as d:
        runtime = GoRuntime(binary, Path(d) / "nri.sock", "-creates", str(creates))
        reference = None
        try:
            runtime.wait_listening()
            if handler is None:
                reference = start_reference_plugin(binary, runtime.socket)
            else:
                plugin = Plugin.connect(str(runtime.socket), handler, "topolet", "90")
                threading.Thread(target=plugin.run, daemon=True).start()
            events = runtime.events_until_done(timeout=600)
        finally:
            runtime.close()
            if reference is not None:
                reference.kill()
                reference.wait()
    return events["timing"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--creates", type=int, default=2000, help="CreateContainer requests per plugin")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run the three plugins in turn this many times (rows per round)")
    args = parser.parse_args()
    binary = build_runtime()
    plugins: list[tuple[str, Handler | None]] = [
        ("topolet agent.nri, cpuset answer", CpusetHandler()),
        ("topolet agent.nri, no-op handler", NoopHandler()),
        ("NRI Go stub, cpuset answer (reference)", None),
    ]
    print(f"CreateContainer round trip as NRI's runtime (pkg/adaptation v0.12.3, ttrpc v1.2.9) times it, "
          f"{args.creates} requests per row")
    print(f"{'plugin':<42} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    worst_p99 = 0.0
    for _ in range(args.rounds):
        for name, handler in plugins:
            timing = timed_run(binary, args.creates, handler)
            print(f"{name:<42} {timing['p50_us'] / 1e3:>8.3f} {timing['p99_us'] / 1e3:>8.3f} "
                  f"{timing['max_us'] / 1e3:>8.3f}", flush=True)
            if handler is not None:
                worst_p99 = max(worst_p99, timing["p99_us"] / 1e3)
    print(f"topolet CreateContainer p99: {worst_p99:.3f} ms (worst row; budget 10 ms, NRI's timeout 2000 ms)")


if __name__ == "__main__":
    main()
