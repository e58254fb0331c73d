"""`helm install`, `upgrade` and `uninstall` of charts/topolet against a real kube-apiserver (a control
plane of this module's own): the objects appear, NFD's CRD is left alone, an upgrade changes a value,
uninstall removes topolet's objects and keeps the CRDs, and a reinstall takes its kept CRDs back.
The tests run in order, each on the state the one before left."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tests.chart.helm import AS_BASE, CHART, IMAGE, NAMESPACE, RELEASE, Helm, set_args
from tests.controlplane.harness import ControlPlane
from tests.controlplane.kubectl import api_request

NRT_CRD = "noderesourcetopologies.topology.node.k8s.io"
NODEFEATURE_CRD = "nodefeatures.nfd.k8s-sigs.io"
CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"
NFD_CRD_FILE = Path(__file__).resolve().parents[1] / "data" / "crds" / "nodefeatures.yaml"
# What the release installs besides the CRDs, by API path (the namespaced ones in NAMESPACE).
OBJECTS = {
    "DaemonSet topolet-agent": f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets/topolet-agent",
    "Deployment topolet-controller": f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/topolet-controller",
    "ClusterRole topolet-agent": "/apis/rbac.authorization.k8s.io/v1/clusterroles/topolet-agent",
    "ClusterRole topolet-controller": "/apis/rbac.authorization.k8s.io/v1/clusterroles/topolet-controller",
    "ValidatingAdmissionPolicy topolet-agent-own-node":
        "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies/topolet-agent-own-node",
    "MutatingAdmissionPolicy topolet-placement":
        "/apis/admissionregistration.k8s.io/v1/mutatingadmissionpolicies/topolet-placement",
    "NetworkPolicy topolet-controller-metrics":
        f"/apis/networking.k8s.io/v1/namespaces/{NAMESPACE}/networkpolicies/topolet-controller-metrics",
    "ConfigMap topolet-dashboards": f"/api/v1/namespaces/{NAMESPACE}/configmaps/topolet-dashboards",
}


def get(plane: ControlPlane, path: str) -> tuple[int, dict[str, Any]]:
    return api_request(plane, "GET", path)


def install_args(*extra: str) -> list[str]:
    return ["upgrade", "--install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--create-namespace",
            "--timeout", "2m", *set_args({**IMAGE, **AS_BASE}), *extra]


def test_install_leaves_nfds_crd_alone(cluster_helm: Helm, chart_plane: ControlPlane) -> None:
    """NFD's NodeFeature CRD already there (not Helm's): crds.install=auto installs only the NRT CRD."""
    nfd = yaml.safe_load(NFD_CRD_FILE.read_text())
    nfd["metadata"]["labels"] = {"app.kubernetes.io/name": "node-feature-discovery"}
    status, body = api_request(chart_plane, "POST", CRD_PATH, body=nfd)
    assert status == 201, body
    done = cluster_helm.run("install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--create-namespace",
                            "--timeout", "2m", *set_args({**IMAGE, **AS_BASE}))
    # NOTES: how to check the install, and where the labels go (NFD's CRD is here, without nfd-master).
    for needle in ("kubectl get nodes -L", "get noderesourcetopologies", "/metrics", "scrape_configs",
                   "NFD's NodeFeature API is served here"):
        assert needle in done.stdout, done.stdout
    for name, path in OBJECTS.items():
        status, body = get(chart_plane, path)
        assert status == 200, f"{name}: {status} {body.get('message')}"
        assert body["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm", name
        assert body["metadata"]["labels"]["app.kubernetes.io/instance"] == RELEASE, name
    status, nrt = get(chart_plane, CRD_PATH + NRT_CRD)
    assert status == 200
    assert nrt["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    status, kept = get(chart_plane, CRD_PATH + NODEFEATURE_CRD)
    assert kept["metadata"]["labels"] == {"app.kubernetes.io/name": "node-feature-discovery"}
    assert "meta.helm.sh/release-name" not in kept["metadata"].get("annotations", {})
    manifest = cluster_helm.run("get", "manifest", RELEASE, "--namespace", NAMESPACE).stdout
    assert NRT_CRD in manifest and NODEFEATURE_CRD not in manifest


def test_a_second_release_is_refused_in_one_line(cluster_helm: Helm, chart_plane: ControlPlane) -> None:
    """Two releases would pin the same nodes' cgroups and admit against the same NRTs: the second one,
    in another namespace, fails naming the first and creates nothing."""
    done = cluster_helm.run("install", "second", str(CHART), "--namespace", "elsewhere", "--create-namespace",
                            "--timeout", "2m", *set_args(IMAGE), check=False)
    assert done.returncode != 0
    assert (f"topolet is already installed in this cluster: release {RELEASE} in namespace {NAMESPACE}"
            in done.stderr), done.stderr
    listed = cluster_helm.run("list", "--all-namespaces", "-o", "yaml").stdout
    assert [r["name"] for r in yaml.safe_load(listed)] == [RELEASE]
    status, _ = get(chart_plane, "/apis/apps/v1/namespaces/elsewhere/daemonsets/topolet-agent")
    assert status == 404


def test_upgrade_changes_a_value(cluster_helm: Helm, chart_plane: ControlPlane) -> None:
    pools = [{"name": "default", "tolerations": [{"operator": "Exists"}], "reservedCpus": "0-1"}]
    cluster_helm.run(*install_args(*set_args({"agent.pools": pools, "controller.replicas": 3,
                                              "agent.enforcement": "off"})))
    status, ds = get(chart_plane, OBJECTS["DaemonSet topolet-agent"])
    assert status == 200
    args = ds["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--reserved-cpus=0-1" in args and "--enforcement=off" in args
    status, deployment = get(chart_plane, OBJECTS["Deployment topolet-controller"])
    assert deployment["spec"]["replicas"] == 3
    history = cluster_helm.run("history", RELEASE, "--namespace", NAMESPACE, "-o", "yaml").stdout
    assert [r["revision"] for r in yaml.safe_load(history)] == [1, 2]


def test_upgrade_to_agent_only_removes_the_controller(cluster_helm: Helm, chart_plane: ControlPlane) -> None:
    cluster_helm.run(*install_args(*set_args({"controller.enabled": False})))
    assert get(chart_plane, OBJECTS["Deployment topolet-controller"])[0] == 404
    assert get(chart_plane, OBJECTS["MutatingAdmissionPolicy topolet-placement"])[0] == 404
    assert get(chart_plane, OBJECTS["DaemonSet topolet-agent"])[0] == 200


def test_uninstall_keeps_the_crds(cluster_helm: Helm, chart_plane: ControlPlane) -> None:
    # --no-hooks: the pre-delete cleanup Job needs a node to run on, which this control plane lacks;
    # tests/realnode/test_uninstall.py runs its command against a real node's agent.
    cluster_helm.run("uninstall", RELEASE, "--namespace", NAMESPACE, "--timeout", "2m", "--no-hooks")
    for name, path in OBJECTS.items():
        assert get(chart_plane, path)[0] == 404, f"{name} left after uninstall"
    assert get(chart_plane, CRD_PATH + NRT_CRD)[0] == 200
    assert get(chart_plane, CRD_PATH + NODEFEATURE_CRD)[0] == 200
    listed = cluster_helm.run("list", "--namespace", NAMESPACE, "-o", "yaml").stdout
    assert yaml.safe_load(listed) == []


def test_reinstall_takes_its_kept_crd_back(cluster_helm: Helm, chart_plane: ControlPlane) -> None:
    """The NRT CRD kept by the uninstall still names this release: auto renders it again; NFD's not."""
    cluster_helm.run(*install_args())
    manifest = cluster_helm.run("get", "manifest", RELEASE, "--namespace", NAMESPACE).stdout
    assert NRT_CRD in manifest and NODEFEATURE_CRD not in manifest
    assert get(chart_plane, OBJECTS["DaemonSet topolet-agent"])[0] == 200

