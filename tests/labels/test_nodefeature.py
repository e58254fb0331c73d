"""NodeFeature object and Node patch bodies."""

from __future__ import annotations

import re

import pytest

from agent.api.validate import is_dns_subdomain
from agent.errors import ConfigError
from agent.labels.nodefeature import node_label_patch, nodefeature_name, nodefeature_object

LABELS = {"topolet.io/numa.nodes": "2", "feature.node.kubernetes.io/memory-numa": "true"}


def test_nodefeature_shape() -> None:
    obj = nodefeature_object("node-1", "node-feature-discovery", LABELS)
    assert obj["apiVersion"] == "nfd.k8s-sigs.io/v1alpha1"
    assert obj["kind"] == "NodeFeature"
    meta = obj["metadata"]
    assert meta["namespace"] == "node-feature-discovery"
    assert meta["labels"]["nfd.node.kubernetes.io/node-name"] == "node-1"
    assert is_dns_subdomain(meta["name"]) and "node-1" in meta["name"]
    assert obj["spec"] == {"labels": LABELS}


# apimachinery's IsDNS1123Subdomain, the rule for object names: no per-label length limit.
_OBJECT_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


@pytest.mark.parametrize("node", ["n", "node-1", "ip-10-0-0-1.ec2.internal", "n" * 63])
def test_object_names_are_valid_and_distinct_from_the_node(node: str) -> None:
    name = nodefeature_name(node)
    assert _OBJECT_NAME.fullmatch(name) and len(name) <= 253
    assert name != node


@pytest.mark.parametrize(("node", "namespace"), [
    ("Node_1", "nfd"), ("n" * 64, "nfd"), ("node-1", "a.b"), ("node-1", ""),
])
def test_nodefeature_refuses_bad_names(node: str, namespace: str) -> None:
    with pytest.raises(ConfigError):
        nodefeature_object(node, namespace, LABELS)


def test_nodefeature_refuses_bad_labels() -> None:
    with pytest.raises(ConfigError):
        nodefeature_object("node-1", "nfd", {"topolet.io/x": "not valid"})


def test_node_patch_sets_and_removes() -> None:
    previous = {"topolet.io/numa.nodes": "1", "topolet.io/memory.tiers": "CXL"}
    patch = node_label_patch(LABELS, previous)
    assert patch == {"metadata": {"labels": {
        "feature.node.kubernetes.io/memory-numa": "true",
        "topolet.io/memory.tiers": None,
        "topolet.io/numa.nodes": "2",
    }}}
    assert node_label_patch(LABELS) == {"metadata": {"labels": dict(sorted(LABELS.items()))}}
