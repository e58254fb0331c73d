"""The chart on a real node: `helm install` brings up the agent (the image `make image` built) and the
controller there, and `helm uninstall`'s pre-delete hook Job cleans the node and the API.

Helm v4.3.2 (tests/controlplane/build.sh) installs charts/topolet with the image's values and a
post-renderer plugin that adapts the rendered objects to this test machine and nothing else, as
tests/realnode/node.py's `write_overlay` does for the kustomize base: the agent's DaemonSet gets the
same patch (the node's own host paths, host network to the API server on 127.0.0.1, its cgroup root);
the controller's Deployment and the cleanup hook's Job get host network, the API server's address and
the node (the cluster also has simulated nodes). Helm v4 sends hooks through the post-renderer too.
A kube-controller-manager of the test's own runs the DaemonSet, Deployment and ReplicaSet controllers
(the cluster's runs the Job controller).
"""

from __future__ import annotations

import json
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.errors import KubeAPIError
from tests.chart.helm import CHART, Helm, build_helm
from tests.conftest import REPO, require, topolet_bin
from tests.controlplane.cluster import Cluster
from tests.controlplane.harness import _Process, free_port
from tests.controlplane.kubectl import Kubectl, build_kubectl
from tests.realnode.node import (
    AGENT_NS,
    IMAGE_ENV,
    IMPORT_TIMEOUT_S,
    LOCAL_IMAGE,
    RealNode,
    container_id,
    image_build_lock,
    image_env,
    milestone,
    start_controller_manager,
    wait,
    write_overlay,
)
from tests.realnode.test_realnode import nrt

RELEASE = "topolet"
CONTROLLERS = ("daemonset-controller", "deployment-controller", "replicaset-controller")
LEFT_CLUSTER_WIDE = ("clusterroles", "clusterrolebindings", "validatingadmissionpolicies",
                     "validatingadmissionpolicybindings", "mutatingadmissionpolicies",
                     "mutatingadmissionpolicybindings")


def start_workload_controllers(cluster: Cluster) -> _Process:
    """A kube-controller-manager running the DaemonSet, Deployment and ReplicaSet controllers."""
    return start_controller_manager(cluster, "chart", CONTROLLERS)


