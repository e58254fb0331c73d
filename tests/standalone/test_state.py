"""`topolet status`, and a corrupt state file rebuilt from the live cgroups without losing a workload."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import stat

import pytest

from agent.alloc.request import Request
from agent.enforce.cgroup import create_cgroup, exists, read_cpus
from agent.enforce.state import Allocation, Owner, State
from agent.enforce.state_file import STATE_NAME, StateFile
from agent.enforce.state_live import REBUILT_POLICY
from agent.errors import EnforcementError
from agent.topology.cpuset import CPUSet
from tests.conftest import require
from tests.standalone.conftest import Node, proc_cpus


def _numa_rows(node: Node, exclusive: CPUSet, reserved: CPUSet) -> dict[int, dict[str, CPUSet]]:
    """What status should say per CPU-bearing NUMA node, from the topology and the held CPUs."""
    rows = {}
    for n in node.topology.numa_nodes:
        if n.memory_only:
            continue
        cpus = n.cpus & node.allowed
        rows[n.id] = {"cpus": cpus, "reserved": cpus & reserved, "exclusive": cpus & exclusive,
                      "free": cpus - exclusive - reserved}
    return rows


def _status(node: Node, fmt: str) -> str:
    result = node.run(node.topolet("status", "--state-dir", node.state_dir, "--format", fmt))
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.parametrize("reserve", [False, True], ids=["nothing-reserved", "last-cpu-reserved"])
def test_status_json_shows_the_allocation_and_free_cpus_per_numa(node: Node, reserve: bool) -> None:
    reserved = CPUSet([max(node.allowed)]) if reserve else CPUSet()
    extra = ("--reserved-cpus", reserved.cpulist())  # '' for none (exec reserves CPU 0 by default)
    held = node.hold(1, *extra)
    assert held.cpus.isdisjoint(reserved)
    data = json.loads(_status(node, "json"))
    assert CPUSet.parse(data["reserved"]) == reserved
    (alloc,) = data["allocations"]
    assert alloc["id"] == held.allocation
    assert CPUSet.parse(alloc["cpus"]) == held.cpus
    assert alloc["pid"] == held.launcher.pid
    assert alloc["alive"] is True
    assert alloc["cgroup"] == f"{node.layout.parent}/{held.allocation}"
    want = _numa_rows(node, held.cpus, reserved)
    assert sorted(r["numa"] for r in data["numa"]) == sorted(want)
    for row in data["numa"]:
        w = want[row["numa"]]
        for key in ("cpus", "reserved", "exclusive", "free"):
            assert CPUSet.parse(row[key]) == w[key], key
        assert row["free_count"] == len(w["free"])
    assert held.stop() == 0
    after = json.loads(_status(node, "json"))
    assert after["allocations"] == []
    assert sum(r["free_count"] for r in after["numa"]) == len(node.allowed - reserved)


def test_status_table_names_the_allocation_and_each_numa_row(node: Node) -> None:
    held = node.hold(1)
    text = _status(node, "table")
    lines = text.splitlines()
    (line,) = [ln for ln in lines if held.allocation in ln]
    assert held.cpus.cpulist() in line.split()
    assert f"pid {held.launcher.pid}" in line
    for numa, w in _numa_rows(node, held.cpus, CPUSet()).items():
        row = [ln.split() for ln in lines if ln.split()[:2] == [str(numa), w["cpus"].cpulist()]]
        assert len(row) == 1, text
        assert (w["free"].cpulist() or "-") in row[0][2:]
    assert "1 allocation(s)" in text
    assert held.stop() == 0


def test_status_without_a_state_file_shows_everything_free(node: Node) -> None:
    data = json.loads(_status(node, "json"))
    assert data["allocations"] == []
    assert CPUSet().union(*(CPUSet.parse(r["free"]) for r in data["numa"])) == node.allowed


def _garbage(kind: str, good: bytes) -> bytes:
    if kind == "noise":
        return os.urandom(512)
    if kind == "truncated":
        return good[: len(good) // 2]
    if kind == "empty":
        return b""
    doc = json.loads(good)
    if kind == "bad-checksum":
        doc["body"]["generation"] += 7
    else:  # "bad-field": the checksum holds, the body does not (two allocations on one CPU)
        body = doc["body"]
        body["allocations"] = body["allocations"] * 2
        canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
        doc = {"version": 1, "checksum": "sha256:" + hashlib.sha256(canonical).hexdigest(), "body": body}
    return json.dumps(doc).encode()


def _rebuild_by(node: Node, how: str) -> str:
    """Make the next topolet pass load the state; return its stderr."""
    if how == "agent-once":
        return node.agent_once().stderr
    if how == "shared-exec":
        result = node.run(node.exec_argv(0, ["true"]))
        assert result.returncode == 0, result.stderr
        return result.stderr
    path = os.path.join(node.state_dir, STATE_NAME)
    with open(path, "rb") as f:
        corrupt = f.read()
    result = node.run(node.exec_argv(node.capacity, ["true"]))  # cannot fit: one is held
    assert result.returncode == 2
    # A command that fails writes nothing: the corrupt file stays as it was, and no copy is made ...
    with open(path, "rb") as f:
        assert f.read() == corrupt
    assert StateFile(node.state_dir).corrupt_copies() == []
    # ... until one that succeeds rebuilds it.
    return result.stderr + _rebuild_by(node, "shared-exec")


@pytest.mark.parametrize(("kind", "how"), [
    ("noise", "agent-once"),
    ("truncated", "agent-once"),
    ("empty", "agent-once"),
    ("bad-checksum", "agent-once"),
    ("bad-field", "agent-once"),
    ("noise", "shared-exec"),
    ("truncated", "exclusive-exec"),
])
def test_corrupt_state_is_rebuilt_from_live_cgroups_keeping_running_allocations(
        node: Node, kind: str, how: str) -> None:
    held = node.hold(node.capacity)
    path = os.path.join(node.state_dir, STATE_NAME)
    with open(path, "rb") as f:
        good = f.read()
    with open(path, "wb") as f:
        f.write(_garbage(kind, good))
    stderr = _rebuild_by(node, how)
    if how == "agent-once":  # the agent logs; exec keeps quiet unless it fails
        assert "rebuilding" in stderr
    assert StateFile(node.state_dir).corrupt_copies()
    (alloc,) = node.state().allocations
    assert (alloc.id, alloc.cpus, alloc.policy) == (held.allocation, held.cpus, REBUILT_POLICY)
    assert alloc.owner.pid == held.launcher.pid
    assert read_cpus(node.layout, alloc.cgroup) == held.cpus
    assert proc_cpus(held.pid) == held.cpus
    assert node.pool() == node.allowed - held.cpus
    # The launcher still finds its allocation (same id) and gives it back on exit.
    assert held.stop() == 0
    assert node.state().allocations == ()
    assert not exists(node.layout, alloc.cgroup)
    assert node.pool() == node.allowed


# --- hostile state files: nothing hangs, nothing untrue is trusted, a failed command writes nothing ---

def _state_path(node: Node) -> str:
    os.makedirs(node.state_dir, exist_ok=True)
    return os.path.join(node.state_dir, STATE_NAME)


def test_a_fifo_at_the_state_path_fails_status_and_exec_at_once(node: Node) -> None:
    os.mkfifo(_state_path(node))
    # `run` times out (and the test fails) rather than waiting forever on a FIFO.
    for argv in (node.topolet("status", "--state-dir", node.state_dir),
                 node.exec_argv(1, ["true"]), node.exec_argv(0, ["true"])):
        result = node.run(argv, timeout=30)
        assert result.returncode == 2, result.stderr
        assert "is not a regular file" in result.stderr
    assert stat.S_ISFIFO(os.stat(_state_path(node)).st_mode)
    assert node.workload_cgroups() == []


def test_every_corrupt_state_is_kept_and_a_failing_exec_writes_nothing(node: Node) -> None:
    path = _state_path(node)
    kept: list[bytes] = []
    for i in range(3):
        garbage = f"corrupt state number {i}".encode()
        with open(path, "wb") as f:
            f.write(garbage)
        failed = node.run(node.exec_argv(node.capacity + 1, ["true"]))  # more than can ever fit
        assert failed.returncode == 2 and "topolet exec:" in failed.stderr
        with open(path, "rb") as f:
            assert f.read() == garbage
        assert [open(c, "rb").read() for c in StateFile(node.state_dir).corrupt_copies()] == kept
        node.run_reporter(1)
        kept.append(garbage)
        assert [open(c, "rb").read() for c in StateFile(node.state_dir).corrupt_copies()] == kept
        assert node.state().allocations == ()


def _commit(node: Node, alloc: Allocation) -> None:
    sf = StateFile(node.state_dir)
    sf.commit(State((alloc,), generation=sf.load(missing_ok=True).generation))


@pytest.mark.parametrize(("what", "why"), [
    ("cgroup", "is neither under topolet/ nor the kubelet's kubepods"),
    ("pid 1", "pid 1 cannot own an allocation"),
    ("cpus", "are not on this machine"),
])
def test_a_checksummed_state_the_machine_contradicts_is_refused_then_rebuilt(
        node: Node, what: str, why: str) -> None:
    cpus = CPUSet([min(node.allowed)])
    alloc = Allocation("planted", cpus, CPUSet(), "topolet/planted", Owner(), "planted", 1.0)
    if what == "cgroup":
        alloc = dataclasses.replace(alloc, cgroup="system.slice/sshd.service")
    elif what == "pid 1":
        alloc = dataclasses.replace(alloc, owner=Owner.of_process(1))
    else:
        lacking = max(node.topology.cpus | node.topology.offline) + 1
        alloc = dataclasses.replace(alloc, cpus=CPUSet([lacking]))
    _commit(node, alloc)
    result = node.run(node.topolet("status", "--state-dir", node.state_dir, "--cgroup-root", node.root))
    assert result.returncode == 2 and why in result.stderr
    # The next command rebuilds from the live cgroups, where nothing was planted.
    _, report = node.run_reporter(1)
    assert len(CPUSet.parse(str(report["cpus_allowed"]))) == 1
    assert node.state().allocations == ()
    assert len(StateFile(node.state_dir).corrupt_copies()) == 1


def test_status_escapes_control_characters_from_the_state(node: Node) -> None:
    held = node.hold(1)
    sf = StateFile(node.state_dir)
    with sf.lock():
        state = sf.load()
        (alloc,) = state.allocations
        evil = dataclasses.replace(alloc, policy="x\x1b]0;owned\x07\x1b[2J\rdone",
                                   owner=dataclasses.replace(alloc.owner, pod_uid=None))
        sf.commit(state.with_allocation(evil))
    out = _status(node, "table")
    assert "\x1b" not in out and "\x07" not in out and "\r" not in out
    assert "x\\x1b]0;owned\\x07\\x1b[2J\\rdone" in out
    assert held.stop() == 0


def test_an_allocation_whose_cgroup_write_fails_is_rolled_back(node: Node) -> None:
    require(len(node.allowed) >= 2, "needs 2 CPUs")
    engine = node.engine()
    engine.reconcile()  # makes topolet/ and topolet/shared
    low, high = min(node.allowed), max(node.allowed)
    # A cgroup whose parent holds only `high`: the kernel refuses to give it `low`.
    create_cgroup(node.layout, "topolet/narrow", cpus=CPUSet([high]), mems=node.mems)
    create_cgroup(node.layout, "topolet/narrow/leaf", cpus=CPUSet([high]), mems=node.mems)
    before = StateFile(node.state_dir).load()
    with pytest.raises(EnforcementError):
        engine.allocate("doomed", Request(1, reserved=node.allowed - CPUSet([low])), Owner(),
                        cgroup="topolet/narrow/leaf")
    after = StateFile(node.state_dir).load()
    assert after.allocations == before.allocations == ()
    assert after.generation == before.generation + 2  # the record, then its undoing
    assert node.pool() == node.allowed
