"""Fixtures for the standalone agent: a private cpuset cgroup per test, `topolet` run as real processes.

Each test gets its own cgroup (`topolet-test-<pid>-<hex>` under the cpuset hierarchy) passed as
`--cgroup-root`, so topolet's `topolet/` parent lives inside it and never meets the node's real one
or another test's.  Needs root and a writable cpuset hierarchy: under CI=true a missing requirement
FAILS, elsewhere the test is skipped.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from agent.enforce.cgroup import (
    CgroupLayout,
    create_cgroup,
    detect_layout,
    exists,
    list_children,
    read_cpuset,
    read_procs,
)
from agent.enforce.state import State
from agent.enforce.state_file import StateFile
from agent.pinning.engine import PinningEngine
from agent.topology.cpuset import CPUSet
from agent.topology.discover import discover
from agent.topology.model import Topology
from tests.conftest import REPO, require, topolet_bin, writable_cpuset_hierarchy

PR_SET_CHILD_SUBREAPER = 36
Completed = subprocess.CompletedProcess[str]
WAIT_SECONDS = 20.0


def wait_for(check: Callable[[], object], what: str, timeout: float = WAIT_SECONDS) -> object:
    """Poll `check` until it returns something truthy; fail the test naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.02)


def proc_field(pid: int, key: str) -> str | None:
    """One field of /proc/PID/status, or None once the process is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                name, _, value = line.partition(":")
                if name == key:
                    return value.strip()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


def proc_cpus(pid: int) -> CPUSet:
    """The CPUs the kernel lets `pid` run on (`Cpus_allowed_list`)."""
    value = proc_field(pid, "Cpus_allowed_list")
    assert value is not None, f"process {pid} is gone"
    return CPUSet.parse(value)


def proc_mems(pid: int) -> CPUSet:
    """The memory nodes the kernel lets `pid` use (`Mems_allowed_list`)."""
    value = proc_field(pid, "Mems_allowed_list")
    assert value is not None, f"process {pid} is gone"
    return CPUSet.parse(value)


def kill_and_reap(pid: int) -> None:
    """SIGKILL a process this test started (directly or as an orphan it now parents) and reap it."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        # Not our child: wait until the kernel has taken it out of its cgroup.
        wait_for(lambda: proc_field(pid, "State") in (None, "Z (zombie)"), f"process {pid} to die")


def _set_subreaper(on: bool) -> None:
    # Orphans of a killed `topolet exec` must come back to the test to be reaped: this machine's
    # init never reaps, and an unreaped zombie still looks like a running owner.
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1 if on else 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


def orphan_children(exclude: set[int]) -> list[int]:
    """Children of this process that no Popen in `exclude` accounts for (orphans handed to us)."""
    found: set[int] = set()
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/children") as f:
                found.update(int(p) for p in f.read().split())
        except FileNotFoundError:
            continue
    return sorted(found - exclude)


@dataclass
class Held:
    """A `topolet exec` whose command (the reporter) is running and has reported."""

    launcher: subprocess.Popen[bytes]
    report: dict[str, object]
    stderr_path: Path

    @property
    def pid(self) -> int:
        return int(str(self.report["pid"]))

    @property
    def cpus(self) -> CPUSet:
        env = self.report["env"]
        assert isinstance(env, dict)
        return CPUSet.parse(env.get("TOPOLET_CPUS", ""))

    @property
    def allocation(self) -> str:
        env = self.report["env"]
        assert isinstance(env, dict)
        return str(env["TOPOLET_ALLOCATION"])

    def stop(self, timeout: float = WAIT_SECONDS) -> int:
        """End the command through the launcher (SIGTERM is forwarded) and return the launcher's status."""
        if self.launcher.poll() is None:
            self.launcher.send_signal(signal.SIGTERM)
        return self.launcher.wait(timeout)

    def stderr(self) -> str:
        return self.stderr_path.read_text()


