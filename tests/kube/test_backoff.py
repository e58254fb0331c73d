"""The API loops' back-off policy (a table) and what an outage costs in log lines (a fake clock)."""

from __future__ import annotations

import logging

import pytest

from agent.kubeapi.backoff import API_BACKOFF, Backoff, Outage, duration_text


@pytest.mark.parametrize(("policy", "failures", "rand", "delay"), [
    # client-go's shape: initial, doubling per failure in a row, capped, jitter added on top.
    (API_BACKOFF, 1, 0.0, 1.0),
    (API_BACKOFF, 2, 0.0, 2.0),
    (API_BACKOFF, 3, 0.0, 4.0),
    (API_BACKOFF, 5, 0.0, 16.0),
    (API_BACKOFF, 6, 0.0, 30.0),        # 32 capped
    (API_BACKOFF, 7, 0.0, 30.0),
    (API_BACKOFF, 10_000, 0.0, 30.0),   # a week-long outage: no overflow
    (API_BACKOFF, 1, 0.5, 1.05),        # jitter: up to 10 % of the step on top
    (API_BACKOFF, 6, 0.999, 32.997),
    (API_BACKOFF, 6, 7.0, 33.0),        # rand outside [0, 1) is clamped
    (API_BACKOFF, 0, 0.0, 1.0),         # no failure counted yet reads as the first
    (Backoff(initial=0.5, factor=3.0, cap=10.0, jitter=0.0), 3, 0.9, 4.5),
    (Backoff(initial=0.5, factor=3.0, cap=10.0, jitter=0.0), 4, 0.9, 10.0),
    (Backoff(initial=2.0, factor=1.0, cap=2.0, jitter=1.0), 9, 0.5, 3.0),  # a constant period, jittered
])
def test_delay(policy: Backoff, failures: int, rand: float, delay: float) -> None:
    assert policy.delay(failures, rand) == pytest.approx(delay)


@pytest.mark.parametrize("kw", [{"initial": 0.0}, {"initial": 5.0, "cap": 1.0}, {"factor": 0.5},
                                {"jitter": -0.1}])
def test_nonsense_policies_are_refused(kw: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="back-off"):
        Backoff(**kw)


@pytest.mark.parametrize(("seconds", "text"), [(0, "0s"), (59.9, "59s"), (60, "1m00s"), (185, "3m05s"),
                                               (7380, "2h03m")])
def test_duration_text(seconds: float, text: str) -> None:
    assert duration_text(seconds) == text


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def outage_log(caplog: pytest.LogCaptureFixture, minutes: float, rand: float = 0.5) -> tuple[
        list[logging.LogRecord], int]:
    """A loop that fails for `minutes`, waiting what the Outage says, then works: (records, attempts)."""
    clock = FakeClock()
    outage = Outage("pod watch on n1", logging.getLogger("test.backoff"), clock=clock, rand=lambda: rand)
    end = clock.now + minutes * 60
    attempts = 0
    with caplog.at_level(logging.DEBUG, logger="test.backoff"):
        outage.recovered()  # working before: says nothing
        while clock.now < end:
            attempts += 1
            clock.now += outage.failed("list pods on n1: API server unreachable: connection refused")
        outage.recovered()
        outage.recovered()  # and again: still nothing more to say
    return [r for r in caplog.records if r.name == "test.backoff"], attempts


def test_a_ten_minute_outage_logs_once_then_a_line_a_minute_then_its_end(
        caplog: pytest.LogCaptureFixture) -> None:
    records, attempts = outage_log(caplog, 10)
    # Before: a retry and a warning every second, 600 lines for ten minutes.  Now about 1+5 tries while
    # the back-off grows and then one per 30-33 s.
    assert 20 <= attempts <= 30
    loud = [r for r in records if r.levelno >= logging.INFO]
    assert 10 <= len(loud) <= 12, [r.getMessage() for r in loud]
    first, *reminders, last = loud
    assert first.levelno == logging.WARNING and "connection refused" in first.getMessage()
    assert all("still failing after" in r.getMessage() for r in reminders)
    assert "still failing after 9m" in reminders[-1].getMessage()
    assert last.levelno == logging.INFO and "working again after 10m" in last.getMessage()
    assert len(records) == attempts + 1  # every other retry is a DEBUG line


def test_a_blip_logs_two_lines_and_the_next_outage_starts_the_back_off_afresh(
        caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    outage = Outage("publishing", logging.getLogger("test.backoff"), clock=clock, rand=lambda: 0.0)
    with caplog.at_level(logging.INFO, logger="test.backoff"):
        assert [outage.failed("HTTP 503") for _ in range(4)] == [1.0, 2.0, 4.0, 8.0]
        outage.recovered()
        assert outage.failed("HTTP 503") == 1.0
        assert outage.ongoing
    assert [r.levelname for r in caplog.records] == ["WARNING", "INFO", "WARNING"]
