"""The test tiers (CONTRIBUTING.md, "Test tiers"; tests/conftest.py): what reaches a real part is
`integration`, and a test of the unit tier that reaches for one fails loudly instead of running it."""

from __future__ import annotations

import pytest

import tests.conftest as tiers
from tests.chart import conftest as chart
from tests.controlplane import fixtures as plane
from tests.enforce import conftest as enforce
from tests.nri import conftest as nri
from tests.realnode import conftest as realnode
from tests.standalone import conftest as standalone


@pytest.mark.parametrize("fixture", [
    plane.control_plane, plane.cluster_session, plane.kueue_session, chart.helm, chart.chart_plane,
    enforce.cpuset_root, standalone.node, nri.runtime_binary, realnode.realnode_parts,
], ids=lambda f: f.__name__)
def test_the_fixtures_that_bring_up_a_real_part_are_seen(fixture: object) -> None:
    assert tiers.setup_reached(fixture)


def test_pure_fixtures_are_not(request: pytest.FixtureRequest) -> None:
    for fixture in (enforce.spawn, standalone.topology):
        assert tiers.setup_reached(fixture) is None, fixture
    assert tiers.needs_setup(request.node) is None


def test_no_test_of_this_run_reaches_a_real_part_unmarked(request: pytest.FixtureRequest) -> None:
    # Under `make unit` this run holds only the unit tier: none of it may need more than the venv.
    unmarked = [item.nodeid for item in request.session.items
                if item.get_closest_marker("integration") is None and tiers.needs_setup(item)]
    assert unmarked == []


def test_a_unit_test_writing_cgroups_fails_loudly() -> None:
    # Looked up by name: naming it here would make this test `integration`, where the call is allowed.
    write_cgroups = getattr(tiers, "writable_cpuset_hierarchy")  # noqa: B009
    with pytest.raises(pytest.fail.Exception, match=tiers.UNIT_TIER_FAILURE):
        write_cgroups()


def test_a_unit_test_missing_a_requirement_fails_instead_of_skipping() -> None:
    with pytest.raises(pytest.fail.Exception, match=f"{tiers.UNIT_TIER_FAILURE}.*needs kubectl"):
        tiers.require(False, "needs kubectl")


@pytest.mark.integration
def test_an_integration_test_skips_or_fails_as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tiers, "IN_CI", False)
    with pytest.raises(pytest.skip.Exception, match="needs kubectl"):
        tiers.require(False, "needs kubectl")


def test_a_sweep_over_every_real_machine_is_slow(request: pytest.FixtureRequest) -> None:
    assert len(tiers.REAL_MACHINES) > 20
    sweep = [item for item in request.session.items if "test_dump_scans[" in item.nodeid]
    assert all(item.get_closest_marker("slow") for item in sweep)
