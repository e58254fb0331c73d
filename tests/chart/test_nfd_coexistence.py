"""topolet's chart beside NFD's real chart (third_party/nfd-chart/, unmodified) on a real API server: in both
install orders, with upgrades and uninstalls of each release, under Helm 4 (server-side apply, its
default), Helm 3 (client-side) and `helm template | kubectl apply --server-side` (as Argo CD applies
a chart), NFD's CRDs and its NodeFeatures survive everything topolet's release does, and topolet's
NodeResourceTopology CRD and NRTs survive everything NFD's release does.

Each scenario gets a control plane of its own (nothing carries over from one to the next). NFD's images
are never pulled: what the API server keeps is what is tested. The regression this guards: under Helm 4
both releases apply as field manager `helm`, so NFD's install stripped the keep annotation from the
NodeFeature CRD topolet had installed, and topolet's next upgrade, no longer rendering it, deleted it
with every NodeFeature in the cluster.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart.conftest import started_plane
from tests.chart.helm import CHART, IMAGE, Helm, build_helm, build_helm3, set_args
from tests.conftest import REPO
from tests.controlplane.harness import ControlPlane
from tests.controlplane.kubectl import Kubectl, api_request, build_kubectl

NFD_CHART = REPO / "third_party" / "nfd-chart" / "node-feature-discovery"
NFD_CRDS = ("nodefeatures.nfd.k8s-sigs.io", "nodefeaturerules.nfd.k8s-sigs.io",
            "nodefeaturegroups.nfd.k8s-sigs.io")
NRT_CRD = "noderesourcetopologies.topology.node.k8s.io"
CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"
TOPOLET, TOPOLET_NS = "topolet", "topolet-system"
NFD, NFD_NS = "nfd", "node-feature-discovery"
NODEFEATURES = f"/apis/nfd.k8s-sigs.io/v1alpha1/namespaces/{NFD_NS}/nodefeatures"
NRTS = "/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies"
# NFD's own values an operator would pick on a cluster whose nodes never run its pods here: no
# post-delete hook Job (it could never run on a control plane without nodes).
NFD_VALUES = {"postDeleteCleanup": False}
# Argo CD's field manager: every application it syncs applies as this one manager.
GITOPS_MANAGER = "argocd-controller"


@pytest.fixture
def plane(tmp_path: Path) -> Iterator[ControlPlane]:
    """A control plane of this scenario's own."""
    with started_plane(tmp_path / "plane") as started:
        yield started


class Installer:
    """Installs, upgrades and uninstalls a chart one way: `helm4`, `helm3` or `gitops`."""

    def __init__(self, way: str, plane: ControlPlane, home: Path) -> None:
        self.way = way
        binary = build_helm3() if way == "helm3" else build_helm()
        self.helm = Helm(binary, home, Path(plane.kubeconfig))
        self.kubectl = Kubectl(build_kubectl(), Path(plane.kubeconfig)) if way == "gitops" else None

    def install(self, release: str, chart: Path, namespace: str, values: dict[str, Any],
                check: bool = True) -> subprocess.CompletedProcess[str]:
        if self.kubectl is not None:
            return self._apply(release, chart, namespace, values, check)
        return self.helm.run("install", release, str(chart), "--namespace", namespace, "--create-namespace",
                             "--timeout", "2m", *set_args(values), check=check)

    def upgrade(self, release: str, chart: Path, namespace: str, values: dict[str, Any]) -> None:
        if self.kubectl is not None:
            self._apply(release, chart, namespace, values, True)
        else:
            self.helm.run("upgrade", release, str(chart), "--namespace", namespace, "--timeout", "2m",
                          *set_args(values))

    def uninstall(self, release: str, namespace: str) -> None:
        # --no-hooks: topolet's pre-delete cleanup Job needs nodes, which this control plane lacks
        # (tests/chart/test_uninstall_hook.py has its uninstall with the hook).
        self.helm.run("uninstall", release, "--namespace", namespace, "--timeout", "2m", "--no-hooks")

    def _apply(self, release: str, chart: Path, namespace: str, values: dict[str, Any],
               check: bool) -> subprocess.CompletedProcess[str]:
        """`helm template --include-crds` piped to `kubectl apply --server-side`, Argo CD's way."""
        assert self.kubectl is not None
        rendered = self.helm.run("template", release, str(chart), "--namespace", namespace, "--include-crds",
                                 *set_args(values)).stdout
        self.kubectl.run("create", "namespace", namespace, check=False)
        done = subprocess.run([str(self.kubectl.binary), "--kubeconfig", str(self.kubectl.kubeconfig),
                               "apply", "--server-side", f"--field-manager={GITOPS_MANAGER}", "-f", "-"],
                              input=rendered, capture_output=True, text=True, timeout=180, check=False)
        if check and done.returncode != 0:
            pytest.fail(f"kubectl apply --server-side of {release} exited {done.returncode}:\n{done.stderr}")
        return done


