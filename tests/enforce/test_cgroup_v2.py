"""cgroup v2's own rules, live: the root's missing cpuset files, partition roots, effective sets.

These run in the guest of tests/vm (this host mounts v1), through tests/vm/test_guest_enforce.py.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable

import pytest

from agent.enforce.apply import apply_assignment, apply_with_shared_pool
from agent.enforce.cgroup import (
    CgroupLayout,
    create_cgroup,
    move_pid,
    read_cpus,
    read_cpuset,
    read_mems,
    read_partition,
)
from agent.errors import EnforcementError
from agent.topology.cpuset import CPUSet
from tests.enforce.conftest import proc_status, require_or_skip

Spawn = Callable[[], "subprocess.Popen[bytes]"]


@pytest.fixture
def throwaway_machine() -> None:
    """Skip unless this runs in the guest of tests/vm: partition roots below the hierarchy root and
    controllers enabled at the root reshape the whole machine's CPUs while the test runs."""
    if os.environ.get("TOPOLET_GUEST") != "1":
        pytest.skip("reshapes the machine's root cgroup: runs only in the throwaway guest (tests/vm)")


def _three_cpus(layout: CgroupLayout) -> tuple[int, int, int]:
    # A partition root may not take every CPU of a parent that still runs tasks (the root cgroup
    # runs this test): three for the test, one left over.  A partition an earlier test removed
    # hands its CPUs back to the root only once the kernel frees its cgroup, a moment later.
    with open("/sys/devices/system/cpu/online") as f:
        online = CPUSet.parse(f.read().strip())
    deadline = time.monotonic() + 10
    while (cpus := read_cpus(layout, "", effective=True)) != online and time.monotonic() < deadline:
        time.sleep(0.05)
    require_or_skip(len(cpus) >= 4, f"needs at least 4 CPUs (qemu -smp 4); the root has {cpus}")
    a, b, c = cpus.sorted()[:3]
    return a, b, c


def _partition(layout: CgroupLayout, rel: str, mode: str | None = None) -> str:
    """Write `mode` to cgroup `rel`'s cpuset.cpus.partition (if given); return what it reads."""
    path = os.path.join(layout.abspath(rel), "cpuset.cpus.partition")
    if mode is not None:
        with open(path, "w") as f:
            f.write(mode)
    with open(path) as f:
        return f.read().strip()


def test_the_root_reads_as_its_effective_set(cpuset_v2: CgroupLayout) -> None:
    layout = cpuset_v2
    assert not os.path.exists(os.path.join(layout.root, "cpuset.cpus"))  # v2's root has none
    assert read_cpuset(layout, "") == read_cpuset(layout, "", effective=True)
    assert read_cpus(layout, "") and read_mems(layout, "")


def test_a_new_cgroup_inherits_until_written(cpuset_v2: CgroupLayout, spawn: Spawn) -> None:
    layout = cpuset_v2
    rel = create_cgroup(layout, layout.workload_path("w"))
    assert read_cpus(layout, rel) == CPUSet()  # "inherit", not "nothing": a task may join at once
    p = spawn()
    move_pid(layout, rel, p.pid)
    assert proc_status(p.pid, "Cpus_allowed_list") == read_cpus(layout, "", effective=True)


@pytest.mark.parametrize("mode", ["root", "isolated"])
def test_writes_below_a_partition_root_parent(cpuset_v2: CgroupLayout, spawn: Spawn, mode: str,
                                              throwaway_machine: None) -> None:
    layout = cpuset_v2
    a, b, c = _three_cpus(layout)
    mems = read_mems(layout, "", effective=True)
    parent = create_cgroup(layout, layout.parent, cpus=CPUSet([a, b, c]), mems=mems)
    assert _partition(layout, parent, mode) == mode
    assert read_partition(layout, parent) == mode
    assert read_cpus(layout, parent, effective=True) == CPUSet([a, b, c])
    # The root lent these CPUs to the partition: its effective set no longer has them, yet the
    # partition may be written its own set.
    assert read_cpus(layout, "", effective=True).isdisjoint(CPUSet([a, b, c]))
    apply_assignment(layout, {parent: CPUSet([a, b, c])})
    shared = create_cgroup(layout, layout.shared_path)
    job = create_cgroup(layout, layout.workload_path("job"))
    sleeper, worker = spawn(), spawn()
    move_pid(layout, shared, sleeper.pid)
    move_pid(layout, job, worker.pid)

    apply_with_shared_pool(layout, allowed=CPUSet([a, b, c]), reserved=CPUSet([a]),
                           exclusive={job: CPUSet([b, c])}, shared=[shared])
    assert proc_status(worker.pid, "Cpus_allowed_list") == CPUSet([b, c])
    assert proc_status(sleeper.pid, "Cpus_allowed_list") == CPUSet([a])
    apply_with_shared_pool(layout, allowed=CPUSet([a, b, c]), reserved=CPUSet([a]),
                           exclusive={job: CPUSet([c])}, shared=[shared])
    assert proc_status(worker.pid, "Cpus_allowed_list") == CPUSet([c])
    assert proc_status(sleeper.pid, "Cpus_allowed_list") == CPUSet([a, b])
    assert _partition(layout, parent) == mode  # still a valid partition root


