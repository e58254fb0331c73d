"""Real cgroups, real processes: create, write, move tasks, ordering, shared pool, drift."""

from __future__ import annotations

import subprocess
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.enforce.apply import (
    apply_assignment,
    apply_with_shared_pool,
    find_drift,
    repair_drift,
)
from agent.enforce.cgroup import (
    CgroupLayout,
    create_cgroup,
    exists,
    move_pid,
    read_cpus,
    read_cpuset,
    read_mems,
    read_procs,
    remove_cgroup,
    write_cpuset,
)
from agent.errors import EnforcementError
from agent.topology.cpuset import CPUSet
from tests.enforce.conftest import proc_status

Spawn = Callable[[], "subprocess.Popen[bytes]"]


def test_workload_cgroup_confines_a_real_process(
    cpuset_root: CgroupLayout, two_cpus: tuple[int, int], spawn: Spawn
) -> None:
    layout = cpuset_root
    a, b = two_cpus
    mems = read_mems(layout, "", effective=True)
    rel = create_cgroup(layout, layout.workload_path("job"), cpus=CPUSet([b]), mems=mems)
    p = spawn()
    move_pid(layout, rel, p.pid)
    assert read_procs(layout, rel) == [p.pid]
    assert proc_status(p.pid, "Cpus_allowed_list") == CPUSet([b])
    assert proc_status(p.pid, "Mems_allowed_list") == mems
    apply_assignment(layout, {rel: CPUSet([a])})
    assert proc_status(p.pid, "Cpus_allowed_list") == CPUSet([a])
    assert read_cpuset(layout, rel) == (CPUSet([a]), mems)


def test_v1_new_cgroup_takes_no_task_until_given_cpus(cpuset_v1: CgroupLayout, spawn: Spawn) -> None:
    layout = cpuset_v1
    rel = create_cgroup(layout, layout.workload_path("empty"))
    assert read_cpus(layout, rel) == CPUSet()
    assert read_mems(layout, rel) == read_mems(layout, layout.parent)  # seeded so only cpus are missing
    with pytest.raises(EnforcementError) as err:
        move_pid(layout, rel, spawn().pid)
    assert err.value.path is not None and err.value.path.endswith("cgroup.procs")


def test_v1_kernel_refuses_child_wider_than_parent_apply_orders_it(
    cpuset_v1: CgroupLayout, two_cpus: tuple[int, int], spawn: Spawn
) -> None:
    layout = cpuset_v1
    a, b = two_cpus
    one, both = CPUSet([a]), CPUSet([a, b])
    outer = create_cgroup(layout, f"{layout.parent}/outer", cpus=one)
    inner = create_cgroup(layout, f"{outer}/inner", cpus=one)
    p = spawn()
    move_pid(layout, inner, p.pid)
    with pytest.raises(EnforcementError):
        write_cpuset(layout, inner, both)  # the parent does not hold b yet
    writes = apply_assignment(layout, {inner: both, outer: both})
    assert [w.path for w in writes] == [outer, inner]  # parent widened first
    assert proc_status(p.pid, "Cpus_allowed_list") == both


def test_v1_kernel_refuses_parent_narrower_than_child_apply_orders_it(
    cpuset_v1: CgroupLayout, two_cpus: tuple[int, int], spawn: Spawn
) -> None:
    layout = cpuset_v1
    a, b = two_cpus
    both = CPUSet([a, b])
    outer = create_cgroup(layout, f"{layout.parent}/outer", cpus=both)
    inner = create_cgroup(layout, f"{outer}/inner", cpus=both)
    p = spawn()
    move_pid(layout, inner, p.pid)
    with pytest.raises(EnforcementError):
        write_cpuset(layout, outer, CPUSet([b]))  # the child still holds a
    writes = apply_assignment(layout, {outer: CPUSet([b]), inner: CPUSet([b])})
    assert [w.path for w in writes] == [inner, outer]  # child narrowed first
    assert read_cpus(layout, outer) == read_cpus(layout, inner) == CPUSet([b])
    assert proc_status(p.pid, "Cpus_allowed_list") == CPUSet([b])


