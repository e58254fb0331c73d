"""Affinity and memory policy syscalls on the running process."""

from __future__ import annotations

import os
import threading

import pytest

from agent.errors import EnforcementError
from agent.topology import native
from agent.topology.cpuset import CPUSet
from tests.conftest import require


def test_affinity_round_trip() -> None:
    before = native.get_affinity(0)
    assert before == CPUSet(os.sched_getaffinity(0))
    target = CPUSet([before.min()])
    try:
        native.set_affinity(0, target)
        assert native.get_affinity(0) == target
        assert os.sched_getaffinity(0) == {before.min()}
    finally:
        native.set_affinity(0, before)
    assert native.get_affinity(0) == before


def test_affinity_of_another_thread_leaves_ours_alone() -> None:
    ours = native.get_affinity(0)
    seen: list[CPUSet] = []

    def pin() -> None:
        tid = threading.get_native_id()
        native.set_affinity(tid, CPUSet([ours.max()]))
        seen.append(native.get_affinity(tid))

    t = threading.Thread(target=pin)
    t.start()
    t.join()
    assert seen == [CPUSet([ours.max()])]
    assert native.get_affinity(0) == ours


def test_affinity_errors() -> None:
    with pytest.raises(EnforcementError):
        native.set_affinity(0, CPUSet())
    with pytest.raises(EnforcementError, match="EINVAL"):
        native.set_affinity(0, CPUSet([(1 << 20) - 1]))  # no such CPU online
    with pytest.raises(EnforcementError, match="ESRCH"):
        native.get_affinity(2**22 + 12345)  # beyond pid_max's ceiling: no such process


def _mempolicy_allowed() -> bool:
    try:
        native.bind_memory(None, "default")
    except EnforcementError:
        return False
    return True


def test_bind_memory_to_node0_and_back() -> None:
    require(os.path.isdir("/sys/devices/system/node/node0") and _mempolicy_allowed(),
            "set_mempolicy permitted and NUMA node 0 present")
    try:
        native.bind_memory(CPUSet([0]), "bind")
        native.bind_memory(CPUSet([0]), "preferred")
    finally:
        native.bind_memory(None, "default")


def test_bind_memory_errors() -> None:
    with pytest.raises(EnforcementError, match="unknown memory policy"):
        native.bind_memory(CPUSet([0]), "interleave-ish")
    with pytest.raises(EnforcementError):
        native.bind_memory(None, "bind")
    require(_mempolicy_allowed(), "set_mempolicy permitted")
    with pytest.raises(EnforcementError, match="EINVAL"):
        native.bind_memory(CPUSet([4000]), "bind")  # no such node
