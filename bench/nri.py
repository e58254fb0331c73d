#!/usr/bin/env python3
"""NRI CreateContainer answer latency: topolet's plugin (agent.nri) vs NRI's own Go stub, same runtime.

The runtime is NRI's pkg/adaptation v0.12.3 over ttrpc v1.2.9 (what containerd v2.4.2 embeds), built
by tests/nri/runtime/build.sh; it times each CreateContainer round trip as containerd would see it
(request out, plugin's answer in and merged).  Three plugins answer the same requests in turn:
topolet's with a cpuset adjustment (the shape of the agent's answer), topolet's with a no-op handler
(the protocol layer alone), and the reference, NRI's Go stub (pkg/stub) with the same cpuset
adjustment.  NRI's plugin timeout is 2 s; the agent's budget is p99 under 10 ms.

Three more rows (as root with a writable cpuset hierarchy) time the agent's real handler
(`agent.kube.pods.nri_pinning.NRIPinning` over the real PinningEngine, state file and PodPinner, in a
private cpuset root, as tests/nri/test_agent_route.py wires them): each CreateContainer of a
Guaranteed 1-CPU container is allocated, committed to the state file (fsync'd) and answered with its
cpuset and the updates narrowing `--shared` running shared containers (whose cgroups the engine
narrows too); a StopContainer (not timed) releases it before the next.  Beside it, the same scripted
exchange answered by the no-op handler.  The runtime times each CreateContainer in both.  The row
"reserved ahead" is the agent's usual case on a real node: the pod watch lists each pod as bound (and
the agent allocates and commits its exclusive containers then, `PodPinner.ahead`) before the runtime
creates the container, so the answer reads the committed allocation and writes nothing; the rows
"state on disk/tmpfs" are the fallback for a container whose pod the watch has not listed yet.

Usage: bench/nri.py [--creates N] [--rounds R] [--shared S]   (needs go; the first run builds the runtime)
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
from tests.nri.goruntime import GoRuntime, ScriptedRuntime, build_runtime, start_reference_plugin  # noqa: E402

# The state file on tmpfs: the handler's own cost, without the disk's fsync (the commit makes two).
TMPFS = "/dev/shm"


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


def percentiles(samples_us: list[float]) -> dict[str, float]:
    """p50, p99 and max of round trips in µs, as main.go computes them (nearest rank below)."""
    ordered = sorted(samples_us)
    at = lambda p: ordered[int((len(ordered) - 1) * p)]  # noqa: E731
    return {"p50_us": at(0.50), "p99_us": at(0.99), "max_us": at(1.0)}


def agent_handler_run(binary: str, creates: int, shared: int, real: bool,
                      state_root: str | None = None, ahead: bool = False) -> dict[str, float] | str:
    """CreateContainer round trips of the agent's NRIPinning (`real`) or a no-op handler, through the
    runtime's -script mode, on a private cpuset root, the state file in a folder under `state_root`
    (default: the temporary folder's file system); with `ahead`, the pod watch lists each pod as bound
    before the runtime creates its container (untimed), as on a real node; a string says why it
    cannot run here."""
    import os

    from agent.api.podplan import plan_pod
    from agent.api.qos import QOSClass
    from agent.enforce.cgroup import detect_layout
    from agent.errors import EnforcementError
    from agent.kube.pods.watch import Changed, Gone
    from tests.nri.agent_parts import AgentParts, bound_pod, private_node

    if os.geteuid() != 0:
        return "needs root (cgroups)"
    try:
        system = detect_layout()
    except EnforcementError as exc:
        return f"needs a cpuset hierarchy: {exc}"
    if not os.access(system.root, os.W_OK):
        return f"{system.root} is not writable"
    with tempfile.TemporaryDirectory(prefix="nri-bench-") as d, private_node(system, Path(d)) as node, \
            tempfile.TemporaryDirectory(prefix="nri-bench-state-", dir=state_root) as state:
        if len(node.cpus) < 2:
            return "needs 2 CPUs"
        runtime = ScriptedRuntime(binary, Path(d) / "nri.sock")
        parts = AgentParts(node.layout, Path(state))
        try:
            runtime.wait_listening()
            for i in range(shared):
                c = node.container(node.pod(f"shared-{i}", QOSClass.BURSTABLE), "app", 100, limit=False)
                node.start(c)
            pods, containers = node.live()
            runtime.request("existing", pods=pods, containers=containers)
            if real:
                parts.connect(runtime.socket)
            else:
                plugin = Plugin.connect(str(runtime.socket), NoopHandler(), "topolet", "50")
                threading.Thread(target=plugin.run, daemon=True).start()
            runtime.wait_event("Synchronize")
            parts.pinner.ahead = ahead
            samples: list[float] = []
            pod = node.pod("pinned", QOSClass.GUARANTEED)
            for i in range(creates):
                if ahead and i:  # a new pod each time: the watch lists it bound before its container
                    pod = node.pod(f"pinned-{i}", QOSClass.GUARANTEED)
                c = node.container(pod, "main", 1000)
                if ahead:
                    parts.pinner.handle(Changed(plan_pod(bound_pod(c))))
                reply = runtime.request("create", pod=pod, container=c.message)
                if "error" in reply:
                    raise RuntimeError(f"CreateContainer failed: {reply['error']}")
                samples.append(float(reply["us"]))
                if real and not parts.state_file.load().allocations:
                    raise RuntimeError("the handler allocated nothing")
                runtime.request("stop", pod=pod, container=c.message)
                node.containers.remove(c)
                if ahead:  # the pod is deleted: the watch forgets it
                    parts.pinner.handle(Gone(pod.uid))
        finally:
            parts.stop()
            runtime.close()
    return percentiles(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--creates", type=int, default=2000, help="CreateContainer requests per plugin")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run the three plugins in turn this many times (rows per round)")
    parser.add_argument("--shared", type=int, default=20,
                        help="running shared containers the handler narrows on every pin (default 20)")
    args = parser.parse_args()
    binary = build_runtime()
    plugins: list[tuple[str, Handler | None]] = [
        ("topolet agent.nri, cpuset answer", CpusetHandler()),
        ("topolet agent.nri, no-op handler", NoopHandler()),
        ("NRI Go stub, cpuset answer (reference)", None),
    ]
    print(f"CreateContainer round trip as NRI's runtime (pkg/adaptation v0.12.3, ttrpc v1.2.9) times it, "
          f"{args.creates} requests per row")
    print(f"{'plugin':<48} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    worst_p99 = 0.0
    agent_p99: dict[str, float] = {}
    for _ in range(args.rounds):
        for name, handler in plugins:
            timing = timed_run(binary, args.creates, handler)
            print(f"{name:<48} {timing['p50_us'] / 1e3:>8.3f} {timing['p99_us'] / 1e3:>8.3f} "
                  f"{timing['max_us'] / 1e3:>8.3f}", flush=True)
            if handler is not None:
                worst_p99 = max(worst_p99, timing["p99_us"] / 1e3)
        rows: list[tuple[str, bool, str | None, bool]] = [
            (f"agent NRIPinning, {args.shared} shared, reserved ahead", True, None, True),
            (f"agent NRIPinning, {args.shared} shared, state on disk", True, None, False),
            (f"agent NRIPinning, {args.shared} shared, state on tmpfs", True, TMPFS, False),
            ("no-op handler, same scripted exchange", False, None, False)]
        for name, real, state_root, ahead in rows:
            if state_root is not None and not Path(state_root).is_dir():
                continue
            result = agent_handler_run(binary, args.creates, args.shared, real, state_root, ahead)
            if isinstance(result, str):
                print(f"{name:<48} skipped: {result}", flush=True)
                continue
            print(f"{name:<48} {result['p50_us'] / 1e3:>8.3f} {result['p99_us'] / 1e3:>8.3f} "
                  f"{result['max_us'] / 1e3:>8.3f}", flush=True)
            if real:
                agent_p99[name] = max(agent_p99.get(name, 0.0), result["p99_us"] / 1e3)
    print(f"topolet agent.nri CreateContainer p99: {worst_p99:.3f} ms (worst row; budget 10 ms, NRI's "
          "timeout 2000 ms)")
    for name, p99 in agent_p99.items():
        print(f"{name}: CreateContainer p99 {p99:.3f} ms (worst round; budget 10 ms)")


if __name__ == "__main__":
    main()
