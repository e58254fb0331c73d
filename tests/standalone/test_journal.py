"""The exec event journal: what `topolet exec` tells the agent survives the file unchanged."""

from __future__ import annotations

import json
from pathlib import Path

from agent.standalone.journal import JOURNAL_NAME, Event, append_event, drain_events

EVENTS = [
    Event("allocated", 0.004, 2),
    Event("refused", state_writes=1, reason="capacity"),
    Event("error"),
    Event("released"),
    Event("", state_writes=2),  # state writes only (a release counted by whoever committed it)
]


def test_events_come_back_as_written_and_once(tmp_path: Path) -> None:
    for ev in EVENTS:
        append_event(str(tmp_path), ev)
    assert drain_events(str(tmp_path)) == EVENTS
    assert drain_events(str(tmp_path)) == []


def test_an_allocation_is_written_success_as_earlier_readers_expect(tmp_path: Path) -> None:
    append_event(str(tmp_path), Event("allocated", 0.001, 1))
    (line,) = (tmp_path / JOURNAL_NAME).read_text().splitlines()
    assert json.loads(line)["result"] == "success"  # bench/pin.py and agents before the rename read it
    (tmp_path / JOURNAL_NAME).write_text(line + "\nnot json\n")
    assert drain_events(str(tmp_path)) == [Event("allocated", 0.001, 1)]
