"""`topolet cleanup --local`: what topolet made on a machine goes, its workloads keep running.

Real cgroups and real processes: `topolet exec` holds an exclusive and a shared workload in the
`topolet/` tree of the test's private cgroup (its `--cgroup-root`); the cleanup moves their tasks to
that root, where the kernel widens their affinity to the root's CPUs, removes the tree, the state
folder's files and the features.d file (never either folder: topolet may not have made them), and
succeeds again with nothing left.
"""

from __future__ import annotations

import os

from agent.enforce.cgroup import exists, read_procs
from tests.standalone.conftest import Node, proc_cpus


def cleanup(node: Node, *extra: str) -> tuple[int, str, str]:
    result = node.run(node.topolet("cleanup", "--local", "--cgroup-root", node.root, "--state-dir",
                                   node.state_dir, "--features-dir", node.features_dir, *extra))
    return result.returncode, result.stdout, result.stderr


def test_cleanup_moves_workloads_to_the_root_and_removes_the_tree_state_and_labels(node: Node) -> None:
    exclusive = node.hold(1)
    shared = node.hold(0)
    assert proc_cpus(exclusive.pid) == exclusive.cpus and len(exclusive.cpus) == 1
    assert proc_cpus(shared.pid) == node.allowed - exclusive.cpus
    node.agent_once()  # the standalone agent writes the features.d label file
    label_file = os.path.join(node.features_dir, "topolet")
    assert os.path.exists(label_file)
    cgroups = [node.layout.parent, node.layout.shared_path, *node.workload_cgroups()]
    assert all(exists(node.layout, rel) for rel in cgroups)

    rc, out, err = cleanup(node)

    assert rc == 0, err
    assert out.count("\n") == 1 and "task(s) moved to " + node.root in out, out
    assert not exists(node.layout, node.layout.parent)
    for held in (exclusive, shared):
        assert held.pid in read_procs(node.layout, "")  # still running, now in the root
        assert proc_cpus(held.pid) == node.allowed  # its affinity as the kernel reads it back
    assert os.listdir(node.state_dir) == []  # the folder stays
    assert not os.path.exists(label_file)
    assert os.path.isdir(node.features_dir)

    rc, out, err = cleanup(node)  # idempotent: nothing left, still a success
    assert rc == 0, err
    assert "0 cgroup(s) removed" in out and "0 state path(s)" in out and "absent" in out, out


def test_a_state_folder_holding_other_files_is_kept(node: Node) -> None:
    node.run_reporter(1)  # a state file, then released
    other = os.path.join(node.state_dir, "operator-notes.txt")
    with open(other, "w") as f:
        f.write("not topolet's\n")
    rc, _, err = cleanup(node)
    assert rc == 0, err
    assert os.listdir(node.state_dir) == ["operator-notes.txt"]


def test_an_empty_state_folder_and_features_folder_stay(node: Node) -> None:
    os.makedirs(node.state_dir)  # made by the operator (or a mount), not by topolet
    os.makedirs(node.features_dir)
    rc, out, err = cleanup(node)
    assert rc == 0, err
    assert "0 state path(s) removed" in out, out
    assert os.path.isdir(node.state_dir) and os.listdir(node.state_dir) == []
    assert os.path.isdir(node.features_dir) and os.listdir(node.features_dir) == []


def test_only_the_files_topolet_writes_go(node: Node) -> None:
    ours = ["state.json", "state.lock", "state.json.corrupt-20261206T120000Z", ".state.json.123.abcd1234.tmp",
            "events.jsonl", "mig-plan.json", ".mig-plan.json.123.tmp"]
    theirs = ["notes.txt", "state.json.bak", ".state.json.swp", "mig-plan.json.tmp", "topolet"]
    os.makedirs(node.state_dir)
    for name in ours + theirs:
        with open(os.path.join(node.state_dir, name), "w") as f:
            f.write("{}\n")
    rc, out, err = cleanup(node)
    assert rc == 0, err
    assert f"{len(ours)} state path(s) removed" in out, out
    assert sorted(os.listdir(node.state_dir)) == sorted(theirs)


def test_a_cgroup_root_that_is_none_is_one_line_and_a_non_zero_exit(node: Node) -> None:
    rc, out, err = cleanup(node, "--cgroup-root", node.state_dir)
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("topolet cleanup: not a cpuset cgroup root"), err


def test_cleanup_says_what_to_remove(node: Node) -> None:
    result = node.run(node.topolet("cleanup"))
    assert result.returncode == 2
    assert result.stderr.strip() == ("topolet cleanup: say what to remove: --local (this machine), "
                                     "--objects (the API), or both")
