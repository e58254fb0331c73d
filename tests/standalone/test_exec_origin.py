"""`topolet exec` started from a cgroup outside its `--cgroup-root` goes back there when it is done.

A `--cgroup-root` below the cgroup the launcher runs in (the node fixture's private root, say) leaves
its origin outside the layout.  On cgroup v2 the layout's root cannot take the launcher back once
topolet's cgroups live below it (no internal processes), so the launcher returns to its origin by
path, on v1 as on v2, and the release is never deferred for that.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator

import pytest

from agent.enforce.cgroup import CgroupLayout, create_cgroup, detect_layout, exists, read_cpuset
from agent.topology.cpuset import CPUSet
from tests.standalone.conftest import Node

# Moves itself into the origin cgroup, runs `topolet exec` in-process (the console script's
# `main`), then prints its exit status and the cgroup it ended in, as /proc/self/cgroup says.
_LAUNCHER = """
import json, os, sys
from agent.cli import main
with open(os.path.join(sys.argv[1], "cgroup.procs"), "w") as f:
    f.write(str(os.getpid()))
rc = main(sys.argv[2:])
with open("/proc/self/cgroup") as f:
    lines = f.read().splitlines()
print(json.dumps({"rc": rc, "cgroup": lines}))
"""


def _cpuset_path(layout: CgroupLayout, lines: list[str]) -> str:
    """The file-system path of the cgroup in `/proc/PID/cgroup` lines, in `layout`'s hierarchy."""
    for line in lines:
        _, controllers, where = line.split(":", 2)
        if (layout.version == 1 and "cpuset" in controllers.split(",")) or \
                (layout.version == 2 and line.startswith("0::")):
            return os.path.normpath(os.path.join(layout.root, where.lstrip("/")))
    raise AssertionError(f"no cpuset line in {lines}")


@pytest.fixture
def origin(node: Node) -> Iterator[tuple[CgroupLayout, str]]:
    """A cgroup beside the node's private root (so outside its layout), removed after the test."""
    system = detect_layout()  # the node fixture checked it writable
    name = f"{os.path.basename(node.root)}-origin"
    cpus, mems = read_cpuset(system, "", effective=True)
    create_cgroup(system, name, cpus=cpus, mems=mems)
    try:
        yield system, name
    finally:
        # The launcher has exited by now (node.run waits for it): the cgroup is empty.
        if exists(system, name):
            os.rmdir(system.abspath(name))


@pytest.mark.parametrize("cpus", [1, 0], ids=["exclusive", "shared"])
def test_exec_goes_back_to_its_origin_outside_the_root(node: Node, origin: tuple[CgroupLayout, str],
                                                       cpus: int) -> None:
    system, name = origin
    command, out = node.reporter()
    argv = node.exec_argv(cpus, command)[1:]  # less the console script: main() takes the words
    result = node.run([sys.executable, "-c", _LAUNCHER, system.abspath(name), *argv])
    assert result.returncode == 0, result.stderr
    assert "deferred" not in result.stderr
    ended = json.loads(result.stdout)
    assert ended["rc"] == 0, result.stderr
    # The command ran pinned, in topolet's cgroup under the private root ...
    report = json.loads(out.read_text())
    where = f"/{node.layout.parent}/" if cpus else f"/{node.layout.shared_path}/"
    assert where in str(report["cgroup"])
    if cpus:
        env = report["env"]
        assert isinstance(env, dict)
        assert CPUSet.parse(str(report["cpus_allowed"])) == CPUSet.parse(env["TOPOLET_CPUS"])
    # ... and the launcher went back to where it came from, not to the private root.
    assert _cpuset_path(system, ended["cgroup"]) == system.abspath(name)
    assert node.state().allocations == ()
    assert node.workload_cgroups() == []
    assert node.pool() == node.allowed
