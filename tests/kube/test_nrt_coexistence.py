"""Beside NFD's topology updater, which writes a NodeResourceTopology per node named after it, too:
topolet's publisher leaves an NRT another publisher owns alone (never overwritten), says so once, and
publishes again once the object is gone; any other edit of its own object is still put back
(tests/kube/test_nrt.py).  Against the real API server; the other publisher's writes carry its field
manager as client-go's would (`nfd-topology-updater`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from agent.api import nrt as api_nrt
from agent.enforce.state import State
from agent.kube.publish import nrt
from agent.kube.publish.nrt import nrt_object
from agent.kube.publish.nrt_publisher import NRTPublisher, foreign_manager
from tests.kube.kubelet_standin import KubeNode, kube_node
from tests.kube.test_kubelet_static import node_events
from tests.kube.test_nrt import TWO_SOCKETS_AND_CXL, get_nrt, node, nrt_api
from tests.kube.test_nrt_devices import agent_args

__all__ = ["kube_node", "node", "nrt_api"]

NFD = "nfd-topology-updater"


def entry(manager: str, *fields: str) -> dict[str, Any]:
    return {"manager": manager, "operation": "Update", "fieldsType": "FieldsV1",
            "fieldsV1": {f: {} for f in fields}}


@pytest.mark.parametrize(("meta", "owner"), [
    ({}, "another manager"),  # no label, no managed fields: not ours
    ({"labels": {nrt.MANAGED_BY_LABEL: "topolet"}, "managedFields": [entry("topolet", "f:zones")]}, ""),
    ({"managedFields": [entry(NFD, "f:zones", "f:attributes")]}, NFD),
    ({"managedFields": [entry("nfd-master", "f:zones")]}, "nfd-master"),  # NFD before v0.14
    # Ours, then NFD's Update rewrote the zones (keeping our label, as its DeepCopy does): NFD's now.
    ({"labels": {nrt.MANAGED_BY_LABEL: "topolet"},
      "managedFields": [entry("topolet", "f:metadata"), entry(NFD, "f:zones")]}, NFD),
    # Ours, edited by someone who is no publisher: ours still (put back, as before).
    ({"labels": {nrt.MANAGED_BY_LABEL: "topolet"},
      "managedFields": [entry("topolet", "f:zones"), entry("kubectl-edit", "f:zones")]}, ""),
    ({"labels": {nrt.MANAGED_BY_LABEL: "helm"}, "managedFields": [entry("helm", "f:zones")]}, "helm"),
])
def test_foreign_manager(meta: dict[str, Any], owner: str) -> None:
    assert foreign_manager({"metadata": meta}) == owner


def nfd_nrt(name: str, uid: str) -> dict[str, Any]:
    """An NRT as NFD's topology updater writes it: its own zones and attributes, no topolet label."""
    return {"apiVersion": api_nrt.API_VERSION, "kind": api_nrt.KIND,
            "metadata": {"name": name, "ownerReferences": [
                {"apiVersion": "v1", "kind": "Node", "name": name, "uid": uid}]},
            "topologyPolicies": ["None"],
            "zones": [{"name": "node-0", "type": "Node", "resources": [
                {"name": "cpu", "capacity": "4", "allocatable": "4", "available": "1"}]}],
            "attributes": [{"name": "topologyManagerPolicy", "value": "none"}]}


@pytest.fixture
def objects(nrt_api: Any) -> Iterator[Any]:
    from kubernetes import client as k8s

    yield k8s.CustomObjectsApi(nrt_api)


