"""The one registry of feature sources and the raw feature record they yield.

A feature source is a function `Topology -> Iterable[RawFeature]` that registers itself at import
with one line, the decorator:

    @feature_source("gpu")
    def gpu_features(topology: Topology) -> Iterator[RawFeature]: ...

Sources never build label strings themselves beyond naming the feature; the builder
(`agent.labels.builder`) turns every raw feature into a label, validating and normalizing in one
place.  Modules that hold sources are listed in `SOURCE_MODULES` and imported on first use, so a
new source is a module with one decorated function plus, when it lives outside this package, one
line in that tuple.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agent.topology.model import Topology

NFD_NAMESPACE = "feature.node.kubernetes.io"
TOPOLET_NAMESPACE = "topolet.io"
GFD_NAMESPACE = "nvidia.com"

# Imported, in this order, before the registry is read.  A listed module that does not exist yet
# is skipped (the GPU source arrives later with agent/gpu); any other import failure is raised.
SOURCE_MODULES: tuple[str, ...] = (
    "agent.labels.cpu",
    "agent.labels.memory",
    "agent.labels.pci",
    "agent.labels.topology",
    "agent.gpu.labels",
)


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
_loaded = False


def register_source(name: str, discover: SourceFn) -> None:
    """Add a source; registering the same name twice replaces the earlier one (module reloads)."""
    _sources[name] = FeatureSource(name, discover)


def feature_source(name: str) -> Callable[[SourceFn], SourceFn]:
    """Decorator form of `register_source`."""

    def register(fn: SourceFn) -> SourceFn:
        register_source(name, fn)
        return fn

    return register


def _load_source_modules() -> None:
    global _loaded
    if _loaded:
        return
    for module in SOURCE_MODULES:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            # Only the listed module itself (or its package) may be missing; a missing dependency
            # inside an existing source module is a real error.
            if exc.name is None or not (module == exc.name or module.startswith(exc.name + ".")):
                raise
    _loaded = True


def registered_sources() -> tuple[FeatureSource, ...]:
    """Every registered source, in registration order, after importing `SOURCE_MODULES`."""
    _load_source_modules()
    return tuple(_sources.values())