def test_v1_nested_disjoint_move_needs_widen_then_settle(
    cpuset_v1: CgroupLayout, two_cpus: tuple[int, int], spawn: Spawn
) -> None:
    # n {a,b}->{b}, c {a}->{b}, g {a}->{b}: no two-pass order works; c must widen, g move, c and n narrow.
    layout = cpuset_v1
    a, b = two_cpus
    n = create_cgroup(layout, f"{layout.parent}/n", cpus=CPUSet([a, b]))
    c = create_cgroup(layout, f"{n}/c", cpus=CPUSet([a]))
    g = create_cgroup(layout, f"{c}/g", cpus=CPUSet([a]))
    p = spawn()
    move_pid(layout, g, p.pid)
    apply_assignment(layout, {n: CPUSet([b]), c: CPUSet([b]), g: CPUSet([b])})
    assert [read_cpus(layout, x) for x in (n, c, g)] == [CPUSet([b])] * 3
    assert proc_status(p.pid, "Cpus_allowed_list") == CPUSet([b])


def test_inconsistent_target_is_refused_before_any_write(
    cpuset_root: CgroupLayout, two_cpus: tuple[int, int]
) -> None:
    layout = cpuset_root
    a, b = two_cpus
    outer = create_cgroup(layout, f"{layout.parent}/outer", cpus=CPUSet([a, b]))
    inner = create_cgroup(layout, f"{outer}/inner", cpus=CPUSet([a, b]))
    cases: list[dict[str, CPUSet]] = [
        {outer: CPUSet([a]), inner: CPUSet([a, b])},  # child outside its parent's target
        {inner: CPUSet()},  # empty
        {outer: CPUSet([a]), "": CPUSet([a])},  # the hierarchy root
    ]
    for target in cases:
        with pytest.raises(EnforcementError):
            apply_assignment(layout, target)
        assert read_cpus(layout, outer) == read_cpus(layout, inner) == CPUSet([a, b])
    if layout.version == 1:
        with pytest.raises(EnforcementError):  # unmanaged child still holds b
            apply_assignment(layout, {outer: CPUSet([a])})
        assert read_cpus(layout, outer) == CPUSet([a, b])


# The tree the property test reshapes: each node's target is a subset of its parent's.
_TREE = ["x", "x/y", "x/y/z", "x/w", "v"]


def _assignments(cpus: list[int]) -> st.SearchStrategy[dict[str, CPUSet]]:
    def subset_of(pool: list[int]) -> st.SearchStrategy[list[int]]:
        return st.lists(st.sampled_from(pool), min_size=1, unique=True)

    @st.composite
    def draw(d: st.DrawFn) -> dict[str, CPUSet]:
        out: dict[str, CPUSet] = {}
        for node in _TREE:
            up = node.rsplit("/", 1)[0] if "/" in node else None
            pool = out[up].sorted() if up else cpus
            out[node] = CPUSet(d(subset_of(pool)))
        return out

    return draw()


def test_apply_reaches_any_consistent_target_from_any_consistent_start(
    cpuset_root: CgroupLayout, spawn: Spawn
) -> None:
    layout = cpuset_root
    cpus = read_cpus(layout, "", effective=True).sorted()[:4]
    if len(cpus) < 2:
        pytest.skip("needs at least 2 CPUs")
    for node in _TREE:
        create_cgroup(layout, f"{layout.parent}/{node}", cpus=CPUSet(cpus))
    p = spawn()
    leaf = f"{layout.parent}/x/y/z"
    move_pid(layout, leaf, p.pid)

    @settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(start=_assignments(cpus), target=_assignments(cpus))
    def check(start: dict[str, CPUSet], target: dict[str, CPUSet]) -> None:
        for goal in (start, target):
            apply_assignment(layout, {f"{layout.parent}/{k}": v for k, v in goal.items()})
            for node in _TREE:
                assert read_cpus(layout, f"{layout.parent}/{node}") == goal[node]
            assert proc_status(p.pid, "Cpus_allowed_list") == goal["x/y/z"]

    check()


