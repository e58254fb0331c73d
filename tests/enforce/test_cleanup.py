"""`remove_cgroup_tree`: topolet's tree goes, deepest first; every task in it moves to the cgroup the tree
hangs from and every thread of it gets that cgroup's CPUs back, even one that narrowed its own affinity.

Real cgroups (the test's unique parent stands for `topolet/`), real multi-threaded processes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from agent.enforce.cgroup import CgroupLayout, create_cgroup, exists, move_pid, read_cpus, read_procs
from agent.enforce.cleanup import remove_cgroup_tree
from agent.topology.cpuset import CPUSet
from tests.enforce.conftest import proc_status

# Three threads, each pinned by the process itself to the CPU given (as `topolet exec`'s command is).
THREADED = """
import os, sys, threading, time
cpu = int(sys.argv[1])
def park():
    os.sched_setaffinity(0, {cpu})
    time.sleep(120)
for _ in range(2):
    threading.Thread(target=park, daemon=True).start()
os.sched_setaffinity(0, {cpu})
print("ready", flush=True)
time.sleep(120)
"""


@pytest.fixture
def threaded() -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for p in procs:
        p.kill()
        p.wait()


def thread_cpus(pid: int) -> list[CPUSet]:
    out = []
    for tid in sorted(os.listdir(f"/proc/{pid}/task")):
        with open(f"/proc/{pid}/task/{tid}/status") as f:
            line = next(x for x in f if x.startswith("Cpus_allowed_list:"))
        out.append(CPUSet.parse(line.split(":", 1)[1].strip()))
    return out


def test_the_tree_goes_and_its_tasks_get_the_roots_cpus(cpuset_root: CgroupLayout, two_cpus: tuple[int, int],
                                                        threaded: list[subprocess.Popen[str]]) -> None:
    layout = cpuset_root
    first, second = two_cpus
    root_cpus = read_cpus(layout, "", effective=True)
    for rel, cpu in ((f"{layout.parent}/shared/job", first), (f"{layout.parent}/exclusive", second)):
        create_cgroup(layout, rel, CPUSet([cpu]))
        p = subprocess.Popen([sys.executable, "-c", THREADED, str(cpu)], stdout=subprocess.PIPE, text=True)
        threaded.append(p)
        assert p.stdout is not None and p.stdout.readline() == "ready\n"
        move_pid(layout, rel, p.pid)
        assert thread_cpus(p.pid) == [CPUSet([cpu])] * 3
    assert len(root_cpus) >= 2

    done = remove_cgroup_tree(layout)

    assert done.to == "" and done.moved == 2
    assert set(done.removed) == {f"{layout.parent}/shared/job", f"{layout.parent}/shared",
                                 f"{layout.parent}/exclusive", layout.parent}
    assert done.removed[-1] == layout.parent  # deepest first
    assert not exists(layout, layout.parent)
    for p in threaded:
        assert p.poll() is None and p.pid in read_procs(layout, "")
        assert thread_cpus(p.pid) == [root_cpus] * 3  # every thread, as the kernel reads it back
        assert proc_status(p.pid, "Cpus_allowed_list") == root_cpus

    again = remove_cgroup_tree(layout)
    assert again.removed == () and again.moved == 0
