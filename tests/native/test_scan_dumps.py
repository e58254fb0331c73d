"""The scan over every real-machine dump from hwloc's test suite, checked against hwloc's own reading."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.topology import native
from agent.topology.cpuset import CPUSet
from agent.topology.raw import RawScan
from tests.conftest import unpacked_dump

REPO = Path(__file__).resolve().parents[2]
_DATA = REPO / "tests" / "data" / "hwloc"
DATA = _DATA if (_DATA / "dumps").is_dir() else Path("/work/shared/hwloc")
DUMPS = sorted(p.name.removesuffix(".tar.bz2") for p in (DATA / "dumps").glob("*.tar.bz2"))


@pytest.fixture(scope="module")
def extracted(dumps_dir: Path) -> Path:
    return dumps_dir


def dump_root(name: str, dest: Path) -> Path:
    """Unpack a dump once per session (tests/conftest.py, shared with the `dump_root` fixture); the
    tarball's one top folder is the file-system root."""
    return unpacked_dump(name, dest)


def expected(name: str) -> dict[str, list[dict[str, object]]] | None:
    path = DATA / "expected" / f"{name}.console.json"
    return json.loads(path.read_text()) if path.exists() else None


def test_there_are_dumps() -> None:
    assert len(DUMPS) >= 20


@pytest.mark.parametrize("name", DUMPS)
def test_dump_scans(name: str, extracted: Path) -> None:
    root = dump_root(name, extracted)
    s = native.scan(str(root))
    assert s.cpus, "every dump has CPUs"
    ids = [c.id for c in s.cpus]
    assert ids == sorted(set(ids))
    assert [n.id for n in s.nodes] == sorted({n.id for n in s.nodes})
    assert s.has_node_dir == (root / "sys/devices/system/node").is_dir()
    for e in s.errors:
        assert not e.path.startswith("/"), "error paths are relative to the root"
        assert e.code.startswith("E")
    for n in s.nodes:
        assert not n.distances or len(n.distances) == len(s.nodes)
    check_against_hwloc(name, s)


def check_against_hwloc(name: str, s: RawScan) -> None:
    """Package and core ids, the PU set and NUMA memory agree with what lstopo printed for the dump."""
    exp = expected(name)
    if exp is None:
        return
    cpus = {c.id: c for c in s.cpus}
    pus = CPUSet(exp["pus"])  # type: ignore[arg-type]
    assert pus <= CPUSet(cpus), "every PU hwloc shows is a cpuN folder"
    for kind, field in (("packages", "package_id"), ("cores", "core_id")):
        for obj in exp[kind]:
            for cpu in CPUSet.parse(str(obj["cpus"])):
                c = cpus[cpu]
                value = getattr(c, field)
                if c.has_topology and value != -1:
                    assert value == obj["os_index"], (kind, cpu)
    if not s.has_node_dir:
        return
    nodes = {n.id: n for n in s.nodes}
    for obj in exp["numa"]:
        node = nodes[int(obj["os_index"])]  # type: ignore[call-overload]
        mem = obj.get("memory")
        if isinstance(mem, dict) and node.mem_total_bytes > 0:
            # lstopo prints rounded sizes and counts hugepages in: agree within 2%
            assert abs(node.mem_total_bytes - mem["bytes"]) <= 0.02 * mem["bytes"]


@pytest.mark.slow  # a dozen real machines unpacked (CONTRIBUTING.md, Test tiers)
def test_known_dump_facts(extracted: Path) -> None:
    """Spot facts read straight from a few dump files."""
    s = native.scan(str(dump_root("256ppc-8n8s4t", extracted)))
    assert len(s.cpus) == 256 and s.arch == "power"
    assert s.nodes[0].cpus == CPUSet.parse_mask(
        (dump_root("256ppc-8n8s4t", extracted) / "sys/devices/system/node/node0/cpumap").read_text())
    s = native.scan(str(dump_root("20s390-2g6s4c", extracted)))
    assert s.arch == "s390" and s.cpu_vendor == "IBM/S390" and not s.has_node_dir
    assert all(c.book_siblings is not None for c in s.cpus if c.has_topology)
    s = native.scan(str(dump_root("nvidiagpunumanodes", extracted)))
    assert (255, "0004:05:00.0") in s.gpu_memory_nodes
    s = native.scan(str(dump_root("fakememinitiators-1np2c+1npp+gi", extracted)))
    assert any(n.initiators for n in s.nodes)
    s = native.scan(str(dump_root("128ia64-17n4s2c", extracted)))
    assert s.arch == "ia64" and s.cpu_vendor == "GenuineIntel"
    # its cpuN/online files are empty: each is reported, and the CPU counts as online
    assert any(e.code == "ENODATA" and e.path.endswith("/online") for e in s.errors)
    assert all(c.online for c in s.cpus)
