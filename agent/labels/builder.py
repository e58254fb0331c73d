"""The one label builder: raw features from every registered source become valid node labels.

Whatever a source yields, only valid Kubernetes label keys and values come out.  Text that breaks
the label alphabet is normalized (`validate.normalize_label_text`); what still cannot be a label
(too long, empty after normalization, a namespace we do not publish, a negative number, a
duplicate key) is dropped and reported, never published.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from agent.api.validate import (
    is_dns_subdomain,
    is_label_key,
    is_label_name,
    is_label_value,
    normalize_label_text,
)
from agent.labels.registry import (
    GFD_NAMESPACE,
    NFD_NAMESPACE,
    TOPOLET_NAMESPACE,
    RawFeature,
    registered_sources,
)

if TYPE_CHECKING:
    from agent.topology.model import Topology

log = logging.getLogger(__name__)

GFD_GATED = "nvidia.com labels need gfd_compat"


@dataclass(frozen=True, slots=True)
class Dropped:
    """A raw feature that produced no label, and why."""

    feature: RawFeature
    reason: str


@dataclass(frozen=True, slots=True)
class Normalized:
    """A raw feature whose name or value was rewritten into the label alphabet."""

    feature: RawFeature
    key: str
    value: str


@dataclass(frozen=True)
class LabelSet:
    """The labels (sorted by key) and an account of every feature that did not pass unchanged."""

    labels: dict[str, str]
    dropped: tuple[Dropped, ...] = ()
    normalized: tuple[Normalized, ...] = ()
    failed_sources: tuple[str, ...] = ()


def _in_namespace(namespace: str, domain: str) -> bool:
    return namespace == domain or namespace.endswith("." + domain)


def _namespace_problem(namespace: str, gfd_compat: bool) -> str | None:
    if not is_dns_subdomain(namespace):
        return "namespace is not a DNS subdomain"
    if _in_namespace(namespace, GFD_NAMESPACE):
        return None if gfd_compat else GFD_GATED
    # NFD's master refuses kubernetes.io namespaces other than feature.node's own, so only that
    # one is published there; topolet's domain may carry subdomains.
    if namespace == NFD_NAMESPACE or _in_namespace(namespace, TOPOLET_NAMESPACE):
        return None
    return "namespace is not one topolet publishes"


def _format_value(value: object) -> tuple[str | None, bool]:
    """The label value for `value` (None when it cannot be one) and whether it was rewritten."""
    if isinstance(value, bool):
        return ("true" if value else "false"), False
    if isinstance(value, int):
        text = str(value)
        # A number is never normalized: dropping a sign or digits would change what it says.
        return (text if is_label_value(text) else None), False
    if not isinstance(value, str):
        return None, False
    if is_label_value(value):
        return value, False
    fixed = normalize_label_text(value)
    if not fixed or not is_label_value(fixed):
        return None, True
    return fixed, True


def _format_name(name: object) -> tuple[str | None, bool]:
    if not isinstance(name, str):
        return None, False
    if is_label_name(name):
        return name, False
    fixed = normalize_label_text(name)
    return (fixed if is_label_name(fixed) else None), True


def make_labels(features: Iterable[RawFeature], *, gfd_compat: bool = False) -> LabelSet:
    """Turn raw features into labels; the first feature to claim a key wins."""
    labels: dict[str, str] = {}
    dropped: list[Dropped] = []
    normalized: list[Normalized] = []
    for feature in features:
        namespace = feature.namespace.strip().lower() if isinstance(feature.namespace, str) else ""
        problem = _namespace_problem(namespace, gfd_compat)
        if problem:
            dropped.append(Dropped(feature, problem))
            continue
        name, name_changed = _format_name(feature.name)
        if name is None:
            dropped.append(Dropped(feature, "name cannot be a label name"))
            continue
        value, value_changed = _format_value(feature.value)
        if value is None:
            dropped.append(Dropped(feature, "value cannot be a label value"))
            continue
        key = f"{namespace}/{name}"
        if not is_label_key(key):  # both halves passed; kept as the last line of defence
            dropped.append(Dropped(feature, "key is not a label key"))
            continue
        if key in labels:
            dropped.append(Dropped(feature, f"duplicate key {key}"))
            continue
        labels[key] = value
        if name_changed or value_changed or namespace != feature.namespace:
            normalized.append(Normalized(feature, key, value))
    return LabelSet(
        labels=dict(sorted(labels.items())),
        dropped=tuple(dropped),
        normalized=tuple(normalized),
    )


def _import_own_sources() -> None:
    """This package's sources, which register on import.  Imported on first use, not at the top:
    they load the topology model (and the C helper), which readers of `validate` never need."""
    import agent.labels.cpu  # noqa: F401
    import agent.labels.memory  # noqa: F401
    import agent.labels.pci  # noqa: F401
    import agent.labels.topology  # noqa: F401


def collect_features(topology: Topology) -> tuple[list[RawFeature], tuple[str, ...]]:
    """Run every registered source; a source that raises is skipped and named, the rest still run."""
    _import_own_sources()
    features: list[RawFeature] = []
    failed: list[str] = []
    for source in registered_sources():
        try:
            features.extend(source.discover(topology))
        except Exception:  # labels are advisory: one broken source must not stop publishing
            log.exception("label source %s failed", source.name)
            failed.append(source.name)
    return features, tuple(failed)


def build_label_set(topology: Topology, *, gfd_compat: bool = False) -> LabelSet:
    """Labels for `topology` from every registered source, with the account of what was dropped."""
    features, failed = collect_features(topology)
    result = make_labels(features, gfd_compat=gfd_compat)
    for d in result.dropped:
        # GFD's labels are dropped on every pass unless asked for: expected, not worth a warning.
        level = logging.DEBUG if d.reason == GFD_GATED else logging.WARNING
        log.log(level, "label dropped (%s): %s/%s=%r", d.reason, d.feature.namespace,
                d.feature.name, d.feature.value)
    for n in result.normalized:
        log.info("label normalized: %r -> %s=%s", n.feature, n.key, n.value)
    return LabelSet(result.labels, result.dropped, result.normalized, failed)


def build_labels(topology: Topology, *, gfd_compat: bool = False) -> dict[str, str]:
    """The node labels for `topology`: every registered source, then the builder."""
    return build_label_set(topology, gfd_compat=gfd_compat).labels
