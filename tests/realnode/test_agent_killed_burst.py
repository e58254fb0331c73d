"""kill -9 of the agent while 50 pods start, on a real node, on each pinning route.

Routes: `pod-cgroup` (Debian's containerd 1.6), `nri` (containerd 2.4.2, NRI's default: a container
created while no plugin is connected is created unadjusted) and `nri-required` (topolet in NRI's
`required_plugins`: the runtime refuses containers while it is gone and the kubelet retries them).

The burst: `BURST` pods created back to back without waiting, one of them Guaranteed with an exclusive
CPU (this host has two CPUs, so one exclusive CPU is all a node may give while the pool keeps one),
the rest Burstable, BestEffort and Guaranteed with a fractional CPU (all on the shared pool).  Right
after the exclusive pod is created the agent is SIGKILLed; the rest of the burst is created while it
is away; it is started again `AWAY_S` later.  Once every pod runs:

- nothing is double-booked: the state's allocations are disjoint, and there is exactly one, the
  exclusive pod's container's;
- nothing is left unpinned: the exclusive container's processes run on exactly its allocation, and
  every other container's processes on CPUs no allocation holds.  Pod sandboxes (pause) are not
  containers here: the NRI route leaves them as the runtime made them, as the kubelet's static policy
  does, and they only sleep.

What a container created while the agent is away sees at its first instruction differs by route, as
daemonset/README.md ("Pinning route") says; here only the end state is checked.  Needs what
tests/realnode needs (containerd 2.4.2 for the NRI routes) and two CPUs: a skip on a laptop, a failure
under CI=true.  Prints the seconds from the restart until everything was settled.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.topology.cpuset import CPUSet
from tests.conftest import require
from tests.controlplane.cluster import Cluster
from tests.realnode.conftest import start_node
from tests.realnode.containerd import CONTAINERD_1_6, CONTAINERD_2_4
from tests.realnode.node import NodeAgent, RealNode, RealNodeParts, container_id, guaranteed_pod, wait

NS = "default"
BURST = 50
AWAY_S = 5.0
LABEL = "topolet-test-burst"
# The kubelet retries a refused container on its back-off (10 s, doubling, per pod): generous.
SETTLE_TIMEOUT_S = 420.0


def burst_pod(i: int, node: str, kind: str) -> dict[str, Any]:
    name = f"burst-{i:02d}"
    if kind == "exclusive":
        pod = guaranteed_pod(name, node, cpu="1")
    elif kind == "fractional":  # Guaranteed, but not a whole CPU: the pool
        pod = guaranteed_pod(name, node, cpu="10m", memory="16Mi")
    elif kind == "burstable":
        pod = guaranteed_pod(name, node, cpu="10m", memory="16Mi", limits=False)
    else:  # best effort
        pod = guaranteed_pod(name, node, cpu=None, memory="16Mi", limits=False)
        del pod["spec"]["containers"][0]["resources"]
    pod["metadata"]["labels"] = {LABEL: "1"}
    return pod


def kinds() -> list[str]:
    """The burst's pods in creation order: the exclusive one in the middle."""
    cycle = ("fractional", "burstable", "besteffort")
    out = [cycle[i % 3] for i in range(BURST - 1)]
    out.insert(BURST // 2, "exclusive")
    return out


def container_procs(pod_dir: Path) -> dict[str, list[int]]:
    """Container cgroup name → its pids, under one pod cgroup (the sandbox's pause included)."""
    out: dict[str, list[int]] = {}
    with contextlib.suppress(OSError):
        for child in pod_dir.iterdir():
            if child.is_dir():
                with contextlib.suppress(OSError):
                    pids = [int(p) for p in (child / "cgroup.procs").read_text().split()]
                    if pids:
                        out[child.name] = pids
    return out


def burst_pods(api: Any) -> list[dict[str, Any]]:
    return list(api.list(f"/api/v1/namespaces/{NS}/pods", {"labelSelector": LABEL}).get("items") or [])


def pod_line(pod: dict[str, Any]) -> str:
    """A pod's name, phase and why its containers wait (for a failure's message)."""
    status = pod.get("status") or {}
    waiting = [f"{(c.get('state') or {}).get('waiting', {}).get('reason')}: "
               f"{(c.get('state') or {}).get('waiting', {}).get('message', '')[:200]}"
               for c in status.get("containerStatuses") or [] if "waiting" in (c.get("state") or {})]
    return f"{pod['metadata']['name']} {status.get('phase')} {waiting or status.get('conditions')}"


def affinity(pid: int) -> CPUSet | None:
    try:
        return CPUSet(os.sched_getaffinity(pid))
    except OSError:  # gone meanwhile
        return None


@contextlib.contextmanager
def burst_node(route: str, cluster: Cluster, parts: RealNodeParts) -> Iterator[tuple[RealNode, NodeAgent]]:
    if route != "pod-cgroup":
        require(parts.containerd2 is not None, "no containerd 2.4.2 among the real node's parts")
    require(len(os.sched_getaffinity(0)) >= 2, "needs two CPUs to tell a pinned pod from the pool")
    required = ("topolet",) if route == "nri-required" else ()
    node = start_node(cluster, parts, runtime=CONTAINERD_1_6 if route == "pod-cgroup" else CONTAINERD_2_4,
                      nri_required_plugins=required)
    args = ("--route", "pod-cgroup") if route == "pod-cgroup" else \
        ("--route", "nri", "--nri-socket", str(node.nri_socket))
    agent = NodeAgent(node, *args)
    try:
        yield node, agent
    finally:
        with node.api() as api:
            with contextlib.suppress(Exception):
                api.request("DELETE", f"/api/v1/namespaces/{NS}/pods",
                            query={"labelSelector": LABEL, "gracePeriodSeconds": 0})
            with contextlib.suppress(Exception):
                wait(lambda: not burst_pods(api),
                     "the burst's pods gone", 180)
        agent.stop()
        print(agent.log()[-6000:])
        print(node.logs())
        node.stop()


@pytest.mark.parametrize("route", ["pod-cgroup", "nri", "nri-required"])
def test_agent_killed_during_a_burst_double_books_nothing_and_pins_everything(
        route: str, realnode_cluster: Cluster, realnode_parts: RealNodeParts) -> None:
    with burst_node(route, realnode_cluster, realnode_parts) as (node, agent):
        agent.start()
        ready = "pinning route: nri (registered" if route != "pod-cgroup" else "pod-cgroup route: watching"
        wait(lambda: ready in agent.log() or not agent.running(), "the agent's route", 60)
        assert agent.running(), agent.log()[-4000:]
        exclusive_uid = ""
        with node.api() as api:
            for i, kind in enumerate(kinds()):
                made = api.create(f"/api/v1/namespaces/{NS}/pods", burst_pod(i, node.name, kind))
                if kind == "exclusive":
                    exclusive_uid = made["metadata"]["uid"]
                    agent.kill()
                    killed = time.monotonic()
            time.sleep(max(0.0, AWAY_S - (time.monotonic() - killed)))
            agent.start()
            restarted = time.monotonic()

            def all_running() -> bool:
                pods = burst_pods(api)
                return len(pods) == BURST and all((p.get("status") or {}).get("phase") == "Running"
                                                  for p in pods)

            try:
                wait(all_running, f"all {BURST} pods Running", SETTLE_TIMEOUT_S)
            except AssertionError:
                pytest.fail(f"not all {BURST} pods Running:\n  " + "\n  ".join(
                    pod_line(p) for p in burst_pods(api)
                    if (p.get("status") or {}).get("phase") != "Running"))
            pods = burst_pods(api)
        assert agent.running(), agent.log()[-4000:]

        kubepods = node.cpuset_root / "kubepods"
        dirs = {p["metadata"]["uid"]: kubepods / {"Guaranteed": "", "Burstable": "burstable",
                                                  "BestEffort": "besteffort"}[p["status"]["qosClass"]]
                / f"pod{p['metadata']['uid']}" for p in pods}

        # Each pod's containers by their runtime id (their cgroups' names under the cgroupfs driver);
        # the sandbox's (pause) cgroup is left out: no route narrows it on NRI, as with the kubelet's
        # static policy, and it only sleeps.
        ids = {p["metadata"]["uid"]: {container_id(p, c["name"]) for c in p["spec"]["containers"]}
               for p in pods}
        last: list[str] = []

        def settled() -> tuple[CPUSet, list[str]] | None:
            state = agent.state()
            mine = [a for a in state.allocations if a.owner.pod_uid == exclusive_uid]
            if len(mine) != 1:
                last[:] = [f"the exclusive pod's allocations: {mine}"]
                return None
            held = mine[0].cpus
            wrong, seen = [], False
            for uid, pod_dir in dirs.items():
                for cgroup, pids in container_procs(pod_dir).items():
                    if cgroup not in ids[uid]:
                        continue
                    for pid in pids:
                        got = affinity(pid)
                        if got is None:
                            continue
                        if uid == exclusive_uid:
                            seen = True
                            if got != held:
                                wrong.append(f"exclusive {cgroup}: pid {pid} on {got}, holds {held}")
                        elif got & held:
                            wrong.append(f"pod {uid} {cgroup}: pid {pid} on {got}, {held} is exclusive")
            last[:] = wrong if seen else ["the exclusive container: no process yet", *wrong]
            return (held, wrong) if seen and not wrong else None

        try:
            held, _ = wait(settled, "the exclusive container pinned and every other one off its CPU", 60)
        except AssertionError:
            pytest.fail("not settled:\n  " + "\n  ".join(last[:20]))
        print(f"\n{route}: {BURST} pods, agent away {AWAY_S:.0f} s: settled "
              f"{time.monotonic() - restarted:.1f} s after the restart; exclusive CPUs {held}")
        state = agent.state()
        (alloc,) = state.allocations  # nothing else allocated: every other pod is on the pool
        assert alloc.owner.pod_uid == exclusive_uid and alloc.cpus == held and len(held) == 1
        assert "overlap" not in agent.log()
