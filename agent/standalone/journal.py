"""An append-only event journal beside the state file: how `topolet exec` processes tell the agent
what they did (allocation results and pin latencies) so its metrics count work done outside it.

Each event is one JSON line written with one O_APPEND write under a shared flock of the journal;
the agent drains it (read, then truncate) under the exclusive flock, so an event appended while it
drains waits for the next drain: none is read twice or lost.
"""

from __future__ import annotations

import fcntl
import json
import os
from dataclasses import dataclass

JOURNAL_NAME = "events.jsonl"
_MAX_LINE = 512  # below PIPE_BUF, so concurrent appends never interleave
_MAX_BYTES = 1 << 20  # without an agent draining it, the journal stops growing here
# An allocation is written "success" on disk, as before the metric's result was renamed: agents of
# the earlier version and bench/pin.py read that word.
_ON_DISK = {"allocated": "success"}
_FROM_DISK = {"success": "allocated"}


@dataclass(frozen=True, slots=True)
class Event:
    result: str  # "allocated" | "refused" | "error" | "released", or "" (state writes only)
    latency_seconds: float | None = None
    state_writes: int = 0
    reason: str = ""  # a refusal's reason (agent.metrics.registry.REFUSAL_REASONS)


def append_event(folder: str, event: Event) -> None:
    """Append one event (best effort: a full disk must not fail a workload that is already pinned)."""
    doc: dict[str, object] = {"result": _ON_DISK.get(event.result, event.result),
                              "latency_seconds": event.latency_seconds, "state_writes": event.state_writes}
    if event.reason:
        doc["reason"] = event.reason
    line = json.dumps(doc, separators=(",", ":")) + "\n"
    data = line.encode()[:_MAX_LINE]
    try:
        os.makedirs(folder, mode=0o755, exist_ok=True)  # as the state lock makes it: a refusal may come first
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
        fd = os.open(os.path.join(folder, JOURNAL_NAME), flags, 0o644)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)  # appenders share; only a drain excludes them
        if os.fstat(fd).st_size < _MAX_BYTES:
            os.write(fd, data)
    except OSError:
        pass
    finally:
        os.close(fd)


def drain_events(folder: str) -> list[Event]:
    """Read and clear the journal.  Malformed lines are skipped."""
    path = os.path.join(folder, JOURNAL_NAME)
    try:
        with open(path, "r+b") as f:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
            data = f.read(_MAX_BYTES + _MAX_LINE)
            f.truncate(0)
    except FileNotFoundError:
        return []
    events: list[Event] = []
    for raw in data.splitlines():
        try:
            doc = json.loads(raw)
            latency = doc.get("latency_seconds")
            result = str(doc["result"])
            events.append(Event(_FROM_DISK.get(result, result),
                                float(latency) if latency is not None else None,
                                int(doc.get("state_writes", 0)), str(doc.get("reason") or "")))
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
    return events
