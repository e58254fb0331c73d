"""The source registry: one-line registration, failure isolation, lazily imported source modules."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.labels import RawFeature, build_label_set, build_labels, feature_source, registry
from agent.topology.model import Topology
from tests.labels.machines import machine


@pytest.fixture
def scratch_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Let a test register sources without leaving them behind."""
    registry.registered_sources()  # built-in sources first
    monkeypatch.setattr(registry, "_sources", dict(registry._sources))


@pytest.mark.usefixtures("scratch_registry")
def test_a_decorated_function_is_a_source() -> None:
    @feature_source("extra")
    def extra(topology: Topology) -> Iterator[RawFeature]:
        yield RawFeature("topolet.io", "extra.cpus", len(topology.cpus))
        yield RawFeature("nvidia.com", "gpu.count", 1)

    topo = machine(cores_per_socket=2, threads=2)
    assert "extra" in [s.name for s in registry.registered_sources()]
    labels = build_labels(topo)
    assert labels["topolet.io/extra.cpus"] == "4"
    assert "nvidia.com/gpu.count" not in labels
    assert build_labels(topo, gfd_compat=True)["nvidia.com/gpu.count"] == "1"


@pytest.mark.usefixtures("scratch_registry")
def test_a_failing_source_is_reported_and_the_others_still_label() -> None:
    @feature_source("boom")
    def boom(topology: Topology) -> Iterator[RawFeature]:
        yield RawFeature("topolet.io", "before.failure", 1)
        raise RuntimeError("broken")

    result = build_label_set(machine())
    assert result.failed_sources == ("boom",)
    assert result.labels["topolet.io/cpu.sockets"] == "1"


def test_listed_module_that_does_not_exist_yet_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "SOURCE_MODULES", ("agent.labels.not_written_yet",))
    monkeypatch.setattr(registry, "_loaded", False)
    monkeypatch.setattr(registry, "_sources", {})
    assert registry.registered_sources() == ()


def test_a_source_module_with_a_missing_dependency_fails_loudly(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "labels_source_needing_dep.py").write_text("import topolet_missing_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "SOURCE_MODULES", ("labels_source_needing_dep",))
    monkeypatch.setattr(registry, "_loaded", False)
    monkeypatch.setattr(registry, "_sources", {})
    with pytest.raises(ModuleNotFoundError):
        registry.registered_sources()
    sys.modules.pop("labels_source_needing_dep", None)
