"""The real agent process on the NRI route: `topolet agent --route nri` registered on NRI's own
runtime side (pkg/adaptation in main.go's -script mode, the test playing containerd's calls), a real
API server, real cgroups; the kubelet stand-in makes the containers with the cpuset the runtime's
adjusted spec carries, as runc would.

A Guaranteed pod's container is pinned in CreateContainer's answer (the state file says the same
CPUs), runs its first instruction there, and the pod watch that then sees it running leaves the
allocation as it is.  The agent is killed; meanwhile that pod goes and another Guaranteed pod starts
unpinned; the restarted agent registers again and pins it at once (Synchronize).  The route is
reported in the log, `topolet_info{route}` and the NRT.

Needs root, writable cgroups, the control plane and go: skips on a laptop, fails under CI=true.
"""

from __future__ import annotations

import os
import secrets
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.api.fingerprint import pod_set_fingerprint
from agent.enforce.cgroup import detect_layout, read_cpuset
from agent.enforce.state_file import StateFile
from agent.nri import api_pb2
from agent.topology.cpuset import CPUSet
from tests.conftest import require
from tests.kube.kubelet_standin import KubeNode, kube_node, metric_sum, proc_cpus, wait_for
from tests.nri.goruntime import ScriptedRuntime, build_runtime, go_available

__all__ = ["kube_node"]


@pytest.fixture
def runtime(kube_node: KubeNode) -> Iterator[ScriptedRuntime]:
    require(go_available(), "needs go to build NRI's runtime side from the Go module proxy")
    binary = build_runtime()
    with tempfile.TemporaryDirectory(prefix="nri-") as d:
        rt = ScriptedRuntime(binary, Path(d) / "nri.sock")
        try:
            rt.wait_listening()
            yield rt
        finally:
            rt.close()


def nri_pair(node: KubeNode, name: str, uid: str) -> tuple[api_pb2.PodSandbox, api_pb2.Container]:
    """What containerd tells NRI of a Guaranteed 1-CPU pod's container c0 (cgroupfs driver)."""
    # The node's kubelet runs under a cgroup root of its own (the test's private cgroup): the runtime
    # spells paths from the hierarchy's top, as a kubelet `--cgroup-root` makes it.
    top = detect_layout().root
    root = "/" + os.path.relpath(node.root, top) if node.root != top else ""
    pod = api_pb2.PodSandbox(id=secrets.token_hex(32), uid=uid, namespace=node.namespace, name=name)
    pod.linux.cgroup_parent = f"{root}/kubepods/pod{uid}"
    cid = secrets.token_hex(32)
    ctr = api_pb2.Container(id=cid, pod_sandbox_id=pod.id, name="c0", state=api_pb2.CONTAINER_CREATED)
    ctr.linux.cgroups_path = f"{root}/kubepods/pod{uid}/{cid}"
    ctr.linux.resources.cpu.shares.value = 1024
    ctr.linux.resources.cpu.quota.value = 100000
    ctr.linux.resources.cpu.period.value = 100000
    ctr.linux.resources.memory.limit.value = 64 << 20
    return pod, ctr


def adjusted_cpus(reply: dict[str, Any]) -> str:
    adjust = (reply.get("response") or {}).get("adjust") or {}
    return str(adjust.get("linux", {}).get("resources", {}).get("cpu", {}).get("cpus", ""))


def counted(node: KubeNode) -> dict[str, float]:
    """topolet_allocations_total by result."""
    return {r: metric_sum(node.metrics_port() or 0, "topolet_allocations_total", result=r)
            for r in ("allocated", "refused", "released", "error")}


def attribute(node: KubeNode, name: str) -> str | None:
    obj = node.nrt()
    return next((a["value"] for a in (obj or {}).get("attributes", []) if a["name"] == name), None)


