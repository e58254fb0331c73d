"""AMD compute units (Bulldozer family): both cores of a unit are listed as thread siblings but keep
their own core ids; the scan reads each one's id, and discovery reports single-thread cores as hwloc
does (fixture: tests/data/amd_compute_units.py, a 4-socket 64-core Opteron 6200-like layout)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path
from types import ModuleType

import pytest

from agent.topology import native
from agent.topology.cpuset import CPUSet
from agent.topology.discover import build_topology
from tests.conftest import require, topolet_bin

BUILDER = Path(__file__).resolve().parent.parent / "data" / "amd_compute_units.py"


def _builder() -> ModuleType:
    spec = importlib.util.spec_from_file_location("amd_compute_units", BUILDER)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def amd_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root: Path = _builder().build(tmp_path_factory.mktemp("amdcu"))
    return root


@pytest.mark.parametrize("parts", [1, 4])
def test_each_thread_reports_its_own_core_id(amd_root: Path, parts: int) -> None:
    s = native.scan(str(amd_root), parts=parts)
    assert not s.errors
    assert len(s.cpus) == 64
    for c in s.cpus:
        assert c.core_id == c.id % 8, c.id
        assert c.package_id == c.id // 16, c.id
        assert c.thread_siblings == CPUSet([c.id - c.id % 2, c.id - c.id % 2 + 1])


def test_discover_reports_64_single_thread_cores(amd_root: Path) -> None:
    topo = build_topology(native.scan(str(amd_root)))
    assert len(topo.cores) == 64
    assert [c.cpus for c in topo.cores] == [CPUSet([i]) for i in range(64)]
    assert [(c.package_id, c.core_id) for c in topo.cores] == [(i // 16, i % 8) for i in range(64)]
    assert [p.cpus for p in topo.packages] == [CPUSet(range(16 * p, 16 * p + 16)) for p in range(4)]
    assert [n.cpus for n in topo.numa_nodes] == [CPUSet(range(8 * n, 8 * n + 8)) for n in range(8)]
    # the compute unit stays visible through the caches it shares: L1i and L2 per pair of cores
    l2 = sorted({c.cpus for c in topo.caches if c.level == 2}, key=min)
    assert l2 == [CPUSet([2 * u, 2 * u + 1]) for u in range(32)]


def test_conformance_view_agrees_with_lstopo(amd_root: Path) -> None:
    require(shutil.which("lstopo-no-graphics") is not None, "lstopo-no-graphics (hwloc-nox) not installed")
    xml = subprocess.run(["lstopo-no-graphics", "--input", str(amd_root), "--of", "xml", "-"],
                         capture_output=True, text=True, check=True, timeout=60).stdout
    hwloc_cores = {CPUSet.parse_mask(o.get("cpuset", "0x0").replace("0x", ""))
                   for o in ET.fromstring(xml).iter("object") if o.get("type") == "Core"}
    got = json.loads(subprocess.run([topolet_bin(), "discover", "--fsroot", str(amd_root), "--format",
                                     "conformance"], capture_output=True, text=True, check=True,
                                    timeout=60).stdout)
    cores = [CPUSet.parse(c["cpus"]) for c in got["cores"]]
    assert len(cores) == 64
    assert set(cores) == hwloc_cores
