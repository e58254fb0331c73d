"""An agent's first start on a machine: the cgroups it makes are not drift, and it leaves none it did
not need; a state folder that is a file is one line."""

from __future__ import annotations

from pathlib import Path

from agent.enforce.cgroup import exists, write_cpuset
from agent.topology.cpuset import CPUSet
from tests.standalone.conftest import Node


def test_creating_the_parents_is_not_drift_but_a_later_rewrite_is(node: Node) -> None:
    assert not exists(node.layout, node.layout.parent)
    engine = node.engine()
    assert engine.reconcile().drift_repaired == 0
    assert node.pool() == node.allowed
    write_cpuset(node.layout, node.layout.shared_path, CPUSet([min(node.allowed)]))
    assert node.engine().reconcile().drift_repaired == 1
    assert node.pool() == node.allowed
    assert node.engine().reconcile().drift_repaired == 0


def _agent_once(node: Node, *extra: str) -> list[str]:
    return node.topolet("agent", "--once", "--mode", "standalone", "--state-dir", node.state_dir,
                        "--features-dir", node.features_dir, "--cgroup-root", node.root, *extra)


def test_an_agent_that_found_no_work_leaves_no_cgroups_behind(node: Node) -> None:
    p = node.run(_agent_once(node))
    assert p.returncode == 0, p.stderr
    assert "repaired cpuset drift" not in p.stderr
    assert f"created cpuset cgroups {node.layout.parent}, {node.layout.shared_path}" in p.stderr
    assert not exists(node.layout, node.layout.parent), p.stderr


def test_an_agent_leaves_the_cgroups_that_hold_work(node: Node) -> None:
    held = node.hold(1)
    p = node.run(_agent_once(node))
    assert p.returncode == 0, p.stderr
    assert "repaired cpuset drift" not in p.stderr
    assert exists(node.layout, node.layout.shared_path)
    assert exists(node.layout, f"{node.layout.parent}/{held.allocation}")
    assert held.stop() == 0


def test_a_state_dir_that_is_a_file_stops_the_agent_in_one_line(node: Node, tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    p = node.run(node.topolet("agent", "--once", "--mode", "standalone", "--state-dir",
                              str(tmp_path / "file"), "--features-dir", node.features_dir,
                              "--cgroup-root", node.root))
    assert p.returncode == 2
    assert "Traceback" not in p.stderr
    assert p.stderr.splitlines()[-1] == f"topolet agent: state folder {tmp_path / 'file'}: not a folder"
