"""First instruction pinned on cgroup v2, both routes, in a guest of 4 vCPUs over two emulated NUMA nodes.

Issue 20's acceptance on cgroup v2: the guest (tests/vm/guest.py, `numa_nodes=2`: CPUs 0-1 and 2048 MiB
on node 0, CPUs 2-3 and 2048 MiB on node 1) runs one real node per route — `pod-cgroup` on the
guest's Debian containerd 1.6, `nri` on containerd 2.4.2 built here (shared read-only from
`~/.cache/topolet` at the same path, as the kubelet is) — each with the real agent as a process
(bench/realnode_arms.py), against this host's test cluster (tests/realnode/remote.py, as
tests/vm/test_guest_realnode.py).  tests/realnode/test_first_instruction.py's
`test_pods_held_together_on_two_numa_nodes` runs there: per route a 2-CPU and a 1-CPU Guaranteed
pod created together and held together, both memory-bound (the 2-CPU pod fills one NUMA node, so the
other's memory is bound to the other node; 3 CPUs exclusive at once, one left shared), and a
Burstable pod started among them.  Every exclusive container's first instruction must print its
allocation (Cpus_allowed_list, nproc, Mems_allowed_list: its one NUMA node), no Burstable pod may
see an exclusive CPU, and the two bound pods' nodes must be both of the guest's.  Fewer pods than on
the host's one-at-a-time run (10 Guaranteed and 2 Burstable per route): under TCG each pod's start
(the shim's and runc's Go start-up, emulated) takes most of a minute and each node's start (containerd,
the kubelet, the agent's Python) several, so one wave of 3 pods per route keeps both routes, on one
boot, within CI's budget.  Under emulation (TOPOLET_REALNODE_EMULATED=1) the node's waits, the
tests' API timeouts and NRI's plugin timeouts are stretched (tests/realnode/node.py: EMULATED_SLACK):
a slow answer is not a miss, a wrong cpuset still is.

It prints the guest's boot and run time, each route's `first instruction pinned N/N` line and where
the guest's time went (tests/realnode/node.py's milestones: each node up, its agent serving, each
wave started and released, in guest seconds from the job's start).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil

import pytest

from tests.conftest import require
from tests.controlplane.cluster import Cluster
from tests.realnode.images import cache_dir
from tests.realnode.node import EMULATED_ENV, MILESTONES_ENV, RealNodeError, find_parts
from tests.realnode.remote import REMOTE_ENV, forget_remote_nodes, write_remote
from tests.vm.conftest import outcomes_on_v2, read_milestones
from tests.vm.guest import GuestRun, Share, kvm_usable, run_in_guest

GUEST_TEST = "tests/realnode/test_first_instruction.py::test_pods_held_together_on_two_numa_nodes"
ROUTES = ("pod-cgroup", "nri")
GUEST_CPUS, GUEST_NUMA_NODES = 4, 2
GUEST_MEMORY_MIB = 4096  # its root file system, two containerds' content in turn, the node's daemons
GUEST_TIMEOUT_S = 1800.0  # a hang's bound: a loaded 2-core host stretches the emulated minutes
# Each route's figures line and what each pod saw (the indented lines under it).
FIGURES = re.compile(r"^(pod-cgroup|nri): first instruction pinned .*(?:\n  .*)*", re.MULTILINE)


@pytest.fixture(scope="module")
def guest_run(cluster_session: Cluster, tmp_path_factory: pytest.TempPathFactory,
              pytestconfig: pytest.Config) -> GuestRun:
    """One guest boot running GUEST_TEST on both routes; the Nodes it left in the cluster removed after."""
    from agent.kubeapi.client import KubeClient
    from tests.controlplane.kubectl import build_kubectl

    require(os.geteuid() == 0, "needs root (debootstrap builds the guest)")
    for tool in ("qemu-system-x86_64", "debootstrap"):
        require(shutil.which(tool) is not None, f"needs {tool} (make deps)")
    try:
        parts = find_parts()
    except RealNodeError as exc:
        require(False, f"no real node: {exc}")
        raise
    assert parts.containerd2 is not None and parts.containerd2_shim is not None
    job = tmp_path_factory.mktemp("guest-first-instruction")
    with contextlib.closing(KubeClient(cluster_session.plane.client())) as api:
        before = {n["metadata"]["name"] for n in api.list("/api/v1/nodes")["items"]}
    try:
        remote = write_remote(job / "cluster.json", cluster_session, parts.kubelet, build_kubectl(),
                              parts.image, daemonset_controller=False,
                              containerd2=(parts.containerd2, parts.containerd2_shim))
        run = run_in_guest(
            ["-q", "-s", GUEST_TEST], job_dir=job, cpus=GUEST_CPUS, numa_nodes=GUEST_NUMA_NODES,
            memory_mib=GUEST_MEMORY_MIB, timeout_s=GUEST_TIMEOUT_S,
            env={REMOTE_ENV: str(remote), MILESTONES_ENV: str(job / "milestones"),
                 EMULATED_ENV: "0" if kvm_usable() else "1"}, net=True,
            # The kubelet, kubectl, containerd 2.4.2 and its shim built here, and the busybox image.
            extra_shares=[Share("topolet-cache", cache_dir().parent)],
        )
    finally:
        forget_remote_nodes(cluster_session, before)
    capture = pytestconfig.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        figures = "\n".join(m.group(0) for m in FIGURES.finditer(run.output))
        steps = " | ".join(f"{name} +{at:.0f} s" for name, at in read_milestones(
            job / "milestones", float((job / "started").read_text())).items()) or "no milestones"
        print(f"\n{run.summary()}\n{figures or 'no figures printed'}\nin the guest: {steps}")
    return run


def test_first_instruction_equals_the_allocation_on_two_numa_nodes(guest_run: GuestRun) -> None:
    cases = outcomes_on_v2(guest_run, 12000)
    assert sorted(cases) == sorted(f"{GUEST_TEST}[{route}]" for route in ROUTES), cases
    assert all(o == "passed" for o in cases.values()), (cases, guest_run.output[-12000:])
