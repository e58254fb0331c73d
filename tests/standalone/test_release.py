"""Allocations end with their processes: on exit, when the launcher or the command is SIGKILLed."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time

import pytest

from agent.alloc.request import Request
from agent.enforce.cgroup import exists, list_children, read_cpus, read_procs
from agent.enforce.state import Owner
from agent.standalone.journal import drain_events
from agent.topology.cpuset import CPUSet
from tests.standalone.conftest import Node, kill_and_reap, proc_cpus, proc_field, wait_for


def _cgroup(node: Node, alloc_id: str) -> str:
    return f"{node.layout.parent}/{alloc_id}"


def _free_by(node: Node, how: str) -> None:
    if how == "agent-once":
        node.agent_once()
    else:  # the next exec reaps before it allocates, and must then fit where the dead one was
        _, report = node.run_reporter(node.capacity)
        assert len(CPUSet.parse(str(report["cpus_allowed"]))) == node.capacity


def test_command_sigkilled_releases_at_once(node: Node) -> None:
    held = node.hold(node.capacity)
    kill_and_reap(held.pid)
    assert held.launcher.wait(20) == 128 + signal.SIGKILL
    assert node.state().allocations == ()
    assert not exists(node.layout, _cgroup(node, held.allocation))
    assert node.pool() == node.allowed


@pytest.mark.parametrize("freer", ["agent-once", "next-exec"])
def test_launcher_sigkilled_keeps_the_allocation_until_the_command_ends(node: Node, freer: str) -> None:
    held = node.hold(node.capacity)
    held.launcher.send_signal(signal.SIGKILL)
    held.launcher.wait(20)
    rel = _cgroup(node, held.allocation)
    # The command still runs in its cgroup: nothing may take its CPUs, not even a reconcile.
    node.agent_once()
    (alloc,) = node.state().allocations
    assert alloc.id == held.allocation
    assert alloc.cpus == held.cpus
    assert read_procs(node.layout, rel) == [held.pid]
    assert read_cpus(node.layout, rel) == held.cpus
    assert proc_cpus(held.pid) == held.cpus
    assert node.pool() == node.allowed - held.cpus
    refused = node.run(node.exec_argv(1, ["true"]))
    assert refused.returncode == 2
    kill_and_reap(held.pid)
    _free_by(node, freer)
    assert held.allocation not in [a.id for a in node.state().allocations]
    assert not exists(node.layout, rel)
    assert node.pool() == node.allowed


@pytest.mark.parametrize("freer", ["agent-once", "next-exec"])
def test_both_sigkilled_is_freed_by_the_next_pass(node: Node, freer: str) -> None:
    held = node.hold(node.capacity)
    held.launcher.send_signal(signal.SIGKILL)
    held.launcher.wait(20)
    kill_and_reap(held.pid)
    assert [a.id for a in node.state().allocations] == [held.allocation]  # nobody has looked yet
    _free_by(node, freer)
    assert node.state().allocations == ()
    assert node.workload_cgroups() == []
    assert node.pool() == node.allowed
    if freer == "next-exec":  # told to the agent through the journal: each release once
        results = [e.result for e in drain_events(node.state_dir)]
        assert results.count("allocated") == 2  # the dead one and the next
        assert results.count("released") == 2  # the dead one, reaped by the next exec, and its own


def test_shared_launcher_sigkilled_leaves_a_cgroup_the_next_pass_collects(node: Node) -> None:
    shared = node.hold(0)
    shared.launcher.send_signal(signal.SIGKILL)
    shared.launcher.wait(20)
    kill_and_reap(shared.pid)
    node.agent_once()
    assert list_children(node.layout, node.layout.shared_path) == []


def test_launcher_sigkilled_at_random_moments_leaves_nothing_after_one_pass(node: Node) -> None:
    rng = random.Random(int(os.environ.get("TOPOLET_CRASH_SEED", "7")))
    for _ in range(12):
        launcher, _err = node.start(node.exec_argv(node.capacity, ["sleep", "299"]))
        time.sleep(rng.uniform(0.0, 0.35))  # before, during or after the allocation
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(20)
        state = node.state() if os.path.exists(os.path.join(node.state_dir, "state.json")) else None
        if state is not None:
            assert len(state.allocations) <= 1
        for pid in node.orphans():
            kill_and_reap(pid)
        node.engine().reconcile()
        assert node.state().allocations == ()
        assert node.workload_cgroups() == []
        assert list_children(node.layout, node.layout.shared_path) == []
        assert node.pool() == node.allowed


def test_an_owner_that_is_a_zombie_does_not_hold_its_cpus(node: Node) -> None:
    sleeper = subprocess.Popen(["sleep", "299"])
    try:
        engine = node.engine()
        engine.allocate("zombie-owner", Request(1), Owner.of_process(sleeper.pid))
        os.kill(sleeper.pid, signal.SIGKILL)
        wait_for(lambda: str(proc_field(sleeper.pid, "State")).startswith("Z"), "a zombie")
        engine.reconcile()  # exited (not yet reaped by its parent), and its cgroup is empty
        assert node.state().allocations == ()
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_cgroup_that_vanishes_during_an_ordered_step_costs_a_retry_not_the_step(node: Node) -> None:
    """A pod cgroup the kubelet removes while the engine writes around it (the pod-cgroup route's
    outer targets, `PinningEngine.outer`): the step is taken again without it and succeeds."""
    from collections.abc import Iterator
    from contextlib import contextmanager

    from agent.enforce.cgroup import create_cgroup, remove_cgroup

    engine = node.engine()
    going = "pod-going"
    create_cgroup(node.layout, going, cpus=node.allowed, mems=node.mems)
    calls: list[bool] = []

    @contextmanager
    def outer(_state: object) -> Iterator[tuple[dict[str, CPUSet], dict[str, CPUSet]]]:
        first = not calls
        calls.append(first)
        if first:  # the targets name it, then it goes before the writes reach it
            remove_cgroup(node.layout, going)
            yield {going: node.allowed}, {}
        else:
            yield {}, {}

    engine.outer = outer
    a = engine.allocate("vanish", Request(1), Owner.of_process(os.getpid()))
    assert calls == [True, False]
    assert node.state().get("vanish") == a and read_cpus(node.layout, a.cgroup) == a.cpus
    assert node.pool() == node.allowed - a.cpus