@dataclass
class Node:
    """One test's view of the node: its private cgroup root, state folder and topology."""

    root: str  # absolute path of the private cgroup, passed as --cgroup-root
    layout: CgroupLayout  # the layout topolet derives from `root` (parent "topolet")
    topology: Topology
    allowed: CPUSet
    mems: CPUSet
    state_dir: str
    features_dir: str
    tmp: Path
    launched: list[subprocess.Popen[bytes]] = field(default_factory=list)
    _count: int = 0
    earlier: set[int] = field(default_factory=set)  # this process's children before the test

    def orphans(self) -> list[int]:
        """Children handed to this process during the test that no Popen of it accounts for."""
        return orphan_children({p.pid for p in self.launched} | self.earlier)

    @property
    def capacity(self) -> int:
        """How many CPUs can be exclusive at once: all but one (the shared pool is never emptied)."""
        return len(self.allowed) - 1

    def env(self) -> dict[str, str]:
        return {**os.environ, "PYTHONPATH": str(REPO)}

    def topolet(self, *args: str) -> list[str]:
        return [topolet_bin(), *args]

    def exec_argv(self, cpus: int, command: list[str], *extra: str) -> list[str]:
        return self.topolet("exec", "--cpus", str(cpus), "--state-dir", self.state_dir,
                            "--cgroup-root", self.root, *extra, "--", *command)

    def reporter(self, mode: str = "once") -> tuple[list[str], Path]:
        """A reporter command line and the file it will write."""
        self._count += 1
        out = self.tmp / f"report-{self._count}.json"
        return [sys.executable, "-m", "tests.standalone.reporter", str(out), mode], out

    def run(self, argv: list[str], timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, capture_output=True, text=True, env=self.env(), cwd=REPO,
                              timeout=timeout, check=False)

    def start(self, argv: list[str]) -> tuple[subprocess.Popen[bytes], Path]:
        """Start a process (stderr to a file, so a chatty one never blocks); killed at teardown."""
        self._count += 1
        err = self.tmp / f"stderr-{self._count}.txt"
        with open(err, "wb") as f:
            p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=f, env=self.env(), cwd=REPO)
        self.launched.append(p)
        return p, err

    def hold(self, cpus: int, *extra: str) -> Held:
        """`topolet exec --cpus N` of a reporter that keeps running; returns once it has reported."""
        command, out = self.reporter("hold")
        launcher, err = self.start(self.exec_argv(cpus, command, *extra))

        def reported() -> bool:
            if launcher.poll() is not None and not out.exists():
                pytest.fail(f"topolet exec exited {launcher.returncode}: {err.read_text()}")
            return out.exists()

        wait_for(reported, f"the command of {' '.join(extra)} --cpus {cpus} to report")
        return Held(launcher, json.loads(out.read_text()), err)

    def run_reporter(self, cpus: int, *extra: str) -> tuple[Completed, dict[str, object]]:
        """`topolet exec --cpus N -- reporter` run to completion: (the result, the command's report)."""
        command, out = self.reporter()
        result = self.run(self.exec_argv(cpus, command, *extra))
        assert result.returncode == 0, result.stderr
        return result, json.loads(out.read_text())

    def agent_once(self, *extra: str) -> subprocess.CompletedProcess[str]:
        """`topolet agent --once` on this node's state and cgroups."""
        result = self.run(self.topolet("agent", "--once", "--state-dir", self.state_dir,
                                       "--features-dir", self.features_dir, "--cgroup-root", self.root,
                                       "--listen", "127.0.0.1:0", *extra))
        assert result.returncode == 0, result.stderr
        return result

    def state(self) -> State:
        return StateFile(self.state_dir).load()

    def engine(self, state_file: StateFile | None = None) -> PinningEngine:
        return PinningEngine(self.topology, self.layout, state_file or StateFile(self.state_dir))

    def workload_cgroups(self) -> list[str]:
        """Relative paths of the exclusive workload cgroups (children of the parent, less `shared`)."""
        return [c for c in list_children(self.layout, self.layout.parent) if c != self.layout.shared_path]

    def pool(self) -> CPUSet:
        """The live shared pool: `topolet/shared`'s cpus."""
        return read_cpuset(self.layout, self.layout.shared_path)[0]


@pytest.fixture(scope="session")
def topology() -> Topology:
    return discover("/")


def _remove_tree(layout: CgroupLayout, rel: str) -> None:
    if not exists(layout, rel):
        return
    for child in list_children(layout, rel):
        _remove_tree(layout, child)
    for _ in range(200):
        for pid in read_procs(layout, rel):
            kill_and_reap(pid)  # only this test's processes run in its private cgroup
        try:
            os.rmdir(layout.abspath(rel))
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.02)
    os.rmdir(layout.abspath(rel))


@pytest.fixture
def node(tmp_path: Path, topology: Topology) -> Iterator[Node]:
    """A private cpuset cgroup with every CPU and memory node, a state folder, and cleanup of both."""
    system = writable_cpuset_hierarchy()
    cpus, mems = read_cpuset(system, "", effective=True)
    require(len(cpus & topology.cpus) >= 2, "needs at least 2 CPUs")
    name = f"topolet-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    create_cgroup(system, name, cpus=cpus, mems=mems)
    root = system.abspath(name)
    _set_subreaper(True)
    # Children this process had before the test (another fixture's control plane, say) are not the
    # test's orphans: only those that appear during it are reaped.
    earlier = set(orphan_children(set()))
    n = Node(root, detect_layout(root), topology, cpus & topology.cpus, mems,
             str(tmp_path / "state"), str(tmp_path / "features.d"), tmp_path, earlier=earlier)
    try:
        yield n
    finally:
        for p in n.launched:
            if p.poll() is None:
                p.kill()
            p.wait()
        _remove_tree(system, name)
        for pid in n.orphans():
            kill_and_reap(pid)
        _set_subreaper(False)
