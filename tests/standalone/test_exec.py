"""`topolet exec` with real processes: what the kernel lets the command run on, side by side."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.enforce.cgroup import exists, list_children
from agent.topology.cpuset import CPUSet
from tests.standalone.conftest import Held, Node, proc_cpus, wait_for


def _numa_of(node: Node, cpus: CPUSet) -> CPUSet:
    return CPUSet(node.topology.numa_of(c) for c in cpus)


@pytest.mark.parametrize("binding", [True, False], ids=["memory-binding", "no-binding"])
@pytest.mark.parametrize("which", ["one", "all-it-can"])
def test_command_runs_on_its_cpus(node: Node, binding: bool, which: str) -> None:
    cpus = 1 if which == "one" else node.capacity
    extra = ("--memory-binding",) if binding else ()
    _, report = node.run_reporter(cpus, *extra)
    env = report["env"]
    assert isinstance(env, dict)
    given = CPUSet.parse(env["TOPOLET_CPUS"])
    assert len(given) == cpus
    assert given <= node.allowed
    assert CPUSet.parse(str(report["cpus_allowed"])) == given
    mems = CPUSet.parse(str(report["mems_allowed"]))
    assert mems == (_numa_of(node, given) & node.mems if binding else node.mems)
    # The command ran inside the allocation's own cgroup under the private root.
    alloc_id = env["TOPOLET_ALLOCATION"]
    assert str(report["cgroup"]).endswith(f"/{node.layout.parent}/{alloc_id}")
    # ... and exit gave everything back.
    assert node.state().allocations == ()
    assert not exists(node.layout, f"{node.layout.parent}/{alloc_id}")
    assert node.pool() == node.allowed


def test_shared_command_runs_on_the_pool_without_topolet_cpus(node: Node) -> None:
    _, report = node.run_reporter(0)
    assert CPUSet.parse(str(report["cpus_allowed"])) == node.allowed
    assert "TOPOLET_CPUS" not in report["env"]  # type: ignore[operator]
    assert f"/{node.layout.shared_path}/" in str(report["cgroup"])
    assert node.state().allocations == ()


@pytest.mark.parametrize("status", [0, 3, 77])
def test_exit_status_is_the_commands(node: Node, status: int) -> None:
    result = node.run(node.exec_argv(1, ["sh", "-c", f"exit {status}"]))
    assert result.returncode == status, result.stderr
    assert node.state().allocations == ()


def test_missing_command_is_127_and_releases(node: Node) -> None:
    result = node.run(node.exec_argv(1, ["/nonexistent/topolet-test-command"]))
    assert result.returncode == 127
    assert "cannot run" in result.stderr
    assert node.state().allocations == ()


def _split(node: Node) -> tuple[int, int]:
    """(m, q): m execs of q CPUs fit together, one more of q does not."""
    c = node.capacity
    for m in (3, 2, 1):
        if m <= c and (m + 1) * (c // m) > c:
            return m, c // m
    raise AssertionError("unreachable: m = 1 always splits")


def test_concurrent_execs_get_disjoint_cpus_and_the_one_too_many_fails(node: Node, tmp_path: Path) -> None:
    m, q = _split(node)
    shared = node.hold(0)
    # m + 1 launchers race for the lock: exactly m fit, whichever order they win in.
    outs, launchers = [], []
    for _ in range(m + 1):
        command, out = node.reporter("hold")
        outs.append(out)
        launchers.append(node.start(node.exec_argv(q, command)))

    def settled() -> bool:
        done = [p.poll() is not None for p, _ in launchers]
        return sum(done) == 1 and sum(o.exists() for o in outs) == m

    wait_for(settled, f"{m} of {m + 1} execs to start and one to fail")
    (failed,) = [(p, err) for p, err in launchers if p.poll() is not None]
    assert failed[0].returncode == 2
    lines = failed[1].read_text().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("topolet exec: ")
    held = [Held(p, json.loads(o.read_text()), err)
            for (p, err), o in zip(launchers, outs, strict=True) if o.exists()]
    grants = [h.cpus for h in held]
    for h in held:
        assert len(h.cpus) == q
        assert proc_cpus(h.pid) == h.cpus
    taken = CPUSet()
    for g in grants:
        assert g.isdisjoint(taken), grants
        taken |= g
    # The shared workload is told the rest, at once.
    assert proc_cpus(shared.pid) == node.allowed - taken
    assert node.pool() == node.allowed - taken
    for h in held:
        assert h.stop() == 0
    assert shared.stop() == 0
    assert node.state().allocations == ()


@pytest.mark.parametrize("ask", ["one-more-than-free", "more-than-the-node"])
def test_request_that_cannot_fit_fails_in_one_line_and_runs_nothing(node: Node, tmp_path: Path,
                                                                   ask: str) -> None:
    held = node.hold(node.capacity) if ask == "one-more-than-free" else None
    want = 1 if held is not None else len(node.allowed) + 1
    marker = tmp_path / "ran"
    before = node.state() if held is not None else None
    result = node.run(node.exec_argv(want, ["touch", str(marker)]))
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("topolet exec: ")
    assert not marker.exists()
    if held is not None:
        assert before is not None
        assert [a.cpus for a in node.state().allocations] == [a.cpus for a in before.allocations]
        assert proc_cpus(held.pid) == held.cpus
        assert held.stop() == 0


@pytest.mark.parametrize("sizes", ["one", "all-it-can"])
def test_shared_pool_shrinks_at_once_and_grows_back(node: Node, sizes: str) -> None:
    shared = node.hold(0)
    assert proc_cpus(shared.pid) == node.allowed
    exclusive = node.hold(1 if sizes == "one" else node.capacity)
    # The exclusive command has reported, so its CPUs already left the pool.
    assert proc_cpus(shared.pid) == node.allowed - exclusive.cpus
    assert proc_cpus(exclusive.pid) == exclusive.cpus
    assert exclusive.stop() == 0
    assert proc_cpus(shared.pid) == node.allowed
    assert node.pool() == node.allowed
    assert shared.stop() == 0


def test_a_second_shared_workload_joins_the_narrowed_pool(node: Node) -> None:
    exclusive = node.hold(1)
    shared = node.hold(0)
    assert proc_cpus(shared.pid) == node.allowed - exclusive.cpus
    assert exclusive.stop() == 0
    assert proc_cpus(shared.pid) == node.allowed
    assert shared.stop() == 0
    # Shared cgroups are removed as their launchers leave.
    assert node.workload_cgroups() == []
    assert list_children(node.layout, node.layout.shared_path) == []


def test_exec_without_a_command_is_a_usage_error(node: Node) -> None:
    result = node.run(node.topolet("exec", "--cpus", "1", "--state-dir", node.state_dir,
                                   "--cgroup-root", node.root))
    assert result.returncode == 2
    assert "no command given" in result.stderr


# -- the reservation ------------------------------------------------------------------------------


def test_exec_leaves_cpu_0_to_the_system_by_default(node: Node) -> None:
    assert 0 in node.allowed
    held = node.hold(node.capacity)
    assert len(held.cpus) == node.capacity and 0 not in held.cpus
    assert node.state().reserved == CPUSet([0])  # recorded, for the agent and the next exec
    assert held.stop() == 0


def test_the_standalone_agent_reserves_the_same_by_default(node: Node) -> None:
    node.agent_once()
    assert node.state().reserved == CPUSet([0])


def test_exec_keeps_the_reservation_the_agent_recorded(node: Node) -> None:
    last = CPUSet([max(node.allowed)])
    node.agent_once("--reserved-cpus", last.cpulist())
    held = node.hold(node.capacity)
    assert held.cpus == node.allowed - last
    assert node.state().reserved == last  # never overwritten by an exec that named none
    assert held.stop() == 0
    assert node.state().reserved == last


def test_an_explicit_reservation_is_recorded_and_then_stands(node: Node) -> None:
    node.run_reporter(1, "--reserved-cpus", "")
    assert node.state().reserved == CPUSet()
    _, report = node.run_reporter(node.capacity)
    env = report["env"]
    assert isinstance(env, dict) and len(CPUSet.parse(env["TOPOLET_CPUS"])) == node.capacity
    assert node.state().reserved == CPUSet()


def _refusal(node: Node, cpus: int, *extra: str) -> str:
    result = node.run(node.exec_argv(cpus, ["true"], *extra))
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith("topolet exec: ")
    return line


@pytest.mark.parametrize("extra", [(), ("--reserved-cpus", "")], ids=["cpu-0-reserved", "none-reserved"])
def test_more_than_the_machine_can_give_says_its_size(node: Node, extra: tuple[str, ...]) -> None:
    n = len(node.allowed)
    line = _refusal(node, n, *extra)
    assert f"only {n} CPUs and one always stays in the shared pool, so at most {n - 1} can be exclusive" \
        in line, line
    assert "reserve a CPU" not in line and "changes the reservation" not in line, line


def test_a_request_the_reservation_blocks_says_how_to_change_it(node: Node) -> None:
    everything = node.allowed.cpulist()
    line = _refusal(node, 1, "--reserved-cpus", everything)
    assert f"{len(node.allowed)} CPUs are reserved ({everything}); --reserved-cpus changes the reservation" \
        in line, line


def test_a_request_other_allocations_block_says_they_hold_the_cpus(node: Node) -> None:
    held = node.hold(node.capacity)
    line = _refusal(node, 1)
    assert f"{node.capacity} held by other allocations (topolet status lists them)" in line, line
    assert "reserve" not in line, line
    assert held.stop() == 0
