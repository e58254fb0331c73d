"""`--label-sink auto` against a real API server: Node labels unless an nfd-master labels the node, and
the labels moved without loss when that changes.

No NFD image exists here: where a test needs "an nfd-master labels this node", it writes on the Node
what nfd-master writes on every Node it labels (pkg/nfd-master/nfd-master.go, `updateNodeObject`):
the annotation `nfd.node.kubernetes.io/feature-labels` listing the label keys it set (those under
`feature.node.kubernetes.io/` without that prefix), and those labels.
"""

from __future__ import annotations

from typing import Any

import pytest

from agent.errors import KubeAPIError
from agent.kube.publish import labels_sink
from agent.kube.publish.labels_sink import MANAGED_LABELS_ANNOTATION, LabelPublisher
from agent.labels.auto_sink import NFD_FEATURE_LABELS_ANNOTATION
from agent.labels.nodefeature import nodefeature_name
from tests.kube.test_labels_sink import api as api  # noqa: F401 - fixture (NFD's CRD installed)
from tests.kube.test_labels_sink import get_nodefeature, node_meta
from tests.kube.test_labels_sink import namespace as namespace  # noqa: F401 - fixture
from tests.kube.test_labels_sink import node as node  # noqa: F401 - fixture

LABELS = {"feature.node.kubernetes.io/cpu-hardware_multithreading": "true", "topolet.io/numa.nodes": "2"}
USERS = {"example.com/team": "blue"}  # the label test_labels_sink's Node carries: never touched
NFD_WORKER = {"feature.node.kubernetes.io/cpu-cpuid.AVX2": "true"}  # what nfd-master set from nfd-worker


def publisher(api: Any, node: str, namespace: str) -> LabelPublisher:
    """`auto` that looks where labels go on every publish (the daemon does every minute)."""
    return LabelPublisher(api, node, namespace, check_seconds=0.0)


def nfd_master_labels_node(api: Any, node: str, extra_keys: tuple[str, ...] = ()) -> None:
    """Label `node` as nfd-master does: nfd-worker's labels and the annotation listing their keys (and
    `extra_keys`, as it lists labels it set from any NodeFeature)."""
    from kubernetes import client as k8s

    keys = sorted(k.removeprefix("feature.node.kubernetes.io/") for k in (*NFD_WORKER, *extra_keys))
    k8s.CoreV1Api(api).patch_node(node, {"metadata": {
        "labels": NFD_WORKER, "annotations": {NFD_FEATURE_LABELS_ANNOTATION: ",".join(keys)}}})


def nfd_master_gone(api: Any, node: str) -> None:
    """What `nfd-master -prune` (NFD's uninstall) leaves: its labels and annotation removed."""
    from kubernetes import client as k8s

    k8s.CoreV1Api(api).patch_node(node, {"metadata": {
        "labels": dict.fromkeys(NFD_WORKER), "annotations": {NFD_FEATURE_LABELS_ANNOTATION: None}}})


def nodefeature_exists(api: Any, namespace: str, node: str) -> bool:
    from kubernetes.client.exceptions import ApiException

    try:
        get_nodefeature(api, namespace, node)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


