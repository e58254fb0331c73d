"""The enforce tests that touch cgroups, run live on cgroup v2 in the throwaway guest (tests/vm/guest.py).

This host mounts cgroup v1 and must never be remounted; the guest mounts cgroup2 alone.  The run
prints its figures (boot and test time) on the terminal.
"""

from __future__ import annotations

import pytest

from tests.vm.conftest import boot_and_run, outcomes_on_v2
from tests.vm.guest import GuestRun

# Everything in tests/enforce that reads or writes a cgroup; the rest (path tables, the state file's
# format) does not depend on the cgroup version and runs on the host alone.
GUEST_SELECTION = [
    "tests/enforce/test_cgroup_v2.py",
    "tests/enforce/test_kubepods_live.py",
    "tests/enforce/test_cgroup.py",
    "tests/enforce/test_state.py::test_rebuild_from_live_cgroups",
    "tests/enforce/test_layout.py::test_detect_this_machine",
]


@pytest.fixture(scope="module")
def guest_run(tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config) -> GuestRun:
    return boot_and_run(GUEST_SELECTION, tmp_path_factory, pytestconfig)


def test_the_enforce_tests_pass_on_cgroup_v2(guest_run: GuestRun) -> None:
    run = guest_run
    cases = outcomes_on_v2(run)
    assert cases and not [n for n, o in cases.items() if o == "failed"]
    # The v2 tests ran, not skipped; whatever was skipped is v1's own behaviour.
    v2 = {n: o for n, o in cases.items() if "test_cgroup_v2.py" in n or "test_kubepods_live.py" in n}
    assert len(v2) >= 8 and set(v2.values()) == {"passed"}, v2
    assert {n for n in cases if "[systemd]" in n} and {n for n in cases if "[cgroupfs]" in n}
    skipped = {n: o for n, o in cases.items() if o.startswith("skipped")}
    assert all("cgroup v1 behaviour" in o for o in skipped.values()), skipped
