"""Affinity and memory policy syscalls on the running process."""

from __future__ import annotations

import ctypes
import os
import platform
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
        native.set_affinity(0, CPUSet([8191]))  # the highest id CPUSet allows; no such CPU online
    with pytest.raises(EnforcementError, match="ESRCH"):
        native.get_affinity(2**22 + 12345)  # beyond pid_max's ceiling: no such process


def _mempolicy_allowed() -> bool:
    try:
        native.bind_memory(None, "default")
    except EnforcementError:
        return False
    return True


# get_mempolicy(2) has no glibc wrapper; these are its numbers (x86_64: arch/x86/entry/syscalls
# syscall_64.tbl; arm64 and other asm-generic arches: include/uapi/asm-generic/unistd.h).
_GET_MEMPOLICY = {"x86_64": 239, "aarch64": 236, "riscv64": 236}
_MPOL_MODES = {0: "default", 1: "preferred", 2: "bind"}


def _read_mempolicy() -> tuple[str, CPUSet]:
    """This thread's memory policy as the kernel holds it: (mode, nodes), read with get_mempolicy(2)."""
    libc = ctypes.CDLL(None, use_errno=True)
    mode = ctypes.c_int(-1)
    words = 16  # 1,024 nodes, past any kernel's MAX_NUMNODES default
    mask = (ctypes.c_ulong * words)()
    bits = ctypes.sizeof(ctypes.c_ulong) * 8
    rc = libc.syscall(ctypes.c_long(_GET_MEMPOLICY[platform.machine()]), ctypes.byref(mode), mask,
                      ctypes.c_ulong(words * bits), ctypes.c_ulong(0), ctypes.c_ulong(0))
    assert rc == 0, os.strerror(ctypes.get_errno())
    nodes = CPUSet(w * bits + b for w in range(words) for b in range(bits) if mask[w] >> b & 1)
    return _MPOL_MODES.get(mode.value & 0xFF, str(mode.value)), nodes


def test_bind_memory_to_node0_and_back() -> None:
    require(os.path.isdir("/sys/devices/system/node/node0") and _mempolicy_allowed(),
            "set_mempolicy permitted and NUMA node 0 present")
    require(platform.machine() in _GET_MEMPOLICY, "get_mempolicy's syscall number known for this arch")
    try:
        native.bind_memory(CPUSet([0]), "bind")
        assert _read_mempolicy() == ("bind", CPUSet([0]))
        native.bind_memory(CPUSet([0]), "preferred")
        assert _read_mempolicy() == ("preferred", CPUSet([0]))
    finally:
        native.bind_memory(None, "default")
    assert _read_mempolicy() == ("default", CPUSet())


def test_bind_memory_errors() -> None:
    with pytest.raises(EnforcementError, match="unknown memory policy"):
        native.bind_memory(CPUSet([0]), "interleave-ish")
    with pytest.raises(EnforcementError):
        native.bind_memory(None, "bind")
    require(_mempolicy_allowed(), "set_mempolicy permitted")
    with pytest.raises(EnforcementError, match="EINVAL"):
        native.bind_memory(CPUSet([4000]), "bind")  # no such node
