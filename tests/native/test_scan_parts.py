"""The CPU folders scanned on several threads give the one-thread scan's records, errors in order."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.topology import native
from tests.native.test_scan_dumps import DUMPS, dump_root
from tests.native.test_scan_malformed import CPU, write

PARTS = (2, 3, 4, 16)


@pytest.fixture(scope="module")
def extracted(dumps_dir: Path) -> Path:
    return dumps_dir


@pytest.mark.parametrize("name", DUMPS)
def test_every_dump_scans_alike_in_parts(name: str, extracted: Path) -> None:
    root = str(dump_root(name, extracted))
    one = native.scan(root, 1)
    for parts in PARTS:
        assert native.scan(root, parts) == one, f"{parts} parts"
    assert native.scan(root) == one, "the automatic choice"


def make_machine(root: Path, ids: list[int], smt: int, halves: bool, per_l3: int,
                 broken: frozenset[int] = frozenset()) -> Path:
    """CPU folders only: `smt` threads a core, numbered side by side or ncpus/2 apart (x86);
    L1 per core, L3 per `per_l3` consecutive cores; CPUs in `broken` carry defects."""
    n = max(ids) + 1
    cores = n // smt if n % smt == 0 else n

    def core_of(c: int) -> int:
        if cores == n:
            return c
        return c % cores if halves else c // smt

    def threads(core: int) -> list[int]:
        if cores == n:
            return [core]
        return [core + k * cores for k in range(smt)] if halves else [core * smt + k for k in range(smt)]

    def cpulist(cpus: list[int]) -> str:
        return ",".join(str(c) for c in sorted(cpus)) + "\n"

    write(root, f"{CPU}/online", cpulist(ids))
    for c in ids:
        core = core_of(c)
        sibs = threads(core)
        l3 = [t for k in range(core - core % per_l3, core - core % per_l3 + per_l3) for t in threads(k)]
        t = f"{CPU}/cpu{c}/topology"
        write(root, f"{t}/physical_package_id", f"{core // per_l3}\n")
        write(root, f"{t}/core_id", f"{core}\n")
        write(root, f"{t}/thread_siblings_list", cpulist(sibs))
        write(root, f"{t}/core_siblings_list", cpulist(l3))
        for index, (level, kind, shared) in enumerate(((1, "Data", sibs), (1, "Instruction", sibs),
                                                        (3, "Unified", l3))):
            idx = f"{CPU}/cpu{c}/cache/index{index}"
            write(root, f"{idx}/level", f"{level}\n")
            write(root, f"{idx}/type", f"{kind}\n")
            write(root, f"{idx}/size", f"{32 * level}K\n")
            write(root, f"{idx}/coherency_line_size", "64\n")
            write(root, f"{idx}/shared_cpu_list", cpulist(shared))
        if c in broken:
            # one defect of each kind the scan records: bad number, bad set, missing folder
            defect = c % 3
            if defect == 0:
                write(root, f"{t}/core_id", "x\n")
            elif defect == 1:
                write(root, f"{CPU}/cpu{c}/cache/index2/shared_cpu_list", "3-1\n")
            else:
                shutil.rmtree(root / f"{CPU}/cpu{c}/cache")
                write(root, f"{CPU}/cpu{c}/cache", "not a folder\n")
    return root


def assert_parts_alike(root: Path) -> None:
    one = native.scan(str(root), 1)
    for parts in (2, 3, 5, 8):
        got = native.scan(str(root), parts)
        assert got.errors == one.errors, f"{parts} parts"
        assert got == one, f"{parts} parts"


@pytest.mark.parametrize("smt,halves", [(1, False), (2, True), (2, False), (4, False)])
def test_machine_layouts(tmp_path: Path, smt: int, halves: bool) -> None:
    root = make_machine(tmp_path, list(range(64)), smt, halves, per_l3=8, broken=frozenset({5, 33, 40, 62}))
    assert_parts_alike(root)
    s = native.scan(str(root), 4)
    assert [c.id for c in s.cpus] == list(range(64))
    assert s.errors
    assert {e.path.split("/")[4] for e in s.errors} <= {"cpu5", "cpu33", "cpu40", "cpu62"}


def test_stray_entries_keep_their_place_among_the_errors(tmp_path: Path) -> None:
    root = make_machine(tmp_path, list(range(40)), 2, True, per_l3=4)
    write(root, f"{CPU}/cpu40", "a file named like a CPU\n")
    (root / f"{CPU}/cpu7").rename(root / f"{CPU}/cpu41")
    (root / f"{CPU}/cpu7").symlink_to("cpu41-missing")
    one = native.scan(str(root), 1)
    assert [e.path for e in one.errors] == [f"{CPU}/cpu7", f"{CPU}/cpu40"]
    assert_parts_alike(root)


# Any machine whose sibling folders agree, whatever the numbering and the gaps in it (a defect
# in one thread's folder may show or not depending on which sibling is asked: see the header).
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    ncpus=st.integers(1, 72),
    smt=st.sampled_from([1, 2, 4]),
    halves=st.booleans(),
    per_l3=st.sampled_from([1, 3, 8]),
    gaps=st.sets(st.integers(0, 71), max_size=6),
)
def test_parts_alike_on_any_machine(scratch_dir: Path, ncpus: int, smt: int, halves: bool, per_l3: int,
                                    gaps: set[int]) -> None:
    ids = [c for c in range(ncpus) if c not in gaps or c == ncpus - 1]
    with tempfile.TemporaryDirectory(dir=scratch_dir) as machine:
        assert_parts_alike(make_machine(Path(machine), ids, smt, halves, per_l3))