def test_an_nrt_nfd_created_is_left_alone_until_it_is_gone(objects: Any, nrt_api: Any,
                                                           node: dict[str, Any]) -> None:
    name, uid = node["metadata"]["name"], node["metadata"]["uid"]
    objects.create_cluster_custom_object(api_nrt.GROUP, api_nrt.VERSION, api_nrt.PLURAL, nfd_nrt(name, uid),
                                         field_manager=NFD)
    theirs = get_nrt(nrt_api, name)
    now = [0.0]
    pub = NRTPublisher(nrt_api, name, verify_seconds=30.0, clock=lambda: now[0])
    ours = nrt_object(node, TWO_SOCKETS_AND_CXL, State())
    assert pub.publish(ours) is False and pub.yielded_to == NFD
    changed = nrt_object(node, TWO_SOCKETS_AND_CXL, State(), pinning_route="nri")
    now[0] = 10.0
    assert pub.publish(changed) is False  # a change of ours: still theirs, not even read again
    assert get_nrt(nrt_api, name)["metadata"]["resourceVersion"] == theirs["metadata"]["resourceVersion"]
    assert pub.writes == 0

    # NFD uninstalled: its object goes (the garbage collector, or by hand); the next look applies ours.
    objects.delete_cluster_custom_object(api_nrt.GROUP, api_nrt.VERSION, api_nrt.PLURAL, name)
    now[0] = 31.0
    assert pub.publish(changed) is True and pub.yielded_to == ""
    assert get_nrt(nrt_api, name)["zones"] == changed["zones"]


def test_nfd_taking_over_topolets_nrt_is_not_fought(objects: Any, nrt_api: Any, node: dict[str, Any]) -> None:
    name, uid = node["metadata"]["name"], node["metadata"]["uid"]
    now = [0.0]
    pub = NRTPublisher(nrt_api, name, verify_seconds=30.0, clock=lambda: now[0])
    ours = nrt_object(node, TWO_SOCKETS_AND_CXL, State())
    assert pub.publish(ours) is True and pub.yielded_to == ""
    # NFD's updater finds the object and rewrites its zones (get, DeepCopy, Update), labels kept.
    live = get_nrt(nrt_api, name)
    live["zones"] = nfd_nrt(name, uid)["zones"]
    objects.replace_cluster_custom_object(api_nrt.GROUP, api_nrt.VERSION, api_nrt.PLURAL, name, live,
                                          field_manager=NFD)
    now[0] = 31.0
    # The next check sees NFD's zones: topolet stands aside, neither now nor with a change of its own.
    assert pub.publish(ours) is False and pub.yielded_to == NFD
    now[0] = 40.0
    assert pub.publish(nrt_object(node, TWO_SOCKETS_AND_CXL, State(), pinning_route="nri")) is False
    assert get_nrt(nrt_api, name)["zones"] == nfd_nrt(name, uid)["zones"]
    assert pub.writes == 1


# ---- the agent: labels go on, the NRT is left alone, said once ----------------------------------

def test_agent_leaves_nfds_nrt_alone_and_says_so_once(kube_node: KubeNode,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from agent.cli import build_parser
    from agent.cli.compose import agent_config, kube_agent
    from agent.kubeapi.client import KubeClient, resource_path
    from agent.metrics.registry import Metrics

    monkeypatch.setenv("POD_NAMESPACE", kube_node.namespace)
    node = KubeClient(kube_node.api).get(resource_path("", "v1", "nodes", kube_node.name), what="get node")
    objects = k8s_objects(kube_node.api)
    objects.create_cluster_custom_object(api_nrt.GROUP, api_nrt.VERSION, api_nrt.PLURAL,
                                         nfd_nrt(kube_node.name, node["metadata"]["uid"]), field_manager=NFD)
    before = get_nrt(kube_node.api, kube_node.name)["metadata"]["resourceVersion"]
    args = agent_args(kube_node, "")
    args[args.index("--label-sink") + 1] = "node"
    metrics = Metrics()
    agent = kube_agent(agent_config(build_parser().parse_args(
        [a for a in args if a != "--pod-resources-socket" and a])), metrics, gpus=())
    try:
        assert agent.run_once()  # labels written: nothing failed
        assert agent.run_once()
    finally:
        agent.api.close()
    assert metrics.registry.get_sample_value("topolet_nrt_yielded") == 1.0
    assert get_nrt(kube_node.api, kube_node.name)["metadata"]["resourceVersion"] == before
    labels = KubeClient(kube_node.api).get(resource_path("", "v1", "nodes", kube_node.name),
                                           what="get node")["metadata"]["labels"]
    assert any(k.startswith("topolet.io/") for k in labels), labels  # the labels go on
    events = [e for e in node_events(kube_node) if e["reason"] == "NodeResourceTopologyOwnedElsewhere"]
    assert len(events) == 1 and events[0]["type"] == "Warning" and NFD in events[0]["note"], events


def k8s_objects(api: Any) -> Any:
    from kubernetes import client as k8s

    return k8s.CustomObjectsApi(api)
