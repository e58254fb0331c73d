"""Labels for every real-machine dump in tests/data/hwloc: all valid, and consistent with the model."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from agent.api.validate import is_label_key, is_label_value
from agent.labels import build_label_set
from agent.topology.model import Topology
from tests.conftest import HWLOC_DATA, require

DUMPS = sorted(p.name.removesuffix(".tar.bz2") for p in (HWLOC_DATA / "dumps").glob("*.tar.bz2"))


def _discover() -> Callable[[str], Topology]:
    try:
        from agent.topology.discover import discover
        from agent.topology.native import scan  # noqa: F401  (the C helper must be built)
    except ImportError as exc:
        require(False, f"discovery is not available: {exc}")
    return discover


@pytest.mark.parametrize("name", DUMPS)
def test_dump_labels_are_valid(name: str, dump_root: Callable[[str], Path]) -> None:
    topology = _discover()(str(dump_root(name)))
    result = build_label_set(topology)
    assert result.failed_sources == ()
    assert result.labels, "every machine has at least its CPU model"
    for key, value in result.labels.items():
        assert is_label_key(key), key
        assert is_label_value(value), (key, value)
    labels = result.labels
    if topology.packages:
        assert labels["topolet.io/cpu.sockets"] == str(len(topology.packages))
    if topology.cores:
        smt = "true" if topology.threads_per_core > 1 else "false"
        assert labels["feature.node.kubernetes.io/cpu-hardware_multithreading"] == smt
    assert ("feature.node.kubernetes.io/memory-numa" in labels) == (len(topology.numa_nodes) > 1)
