"""Removing the API objects topolet's agents created (uninstall), and never another project's.

`delete_objects(kube, namespace, node=None) -> ObjectCleanup`: the NRTs topolet publishes (no other
publisher owning them, deleted on the resourceVersion read), its NodeFeatures, and the Node labels
`topolet.io/managed-labels` lists.  Stop the agents first.  Idempotent; raises KubeAPIError
otherwise (README.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agent.api.nrt import GROUP as NRT_GROUP
from agent.api.nrt import PLURAL as NRT_PLURAL
from agent.api.nrt import VERSION as NRT_VERSION
from agent.errors import KubeAPIError
from agent.kube.publish.labels_sink import (
    MANAGED_LABELS_ANNOTATION,
    NODEFEATURE_GROUP,
    NODEFEATURE_PLURAL,
    NODEFEATURE_VERSION,
    _managed_keys,
)
from agent.kube.publish.nrt import MANAGED_BY_LABEL
from agent.kube.publish.nrt_publisher import foreign_manager
from agent.kubeapi.client import KubeClient, resource_path
from agent.labels.nodefeature import NODE_NAME_LABEL, nodefeature_name

MANAGER = "topolet"
_OURS = f"{MANAGED_BY_LABEL}={MANAGER}"
_CONFLICT_ATTEMPTS = 3


@dataclass
class ObjectCleanup:
    """What `delete_objects` removed and what it left to another manager."""

    nrts: list[str] = field(default_factory=list)
    nodefeatures: list[str] = field(default_factory=list)
    node_labels: list[str] = field(default_factory=list)  # nodes whose topolet labels it removed
    left: list[str] = field(default_factory=list)  # "NRT <name> (<manager>)": another publisher's


def absent_ok(call: Callable[[], dict[str, Any]]) -> dict[str, Any] | None:
    """`call()`, or None when the object (or the API serving its kind) is not there."""
    try:
        return call()
    except KubeAPIError as exc:
        if exc.not_found:
            return None
        raise


def _delete_exactly(kube: KubeClient, path: str, obj: dict[str, Any], what: str) -> bool:
    """Delete the object read as `obj`, only while it is unchanged (uid and resourceVersion);
    True when deleted (or already gone), False on a conflict (someone changed it meanwhile)."""
    meta = obj.get("metadata") or {}
    body = {"kind": "DeleteOptions", "apiVersion": "v1",
            "preconditions": {"uid": meta.get("uid"), "resourceVersion": meta.get("resourceVersion")}}
    try:
        kube.request("DELETE", path, body=body, content_type="application/json", what=what)
    except KubeAPIError as exc:
        if exc.not_found:
            return True
        if exc.status == 409:
            return False
        raise
    return True


def _delete_nrt(kube: KubeClient, name: str, result: ObjectCleanup) -> None:
    path = resource_path(NRT_GROUP, NRT_VERSION, NRT_PLURAL, name)
    for _ in range(_CONFLICT_ATTEMPTS):
        live = absent_ok(lambda: kube.get(path, what=f"read NodeResourceTopology {name}"))
        if live is None:
            return
        other = foreign_manager(live, MANAGER)
        if other:
            result.left.append(f"NodeResourceTopology {name} ({other})")
            return
        if _delete_exactly(kube, path, live, f"delete NodeResourceTopology {name}"):
            result.nrts.append(name)
            return
    raise KubeAPIError(f"NodeResourceTopology {name} kept changing while being deleted", 409)


def _nrt_names(kube: KubeClient, node: str | None) -> list[str]:
    if node is not None:
        return [node]
    listed = absent_ok(lambda: kube.list_paged(resource_path(NRT_GROUP, NRT_VERSION, NRT_PLURAL),
                                                {"labelSelector": _OURS},
                                                what="list NodeResourceTopologies"))
    return sorted(str((o.get("metadata") or {}).get("name") or "") for o in (listed or {}).get("items") or [])


def _delete_nodefeatures(kube: KubeClient, namespace: str, node: str | None,
                         result: ObjectCleanup) -> None:
    selector = _OURS if node is None else f"{_OURS},{NODE_NAME_LABEL}={node}"
    collection = resource_path(NODEFEATURE_GROUP, NODEFEATURE_VERSION, NODEFEATURE_PLURAL,
                               namespace=namespace)
    listed = absent_ok(lambda: kube.list_paged(collection, {"labelSelector": selector},
                                                what=f"list NodeFeatures in {namespace}"))
    for obj in (listed or {}).get("items") or []:
        meta = obj.get("metadata") or {}
        name = str(meta.get("name") or "")
        owner_node = str((meta.get("labels") or {}).get(NODE_NAME_LABEL) or "")
        if not owner_node or name != nodefeature_name(owner_node):
            continue  # labelled as ours but not named as the agent names them: not ours to judge
        path = resource_path(NODEFEATURE_GROUP, NODEFEATURE_VERSION, NODEFEATURE_PLURAL, name,
                             namespace=namespace)
        if _delete_exactly(kube, path, obj, f"delete NodeFeature {namespace}/{name}"):
            result.nodefeatures.append(name)


def _remove_node_labels(kube: KubeClient, node: str | None, result: ObjectCleanup) -> None:
    if node is not None:
        one = absent_ok(lambda: kube.get(resource_path("", "v1", "nodes", node), what=f"read Node {node}"))
        nodes = [one] if one else []
    else:
        nodes = kube.list_paged(resource_path("", "v1", "nodes"), what="list Nodes").get("items") or []
    for obj in nodes:
        meta = obj.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        if MANAGED_LABELS_ANNOTATION not in annotations:
            continue
        name = str(meta.get("name") or "")
        labels: dict[str, str | None] = {k: None for k in _managed_keys(annotations)}
        patch = {"metadata": {"labels": labels, "annotations": {MANAGED_LABELS_ANNOTATION: None}}}
        try:
            kube.patch(resource_path("", "v1", "nodes", name), patch, "application/merge-patch+json",
                       what=f"remove topolet's labels from Node {name}")
        except KubeAPIError as exc:
            if exc.not_found:
                continue
            raise
        result.node_labels.append(name)


def delete_objects(kube: KubeClient, namespace: str, node: str | None = None) -> ObjectCleanup:
    """Delete topolet's NRTs, NodeFeatures and Node labels for `node` (None: every node)."""
    result = ObjectCleanup()
    for name in _nrt_names(kube, node):
        _delete_nrt(kube, name, result)
    _delete_nodefeatures(kube, namespace, node, result)
    _remove_node_labels(kube, node, result)
    return result
