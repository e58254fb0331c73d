"""The one registry of feature sources and the raw feature record they yield.

A feature source is a function `Topology -> Iterable[RawFeature]` registered at import with
`@feature_source(name)`.  Sources only name features; `agent.labels.builder` makes every label.
The registry imports no source: the builder imports this package's own, and the composition root
(`agent.cli.commands`) imports any other (agent/labels/README.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agent.topology.model import Topology

NFD_NAMESPACE = "feature.node.kubernetes.io"
TOPOLET_NAMESPACE = "topolet.io"
GFD_NAMESPACE = "nvidia.com"


@dataclass(frozen=True, slots=True)
class RawFeature:
    """One discovered fact: the label namespace, the feature name under it, and its value.

    `name` follows the namespace's convention, e.g. "cpu-cpuid.AVX512F" under NFD's namespace or
    "numa.nodes" under topolet's.  Bools become "true"/"false", ints their decimal form.
    """

    namespace: str
    name: str
    value: str | int | bool


SourceFn = Callable[["Topology"], Iterable[RawFeature]]


@dataclass(frozen=True, slots=True)
class FeatureSource:
    name: str
    discover: SourceFn


_sources: dict[str, FeatureSource] = {}


def register_source(name: str, discover: SourceFn) -> None:
    """Add a source; registering the same name twice replaces the earlier one (module reloads)."""
    _sources[name] = FeatureSource(name, discover)


def feature_source(name: str) -> Callable[[SourceFn], SourceFn]:
    """Decorator form of `register_source`."""

    def register(fn: SourceFn) -> SourceFn:
        register_source(name, fn)
        return fn

    return register


def registered_sources() -> tuple[FeatureSource, ...]:
    """Every source registered so far, in registration order."""
    return tuple(_sources.values())