@pytest.mark.parametrize("annotated", [False, True], ids=["bare node", "nfd-master annotation left over"])
def test_no_nodefeature_crd_labels_the_node(api: Any, namespace: str, node: str, annotated: bool,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    # Discovery of a group the server does not serve answers 404, as without NFD's CRD.
    monkeypatch.setattr(labels_sink, "NODEFEATURE_GROUP", "nfd.not-installed.example.com")
    if annotated:
        nfd_master_labels_node(api, node)
    pub = publisher(api, node, namespace)
    assert pub.publish(LABELS) is True
    assert pub.resolved_sink == "node"
    labels, annotations, _ = node_meta(api, node)
    assert {k: labels.get(k) for k in (*LABELS, *USERS)} == {**LABELS, **USERS}
    assert set(annotations[MANAGED_LABELS_ANNOTATION].split(",")) == set(LABELS)


def test_crd_without_an_nfd_master_labels_the_node(api: Any, namespace: str, node: str) -> None:
    pub = publisher(api, node, namespace)
    assert pub.publish(LABELS) is True
    assert pub.resolved_sink == "node"
    labels, annotations, version = node_meta(api, node)
    assert labels == {"kubernetes.io/hostname": node, **USERS, **LABELS}
    assert set(annotations[MANAGED_LABELS_ANNOTATION].split(",")) == set(LABELS)
    assert not nodefeature_exists(api, namespace, node)
    # Looking again finds the same: no write.
    assert pub.publish(LABELS) is False
    assert node_meta(api, node)[2] == version


def test_labels_move_to_the_nodefeature_and_back_as_nfd_master_comes_and_goes(
        api: Any, namespace: str, node: str) -> None:
    pub = publisher(api, node, namespace)
    assert pub.publish(LABELS) and pub.resolved_sink == "node"

    # nfd-master installed: the agent's labels go through a NodeFeature, and off the Node.
    nfd_master_labels_node(api, node)
    assert pub.publish(LABELS) is True
    assert pub.resolved_sink == "nodefeature"
    assert get_nodefeature(api, namespace, node)["spec"]["labels"] == LABELS
    labels, annotations, _ = node_meta(api, node)
    assert labels == {"kubernetes.io/hostname": node, **USERS, **NFD_WORKER}
    assert MANAGED_LABELS_ANNOTATION not in annotations
    assert pub.publish(LABELS) is False  # settled

    # Topology changes reach the NodeFeature, not the Node.
    changed = {**LABELS, "topolet.io/numa.nodes": "4"}
    assert pub.publish(changed) is True
    assert get_nodefeature(api, namespace, node)["spec"]["labels"] == changed
    assert "topolet.io/numa.nodes" not in node_meta(api, node)[0]

    # NFD uninstalled (its prune removes its labels and annotation): back on the Node, NodeFeature gone.
    nfd_master_gone(api, node)
    assert pub.publish(changed) is True
    assert pub.resolved_sink == "node"
    labels, annotations, _ = node_meta(api, node)
    assert labels == {"kubernetes.io/hostname": node, **USERS, **changed}
    assert set(annotations[MANAGED_LABELS_ANNOTATION].split(",")) == set(changed)
    assert not nodefeature_exists(api, namespace, node)
    assert pub.publish(changed) is False


def test_a_label_nfd_master_already_lists_stays_on_the_node(api: Any, namespace: str, node: str) -> None:
    """nfd-master set one of the agent's keys itself (from the agent's NodeFeature, or nfd-worker's):
    the hand-over leaves that one on the Node and removes only the rest."""
    pub = publisher(api, node, namespace)
    assert pub.publish(LABELS)
    shared = "feature.node.kubernetes.io/cpu-hardware_multithreading"
    nfd_master_labels_node(api, node, extra_keys=(shared,))
    assert pub.publish(LABELS) is True
    labels, annotations, _ = node_meta(api, node)
    assert labels == {"kubernetes.io/hostname": node, **USERS, **NFD_WORKER, shared: "true"}
    assert MANAGED_LABELS_ANNOTATION not in annotations


def test_nfd_master_labelling_the_node_during_the_hand_over_loses_nothing(
        api: Any, namespace: str, node: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """nfd-master takes topolet.io/numa.nodes (from the NodeFeature just applied) between the agent's
    read of the Node and its hand-over patch: that patch, on the version read, is refused, and the one
    decided again leaves the label to nfd-master."""
    from kubernetes import client as k8s

    pub = publisher(api, node, namespace)
    assert pub.publish(LABELS)
    nfd_master_labels_node(api, node)
    kube = pub.kube
    send = kube.patch
    statuses: list[int | None] = []

    def patch_after_nfd_master(path: str, body: Any, content_type: str, **kw: Any) -> Any:
        if path.endswith(f"/nodes/{node}") and not statuses:
            k8s.CoreV1Api(api).patch_node(node, {"metadata": {"annotations": {
                NFD_FEATURE_LABELS_ANNOTATION: "cpu-cpuid.AVX2,topolet.io/numa.nodes"}}})
        try:
            out = send(path, body, content_type, **kw)
        except KubeAPIError as exc:
            statuses.append(exc.status)
            raise
        if path.endswith(f"/nodes/{node}"):
            statuses.append(200)
        return out

    monkeypatch.setattr(kube, "patch", patch_after_nfd_master)
    assert pub.publish(LABELS) is True
    assert statuses == [409, 200]
    labels, annotations, _ = node_meta(api, node)
    assert labels == {"kubernetes.io/hostname": node, **USERS, **NFD_WORKER, "topolet.io/numa.nodes": "2"}
    assert MANAGED_LABELS_ANNOTATION not in annotations
    assert nodefeature_name(node) == get_nodefeature(api, namespace, node)["metadata"]["name"]


def test_auto_looks_again_only_when_due(api: Any, namespace: str, node: str) -> None:
    now = [1000.0]
    pub = LabelPublisher(api, node, namespace, check_seconds=60.0, clock=lambda: now[0])
    assert pub.next_check_in() == 0
    assert pub.publish(LABELS) and pub.resolved_sink == "node"
    assert pub.next_check_in() == 60.0
    nfd_master_labels_node(api, node)
    assert pub.publish(LABELS) is False  # not due: the same labels, nothing read
    assert pub.resolved_sink == "node"
    now[0] += 60.0
    assert pub.next_check_in() == 0
    assert pub.publish(LABELS) is True
    assert pub.resolved_sink == "nodefeature"
    assert LabelPublisher(api, node, namespace, sink="node").next_check_in() is None


def test_the_agents_publisher_looks_again_with_unchanged_labels(api: Any, namespace: str, node: str) -> None:
    """The daemon's publisher passes unchanged labels to the sink once `auto` is due to look again, so
    an nfd-master installed after the agent takes its labels over without a topology change."""
    from agent.cli.compose import agent_config
    from agent.cli.parser import build_parser
    from agent.enforce.state import State
    from agent.kube.publish.nrt_build import Snapshot
    from agent.kube.publish.publisher import Publisher
    from agent.kubeapi.client import KubeClient
    from agent.labels import build_labels
    from agent.metrics.registry import Metrics
    from tests.kube.test_nrt import NRT_CRD, TWO_SOCKETS_AND_CXL, install_crd

    install_crd(api, NRT_CRD)
    now = [1000.0]
    config = agent_config(build_parser().parse_args(["agent"])).publisher
    metrics = Metrics()
    kube = KubeClient(api)
    pub = Publisher(kube, node, config, metrics, lambda: Snapshot(TWO_SOCKETS_AND_CXL, State()),
                    namespace=namespace)
    pub.labels = LabelPublisher(kube, node, namespace, check_seconds=60.0, clock=lambda: now[0])
    ours = build_labels(TWO_SOCKETS_AND_CXL, gfd_compat=False)

    assert pub.publish_once(), pub.problems
    assert pub.labels.resolved_sink == "node"
    assert {k: v for k, v in node_meta(api, node)[0].items() if k in ours} == ours
    nfd_master_labels_node(api, node)
    assert pub.publish_once(), pub.problems  # not due: the sink is not asked
    assert pub.labels.resolved_sink == "node"
    now[0] += 60.0
    assert pub.publish_once(), pub.problems
    assert pub.labels.resolved_sink == "nodefeature"
    assert get_nodefeature(api, namespace, node)["spec"]["labels"] == ours
    assert not set(node_meta(api, node)[0]) & set(ours)
    assert metrics.registry.get_sample_value("topolet_api_writes_total", {"kind": "labels"}) == 2
