"""Shared test fixtures.  Under CI=true a test whose requirement (root, cgroups, tools) is missing fails."""

from __future__ import annotations

import os
import shutil
import sys
import tarfile
from pathlib import Path

import pytest

from agent.cli.commands import register_label_sources

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
HWLOC_DATA = TESTS / "data" / "hwloc"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

# The CLI registers the label sources outside agent.labels (the GPU source) before it builds labels
# (agent/cli/commands.py); tests build agents in process without the CLI, so register them here once,
# and the labels a test sees never depend on which test module happened to import agent.gpu first.
register_label_sources()


def require(condition: bool, reason: str) -> None:
    """Skip when `condition` is false, except under CI=true where a missing requirement is a failure."""
    if condition:
        return
    if IN_CI:
        pytest.fail(f"required under CI: {reason}")
    pytest.skip(reason)


def writable_cpuset_hierarchy():  # type: ignore[no-untyped-def]
    """The machine's cpuset cgroup hierarchy, checked writable (a failure under CI, else a skip)."""
    from agent.enforce.cgroup import detect_layout
    from agent.errors import EnforcementError

    require(os.geteuid() == 0, "needs root to write cgroups")
    try:
        system = detect_layout()
    except EnforcementError as exc:
        require(False, f"needs a cpuset cgroup hierarchy: {exc}")
        raise
    require(os.access(system.root, os.W_OK), f"cpuset hierarchy {system.root} is not writable")
    return system


def topolet_bin() -> str:
    """The installed `topolet` console script (next to the running interpreter)."""
    exe = Path(sys.executable).parent / "topolet"
    return str(exe) if exe.exists() else shutil.which("topolet") or "topolet"


_EXTRACTED: dict[str, Path] = {}


def extract_dump(name: str, dest: Path) -> Path:
    """Unpack `tests/data/hwloc/dumps/<name>.tar.bz2` under dest and return its file-system root."""
    out = dest / name
    if not out.exists():
        with tarfile.open(HWLOC_DATA / "dumps" / f"{name}.tar.bz2") as tar:
            tar.extractall(out, filter="tar")
    (root,) = [p for p in out.iterdir() if p.is_dir()]
    return root


@pytest.fixture(scope="session")
def dumps_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hwloc-dumps")


@pytest.fixture(scope="session")
def dump_root(dumps_dir: Path):  # type: ignore[no-untyped-def]
    """A function: dump name → its extracted root (cached for the session)."""

    def get(name: str) -> Path:
        if name not in _EXTRACTED:
            _EXTRACTED[name] = extract_dump(name, dumps_dir)
        return _EXTRACTED[name]

    return get
