"""`topolet cleanup --objects --daemonset` within one overall budget (`--timeout-seconds`).

The budget's split into the node cleanup's steps is a table; a node cleanup that cannot finish (no
garbage collector and no DaemonSet controller on this control plane, an agent's pod on a node that
never answers) still ends within the budget, deletes topolet's objects all the same, names what it
left on one line and exits 3; the cleanup DaemonSet keeps off the node whose agent may still run.
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import astuple
from typing import Any

import pytest

from agent.api import nrt
from agent.kube.cleanup.command import PARTIAL
from agent.kube.cleanup.nodes import (
    CLEANUP_LABELS,
    CLEANUP_OF_LABEL,
    Deadlines,
    cleanup_daemonset,
    pod_node,
    pod_state,
    split_budget,
)
from agent.kube.cleanup.sweep import MANAGER
from agent.kube.publish.nrt import MANAGED_BY_LABEL
from agent.kube.publish.nrt_publisher import foreign_manager
from tests.conftest import REPO, topolet_bin
from tests.controlplane.harness import ControlPlane
from tests.kube.test_cleanup import api, exists, namespace, nodes, publish_as_topolet

__all__ = ["api", "namespace", "nodes"]


@pytest.mark.parametrize(("start", "budget", "want"), [
    (0.0, 180.0, Deadlines(60.0, 135.0, 165.0, 180.0)),   # the chart's default
    (0.0, 240.0, Deadlines(80.0, 180.0, 220.0, 240.0)),   # the schema's bound: the Job gives up at 270 s
    (100.0, 12.0, Deadlines(104.0, 109.0, 111.0, 112.0)),  # from the clock's now, however short
])
def test_one_budget_cut_into_the_steps(start: float, budget: float, want: Deadlines) -> None:
    got = split_budget(start, budget)
    assert astuple(got) == pytest.approx(astuple(want))
    assert start < got.stop_agents < got.clean < got.remove < got.end == start + budget


AGENTS = {"metadata": {"name": "topolet-agent", "namespace": "n"},
          "spec": {"template": {"spec": {"containers": [{"name": "agent", "image": "i"}]}}}}


def with_affinity(terms: list[dict[str, Any]]) -> dict[str, Any]:
    agents: dict[str, Any] = {**AGENTS, "spec": {"template": {"spec": {
        **AGENTS["spec"]["template"]["spec"],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": terms}}}}}}}
    return agents


SKIP = {"key": "metadata.name", "operator": "NotIn", "values": ["a", "b"]}
ARCH = {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}


@pytest.mark.parametrize(("agents", "skip", "want"), [
    (AGENTS, [], None),
    (AGENTS, ["b", "a"], [{"matchFields": [SKIP]}]),
    # Terms are ORed: the nodes kept off go into each.
    (with_affinity([{"matchExpressions": [ARCH]}, {"matchFields": [{"key": "metadata.name",
                                                                    "operator": "In", "values": ["c"]}]}]),
     ["a", "b"],
     [{"matchExpressions": [ARCH], "matchFields": [SKIP]},
      {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["c"]}, SKIP]}]),
])
def test_the_cleanup_daemonset_keeps_off_the_nodes_left(agents: dict[str, Any], skip: list[str],
                                                        want: list[dict[str, Any]] | None) -> None:
    ds = cleanup_daemonset(agents, "topolet-agent-cleanup", skip)
    affinity = ds["spec"]["template"]["spec"].get("affinity")
    if want is None:
        assert affinity is None
    else:
        assert affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"] == want
    # One selector per agents' DaemonSet: two pools' cleanups never share pods.
    assert ds["spec"]["selector"]["matchLabels"] == {**CLEANUP_LABELS, CLEANUP_OF_LABEL: "topolet-agent"}


@pytest.mark.parametrize(("pod", "node", "state"), [
    ({"spec": {"nodeName": "n1"}, "status": {"phase": "Pending", "initContainerStatuses": [
        {"name": "cleanup", "state": {"waiting": {"reason": "ErrImagePull"}}}]}},
     "n1", "cleanup: ErrImagePull"),
    ({"spec": {"nodeName": "n1"}, "status": {"phase": "Running", "initContainerStatuses": [
        {"name": "cleanup", "state": {"running": {}}, "lastState": {"terminated": {"exitCode": 2}}}]}},
     "n1", "cleanup: exited 2"),
    ({"metadata": {"name": "p"}, "spec": {"affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": ["n2"]}]}]}}}},
      "status": {"phase": "Pending", "conditions": [
          {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}},
     "n2", "not scheduled (Unschedulable)"),
    ({"metadata": {"name": "p", "deletionTimestamp": "2026-01-01T00:00:00Z"}, "spec": {}, "status": {}},
     "p", "being deleted"),
])
def test_a_pod_left_says_its_node_and_why(pod: dict[str, Any], node: str, state: str) -> None:
    assert (pod_node(pod), pod_state(pod)) == (node, state)


def test_a_node_cleanup_that_cannot_finish_ends_within_the_budget(
        control_plane: ControlPlane, api: Any, namespace: str, nodes: list[dict[str, Any]]) -> None:
    from kubernetes import client as k8s

    apps, core, objects = k8s.AppsV1Api(api), k8s.CoreV1Api(api), k8s.CustomObjectsApi(api)
    ours = nodes[0]["metadata"]["name"]
    publish_as_topolet(api, nodes[0], namespace)
    labels = {"app.kubernetes.io/name": "topolet", "app.kubernetes.io/component": "agent"}
    agents = apps.create_namespaced_daemon_set(namespace, {
        "apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "topolet-agent"},
        "spec": {"selector": {"matchLabels": labels}, "template": {"metadata": {"labels": labels}, "spec": {
            "containers": [{"name": "agent", "image": "registry.example.com/topolet:test",
                            "args": ["--state-dir=/var/lib/topolet"]}]}}}})
    # The agent's pod on a node that never answers: it never goes.
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "default"}})
    core.create_namespaced_pod(namespace, {
        "metadata": {"name": "topolet-agent-x", "labels": labels, "ownerReferences": [{
            "apiVersion": "apps/v1", "kind": "DaemonSet", "name": "topolet-agent",
            "uid": agents.metadata.uid, "controller": True}]},
        "spec": {"nodeName": "gone-node", "containers": [{"name": "agent", "image": "i"}]}})
    # --all-nodes deletes every NRT of topolet's on the plane, this test's and those other tests of the
    # session left behind, but those another publisher took over (the cleanup's own rule).
    listed = objects.list_cluster_custom_object(nrt.GROUP, nrt.VERSION, nrt.PLURAL,
                                                label_selector=f"{MANAGED_BY_LABEL}={MANAGER}")["items"]
    ours_nrts = len([o for o in listed if not foreign_manager(o, MANAGER)])
    budget = 6.0
    start = time.monotonic()
    done = subprocess.run([topolet_bin(), "cleanup", "--objects", "--all-nodes", "--namespace", namespace,
                           "--daemonset", "topolet-agent", "--timeout-seconds", f"{budget:g}",
                           "--kubeconfig", str(control_plane.kubeconfig)],
                          capture_output=True, text=True, cwd=REPO, timeout=120, check=False)
    took = time.monotonic() - start
    try:
        assert done.returncode == PARTIAL, done.stderr
        assert took < budget + 5, took  # the budget, and the interpreter's start
        (line,) = [x for x in done.stderr.splitlines() if x.startswith("topolet cleanup:")]  # logs aside
        assert line.startswith("topolet cleanup: not done within 6 s"), done.stderr
        for left in ("gone-node (the agent's pod of topolet-agent still there: not visited)",
                     f"DaemonSet {namespace}/topolet-agent-cleanup (no DaemonSet controller took it up)",
                     f"DaemonSet {namespace}/topolet-agent-cleanup (still being deleted)"):
            assert left in line, done.stderr
        # The objects went all the same.
        assert f"{ours_nrts} NodeResourceTopology(ies), 1 NodeFeature(s)" in done.stdout, done.stdout
        assert not exists(objects.get_cluster_custom_object, nrt.GROUP, nrt.VERSION, nrt.PLURAL, ours)
        # The cleanup DaemonSet (being deleted, no garbage collector here) kept off that node.
        cleanup = apps.read_namespaced_daemon_set("topolet-agent-cleanup", namespace)
        terms = cleanup.spec.template.spec.affinity.node_affinity \
            .required_during_scheduling_ignored_during_execution.node_selector_terms
        assert [(f.key, f.operator, f.values) for t in terms for f in t.match_fields] == [
            ("metadata.name", "NotIn", ["gone-node"])]
    finally:
        core.delete_namespaced_pod("topolet-agent-x", namespace, grace_period_seconds=0)
        for name in ("topolet-agent", "topolet-agent-cleanup"):  # what the garbage collector would do
            apps.patch_namespaced_daemon_set(name, namespace, {"metadata": {"finalizers": None}})
