"""What the state file needs from /proc: a process's start time (to tell a recycled pid) and parent."""

from __future__ import annotations


def _stat_fields(pid: int, proc: str) -> list[str] | None:
    try:
        with open(f"{proc}/{pid}/stat", "rb") as f:
            raw = f.read().decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        return None
    # comm (field 2) is in parentheses and may itself hold spaces and ")": split after the last ")".
    _, sep, rest = raw.rpartition(")")
    if not sep:
        return None
    return rest.split()  # rest[0] is field 3 (state)


def start_time(pid: int, proc: str = "/proc") -> int | None:
    """Start time of `pid` in clock ticks since boot (stat field 22); None if there is no such process.

    A zombie (state Z) or dead (X) process counts as gone: it runs nothing and holds no CPU, but its
    /proc entry lingers until its parent reaps it, which some parents never do.
    """
    fields = _stat_fields(pid, proc)
    if fields is None or len(fields) < 20 or fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def parent_pid(pid: int, proc: str = "/proc") -> int | None:
    """Parent pid of `pid` (stat field 4); None if there is no such process."""
    fields = _stat_fields(pid, proc)
    if fields is None or len(fields) < 2:
        return None
    return int(fields[1])
