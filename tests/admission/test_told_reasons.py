"""`ToldReasons`: a Waiting reason is told once while it holds, again once it changes or is forgotten."""

from __future__ import annotations

from agent.admission.report.events import ToldReasons


def test_a_reason_is_told_once_until_it_changes() -> None:
    told = ToldReasons()
    assert told.changed("a", "no room") is True
    assert told.changed("a", "no room") is False
    assert told.changed("b", "no room") is True
    assert told.changed("a", "quota") is True
    assert told.changed("a", "no room") is True


def test_forget_and_retain() -> None:
    told = ToldReasons()
    for uid in "abc":
        told.changed(uid, "no room")
    told.forget("a")
    told.retain({"a", "b"})
    assert told.changed("a", "no room") is True  # forgotten
    assert told.changed("b", "no room") is False  # kept
    assert told.changed("c", "no room") is True  # not retained