def wait_established(plane: ControlPlane, name: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status, crd = api_request(plane, "GET", CRD_PATH + name)
        conditions = {c["type"]: c["status"] for c in (crd.get("status") or {}).get("conditions") or []}
        if status == 200 and conditions.get("Established") == "True":
            return
        time.sleep(0.2)
    pytest.fail(f"CRD {name} not established after {timeout_s:.0f} s")


def make_nodefeature(plane: ControlPlane, name: str) -> None:
    """A NodeFeature as nfd-worker writes one (NFD's data, which no topolet step may lose)."""
    wait_established(plane, NFD_CRDS[0])
    body = {"apiVersion": "nfd.k8s-sigs.io/v1alpha1", "kind": "NodeFeature",
            "metadata": {"name": name, "namespace": NFD_NS,
                         "labels": {"nfd.node.kubernetes.io/node-name": name}},
            "spec": {"labels": {"feature.node.kubernetes.io/example": "true"}}}
    status, created = api_request(plane, "POST", NODEFEATURES, body=body)
    assert status == 201, created


def make_nrt(plane: ControlPlane, name: str) -> None:
    """An NRT as topolet's agent publishes one (topolet's data, which no NFD step may lose)."""
    wait_established(plane, NRT_CRD)
    body = {"apiVersion": "topology.node.k8s.io/v1alpha2", "kind": "NodeResourceTopology",
            "metadata": {"name": name}, "zones": [{"name": "node-0", "type": "Node"}]}
    status, created = api_request(plane, "POST", NRTS, body=body)
    assert status == 201, created


def names(plane: ControlPlane, path: str) -> set[str]:
    status, listed = api_request(plane, "GET", path)
    assert status == 200, listed
    return {item["metadata"]["name"] for item in listed["items"]}


def assert_intact(plane: ControlPlane, nodefeatures: set[str], nrts: set[str], when: str) -> None:
    """NFD's three CRDs and `nodefeatures`, and topolet's NRT CRD and `nrts`, all still there."""
    for crd in (*(NFD_CRDS if nodefeatures else ()), *((NRT_CRD,) if nrts else ())):
        status, body = api_request(plane, "GET", CRD_PATH + crd)
        assert status == 200, f"{when}: CRD {crd} is gone ({body.get('message')})"
        assert "deletionTimestamp" not in body["metadata"], f"{when}: CRD {crd} is being deleted"
    if nodefeatures:
        assert names(plane, NODEFEATURES) == nodefeatures, f"{when}: NodeFeatures lost"
    if nrts:
        assert names(plane, NRTS) == nrts, f"{when}: NRTs lost"


def keep(plane: ControlPlane, crd: str) -> None:
    """The line the chart's refusals print: Helm then keeps `crd` whatever its release does."""
    subprocess.run([str(build_kubectl()), "--kubeconfig", str(plane.kubeconfig), "annotate", "crd", crd,
                    "helm.sh/resource-policy=keep", "--overwrite"], check=True, capture_output=True)


def topolet_values(**more: Any) -> dict[str, Any]:
    return {**IMAGE, **more}


WAYS = ("helm4", "helm3", "gitops")


@pytest.mark.parametrize("way", WAYS)
def test_topolet_first_then_nfd(way: str, plane: ControlPlane, tmp_path: Path) -> None:
    tool = Installer(way, plane, tmp_path / "helm")
    tool.install(TOPOLET, CHART, TOPOLET_NS, topolet_values())
    make_nrt(plane, "node-1")
    tool.install(NFD, NFD_CHART, NFD_NS, NFD_VALUES)
    make_nodefeature(plane, "node-1")
    assert_intact(plane, {"node-1"}, {"node-1"}, "after NFD's install")

    tool.upgrade(TOPOLET, CHART, TOPOLET_NS, topolet_values(**{"controller.replicas": 3}))
    assert_intact(plane, {"node-1"}, {"node-1"}, "after topolet's upgrade")
    tool.upgrade(TOPOLET, CHART, TOPOLET_NS, topolet_values(**{"controller.replicas": 1}))
    assert_intact(plane, {"node-1"}, {"node-1"}, "after topolet's second upgrade")
    tool.upgrade(NFD, NFD_CHART, NFD_NS, {**NFD_VALUES, "master.replicaCount": 2})
    assert_intact(plane, {"node-1"}, {"node-1"}, "after NFD's upgrade")
    if way == "gitops":
        return  # Argo CD's deletion of an application is its own (its sync options), not Helm's.

    tool.uninstall(TOPOLET, TOPOLET_NS)
    assert_intact(plane, {"node-1"}, {"node-1"}, "after topolet's uninstall")
    tool.install(TOPOLET, CHART, TOPOLET_NS, topolet_values())
    manifest = tool.helm.run("get", "manifest", TOPOLET, "--namespace", TOPOLET_NS).stdout
    assert NRT_CRD in manifest and not any(crd in manifest for crd in NFD_CRDS)
    tool.uninstall(NFD, NFD_NS)
    assert_intact(plane, set(), {"node-1"}, "after NFD's uninstall")
    tool.upgrade(TOPOLET, CHART, TOPOLET_NS, topolet_values(**{"controller.replicas": 3}))
    assert_intact(plane, set(), {"node-1"}, "after topolet's upgrade without NFD")


@pytest.mark.parametrize("way", WAYS)
def test_nfd_first_then_topolet(way: str, plane: ControlPlane, tmp_path: Path) -> None:
    tool = Installer(way, plane, tmp_path / "helm")
    tool.install(NFD, NFD_CHART, NFD_NS, NFD_VALUES)
    make_nodefeature(plane, "node-1")
    before = {crd: api_request(plane, "GET", CRD_PATH + crd)[1]["metadata"] for crd in NFD_CRDS}
    tool.install(TOPOLET, CHART, TOPOLET_NS, topolet_values())
    make_nrt(plane, "node-1")
    assert_intact(plane, {"node-1"}, {"node-1"}, "after topolet's install")
    tool.upgrade(TOPOLET, CHART, TOPOLET_NS, topolet_values(**{"controller.replicas": 3}))
    tool.upgrade(TOPOLET, CHART, TOPOLET_NS, topolet_values(**{"crds.install": True}))
    assert_intact(plane, {"node-1"}, {"node-1"}, "after topolet's upgrades")
    for crd, meta in before.items():  # NFD's CRDs are as NFD left them: no field of topolet's on them
        now = api_request(plane, "GET", CRD_PATH + crd)[1]["metadata"]
        assert now.get("annotations") == meta.get("annotations"), crd
        assert now.get("labels") == meta.get("labels"), crd
        managers = {f["manager"] for f in now["managedFields"]}
        assert managers == {f["manager"] for f in meta["managedFields"]}, crd
    tool.upgrade(NFD, NFD_CHART, NFD_NS, {**NFD_VALUES, "master.replicaCount": 2})
    assert_intact(plane, {"node-1"}, {"node-1"}, "after NFD's upgrade")
    if way == "gitops":
        return

    tool.uninstall(TOPOLET, TOPOLET_NS)
    assert_intact(plane, {"node-1"}, {"node-1"}, "after topolet's uninstall")
    tool.install(TOPOLET, CHART, TOPOLET_NS, topolet_values())
    tool.uninstall(NFD, NFD_NS)
    assert_intact(plane, set(), {"node-1"}, "after NFD's uninstall")
    tool.uninstall(TOPOLET, TOPOLET_NS)
    assert_intact(plane, set(), {"node-1"}, "after topolet's second uninstall")


@pytest.mark.parametrize("way", ("helm4", "helm3"))
def test_nfds_topology_updater_crd_is_left_to_nfd(way: str, plane: ControlPlane, tmp_path: Path) -> None:
    """NFD installed first with its topology updater's NRT CRD (a template of its release): topolet's
    `crds.install: auto` leaves it to NFD, and nothing topolet's release does removes it."""
    tool = Installer(way, plane, tmp_path / "helm")
    tool.install(NFD, NFD_CHART, NFD_NS, {**NFD_VALUES, "topologyUpdater.enable": True,
                                         "topologyUpdater.createCRDs": True})
    make_nrt(plane, "node-1")
    tool.install(TOPOLET, CHART, TOPOLET_NS, topolet_values())
    manifest = tool.helm.run("get", "manifest", TOPOLET, "--namespace", TOPOLET_NS).stdout
    assert NRT_CRD not in manifest
    tool.upgrade(TOPOLET, CHART, TOPOLET_NS, topolet_values(**{"controller.replicas": 3}))
    tool.uninstall(TOPOLET, TOPOLET_NS)
    assert_intact(plane, set(), {"node-1"}, "after topolet's upgrade and uninstall")
    status, crd = api_request(plane, "GET", CRD_PATH + NRT_CRD)
    assert crd["metadata"]["annotations"]["meta.helm.sh/release-name"] == NFD


@pytest.mark.parametrize("way", ("helm4", "helm3"))
def test_nfds_topology_updater_cannot_take_topolets_crd(way: str, plane: ControlPlane,
                                                        tmp_path: Path) -> None:
    """topolet first: NFD's install with its own NRT CRD is refused by Helm's ownership check, and
    topolet's CRD and NRTs stay as they were."""
    tool = Installer(way, plane, tmp_path / "helm")
    tool.install(TOPOLET, CHART, TOPOLET_NS, topolet_values())
    make_nrt(plane, "node-1")
    done = tool.install(NFD, NFD_CHART, NFD_NS, {**NFD_VALUES, "topologyUpdater.enable": True,
                                                "topologyUpdater.createCRDs": True}, check=False)
    assert done.returncode != 0 and NRT_CRD in done.stderr, done.stderr
    tool.upgrade(TOPOLET, CHART, TOPOLET_NS, topolet_values(**{"controller.replicas": 3}))
    assert_intact(plane, set(), {"node-1"}, "after NFD's refused install")
    status, crd = api_request(plane, "GET", CRD_PATH + NRT_CRD)
    assert crd["metadata"]["annotations"]["meta.helm.sh/release-name"] == TOPOLET


def crds_only_chart(folder: Path) -> Path:
    """A chart with the NRT CRD in Helm's crds/ folder, as scheduler-plugins' chart ships it."""
    chart = folder / "nrt-crds"
    (chart / "crds").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: nrt-crds\nversion: 0.1.0\n")
    crd = yaml.safe_load((CHART / "files" / "crds" / "noderesourcetopologies.yaml").read_text())
    (chart / "crds" / "nrt.yaml").write_text(yaml.safe_dump(crd))
    return chart


def test_an_upgrade_never_drops_a_crd_another_apply_stripped(plane: ControlPlane, tmp_path: Path) -> None:
    """Helm 4: another release's crds/ folder applies the NRT CRD as field manager `helm` too, which strips
    the keep annotation and the release's name that topolet's release put on it. topolet's record of
    the CRDs it installed still names it, so its upgrades keep rendering it and never delete it."""
    tool = Installer("helm4", plane, tmp_path / "helm")
    tool.install(TOPOLET, CHART, TOPOLET_NS, topolet_values())
    make_nrt(plane, "node-1")
    tool.install("other", crds_only_chart(tmp_path), "other", {})
    annotations = api_request(plane, "GET", CRD_PATH + NRT_CRD)[1]["metadata"].get("annotations", {})
    assert "helm.sh/resource-policy" not in annotations  # stripped: the case the record is for
    assert "meta.helm.sh/release-name" not in annotations
    tool.upgrade(TOPOLET, CHART, TOPOLET_NS, topolet_values(**{"controller.replicas": 3}))
    assert_intact(plane, set(), {"node-1"}, "after topolet's upgrade")
    annotations = api_request(plane, "GET", CRD_PATH + NRT_CRD)[1]["metadata"]["annotations"]
    assert annotations["helm.sh/resource-policy"] == "keep"  # rendered again, so kept again

    # Stripped again, crds.install=false would have Helm delete the CRD: refused, with the way to hand
    # it over; once its keep annotation is back, Helm keeps it and the release lets go of it.
    tool.install("other2", crds_only_chart(tmp_path / "again"), "other2", {})
    done = tool.helm.run("upgrade", TOPOLET, str(CHART), "--namespace", TOPOLET_NS,
                         *set_args(topolet_values(**{"crds.install": False})), check=False)
    assert done.returncode != 0 and "kubectl annotate crd" in done.stderr, done.stderr
    keep(plane, NRT_CRD)
    tool.upgrade(TOPOLET, CHART, TOPOLET_NS, topolet_values(**{"crds.install": False}))
    manifest = tool.helm.run("get", "manifest", TOPOLET, "--namespace", TOPOLET_NS).stdout
    assert NRT_CRD not in manifest
    assert_intact(plane, set(), {"node-1"}, "after handing the CRD over")


def test_an_upgrade_from_a_chart_before_the_record_never_drops_nfds_crd(plane: ControlPlane,
                                                                       tmp_path: Path) -> None:
    """A release of a chart older than the record may hold NFD's NodeFeature CRD in its manifest (that
    chart rendered it where it was missing, and NFD's install strips its keep annotation): its first
    upgrade to this chart is refused while the live CRD lacks the keep annotation, with the line that
    adds it; after that line the upgrade goes through, and NFD's CRD and NodeFeatures are still there."""
    tool = Installer("helm4", plane, tmp_path / "helm")
    tool.install(NFD, NFD_CHART, NFD_NS, NFD_VALUES)
    make_nodefeature(plane, "node-1")
    tool.install(TOPOLET, CHART, TOPOLET_NS, topolet_values())
    # As such a release stands: no record (the older chart had none).
    status, body = api_request(plane, "DELETE", f"/api/v1/namespaces/{TOPOLET_NS}/configmaps/{TOPOLET}-crds")
    assert status == 200, body
    done = tool.helm.run("upgrade", TOPOLET, str(CHART), "--namespace", TOPOLET_NS,
                         *set_args(topolet_values()), check=False)
    assert done.returncode != 0, done.stdout
    assert f"kubectl annotate crd {NFD_CRDS[0]} helm.sh/resource-policy=keep --overwrite" in done.stderr
    assert_intact(plane, {"node-1"}, set(), "after the refused upgrade")
    keep(plane, NFD_CRDS[0])
    tool.upgrade(TOPOLET, CHART, TOPOLET_NS, topolet_values(**{"controller.replicas": 3}))
    tool.upgrade(TOPOLET, CHART, TOPOLET_NS, topolet_values())  # the record is back: no check
    assert_intact(plane, {"node-1"}, set(), "after the upgrades")
