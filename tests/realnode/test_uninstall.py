"""Uninstall on a real node: `topolet cleanup --objects --all-nodes --daemonset topolet-agent`, what the
chart's pre-delete hook Job runs, against the DaemonSet's pod from the image `make image` built.

It stops the agents (their DaemonSet deleted, its pod gone), runs `topolet cleanup --local` on the node
through a DaemonSet made from the agents' pod template (the real kubelet and containerd run it), and
deletes the NRT and the Node labels the agent wrote (no NFD here: the agent labels its Node): the
node's `topolet/` cgroup tree and state file are gone, a pod the agent pinned keeps running on its
CPUs, and the NRT CRD stays.
"""

from __future__ import annotations

import subprocess

from agent.topology.cpuset import CPUSet
from tests.conftest import REPO, topolet_bin
from tests.realnode.node import AGENT_NS, DaemonSetAgent, RealNode, milestone, proc_affinity, wait
from tests.realnode.test_chart import namespace_free
from tests.realnode.test_daemonset import daemonset
from tests.realnode.test_realnode import exclusive_cpus, nrt, run

__all__ = ["daemonset", "namespace_free"]

CRDS = ("noderesourcetopologies.topology.node.k8s.io",)


def test_cleanup_stops_the_agents_and_cleans_the_real_node(
        real_node: RealNode, namespace_free: None, daemonset: DaemonSetAgent, pods: list[str]) -> None:
    wait(lambda: nrt(real_node), "the agent's NRT")
    wait(lambda: real_node.node_labels().get("topolet.io/numa.nodes"), "the agent's Node labels")
    _, pid = run(real_node, pods, "pinned-before-uninstall")
    pinned = wait(lambda: exclusive_cpus(pid), "the agent to pin the pod")
    tree = real_node.cpuset_root / "topolet"
    state = real_node.dir / "agent-state" / "state.json"
    assert tree.is_dir() and state.exists()

    done = subprocess.run([topolet_bin(), "cleanup", "--objects", "--all-nodes", "--namespace", AGENT_NS,
                           "--daemonset", "topolet-agent", "--timeout-seconds", "240",
                           "--kubeconfig", str(real_node.cluster.plane.kubeconfig)],
                          capture_output=True, text=True, cwd=REPO, timeout=600, check=False)
    milestone("cleanup done")
    assert done.returncode == 0, done.stderr
    assert "DaemonSet topolet-system/topolet-agent deleted, 1 node(s) cleaned by topolet-agent-cleanup" \
        in done.stdout, done.stdout
    assert "1 NodeResourceTopology(ies), 0 NodeFeature(s)" in done.stdout, done.stdout
    assert "topolet labels removed from 1 Node(s)" in done.stdout, done.stdout

    assert not tree.exists()  # the node's cgroups topolet made
    assert not state.exists()
    assert nrt(real_node) is None
    assert "topolet.io/numa.nodes" not in real_node.node_labels()
    with real_node.api() as api:
        for name in ("topolet-agent", "topolet-agent-cleanup"):
            listed = api.list(f"/apis/apps/v1/namespaces/{AGENT_NS}/daemonsets")["items"]
            assert name not in [d["metadata"]["name"] for d in listed]
        for crd in CRDS:
            assert api.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd}")
    # A pod the agent pinned keeps its CPUs until it ends (the kubelet's cgroup, not topolet's).
    assert exclusive_cpus(pid) == pinned
    assert CPUSet.parse(proc_affinity(pid)) == pinned
