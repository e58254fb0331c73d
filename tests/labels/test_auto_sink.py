"""`--label-sink auto`'s rule and hand-over, as tables (agent/labels/auto_sink.py)."""

from __future__ import annotations

import pytest

from agent.labels.auto_sink import (
    NFD_FEATURE_LABELS_ANNOTATION,
    choose_auto_sink,
    handover_removals,
    nfd_master_labels,
)

# (id, has_api, an nfd-master labels the node, NodeFeature served, sink)
CHOICES = [
    ("out of cluster", False, False, False, "file"),
    ("out of cluster, whatever else", False, True, True, "file"),
    ("no NFD at all", True, False, False, "node"),
    ("NodeFeature CRD, no nfd-master", True, False, True, "node"),
    ("nfd-master's annotation left, CRD gone", True, True, False, "node"),
    ("nfd-master labels the node", True, True, True, "nodefeature"),
]


@pytest.mark.parametrize(("has_api", "labelled", "served", "sink"), [c[1:] for c in CHOICES],
                         ids=[c[0] for c in CHOICES])
def test_choose_auto_sink(has_api: bool, labelled: bool, served: bool, sink: str) -> None:
    choice = choose_auto_sink(has_api=has_api, nfd_master_labels_node=labelled, nodefeature_served=served)
    assert choice.sink == sink
    assert choice.reason


# (id, Node annotations, keys nfd-master lists; None: no nfd-master labels the node)
ANNOTATIONS: list[tuple[str, dict[str, str], frozenset[str] | None]] = [
    ("none", {}, None),
    ("others only", {"topolet.io/managed-labels": "topolet.io/numa.nodes",
                     "nfd.node.kubernetes.io/extended-resources": "x"}, None),
    ("default prefix restored", {NFD_FEATURE_LABELS_ANNOTATION: "cpu-cpuid.AVX2,kernel-version.full"},
     frozenset({"feature.node.kubernetes.io/cpu-cpuid.AVX2",
                "feature.node.kubernetes.io/kernel-version.full"})),
    ("other prefixes kept", {NFD_FEATURE_LABELS_ANNOTATION: "topolet.io/numa.nodes,cpu-model.family"},
     frozenset({"topolet.io/numa.nodes", "feature.node.kubernetes.io/cpu-model.family"})),
    ("empty value still an nfd-master", {NFD_FEATURE_LABELS_ANNOTATION: ""}, frozenset()),
    ("an -instance master", {"blue.nfd.node.kubernetes.io/feature-labels": "pci-10de.present"},
     frozenset({"feature.node.kubernetes.io/pci-10de.present"})),
    ("two instances together",
     {NFD_FEATURE_LABELS_ANNOTATION: "a", "b2.nfd.node.kubernetes.io/feature-labels": "b"},
     frozenset({"feature.node.kubernetes.io/a", "feature.node.kubernetes.io/b"})),
    ("a look-alike key", {"example.com/nfd.node.kubernetes.io/feature-labels": "a",
                          "xnfd.node.kubernetes.io/feature-labels": "b"}, None),
]


@pytest.mark.parametrize(("annotations", "listed"), [a[1:] for a in ANNOTATIONS],
                         ids=[a[0] for a in ANNOTATIONS])
def test_nfd_master_labels(annotations: dict[str, str], listed: frozenset[str] | None) -> None:
    assert nfd_master_labels(annotations) == listed


# (id, keys topolet set, labels on the Node, keys nfd-master lists, to remove)
HANDOVERS = [
    ("all ours go", ["topolet.io/a", "topolet.io/b"], {"topolet.io/a": "1", "topolet.io/b": "2"}, [],
     ["topolet.io/a", "topolet.io/b"]),
    ("nfd-master's stay", ["topolet.io/a", "topolet.io/b"], {"topolet.io/a": "1", "topolet.io/b": "2"},
     ["topolet.io/b"], ["topolet.io/a"]),
    ("already gone", ["topolet.io/a"], {}, [], []),
    ("never someone else's", [], {"example.com/team": "blue", "topolet.io/a": "1"}, [], []),
]


@pytest.mark.parametrize(("managed", "node_labels", "claimed", "removed"), [h[1:] for h in HANDOVERS],
                         ids=[h[0] for h in HANDOVERS])
def test_handover_removals(managed: list[str], node_labels: dict[str, str], claimed: list[str],
                           removed: list[str]) -> None:
    assert handover_removals(managed, node_labels, claimed) == removed
