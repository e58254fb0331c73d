"""Fixtures for enforcement tests: real cgroups under a unique test parent, real processes.

A test that needs root or a cpuset cgroup FAILS when env CI=true and the requirement is missing;
elsewhere it is skipped with the reason.
"""

from __future__ import annotations

import os
import signal
import subprocess
import uuid
from collections.abc import Callable, Iterator

import pytest

from agent.enforce.cgroup import (
    CgroupLayout,
    detect_layout,
    exists,
    list_children,
    move_pid,
    read_cpus,
    read_procs,
)
from agent.errors import EnforcementError
from agent.topology.cpuset import CPUSet

Require = Callable[[bool, str], None]


def require_or_skip(ok: bool, reason: str) -> None:
    """Fail under CI=true, skip elsewhere, when a test's requirement is missing."""
    if ok:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true but the requirement is missing: {reason}")
    pytest.skip(reason)


@pytest.fixture
def require() -> Require:
    return require_or_skip


def _cpuset_layout(version: int | None) -> CgroupLayout:
    require_or_skip(os.geteuid() == 0, "needs root to write cgroups")
    parent = f"topolet-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        layout = detect_layout(parent=parent)
    except EnforcementError as exc:
        require_or_skip(False, f"needs a cpuset cgroup hierarchy: {exc}")
        raise
    if version is not None and layout.version != version:
        # Not a missing requirement: the other version's run covers it (this host's v1, and v2 in
        # the guest of tests/vm, which checks that its v2 tests ran).
        pytest.skip(f"cgroup v{version} behaviour (this machine has v{layout.version})")
    require_or_skip(os.access(layout.root, os.W_OK), f"cpuset hierarchy {layout.root} is not writable")
    return layout


def _remove_tree(layout: CgroupLayout, rel: str) -> None:
    if not exists(layout, rel):
        return
    for child in list_children(layout, rel):
        _remove_tree(layout, child)
    for pid in read_procs(layout, rel):
        try:
            move_pid(layout, "", pid)
        except EnforcementError:
            pass  # exited meanwhile
    os.rmdir(layout.abspath(rel))


@pytest.fixture
def cpuset_root() -> Iterator[CgroupLayout]:
    """A layout (v1 or v2) whose `parent` is a unique test cgroup, removed with its tree afterwards."""
    layout = _cpuset_layout(None)
    yield layout
    _remove_tree(layout, layout.parent)


@pytest.fixture
def cpuset_v1() -> Iterator[CgroupLayout]:
    """As `cpuset_root`, for tests of v1's parent/child rules."""
    layout = _cpuset_layout(1)
    yield layout
    _remove_tree(layout, layout.parent)


@pytest.fixture
def cpuset_v2() -> Iterator[CgroupLayout]:
    """As `cpuset_root`, for tests of v2's rules (partitions, effective sets)."""
    layout = _cpuset_layout(2)
    yield layout
    _remove_tree(layout, layout.parent)


@pytest.fixture
def two_cpus(cpuset_root: CgroupLayout) -> tuple[int, int]:
    """Two CPUs this machine lets the test use."""
    cpus = read_cpus(cpuset_root, "", effective=True).sorted()
    require_or_skip(len(cpus) >= 2, "needs at least 2 CPUs")
    return cpus[0], cpus[1]


@pytest.fixture
def spawn() -> Iterator[Callable[[], subprocess.Popen[bytes]]]:
    """Start `sleep` processes; each is killed at teardown."""
    procs: list[subprocess.Popen[bytes]] = []

    def start() -> subprocess.Popen[bytes]:
        p = subprocess.Popen(["sleep", "120"])
        procs.append(p)
        return p

    yield start
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
        p.wait()


def proc_status(pid: int, field: str) -> CPUSet:
    """`Cpus_allowed_list` or `Mems_allowed_list` of a process, as the kernel reports it."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key == field:
                return CPUSet.parse(value.strip())
    raise AssertionError(f"{field} not in /proc/{pid}/status")