def test_grant_shrinks_shared_before_exclusive_widens_and_release_reverses(
    cpuset_root: CgroupLayout, two_cpus: tuple[int, int], spawn: Spawn
) -> None:
    layout = cpuset_root
    a, b = two_cpus
    allowed = CPUSet([a, b])
    shared = [create_cgroup(layout, layout.shared_path, cpus=allowed)]
    for name in ("s1", "s2"):
        shared.append(create_cgroup(layout, layout.workload_path(name, shared=True), cpus=allowed))
    sleepers = [spawn() for _ in range(2)]
    for rel, p in zip(shared[1:], sleepers, strict=True):
        move_pid(layout, rel, p.pid)
    excl = create_cgroup(layout, layout.workload_path("job"))
    job = spawn()

    writes = apply_with_shared_pool(
        layout, allowed=allowed, reserved=CPUSet([a]), exclusive={excl: CPUSet([b])}, shared=shared
    )
    move_pid(layout, excl, job.pid)
    order = [w.path for w in writes if w.key == "cpus"]
    assert order[-1] == excl and set(order[:-1]) == set(shared)
    for p in sleepers:
        assert proc_status(p.pid, "Cpus_allowed_list") == CPUSet([a])
    assert proc_status(job.pid, "Cpus_allowed_list") == CPUSet([b])

    with pytest.raises(EnforcementError):  # the job still runs in it: refused before any write
        apply_with_shared_pool(layout, allowed=allowed, reserved=CPUSet([a]), exclusive={},
                               shared=shared, remove=[excl])
    assert [read_cpus(layout, rel) for rel in shared] == [CPUSet([a])] * len(shared)
    job.kill()
    job.wait()
    writes = apply_with_shared_pool(
        layout, allowed=allowed, reserved=CPUSet([a]), exclusive={}, shared=shared, remove=[excl]
    )
    assert not exists(layout, excl)
    assert {w.path for w in writes} == set(shared)
    for p in sleepers:
        assert proc_status(p.pid, "Cpus_allowed_list") == allowed


def test_drift_is_found_and_repaired(
    cpuset_root: CgroupLayout, two_cpus: tuple[int, int], spawn: Spawn
) -> None:
    layout = cpuset_root
    a, b = two_cpus
    w1 = create_cgroup(layout, layout.workload_path("w1"), cpus=CPUSet([a]))
    w2 = create_cgroup(layout, layout.workload_path("w2"), cpus=CPUSet([b]))
    p = spawn()
    move_pid(layout, w1, p.pid)
    desired = {w1: CPUSet([a]), w2: CPUSet([b]), layout.workload_path("gone"): CPUSet([b])}
    assert find_drift(layout, desired).changed == ()
    assert repair_drift(layout, desired) == 0

    write_cpuset(layout, w1, CPUSet([a, b]))  # behind the code's back
    assert proc_status(p.pid, "Cpus_allowed_list") == CPUSet([a, b])
    drift = find_drift(layout, desired)
    assert drift.changed == (w1,)
    assert drift.missing == (layout.workload_path("gone"),)
    assert repair_drift(layout, desired) == 1
    assert read_cpus(layout, w1) == CPUSet([a])
    assert proc_status(p.pid, "Cpus_allowed_list") == CPUSet([a])
    assert repair_drift(layout, desired) == 0


def test_mems_drift_is_found(cpuset_root: CgroupLayout, two_cpus: tuple[int, int]) -> None:
    layout = cpuset_root
    mems = read_mems(layout, "", effective=True)
    w = create_cgroup(layout, layout.workload_path("w"), cpus=CPUSet([two_cpus[0]]), mems=mems)
    assert find_drift(layout, {w: CPUSet([two_cpus[0]])}, {w: mems}).changed == ()
    other = CPUSet([mems.max() + 1])  # a node id the cgroup does not have
    assert find_drift(layout, {w: CPUSet([two_cpus[0]])}, {w: other}).changed == (w,)


def test_remove_cgroup_with_processes(
    cpuset_root: CgroupLayout, two_cpus: tuple[int, int], spawn: Spawn
) -> None:
    layout = cpuset_root
    a, _ = two_cpus
    mems = read_mems(layout, "", effective=True)
    w = create_cgroup(layout, layout.workload_path("w"), cpus=CPUSet([a]), mems=mems)
    p = spawn()
    move_pid(layout, w, p.pid)
    with pytest.raises(EnforcementError):
        remove_cgroup(layout, w)
    with pytest.raises(EnforcementError):
        remove_cgroup(layout, layout.parent)  # has a child
    assert remove_cgroup(layout, w, move_procs_to="") is True
    assert p.pid in read_procs(layout, "")
    assert remove_cgroup(layout, w) is False


def test_bad_paths_and_pids_are_refused(cpuset_root: CgroupLayout) -> None:
    layout = cpuset_root
    for rel in ("../escape", "a/./b", "a/../../b"):
        with pytest.raises(EnforcementError):
            layout.abspath(rel)
    for name in ("shared", "", "a/b", "-x", "x" * 300):
        with pytest.raises(EnforcementError):
            layout.workload_path(name)
    with pytest.raises(EnforcementError):
        move_pid(layout, layout.parent, 0)
    with pytest.raises(EnforcementError):
        read_cpus(layout, f"{layout.parent}/does-not-exist")
