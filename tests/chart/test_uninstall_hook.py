"""`helm uninstall` when the pre-delete cleanup hook cannot run, against a real kube-apiserver.

This module's control plane also runs kube-controller-manager (Jobs, DaemonSets, the garbage
collector) and kube-scheduler, and has one Node that no pod of the chart fits (no
`kubernetes.io/os` label): the hook Job's pod is never scheduled, as where no node fits its selector
or none can pull its image. With Helm's default --timeout (5m), the uninstall fails once the Job's
activeDeadlineSeconds (cleanup.timeoutSeconds + 30 s) runs out, no hook object stays, the reason stays
in the Events, and the release is left `uninstalling`; the way out that charts/topolet/README.md
gives (`topolet cleanup` by hand, then `helm uninstall --no-hooks`) ends with no release and no
topolet object. The tests run in order, each on the state the one before left.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from agent.api.nrt import GROUP, PLURAL, VERSION
from agent.enforce.state import State
from agent.kube.publish.labels_sink import MANAGED_LABELS_ANNOTATION, LabelPublisher
from agent.kube.publish.nrt import nrt_object
from agent.kube.publish.nrt_publisher import NRTPublisher
from tests.chart.helm import CHART, NAMESPACE, RELEASE, Helm, set_args
from tests.chart.test_install import OBJECTS
from tests.conftest import REPO, topolet_bin
from tests.controlplane.cluster import Cluster, build_cluster_binaries
from tests.controlplane.fixtures import IN_CI
from tests.controlplane.harness import ControlPlane, ControlPlaneError
from tests.controlplane.kubectl import api_request
from tests.kube.test_nrt import TWO_SOCKETS_AND_CXL

BUDGET_S = 10  # cleanup.timeoutSeconds: the Job gives up 30 s later
JOB_DEADLINE_S = BUDGET_S + 30
VALUES = {"image.repository": "registry.example.com/topolet", "image.tag": "test",
          "cleanup.timeoutSeconds": BUDGET_S}
NODE = "no-pod-fits"
LABELS = {"topolet.io/numa.nodes": "2"}
HOOK_OBJECTS = {
    "Job": f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs/topolet-cleanup",
    "ServiceAccount": f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/topolet-cleanup",
    "ClusterRole": "/apis/rbac.authorization.k8s.io/v1/clusterroles/topolet-cleanup",
    "ClusterRoleBinding": "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/topolet-cleanup",
    "Role": f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NAMESPACE}/roles/topolet-cleanup",
    "RoleBinding": f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NAMESPACE}/rolebindings/topolet-cleanup",
}
NRT_PATH = f"/apis/{GROUP}/{VERSION}/{PLURAL}/{NODE}"


class _JobsAndDaemonSets(Cluster):
    """The test cluster's components with the DaemonSet controller too (the node cleanup's DaemonSets)."""

    def _kcm_argv(self, port: int) -> list[str]:
        argv = super()._kcm_argv(port)
        at = argv.index("--controllers") + 1
        argv[at] += ",daemonset-controller"
        return argv


@pytest.fixture(scope="module")
def chart_plane(chart_plane: ControlPlane,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """The module's chart plane, with kube-controller-manager and kube-scheduler running on it."""
    try:
        cluster = _JobsAndDaemonSets(chart_plane, build_cluster_binaries(), tmp_path_factory.mktemp("hook"))
        cluster.start()
    except ControlPlaneError as exc:
        if IN_CI:
            pytest.fail(f"cluster components required under CI: {exc}")
        pytest.skip(f"no cluster components: {exc}")
    yield chart_plane
    cluster.stop()


def get(plane: ControlPlane, path: str) -> tuple[int, dict[str, Any]]:
    return api_request(plane, "GET", path)


