"""Losing the API server stops publishing, never enforcing.

The API server is stopped for 30 s while the node churns: processes in known pods exit and restart,
someone rewrites cpusets (drift).  Pinning of the known pods must go on (new processes land on the
right CPUs, drift is repaired), the agent must stay up and healthy, and no allocation may be released
because a pod cannot be seen.  After the server returns, the change it missed (a container that
exited during the outage, reported by the kubelet once it can) reaches the NodeResourceTopology; the
catch-up time is printed, not asserted.
"""

from __future__ import annotations

import time

from kubernetes.client.rest import ApiException
from urllib3.exceptions import HTTPError

from agent.enforce.cgroup import read_cpuset, write_cpuset
from agent.enforce.state_file import StateFile
from tests.kube.kubelet_standin import KubeNode, kube_node, proc_cpus, wait_for

__all__ = ["kube_node"]

OUTAGE_SECONDS = 30.0


def test_api_outage_keeps_pinning_and_publishing_catches_up(kube_node: KubeNode,
                                                            control_plane: object) -> None:
    node = kube_node
    everything = read_cpuset(node.layout, "", effective=True)[0]
    # The watch alone (an NRI route whose runtime never answers): on the pod-cgroup route the pod
    # cgroups would keep the kernel from taking the drift written below.
    node.start_agent("--route", "nri", "--nri-socket", str(node.tmp / "absent.sock"))
    shared = node.run_pod("shared", cpu="100m", memory="32Mi", limits=False)
    pinned = node.run_pod("pinned", cpu="1", memory="64Mi")
    wait_for(lambda: len(StateFile(node.state_dir).load(missing_ok=True).allocations) == 1, "the allocation")
    alloc = StateFile(node.state_dir).load().allocations[0]
    pool = everything - alloc.cpus
    wait_for(lambda: proc_cpus(shared.containers["c0"].pid) == pool.cpulist(), "the pool to shrink")
    wait_for(lambda: node.nrt_available_cpus() == len(everything) - 1, "the NRT before the outage")

    control_plane.stop_apiserver()  # type: ignore[attr-defined]
    stopped = time.monotonic()
    try:
        # Processes in known pods exit and restart (same container, same cgroup): no API involved.
        a = node.kubelet.restart_process(pinned, "c0")
        b = node.kubelet.restart_process(shared, "c0")
        assert proc_cpus(a.pid) == alloc.cpus.cpulist()
        assert proc_cpus(b.pid) == pool.cpulist()
        # Drift, twice: the reconcile loop repairs it without the API.
        for _ in range(2):
            write_cpuset(node.layout, pinned.containers["c0"].cgroup, everything)
            write_cpuset(node.layout, shared.containers["c0"].cgroup, alloc.cpus)
            wait_for(lambda: proc_cpus(a.pid) == alloc.cpus.cpulist() and proc_cpus(b.pid) == pool.cpulist(),
                     "drift repair while the API server is down")
        assert node.healthz() == 200
        # The container exits while the API server is away: the kubelet cannot report it yet.
        node.kubelet.stop_container(pinned, "c0", exit_code=0, report=False)
        time.sleep(max(0.0, OUTAGE_SECONDS - (time.monotonic() - stopped)))
        # Nothing was released for a pod the agent could not see.
        assert [x.id for x in StateFile(node.state_dir).load().allocations] == [alloc.id]
        assert node.agent is not None and node.agent.poll() is None, node.log_text()[-3000:]
        assert node.healthz() == 200
    finally:
        control_plane.start_apiserver()  # type: ignore[attr-defined]
    back = time.monotonic()

    def reported() -> bool:
        try:
            node.kubelet.report(pinned)
            return True
        except (ApiException, HTTPError, OSError):
            return False

    wait_for(reported, "the kubelet stand-in to report the exited container", timeout=30)
    wait_for(lambda: node.nrt_available_cpus() == len(everything), "the NRT to catch up", timeout=60)
    caught_up = time.monotonic() - back
    print(f"\nNRT caught up {caught_up:.2f} s after the API server was ready again "
          f"(outage {back - stopped:.1f} s)")
    wait_for(lambda: proc_cpus(b.pid) == everything.cpulist(), "the pool to widen after the release")
    assert node.agent is not None and node.agent.poll() is None
    assert "Traceback" not in node.log_text()