def test_cpus_a_sibling_partition_holds_are_refused_clearly(cpuset_v2: CgroupLayout,
                                                            throwaway_machine: None) -> None:
    layout = cpuset_v2
    a, b, c = _three_cpus(layout)
    mems = read_mems(layout, "", effective=True)
    parent = create_cgroup(layout, layout.parent, cpus=CPUSet([a, b, c]), mems=mems)
    assert _partition(layout, parent, "root") == "root"
    held = create_cgroup(layout, f"{parent}/held", cpus=CPUSet([c]), mems=mems)
    assert _partition(layout, held, "isolated") == "isolated"
    # The partition's CPUs leave its parent's effective set, so a sibling cannot have them.
    assert read_cpus(layout, parent, effective=True) == CPUSet([a, b])
    job = create_cgroup(layout, layout.workload_path("job"), cpus=CPUSet([a]))

    with pytest.raises(EnforcementError, match=f"belong to the partition root {held}"):
        apply_assignment(layout, {job: CPUSet([b, c])})  # refused before any write
    assert read_cpus(layout, job) == CPUSet([a])
    # Even with the parent written in the same step (its effective set then says nothing): the
    # kernel would take the set and quietly turn the sibling "isolated invalid" (seen on 6.1).
    with pytest.raises(EnforcementError, match=f"belong to the partition root {held}") as err:
        apply_assignment(layout, {parent: CPUSet([a, b, c]), job: CPUSet([b, c])})
    assert err.value.path == layout.abspath(job)
    assert read_cpus(layout, job) == CPUSet([a])
    assert _partition(layout, held) == "isolated"
    apply_assignment(layout, {parent: CPUSet([a, b, c]), job: CPUSet([b])})
    assert read_cpus(layout, job, effective=True) == CPUSet([b])
    assert _partition(layout, held) == "isolated"


def test_writes_succeed_when_a_parents_effective_set_differs_from_its_own(
    cpuset_v2: CgroupLayout, spawn: Spawn
) -> None:
    layout = cpuset_v2
    a, b, c = _three_cpus(layout)
    mems = read_mems(layout, "", effective=True)
    outer = create_cgroup(layout, layout.parent, cpus=CPUSet([a, b]), mems=mems)
    # v2 takes a set wider than the parent's and runs it on the intersection.
    wide = create_cgroup(layout, f"{outer}/wide", cpus=CPUSet([a, b, c]))
    inherit = create_cgroup(layout, f"{outer}/inherit")  # empty cpuset.cpus: the parent's
    assert read_cpuset(layout, wide) == (CPUSet([a, b, c]), CPUSet())
    assert read_cpus(layout, wide, effective=True) == CPUSet([a, b])
    assert read_cpus(layout, inherit, effective=True) == CPUSet([a, b])

    procs = {}
    for parent in (wide, inherit):
        for name, cpu in (("x", a), ("y", b)):
            rel = create_cgroup(layout, f"{parent}/{name}")
            procs[rel] = (spawn(), cpu)
            move_pid(layout, rel, procs[rel][0].pid)
    apply_assignment(layout, {rel: CPUSet([cpu]) for rel, (_, cpu) in procs.items()})
    for rel, (p, cpu) in procs.items():
        assert proc_status(p.pid, "Cpus_allowed_list") == CPUSet([cpu]), rel

    # A CPU the parent has configured but does not have (c) would silently become "all of the
    # parent's" in v2: refused by name instead, and when the parent is written in the same step.
    target = f"{wide}/x"
    with pytest.raises(EnforcementError, match="not within the parent's"):
        apply_assignment(layout, {target: CPUSet([c])})
    with pytest.raises(EnforcementError, match="not within the parent's"):
        apply_assignment(layout, {wide: CPUSet([a, b, c]), target: CPUSet([c])})
    assert proc_status(procs[target][0].pid, "Cpus_allowed_list") == CPUSet([a])


def test_a_cgroup_without_the_cpuset_controller_is_named(cpuset_v2: CgroupLayout) -> None:
    layout = cpuset_v2
    parent = create_cgroup(layout, layout.parent)
    bare = f"{parent}/bare"
    os.mkdir(layout.abspath(bare))  # as a runtime would that never enabled cpuset below the parent
    with pytest.raises(EnforcementError, match="subtree_control lacks cpuset"):
        read_cpus(layout, bare)
    with pytest.raises(EnforcementError, match="subtree_control lacks cpuset"):
        apply_assignment(layout, {bare: read_cpus(layout, "", effective=True)})


def test_a_process_is_refused_clearly_where_v2_allows_none(cpuset_v2: CgroupLayout, spawn: Spawn,
                                                           throwaway_machine: None) -> None:
    layout = cpuset_v2
    create_cgroup(layout, layout.workload_path("w"))  # the parent now enables cpuset for its children
    # cpuset alone is a threaded controller, which v2 lets a cgroup with processes hand down; a domain
    # controller such as memory (which systemd enables everywhere) it does not.
    for rel in ("", layout.parent):
        with open(os.path.join(layout.abspath(rel), "cgroup.subtree_control"), "w") as f:
            f.write("+memory")
    with pytest.raises(EnforcementError, match="enables controllers for its children") as err:
        move_pid(layout, layout.parent, spawn().pid)
    assert err.value.path == os.path.join(layout.abspath(layout.parent), "cgroup.procs")
