"""Bodies for the two API sinks: an NFD `NodeFeature` object and a Node label merge patch.

Pure functions: the Kubernetes code sends what these build.  NodeFeature shape from NFD's docs
("Customization guide", NodeFeature custom resource): `nfd.k8s-sigs.io/v1alpha1`, namespaced,
labelled `nfd.node.kubernetes.io/node-name=<node>` so nfd-master knows the target node, and
`spec.labels` holding the labels to create.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agent.api.validate import is_dns_label, is_dns_subdomain, is_label_key, is_label_value
from agent.errors import ConfigError

NODEFEATURE_API_VERSION = "nfd.k8s-sigs.io/v1alpha1"
NODEFEATURE_KIND = "NodeFeature"
NODE_NAME_LABEL = "nfd.node.kubernetes.io/node-name"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
_NAME_PREFIX = "topolet-"


def _checked(labels: Mapping[str, str]) -> dict[str, str]:
    for key, value in labels.items():
        if not is_label_key(key) or not is_label_value(value):
            raise ConfigError(f"not a valid label: {key!r}={value!r}")
    return dict(sorted(labels.items()))


def nodefeature_name(node: str) -> str:
    """The object name for `node`, distinct from the object nfd-worker names after the node itself.

    Node names used here fit a label value (at most 63 characters), so the name stays far below
    the 253 characters an object name may have.
    """
    return _NAME_PREFIX + node


def nodefeature_object(node: str, namespace: str, labels: Mapping[str, str]) -> dict[str, Any]:
    """A `NodeFeature` asking nfd-master to put `labels` on `node`."""
    if not is_dns_subdomain(node) or not is_label_value(node):
        # The node name must also fit a label value (63 characters) to be the node-name label.
        raise ConfigError(f"node name {node!r} cannot be used in a NodeFeature")
    if not is_dns_label(namespace):
        raise ConfigError(f"invalid namespace {namespace!r}")
    return {
        "apiVersion": NODEFEATURE_API_VERSION,
        "kind": NODEFEATURE_KIND,
        "metadata": {
            "name": nodefeature_name(node),
            "namespace": namespace,
            "labels": {NODE_NAME_LABEL: node, MANAGED_BY_LABEL: "topolet"},
        },
        "spec": {"labels": _checked(labels)},
    }


def node_label_patch(labels: Mapping[str, str],
                     previous: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A JSON merge patch for the Node: set `labels`, and null out keys in `previous` now gone."""
    body: dict[str, str | None] = {k: None for k in sorted(previous or {}) if k not in labels}
    body.update(_checked(labels))
    return {"metadata": {"labels": dict(sorted(body.items()))}}
