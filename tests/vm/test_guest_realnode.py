"""The real-node end-to-end test on cgroup v2: the node in the throwaway guest, its cluster on this host.

Under emulation a whole control plane in the guest is too slow to start, so the split is the one of a
real cluster: this host runs the test cluster (etcd, kube-apiserver, kube-controller-manager,
kube-scheduler: `cluster_session`) and a DaemonSet controller; the guest (tests/vm/guest.py, qemu's
user network) runs only the node — Debian's containerd, runc and CNI plugins from its own packages,
the kubelet built here — and tests/realnode/test_daemonset.py against it (tests/realnode/remote.py):
the DaemonSet's pod from the image of `make image`, its labels and NRT, a Guaranteed pod pinned in
the cgroup v2 folder runc made, the shared pool shrinking, the agent's container killed, the kubelet
and containerd restarted (the pin kept, nothing assigned twice), the pod deleted and its CPU freed.
The kubelet uses the cgroupfs driver: the systemd driver needs systemd as PID 1 (the enforce tests
cover systemd's slice naming on v2, tests/vm/test_guest_enforce.py).  runc enters containers without
pivot_root there (the guest's root is its initramfs, which pivot_root cannot move: node.py).

The run prints its figures on the terminal: boot, then the node's milestones in guest time from the
job's start (kubelet healthy, Node Ready, the agent's image imported, the DaemonSet's pod Running,
the pod pinned, the restarts survived).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.conftest import require
from tests.controlplane.cluster import Cluster
from tests.realnode.images import cache_dir
from tests.realnode.node import (
    AGENT_NS,
    EMULATED_ENV,
    IMAGE_ENV,
    MILESTONES_ENV,
    RealNodeError,
    find_parts,
    image_env,
    start_daemonset_controller,
)
from tests.realnode.remote import REMOTE_ENV, forget_remote_nodes, write_remote
from tests.vm.conftest import outcomes_on_v2, read_milestones
from tests.vm.guest import GuestRun, Share, kvm_usable, run_in_guest

GUEST_SELECTION = ["tests/realnode/test_daemonset.py"]
# The guest's RAM holds its root file system, containerd's content and snapshots (the agent's image
# twice) and the node's daemons.
GUEST_MEMORY_MIB = 4096
GUEST_TIMEOUT_S = 1500.0


@dataclass(frozen=True)
class RealNodeRun:
    """The guest's run and the node's milestones (guest seconds from the job's start)."""

    run: GuestRun
    milestones: dict[str, float]

    def summary(self) -> str:
        """Boot time, then each milestone after it, in one line."""
        steps = " | ".join(f"{name} +{at:.1f} s" for name, at in self.milestones.items())
        return f"{self.run.summary()}\nreal node in the guest (after boot): {steps or 'no milestones'}"


@pytest.fixture(scope="module")
def realnode_run(cluster_session: Cluster, tmp_path_factory: pytest.TempPathFactory,
                 pytestconfig: pytest.Config) -> Iterator[RealNodeRun]:
    """One guest boot running the node and GUEST_SELECTION against this host's cluster; whatever the
    node left in the cluster is removed after it, and the DaemonSet controller stopped."""
    from agent.kubeapi.client import KubeClient
    from tests.controlplane.kubectl import build_kubectl

    require(os.geteuid() == 0, "needs root (debootstrap builds the guest)")
    for tool in ("qemu-system-x86_64", "debootstrap"):
        require(shutil.which(tool) is not None, f"needs {tool} (make deps)")
    env = image_env()
    require(bool(env), f"no agent image: {IMAGE_ENV} missing (make image)")
    try:
        parts = find_parts()
    except RealNodeError as exc:
        require(False, f"no real node: {exc}")
        raise
    kubectl = build_kubectl()
    job = tmp_path_factory.mktemp("guest-realnode")
    with contextlib.closing(KubeClient(cluster_session.plane.client())) as api:
        before = {n["metadata"]["name"] for n in api.list("/api/v1/nodes")["items"]}
    controller = start_daemonset_controller(cluster_session)
    try:
        remote = write_remote(job / "cluster.json", cluster_session, parts.kubelet, kubectl, parts.image,
                              daemonset_controller=True)
        milestones = job / "milestones"
        run = run_in_guest(
            ["-q", *GUEST_SELECTION], job_dir=job, memory_mib=GUEST_MEMORY_MIB, timeout_s=GUEST_TIMEOUT_S,
            env={REMOTE_ENV: str(remote), MILESTONES_ENV: str(milestones),
                 EMULATED_ENV: "0" if kvm_usable() else "1"}, net=True,
            # The kubelet and kubectl built here and the busybox image, at the same paths.
            extra_shares=[Share("topolet-cache", cache_dir().parent)],
        )
        started = float((job / "started").read_text())
        result = RealNodeRun(run, read_milestones(milestones, started))
    finally:
        controller.stop()
        forget_remote_nodes(cluster_session, before, namespaces=(AGENT_NS,))
    capture = pytestconfig.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        print(f"\n{result.summary()}")
    yield result


def test_the_real_node_end_to_end_passes_on_cgroup_v2(realnode_run: RealNodeRun) -> None:
    run = realnode_run.run
    cases = outcomes_on_v2(run, 12000)
    assert cases and all(o == "passed" for o in cases.values()), cases
    assert any("test_daemonset_pod_publishes_and_pins_on_the_real_node" in n for n in cases), sorted(cases)
    # The node came up in the guest and the pin happened there, in this order.
    steps = list(realnode_run.milestones)
    for step in ("kubelet healthy", "node ready", "daemonset pod running", "pod pinned", "restarts survived"):
        assert step in steps, realnode_run.milestones
    assert steps.index("node ready") < steps.index("daemonset pod running") < steps.index("pod pinned") \
        < steps.index("restarts survived")
