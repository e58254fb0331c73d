"""The one registry of feature sources and the raw feature record they yield.

A feature source is a function `Topology -> Iterable[RawFeature]` that registers itself at import
with one line, the decorator:

    @feature_source("gpu")
    def gpu_features(topology: Topology) -> Iterator[RawFeature]: ...

Sources never build label strings themselves beyond naming the feature; the builder
(`agent.labels.builder`) turns every raw feature into a label, validating and normalizing in one
place.  The registry imports no source: `agent.labels`' own (cpu, memory, pci, topology) are imported
by the builder, and a source living elsewhere is imported by the program that wants its labels, its
composition root (`agent.cli.commands` imports `agent.gpu.labels`), the way NFD's worker lists its
sources.
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
