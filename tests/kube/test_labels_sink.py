"""Label sinks against a real API server: NodeFeature (server-side apply), Node patch, file, auto."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.errors import ConfigError, KubeAPIError
from agent.kube.publish.labels_sink import MANAGED_LABELS_ANNOTATION, LabelPublisher
from agent.labels.nodefeature import NODE_NAME_LABEL, nodefeature_name
from tests.controlplane.harness import ControlPlane
from tests.kube.test_nrt import install_crd

# NFD's CRD: neither the base nor the chart installs it.
NODEFEATURE_CRD = Path(__file__).resolve().parents[1] / "data" / "crds" / "nodefeatures.yaml"
LABELS = {"feature.node.kubernetes.io/cpu-hardware_multithreading": "true", "topolet.io/numa.nodes": "2"}


@pytest.fixture(scope="module")
def api(control_plane: ControlPlane) -> Iterator[Any]:
    """An admin ApiClient with the NodeFeature CRD installed."""
    with control_plane.client() as client:
        install_crd(client, NODEFEATURE_CRD)
        yield client


@pytest.fixture
def namespace(api: Any) -> str:
    """A fresh namespace (never deleted: without a controller-manager it would not finish deleting)."""
    from kubernetes import client as k8s

    name = f"labels-{uuid.uuid4().hex[:8]}"
    k8s.CoreV1Api(api).create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name)))
    return name


@pytest.fixture
def node(api: Any) -> Iterator[str]:
    """A fresh Node carrying labels that are not ours; deleted afterwards."""
    from kubernetes import client as k8s

    core = k8s.CoreV1Api(api)
    name = f"labels-{uuid.uuid4().hex[:8]}"
    core.create_node(k8s.V1Node(metadata=k8s.V1ObjectMeta(
        name=name, labels={"kubernetes.io/hostname": name, "example.com/team": "blue"})))
    yield name
    core.delete_node(name)


def get_nodefeature(api: Any, namespace: str, node: str) -> dict[str, Any]:
    from kubernetes import client as k8s

    out: dict[str, Any] = k8s.CustomObjectsApi(api).get_namespaced_custom_object(
        "nfd.k8s-sigs.io", "v1alpha1", namespace, "nodefeatures", nodefeature_name(node))
    return out


def node_meta(api: Any, node: str) -> tuple[dict[str, str], dict[str, str], str]:
    """(labels, annotations, resourceVersion) of the Node."""
    from kubernetes import client as k8s

    meta = k8s.CoreV1Api(api).read_node(node).metadata
    return dict(meta.labels or {}), dict(meta.annotations or {}), str(meta.resource_version)


# ---- NodeFeature ---------------------------------------------------------------------------------

def test_nodefeature_sink_applies_it(api: Any, namespace: str, node: str) -> None:
    # `auto` picks it only where an nfd-master labels the node: tests/kube/test_labels_sink_auto.py.
    pub = LabelPublisher(api, node, namespace, sink="nodefeature")
    assert pub.publish(LABELS) is True
    assert pub.resolved_sink == "nodefeature"
    live = get_nodefeature(api, namespace, node)
    assert live["metadata"]["labels"][NODE_NAME_LABEL] == node
    assert live["spec"]["labels"] == LABELS
    managers = {(m["manager"], m["operation"]) for m in live["metadata"]["managedFields"]}
    assert managers == {("topolet", "Apply")}


def test_nodefeature_writes_only_on_change(api: Any, namespace: str, node: str) -> None:
    pub = LabelPublisher(api, node, namespace, sink="nodefeature")
    assert pub.publish(LABELS)
    version = get_nodefeature(api, namespace, node)["metadata"]["resourceVersion"]
    assert pub.publish(dict(reversed(list(LABELS.items())))) is False
    assert pub.writes == 1
    assert get_nodefeature(api, namespace, node)["metadata"]["resourceVersion"] == version

    # A restarted agent finds the object already right and does not write.
    again = LabelPublisher(api, node, namespace, sink="nodefeature")
    assert again.publish(LABELS) is False and again.writes == 0
    assert get_nodefeature(api, namespace, node)["metadata"]["resourceVersion"] == version

    fewer = {"topolet.io/numa.nodes": "2"}
    assert again.publish(fewer) is True
    live = get_nodefeature(api, namespace, node)
    assert live["spec"]["labels"] == fewer  # apply drops the key we no longer send
    assert live["metadata"]["resourceVersion"] != version


def test_auto_without_an_api_client_writes_the_file(tmp_path: Path) -> None:
    pub = LabelPublisher(None, "n", "topolet-system", features_dir=str(tmp_path))
    assert pub.resolved_sink == "file" and pub.next_check_in() is None
    assert pub.publish(LABELS) is True
    assert pub.resolved_sink == "file"
    text = (tmp_path / "topolet").read_text()
    assert "topolet.io/numa.nodes=2\n" in text
    assert pub.publish(LABELS) is False


def test_api_outage_fails_cleanly_and_the_next_publish_catches_up(
        control_plane: ControlPlane, api: Any, namespace: str, node: str) -> None:
    pub = LabelPublisher(api, node, namespace, sink="nodefeature")
    assert pub.publish(LABELS)
    changed = {**LABELS, "topolet.io/numa.nodes": "4"}
    control_plane.stop_apiserver()
    try:
        with pytest.raises(KubeAPIError):
            pub.publish(changed)
        assert pub.failures == 1
    finally:
        control_plane.start_apiserver()
    assert pub.publish(changed) is True
    assert get_nodefeature(api, namespace, node)["spec"]["labels"] == changed


# ---- Node patch ----------------------------------------------------------------------------------

def test_node_sink_touches_only_our_keys(api: Any, node: str) -> None:
    foreign = {"kubernetes.io/hostname": node, "example.com/team": "blue"}
    pub = LabelPublisher(api, node, "topolet-system", sink="node")
    assert pub.publish(LABELS) is True
    labels, annotations, _ = node_meta(api, node)
    assert labels == {**foreign, **LABELS}
    assert set(annotations[MANAGED_LABELS_ANNOTATION].split(",")) == set(LABELS)

    assert pub.publish({"topolet.io/numa.nodes": "4"}) is True
    labels, _, _ = node_meta(api, node)
    assert labels == {**foreign, "topolet.io/numa.nodes": "4"}

    # A restarted agent still knows which keys were its own (the annotation) and removes only those.
    restarted = LabelPublisher(api, node, "topolet-system", sink="node")
    assert restarted.publish({"topolet.io/cpu.threads-per-core": "2"}) is True
    labels, _, version = node_meta(api, node)
    assert labels == {**foreign, "topolet.io/cpu.threads-per-core": "2"}

    # Nothing changed: no write, from the same publisher or a new one.
    assert restarted.publish({"topolet.io/cpu.threads-per-core": "2"}) is False
    fresh = LabelPublisher(api, node, "topolet-system", sink="node")
    assert fresh.publish({"topolet.io/cpu.threads-per-core": "2"}) is False
    assert node_meta(api, node)[2] == version


def test_node_sink_leaves_a_label_it_never_set(api: Any, node: str) -> None:
    # example.com/team is someone else's: publishing without it must not remove it.
    pub = LabelPublisher(api, node, "topolet-system", sink="node")
    pub.publish({"topolet.io/numa.nodes": "1"})
    pub.publish({})
    labels, annotations, _ = node_meta(api, node)
    assert labels == {"kubernetes.io/hostname": node, "example.com/team": "blue"}
    assert annotations[MANAGED_LABELS_ANNOTATION] == ""


# ---- file and none -------------------------------------------------------------------------------

def test_file_and_none_sinks_need_no_api(tmp_path: Path) -> None:
    pub = LabelPublisher(None, "n", "topolet-system", sink="file", features_dir=str(tmp_path))
    assert pub.publish(LABELS) is True
    assert pub.publish(LABELS) is False
    assert (tmp_path / "topolet").exists()
    off = LabelPublisher(None, "n", "topolet-system", sink="none", features_dir=str(tmp_path / "absent"))
    assert off.publish(LABELS) is False
    assert not (tmp_path / "absent").exists()


@pytest.mark.parametrize(("sink", "client"), [("nfd", object()), ("node", None), ("nodefeature", None)])
def test_invalid_configurations_are_refused(sink: str, client: object) -> None:
    with pytest.raises(ConfigError):
        LabelPublisher(client, "n", "topolet-system", sink=sink)


def test_invalid_label_changes_nothing(tmp_path: Path) -> None:
    pub = LabelPublisher(None, "n", "topolet-system", sink="file", features_dir=str(tmp_path))
    with pytest.raises(ConfigError):
        pub.publish({"topolet.io/bad": "not a value"})
    assert not (tmp_path / "topolet").exists()
