"""The controller loop's pace after a pass (agent/admission/controller/loop.py `pace_seconds`)."""

from __future__ import annotations

import pytest

from agent.admission.controller.loop import DEBOUNCE_SECONDS, PACE, PACE_MAX_SECONDS, pace_seconds


@pytest.mark.parametrize(("cpu", "wall", "wait"), [
    (0.0, 0.0, DEBOUNCE_SECONDS),  # a quiet pass: the debounce alone
    (0.05, 0.05, DEBOUNCE_SECONDS),  # PACE * cpu under the debounce
    (0.5, 0.5, PACE * 0.5),  # all work, no waiting: PACE times its CPU
    (0.5, 0.8, PACE * 0.5 - 0.3),  # 0.3 s waiting on writes counts as rest taken
    (3.0, 3.0, PACE_MAX_SECONDS),  # capped
    (3.0, 4.0, PACE_MAX_SECONDS - 1.0),
    (1.0, 6.0, DEBOUNCE_SECONDS),  # seconds waiting on the API server: decide the newcomers soon
    (2.0, 1.5, PACE_MAX_SECONDS),  # watch threads on both cores: CPU over wall is no rest
])
def test_the_pace_is_pace_times_the_cpu_less_the_rest_taken(cpu: float, wall: float, wait: float) -> None:
    assert pace_seconds(cpu, wall) == pytest.approx(wait)


def test_work_and_rest_come_to_one_part_in_one_plus_pace() -> None:
    """Under a stream, a pass of `cpu` seconds and its wait keep the controller's share of a core at
    1/(1 + PACE) whatever part of the pass was spent waiting on writes (below the cap)."""
    for cpu, waited in ((0.3, 0.0), (0.3, 0.2), (0.6, 0.5)):
        wall = cpu + waited
        share = cpu / (wall + pace_seconds(cpu, wall))
        assert share == pytest.approx(1 / (1 + PACE))
