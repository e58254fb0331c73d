"""What the guest tests share: one boot that runs a pytest selection inside, its JUnit read back, and the
session's test cluster."""

from __future__ import annotations

import contextlib
import os
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.conftest import require
from tests.controlplane.fixtures import cluster_session
from tests.vm.guest import GuestRun, run_in_guest

# The test cluster of tests/vm/test_guest_realnode.py, whose node runs in the guest.
__all__ = ["boot_and_run", "cluster_session", "junit_outcomes", "outcomes_on_v2", "read_milestones"]


def boot_and_run(selection: list[str], tmp_path_factory: pytest.TempPathFactory,
                 pytestconfig: pytest.Config) -> GuestRun:
    """Boot the guest once and run `selection` there (a failure under CI=true when it cannot boot); its
    figures (boot and test time) go to the terminal even though pytest captures output."""
    require(os.geteuid() == 0, "needs root (debootstrap builds the guest)")
    for tool in ("qemu-system-x86_64", "debootstrap"):
        require(shutil.which(tool) is not None, f"needs {tool} (make deps)")
    capture = pytestconfig.pluginmanager.getplugin("capturemanager")
    run = run_in_guest(["-q", *selection], job_dir=tmp_path_factory.mktemp("guest"))
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        print(f"\n{run.summary()}")
    return run


def junit_outcomes(junit: Path) -> dict[str, str]:
    """`file::test[param]` -> "passed" | "failed" | "skipped: <message>" from a JUnit XML file."""
    out: dict[str, str] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = "failed"
            elif child.tag == "skipped":
                outcome = f"skipped: {child.get('message', '')}"
        out[name] = outcome
    return out


def outcomes_on_v2(run: GuestRun, output_tail: int = 8000) -> dict[str, str]:
    """The in-guest run's JUnit outcomes, once it is known to have run on cgroup2 and pytest passed."""
    assert run.cgroup_fs == "cgroup2fs", run.console[-3000:]
    assert run.rc == 0, run.output[-output_tail:]
    return junit_outcomes(run.junit)


def read_milestones(path: Path, started: float) -> dict[str, float]:
    """`name -> seconds after started` from a milestones file (tests/realnode/node.py: milestone); the
    first time each name was reached."""
    out: dict[str, float] = {}
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            name, _, at = line.rpartition(" ")
            if name and name not in out:
                out[name] = float(at) - started
    return out
