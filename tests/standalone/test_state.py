"""`topolet status`, and a corrupt state file rebuilt from the live cgroups without losing a workload."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from agent.enforce.cgroup import exists, read_cpus
from agent.enforce.state import REBUILT_POLICY, STATE_NAME
from agent.topology.cpuset import CPUSet
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
    extra = ("--reserved-cpus", reserved.cpulist()) if reserve else ()
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
    result = node.run(node.exec_argv(node.capacity, ["true"]))  # cannot fit: one is held
    assert result.returncode == 2
    return result.stderr


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
    assert os.path.exists(path + ".corrupt")
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
