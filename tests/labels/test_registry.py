"""The source registry: one-line registration, failure isolation, and who registers which source (the
labels package its own, the composition root the GPU's: the registry reaches up to no source)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.labels import RawFeature, build_label_set, build_labels, feature_source, registry
from agent.topology.model import Topology
from tests.conftest import REPO, topolet_bin
from tests.gpu.sysfs_fixture import build_hgx
from tests.labels.machines import machine


@pytest.fixture
def scratch_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Let a test register sources without leaving them behind."""
    build_labels(machine())  # the package's own sources first
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


_LABELS_ALONE = """
import sys
from agent.labels import build_labels, registry
from tests.labels.machines import machine
assert build_labels(machine())["topolet.io/cpu.sockets"] == "1"
print(" ".join(s.name for s in registry.registered_sources()))
print(" ".join(sorted(m for m in sys.modules if m.startswith("agent.gpu"))) or "-")
"""


def test_the_labels_package_registers_its_own_sources_and_imports_no_gpu_code() -> None:
    """`agent.labels` sits below `agent.gpu`: building labels registers cpu, memory, pci and topology
    and never imports the GPU source (or any of `agent.gpu`), whose registration is the caller's."""
    done = subprocess.run([sys.executable, "-c", _LABELS_ALONE], cwd=REPO, capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    sources, gpu_modules = done.stdout.splitlines()
    assert sources == "cpu memory pci topology"
    assert gpu_modules == "-"


def test_discover_labels_register_the_gpu_source_from_the_command_line(tmp_path: Path) -> None:
    """`topolet discover --format labels` (the composition root registers the GPU source) prints the
    GPU labels the agent publishes, beside the CPU ones."""
    root = build_hgx(tmp_path)
    done = subprocess.run([topolet_bin(), "discover", "--fsroot", str(root), "--format", "labels"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    labels = dict(line.split("=", 1) for line in done.stdout.splitlines())
    assert labels["topolet.io/gpu.count"] == "8"
    assert labels["topolet.io/cpu.sockets"] == "2"
