"""Where `--label-sink auto` publishes: the rule, from what the agent sees of NFD, and the hand-over.

Pure: the caller reads its Node and API discovery; these functions only decide.  The signal that an
nfd-master reads NodeFeatures for this node is the annotation nfd-master writes on every Node it
labels (`nfd.node.kubernetes.io/feature-labels`, `<instance>.`-prefixed under `-instance`): the
keys of the labels it set, those in `feature.node.kubernetes.io/` without that prefix.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

NFD_FEATURE_LABELS_ANNOTATION = "nfd.node.kubernetes.io/feature-labels"
NFD_DEFAULT_LABEL_PREFIX = "feature.node.kubernetes.io/"


@dataclass(frozen=True)
class AutoSink:
    """The sink `auto` resolves to, and why (for the log)."""

    sink: str
    reason: str


def nfd_master_labels(annotations: Mapping[str, str] | None) -> frozenset[str] | None:
    """The label keys an nfd-master says it set on the Node; None when no nfd-master labels it."""
    found: set[str] | None = None
    for key, value in (annotations or {}).items():
        if key != NFD_FEATURE_LABELS_ANNOTATION and not key.endswith("." + NFD_FEATURE_LABELS_ANNOTATION):
            continue
        found = found or set()
        found.update(name if "/" in name else NFD_DEFAULT_LABEL_PREFIX + name
                     for name in value.split(",") if name)
    return None if found is None else frozenset(found)


def choose_auto_sink(*, has_api: bool, nfd_master_labels_node: bool, nodefeature_served: bool) -> AutoSink:
    """The sink for `auto`: a NodeFeature only where an nfd-master turns it into labels."""
    if not has_api:
        return AutoSink("file", "no API client: NFD's features.d file")
    if not nfd_master_labels_node:
        return AutoSink("node", f"no {NFD_FEATURE_LABELS_ANNOTATION} annotation on the Node: no "
                                "nfd-master labels it, so the agent does")
    if not nodefeature_served:
        return AutoSink("node", "the API serves no NodeFeature, whatever annotation nfd-master left "
                                "on the Node: the agent labels it")
    return AutoSink("nodefeature", "an nfd-master labels this node and the API serves NodeFeature")


def handover_removals(managed: Iterable[str], node_labels: Mapping[str, str],
                      nfd_claimed: Iterable[str]) -> list[str]:
    """The Node labels the agent set that go when its labels move to a NodeFeature (nfd-master's stay)."""
    claimed = frozenset(nfd_claimed)
    return sorted(k for k in set(managed) if k in node_labels and k not in claimed)
