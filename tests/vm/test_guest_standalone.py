"""`topolet exec` and the standalone agent, run live on cgroup v2 in the throwaway guest (tests/vm/guest.py).

Each test's `--cgroup-root` is a private cgroup below the one its launcher runs in, which v2's
no-internal-processes rule makes matter: the launcher must go back to where it came from, never into
that root.  The run prints its figures (boot and test time) on the terminal.
"""

from __future__ import annotations

import pytest

from tests.vm.conftest import boot_and_run, outcomes_on_v2
from tests.vm.guest import GuestRun

# Standalone tests that create cgroups (the `node` fixture) and end a launcher inside a private
# --cgroup-root, chosen to keep the boot's test time near a minute and a half under TCG.  The whole of
# tests/standalone passes there too, less two tests whose wall-time budgets (a 20 s wait for four
# racing launchers, a crash loop's 80 s) emulation overruns: `python -m tests.vm.guest tests/standalone`.
GUEST_SELECTION = [
    "tests/standalone/test_exec_origin.py",
    "tests/standalone/test_exec.py::test_command_runs_on_its_cpus[one-memory-binding]",
    "tests/standalone/test_exec.py::test_command_runs_on_its_cpus[all-it-can-no-binding]",
    "tests/standalone/test_exec.py::test_shared_command_runs_on_the_pool_without_topolet_cpus",
    "tests/standalone/test_exec.py::test_exit_status_is_the_commands[3]",
    "tests/standalone/test_exec.py::test_shared_pool_shrinks_at_once_and_grows_back[one]",
    "tests/standalone/test_release.py::test_command_sigkilled_releases_at_once",
    "tests/standalone/test_release.py::test_launcher_sigkilled_at_random_moments_leaves_nothing_after_one_pass",
    "tests/standalone/test_release.py::test_an_owner_that_is_a_zombie_does_not_hold_its_cpus",
]


@pytest.fixture(scope="module")
def guest_run(tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config) -> GuestRun:
    return boot_and_run(GUEST_SELECTION, tmp_path_factory, pytestconfig)


def test_the_standalone_tests_pass_on_cgroup_v2(guest_run: GuestRun) -> None:
    run = guest_run
    cases = outcomes_on_v2(run)
    assert cases and not [n for n, o in cases.items() if o != "passed"], \
        {n: o for n, o in cases.items() if o != "passed"}
    # Every entry of the selection ran, the launcher's way back from outside its root included.
    for chosen in GUEST_SELECTION:
        assert [n for n in cases if n == chosen or n.startswith(f"{chosen}::")], (chosen, sorted(cases))