def test_agent_pins_through_nri_and_again_after_a_restart(kube_node: KubeNode,
                                                          runtime: ScriptedRuntime) -> None:
    node = kube_node
    everything = read_cpuset(node.layout, "", effective=True)[0]
    nri = ("--route", "nri", "--nri-socket", str(runtime.socket))
    node.start_agent(*nri)
    runtime.wait_event("Synchronize", timeout=90)
    wait_for(lambda: "pinning route: nri (registered as an NRI plugin" in node.log_text(),
             "the route's log line")
    wait_for(lambda: node.metrics_port() is not None, "the metrics server")
    wait_for(lambda: metric_sum(node.metrics_port() or 0, "topolet_info", route="nri") == 1,
             "topolet_info{route}")
    wait_for(lambda: attribute(node, "topolet.io/pinning-route") == "nri", "the NRT's pinning-route")

    uid = node.create_pod("pinned", cpu="1", memory="64Mi")
    pod, ctr = nri_pair(node, "pinned", uid)
    reply = runtime.request("create", pod=pod, container=ctr)
    assert "error" not in reply, reply
    cpus = CPUSet.parse(adjusted_cpus(reply))
    (alloc,) = StateFile(node.state_dir).load().allocations  # recorded before the answer
    assert (alloc.owner.pod_uid, alloc.owner.container, alloc.cpus) == (uid, "c0", cpus) and len(cpus) == 1
    running = node.kubelet.start_pod(node.namespace, "pinned", container_ids={"c0": ctr.id},
                                     cpusets={"c0": cpus})
    assert proc_cpus(running.containers["c0"].pid) == cpus.cpulist()  # from its first instruction
    # The watch has the pod once the NRT fingerprints it as pinned: it kept the allocation (the same
    # id and CPUs, once the status lists the container at the container's cgroup; an allocation the
    # watch made when the pod was bound starts at a planned cgroup and is moved there).
    wait_for(lambda: attribute(node, "nodeTopologyPodsFingerprint")
             == pod_set_fingerprint([(node.namespace, "pinned")]), "the watch to count the pinned pod")
    c0 = running.containers["c0"].cgroup
    wait_for(lambda: [a.cgroup for a in StateFile(node.state_dir).load().allocations] == [c0],
             "the allocation at the container's cgroup")
    (kept,) = StateFile(node.state_dir).load().allocations
    assert (kept.id, kept.cpus, kept.owner) == (alloc.id, alloc.cpus, alloc.owner)
    assert counted(node) == {"allocated": 1.0, "refused": 0.0, "released": 0.0, "error": 0.0}

    node.agent.kill()  # type: ignore[union-attr]
    node.agent.wait()  # type: ignore[union-attr]
    # While the agent is away: the pinned pod goes, another Guaranteed pod starts on every CPU.
    node.kubelet.delete_pod(running)
    runtime.request("stop", pod=pod, container=ctr)
    runtime.request("remove", pod=pod, container=ctr)
    uid2 = node.create_pod("late", cpu="1", memory="64Mi")
    pod2, ctr2 = nri_pair(node, "late", uid2)
    reply = runtime.request("create", pod=pod2, container=ctr2)
    assert adjusted_cpus(reply) == ""  # no plugin connected
    late = node.kubelet.start_pod(node.namespace, "late", container_ids={"c0": ctr2.id})
    assert proc_cpus(late.containers["c0"].pid) == everything.cpulist()
    ctr2.state = api_pb2.CONTAINER_RUNNING
    runtime.request("existing", pods=[pod2], containers=[ctr2])

    node.start_agent(*nri)
    sync = runtime.wait_event("Synchronize", timeout=90)
    (alloc2,) = StateFile(node.state_dir).load().allocations
    assert (alloc2.owner.pod_uid, len(alloc2.cpus)) == (uid2, 1)
    assert {u["container_id"]: u["linux"]["resources"]["cpu"]["cpus"] for u in sync["update"]} == {
        ctr2.id: alloc2.cpus.cpulist()}
    assert proc_cpus(late.containers["c0"].pid) == alloc2.cpus.cpulist()  # the engine wrote its cgroup too
    wait_for(lambda: node.metrics_port() is not None, "the metrics server")
    want = {"allocated": 1.0, "refused": 0.0, "released": 1.0, "error": 0.0}
    wait_for(lambda: counted(node) == want,
             "the restarted agent to count late's allocation and pinned's release")
    assert node.agent is not None and node.agent.poll() is None
