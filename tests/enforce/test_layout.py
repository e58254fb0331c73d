"""Finding the cpuset hierarchy: mount tables of real shapes, root overrides, this machine."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent.enforce.cgroup import CgroupLayout, depth_of, detect_layout, hierarchy_path, parent_of
from agent.errors import EnforcementError
from tests.enforce.conftest import Require

HYBRID = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
34 31 0:31 / {v1} rw,relatime - cgroup cgroup rw,cpuset
41 31 0:38 / {v2} rw,relatime - cgroup2 cgroup2 rw
"""
UNIFIED = """\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
30 22 0:26 / {v2} rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate
"""
COMBINED = """\
35 31 0:31 / {v1} rw,relatime - cgroup cgroup rw,cpu,cpuacct,cpuset
"""


def _tree(tmp_path: Path, controllers: str) -> tuple[str, str]:
    v1 = tmp_path / "cpu set"  # a space: mountinfo writes it as \\040
    v1.mkdir()
    (v1 / "cpuset.cpus").write_text("0-1\n")
    v2 = tmp_path / "unified"
    v2.mkdir()
    (v2 / "cgroup.controllers").write_text(controllers + "\n")
    return str(v1), str(v2)


def _mountinfo(tmp_path: Path, template: str, v1: str, v2: str) -> str:
    path = tmp_path / "mountinfo"
    path.write_text(template.format(v1=v1.replace(" ", "\\040"), v2=v2))
    return str(path)


@pytest.mark.parametrize(
    ("template", "controllers", "expected"),
    [
        (HYBRID, "hugetlb", (1, "v1")),  # cpuset bound to v1, unified has no cpuset
        (COMBINED, "", (1, "v1")),  # co-mounted controllers
        (UNIFIED, "cpuset cpu io memory pids", (2, "v2")),
    ],
)
def test_detect_from_mountinfo(
    tmp_path: Path, template: str, controllers: str, expected: tuple[int, str]
) -> None:
    v1, v2 = _tree(tmp_path, controllers)
    layout = detect_layout(mountinfo=_mountinfo(tmp_path, template, v1, v2), parent="tp")
    assert (layout.version, layout.root) == (expected[0], v1 if expected[1] == "v1" else v2)
    assert layout.abspath("tp/a") == os.path.join(layout.root, "tp/a")


def test_detect_fails_without_cpuset(tmp_path: Path) -> None:
    v1, v2 = _tree(tmp_path, "cpu io memory")
    with pytest.raises(EnforcementError):
        detect_layout(mountinfo=_mountinfo(tmp_path, UNIFIED, v1, v2))
    with pytest.raises(EnforcementError):
        detect_layout(mountinfo=str(tmp_path / "absent"))


def test_root_override(tmp_path: Path) -> None:
    v1, v2 = _tree(tmp_path, "cpuset memory")
    assert detect_layout(v1) == CgroupLayout(1, v1)
    assert detect_layout(v2, parent="x") == CgroupLayout(2, v2, "x")
    (Path(v2) / "cgroup.controllers").write_text("memory\n")
    with pytest.raises(EnforcementError):
        detect_layout(v2)
    with pytest.raises(EnforcementError):
        detect_layout(str(tmp_path))
    for parent in ("", "/", "a/../b", "/a"):
        with pytest.raises(EnforcementError):
            CgroupLayout(1, v1, parent)


def test_detect_this_machine(require: Require) -> None:
    try:
        layout = detect_layout()
    except EnforcementError as exc:
        require(False, f"no cpuset hierarchy here: {exc}")
        return
    assert os.path.isfile(layout.file("", "effective_cpus"))


@pytest.mark.parametrize(
    ("rel", "parent", "depth"),
    [("a", "", 1), ("/a/b/", "a", 2), ("a//b/c", "a/b", 3), ("", "", 0)],
)
def test_path_arithmetic(rel: str, parent: str, depth: int) -> None:
    assert parent_of(rel) == parent
    assert depth_of(rel) == depth


@pytest.mark.parametrize(
    ("version", "rel", "key", "name"),
    [
        (1, "", "cpus", "cpuset.cpus"),
        (1, "a", "effective_cpus", "cpuset.effective_cpus"),
        (2, "a", "cpus", "cpuset.cpus"),
        (2, "a/b", "effective_mems", "cpuset.mems.effective"),
        # v2's root has no cpuset.cpus/mems: its own set is its effective one
        (2, "", "cpus", "cpuset.cpus.effective"),
        (2, "/", "mems", "cpuset.mems.effective"),
        (2, "", "effective_cpus", "cpuset.cpus.effective"),
    ],
)
def test_cpuset_file_names(version: int, rel: str, key: str, name: str) -> None:
    layout = CgroupLayout(version, "/cg", "p")
    assert layout.file(rel, key) == os.path.join(layout.abspath(rel), name)


@pytest.mark.parametrize(
    ("mounts", "root", "expected"),
    [
        ("34 31 0:31 / /sys/fs/cgroup/cpuset rw - cgroup cgroup rw,cpuset", "/sys/fs/cgroup/cpuset", ""),
        # a kubelet --cgroup-root the agent's --cgroup-root names (the test node's shape)
        ("34 31 0:31 / /sys/fs/cgroup/cpuset rw - cgroup cgroup rw,cpuset",
         "/sys/fs/cgroup/cpuset/topolet-rn-a/", "/topolet-rn-a"),
        # a container's bind mount of a subtree counts from the subtree's own place
        ("50 40 0:31 /kubepods/podx /sys/fs/cgroup rw - cgroup2 cgroup2 rw", "/sys/fs/cgroup/k",
         "/kubepods/podx/k"),
        # the longest mount point holding the root wins; a name that only starts the same does not hold it
        ("30 22 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"
         "31 22 0:27 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw",
         "/sys/fs/cgroup/unified2/a", "/unified2/a"),
    ],
)
def test_hierarchy_path(tmp_path: Path, mounts: str, root: str, expected: str) -> None:
    """Where the cpuset root sits inside its hierarchy, as a runtime spells cgroup paths (NRI's)."""
    info = tmp_path / "mountinfo"
    info.write_text(mounts + "\n")
    assert hierarchy_path(CgroupLayout(1, root.rstrip("/") or "/"), str(info)) == expected


def test_hierarchy_path_off_every_mount(tmp_path: Path) -> None:
    info = tmp_path / "mountinfo"
    info.write_text("34 31 0:31 / /sys/fs/cgroup/cpuset rw - cgroup cgroup rw,cpuset\n")
    with pytest.raises(EnforcementError):
        hierarchy_path(CgroupLayout(1, "/elsewhere"), str(info))