def host_patch(node: RealNode, port: int, kind: str, name: str, *extra: dict[str, Any]) -> dict[str, Any]:
    """A kustomize patch giving a workload's pod host networking to the test API server on this node."""
    api_port = node.cluster.plane.url.rsplit(":", 1)[1]
    spec, c = "/spec/template/spec", "/spec/template/spec/containers/0"
    ops = [
        {"op": "add", "path": f"{spec}/nodeSelector", "value": {"kubernetes.io/hostname": node.name}},
        {"op": "add", "path": f"{spec}/hostNetwork", "value": True},
        {"op": "add", "path": f"{c}/env", "value": [
            {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
            {"name": "KUBERNETES_SERVICE_PORT", "value": api_port}]},
        *extra,
    ]
    if port:
        ops += [{"op": "add", "path": f"{c}/args/-", "value": f"--listen=0.0.0.0:{port}"},
                {"op": "replace", "path": f"{c}/ports/0/containerPort", "value": port}]
    return {"target": {"kind": kind, "name": name}, "patch": json.dumps(ops)}


def write_post_renderer(plugins: Path, node: RealNode) -> None:
    """The post-renderer plugin `realnode`: `kubectl kustomize` of Helm's output with the patches."""
    overlay = write_overlay(node.dir / "chart-overlay", node, LOCAL_IMAGE, free_port())
    patches = json.loads((overlay / "kustomization.yaml").read_text())["patches"]  # the agent's
    # The controller's env is replaced whole: keep what it had (POD_NAME, POD_NAMESPACE) after the API's.
    controller_env = [{"op": "add", "path": "/spec/template/spec/containers/0/env/-", "value": {
        "name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}}
        for name, path in (("POD_NAME", "metadata.name"), ("POD_NAMESPACE", "metadata.namespace"))]
    patches += [host_patch(node, free_port(), "Deployment", "topolet-controller", *controller_env),
                host_patch(node, 0, "Job", "topolet-cleanup")]
    folder = plugins / "realnode"
    folder.mkdir(parents=True)
    (folder / "plugin.yaml").write_text(textwrap.dedent("""\
        apiVersion: v1
        type: postrenderer/v1
        name: realnode
        version: 0.1.0
        runtime: subprocess
        runtimeConfig:
          platformCommand:
            - command: ${HELM_PLUGIN_DIR}/render.py
        """))
    (folder / "patches.json").write_text(json.dumps(patches))
    script = folder / "render.py"
    script.write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import json, subprocess, sys, tempfile
        from pathlib import Path
        here = Path(__file__).resolve().parent
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "rendered.yaml").write_text(sys.stdin.read())
            patches = json.loads((here / "patches.json").read_text())
            (Path(tmp) / "kustomization.yaml").write_text(
                json.dumps({{"resources": ["rendered.yaml"], "patches": patches}}))
            done = subprocess.run([{str(build_kubectl())!r}, "kustomize", tmp],
                                  capture_output=True, text=True)
            sys.stderr.write(done.stderr)
            sys.stdout.write(done.stdout)
            sys.exit(done.returncode)
        """))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)


def agent_pods(node: RealNode, component: str) -> list[dict[str, Any]]:
    with node.api() as api:
        pods = api.list(f"/api/v1/namespaces/{AGENT_NS}/pods",
                        {"labelSelector": f"app.kubernetes.io/component={component}"})["items"]
    return [p for p in pods if p["spec"].get("nodeName") == node.name
            and container_id(p, component) and p["status"].get("phase") == "Running"]


def namespace_gone(node: RealNode) -> bool:
    """True once the agents' namespace is gone.  While it terminates, its pods that are already being
    deleted are deleted with grace 0: an earlier module of the session may have left them on a stand-in
    node with no kubelet left to confirm their end, and the namespace would wait for them forever."""
    with node.api() as api:
        if not [n for n in api.list("/api/v1/namespaces")["items"] if n["metadata"]["name"] == AGENT_NS]:
            return True
        for pod in api.list(f"/api/v1/namespaces/{AGENT_NS}/pods")["items"]:
            meta = pod["metadata"]
            if meta.get("deletionTimestamp") and pod["spec"].get("nodeName") != node.name:
                try:
                    api.request("DELETE", f"/api/v1/namespaces/{AGENT_NS}/pods/{meta['name']}",
                                query={"gracePeriodSeconds": 0})
                except KubeAPIError as exc:
                    if not exc.not_found:
                        raise
        return False


@pytest.fixture(scope="module")
def namespace_free(real_node: RealNode) -> None:
    """The agents' namespace gone: an earlier module of the session's cluster may have left it (the
    Kueue RBAC test creates it for its service account) or deleted it without waiting, and a namespace
    still terminating refuses what the next install puts there."""
    with real_node.api() as api:
        try:
            api.request("DELETE", f"/api/v1/namespaces/{AGENT_NS}")
        except KubeAPIError as exc:
            if not exc.not_found and exc.status != 409:  # 409: already terminating
                raise
    wait(lambda: namespace_gone(real_node), f"namespace {AGENT_NS} left by an earlier test to go",
         timeout=180)


@pytest.fixture(scope="module")
def chart(real_node: RealNode, namespace_free: None,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Helm]:
    """helm with the real node's cluster, its image imported, workload controllers running and the
    namespace free; uninstalled (without hooks) and the namespace deleted afterwards if still there."""
    env = image_env()
    require(bool(env), f"no agent image: {IMAGE_ENV} missing (make image)")
    with image_build_lock():
        real_node._ctr("images", "import", env["IMAGE_ARCHIVE"], timeout=IMPORT_TIMEOUT_S)
    home = tmp_path_factory.mktemp("helm-realnode")
    write_post_renderer(home / "plugins", real_node)
    helm = Helm(build_helm(), home, Path(real_node.cluster.plane.kubeconfig),
                env={"HELM_PLUGINS": str(home / "plugins")})
    controllers = start_workload_controllers(real_node.cluster)
    # What `kubectl apply -k` of an earlier module left cluster-wide (its teardown deletes only the
    # DaemonSet and the namespace): Helm adopts none of it. The CRDs stay, as any install keeps them.
    kubectl = Kubectl(build_kubectl(), Path(real_node.cluster.plane.kubeconfig))
    for kind in LEFT_CLUSTER_WIDE:
        kubectl.run("delete", kind, "-l", "app.kubernetes.io/part-of=topolet", "--ignore-not-found",
                    check=False)
    try:
        yield helm
    finally:
        if RELEASE in helm.run("list", "-n", AGENT_NS, "-q", check=False).stdout.split():
            helm.run("uninstall", RELEASE, "-n", AGENT_NS, "--no-hooks", "--wait", "--timeout", "2m",
                     check=False)
        with real_node.api() as api:
            try:
                api.request("DELETE", f"/api/v1/namespaces/{AGENT_NS}")
            except KubeAPIError as exc:
                if not exc.not_found:
                    raise
        # The next module applies its own objects there: a namespace still terminating refuses them.
        wait(lambda: namespace_gone(real_node), f"namespace {AGENT_NS} to go", timeout=180)
        controllers.stop()


def lease_holder(api: Any, namespace: str, name: str) -> str | None:
    """The Lease's holder; None while it has none or does not exist yet (a Running pod has not led yet)."""
    try:
        lease = api.get(f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}")
    except KubeAPIError as exc:
        if exc.status == 404:
            return None
        raise
    holder = lease.get("spec", {}).get("holderIdentity")
    return str(holder) if holder else None


def test_chart_brings_up_agent_and_controller_and_its_uninstall_cleans_the_node(
        real_node: RealNode, chart: Helm) -> None:
    done = chart.run("install", RELEASE, str(CHART), "-n", AGENT_NS, "--create-namespace",
                     "--post-renderer", "realnode", "--timeout", "5m",
                     "--set", "image.repository=localhost/topolet", "--set", "image.tag=0.1.0",
                     "--set", "image.pullPolicy=Never", "--set", "controller.replicas=1")
    assert "kubectl get noderesourcetopologies" in done.stdout  # NOTES: how to check it
    wait(lambda: agent_pods(real_node, "agent"), "the chart's agent pod Running on the real node",
         timeout=240)
    milestone("chart agent running")
    wait(lambda: nrt(real_node), "the NRT from the chart's agent")
    # No NFD here: the default label sink labels the Node itself.
    numa_nodes = wait(lambda: real_node.node_labels().get("topolet.io/numa.nodes"), "the agent's Node labels")
    assert numa_nodes == "1"
    wait(lambda: agent_pods(real_node, "controller"), "the chart's controller pod Running", timeout=240)
    with real_node.api() as api:
        wait(lambda: lease_holder(api, AGENT_NS, "topolet-controller"), "the controller to lead")
    milestone("chart controller leading")
    tree = real_node.cpuset_root / "topolet"
    assert tree.is_dir()

    chart.run("uninstall", RELEASE, "-n", AGENT_NS, "--timeout", "8m")
    milestone("chart uninstalled")
    assert not tree.exists()  # the hook's node cleanup
    assert nrt(real_node) is None
    assert "topolet.io/numa.nodes" not in real_node.node_labels()  # the hook removed the agent's labels
    with real_node.api() as api:
        assert api.get("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"
                       "noderesourcetopologies.topology.node.k8s.io")  # kept
        assert not [j for j in api.list(f"/apis/batch/v1/namespaces/{AGENT_NS}/jobs")["items"]
                    if j["metadata"]["name"] == "topolet-cleanup"]  # deleted once it succeeded


# The hook's objects (templates/cleanup-hook.yaml), by API path.
HOOK_OBJECTS = (f"/apis/batch/v1/namespaces/{AGENT_NS}/jobs/topolet-cleanup",
                f"/api/v1/namespaces/{AGENT_NS}/serviceaccounts/topolet-cleanup",
                "/apis/rbac.authorization.k8s.io/v1/clusterroles/topolet-cleanup",
                "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/topolet-cleanup",
                f"/apis/rbac.authorization.k8s.io/v1/namespaces/{AGENT_NS}/roles/topolet-cleanup",
                f"/apis/rbac.authorization.k8s.io/v1/namespaces/{AGENT_NS}/rolebindings/topolet-cleanup")


def present(real_node: RealNode, path: str) -> bool:
    with real_node.api() as api:
        try:
            api.get(path)
        except KubeAPIError as exc:
            if exc.not_found:
                return False
            raise
    return True


def test_an_uninstall_whose_image_cannot_pull_fails_in_time_and_leaves_a_way_out(
        real_node: RealNode, chart: Helm) -> None:
    """An image the node can never pull (the agents, the controller and the hook's Job alike): `helm
    uninstall` with Helm's default --timeout fails well within it, leaves no hook object behind, and
    the way out in charts/topolet/README.md ("Uninstall": the hook's command by hand, then
    `helm uninstall --no-hooks`) ends with no release and none of the release's objects."""
    chart.run("install", RELEASE, str(CHART), "-n", AGENT_NS, "--create-namespace",
              "--post-renderer", "realnode", "--timeout", "2m",
              "--set", "image.repository=localhost/topolet-never-built", "--set", "image.tag=0.0.0",
              "--set", "image.pullPolicy=Never", "--set", "controller.replicas=1",
              "--set", "cleanup.timeoutSeconds=20")
    started = time.monotonic()
    done = chart.run("uninstall", RELEASE, "-n", AGENT_NS, check=False)  # Helm's default --timeout, 5m
    took = time.monotonic() - started
    milestone("stuck uninstall failed")
    print(f"an uninstall whose image cannot pull failed in {took:.1f} s (Helm's --timeout: 300 s)")
    assert done.returncode != 0, done.stdout
    assert took < 240, f"the failed hook took {took:.0f} s"
    assert "topolet-cleanup" in done.stderr, done.stderr
    for path in HOOK_OBJECTS:
        assert not present(real_node, path), f"hook object {path} left behind"

    way_out = subprocess.run([topolet_bin(), "cleanup", "--objects", "--all-nodes", "--namespace", AGENT_NS,
                              "--daemonset", "topolet-agent", "--timeout-seconds", "20",
                              "--kubeconfig", str(real_node.cluster.plane.kubeconfig)],
                             capture_output=True, text=True, cwd=REPO, timeout=300, check=False)
    # Its node cleanup cannot run either (the same image): the objects go, the node is named.
    assert way_out.returncode == 3, way_out.stderr
    assert real_node.name in way_out.stderr, way_out.stderr
    chart.run("uninstall", RELEASE, "-n", AGENT_NS, "--no-hooks", "--timeout", "2m")
    assert RELEASE not in chart.run("list", "-n", AGENT_NS, "-q").stdout.split()  # any status (Helm 4)
    for path in (*HOOK_OBJECTS, f"/apis/apps/v1/namespaces/{AGENT_NS}/daemonsets/topolet-agent",
                 f"/apis/apps/v1/namespaces/{AGENT_NS}/deployments/topolet-controller",
                 "/apis/rbac.authorization.k8s.io/v1/clusterroles/topolet-agent"):
        assert not present(real_node, path), f"{path} left after the way out"