def wait_for(check: Any, what: str, timeout_s: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (got := check()):
        assert time.monotonic() < deadline, f"{what}: not after {timeout_s:g} s"
        time.sleep(0.5)
    return got


def hook_pods(plane: ControlPlane) -> list[dict[str, Any]]:
    status, pods = get(plane, f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector=job-name%3Dtopolet-cleanup")
    assert status == 200, pods
    return list(pods["items"])


def test_a_hook_that_cannot_run_fails_the_uninstall_in_time_and_leaves_no_hook_object(
        cluster_helm: Helm, chart_plane: ControlPlane) -> None:
    with chart_plane.client() as api:
        from kubernetes import client as k8s

        node = k8s.CoreV1Api(api).create_node({"metadata": {"name": NODE}})
        # What an agent on it wrote (it ran there once): its NRT and, with the Node sink, its labels.
        assert NRTPublisher(api, NODE).publish(
            nrt_object({"metadata": {"name": NODE, "uid": node.metadata.uid}}, TWO_SOCKETS_AND_CXL, State()))
        assert LabelPublisher(api, NODE, NAMESPACE, sink="node").publish(LABELS)
    cluster_helm.run("install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--create-namespace",
                     *set_args(VALUES))

    start = time.monotonic()
    done = cluster_helm.run("uninstall", RELEASE, "--namespace", NAMESPACE, check=False)  # --timeout 5m
    took = time.monotonic() - start
    output = done.stderr + done.stdout
    print(f"helm uninstall with the hook unable to run: exit {done.returncode} after {took:.1f} s\n{output}")
    assert done.returncode != 0, output
    assert JOB_DEADLINE_S - 5 < took < JOB_DEADLINE_S + 30, output  # the Job's deadline, not Helm's 300 s
    # One line naming the hook: "resource Job/topolet-system/topolet-cleanup not ready. status: Failed".
    assert f"Job/{NAMESPACE}/topolet-cleanup not ready. status: Failed" in output, output

    for kind, path in HOOK_OBJECTS.items():
        assert get(chart_plane, path)[0] == 404, f"hook {kind} topolet-cleanup left"
    wait_for(lambda: not hook_pods(chart_plane), "the hook Job's pods gone")
    # Why, after the Job is gone: its Events (the scheduler's for its pod, the Job controller's).
    status, events = get(chart_plane, f"/api/v1/namespaces/{NAMESPACE}/events")
    reasons = {(e["involvedObject"]["kind"], e["reason"]) for e in events["items"]
               if e["involvedObject"]["name"].startswith("topolet-cleanup")}
    assert {("Job", "DeadlineExceeded"), ("Pod", "FailedScheduling")} <= reasons, reasons
    # Helm keeps the release, `uninstalling`: the README's way out finishes it (below).
    state = json.loads(cluster_helm.run("status", RELEASE, "--namespace", NAMESPACE, "-o", "json").stdout)
    assert state["info"]["status"] == "uninstalling"
    assert get(chart_plane, OBJECTS["DaemonSet topolet-agent"])[0] == 200


def test_the_way_out_leaves_no_release_and_no_topolet_object(cluster_helm: Helm,
                                                             chart_plane: ControlPlane) -> None:
    """charts/topolet/README.md, "Uninstall": the hook's command by hand, then `--no-hooks`."""
    done = subprocess.run([topolet_bin(), "cleanup", "--objects", "--all-nodes", "--namespace", NAMESPACE,
                           "--daemonset", "topolet-agent", "--timeout-seconds", "60",
                           "--kubeconfig", str(chart_plane.kubeconfig)],
                          capture_output=True, text=True, cwd=REPO, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert (f"DaemonSet {NAMESPACE}/topolet-agent deleted, 0 node(s) cleaned by topolet-agent-cleanup; "
            "1 NodeResourceTopology(ies)") in done.stdout, done.stdout
    cluster_helm.run("uninstall", RELEASE, "--namespace", NAMESPACE, "--no-hooks")

    listed = cluster_helm.run("list", "--namespace", NAMESPACE, "-o", "json").stdout  # every status
    assert json.loads(listed) == []
    for name, path in {**OBJECTS, **{f"hook {k}": p for k, p in HOOK_OBJECTS.items()}}.items():
        assert get(chart_plane, path)[0] == 404, f"{name} left"
    status, daemonsets = get(chart_plane, f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets")
    assert daemonsets["items"] == []  # neither the agents' nor the node cleanup's
    assert get(chart_plane, NRT_PATH)[0] == 404
    status, node = get(chart_plane, f"/api/v1/nodes/{NODE}")
    assert not set(LABELS) & set(node["metadata"].get("labels", {}))
    assert MANAGED_LABELS_ANNOTATION not in node["metadata"].get("annotations", {})
