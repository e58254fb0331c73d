"""Fixtures shared by the GPU tests: the default HGX tree is built once per session (it is only read)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.topology.model import Topology
from tests.gpu.sysfs_fixture import build_hgx


@pytest.fixture(scope="session")
def hgx_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default 8-GPU HGX H100 tree (symlinked PCI entries, driver proc files)."""
    return build_hgx(tmp_path_factory.mktemp("hgx"))


@pytest.fixture(scope="session")
def hgx_topology(hgx_root: Path) -> Topology:
    """What the C helper's scan makes of `hgx_root`."""
    from agent.topology.discover import discover

    return discover(str(hgx_root))
