"""What the benches read of a running process from /proc: resident memory (now and peak) and CPU time."""

from __future__ import annotations

import os

TICKS = os.sysconf("SC_CLK_TCK")


def _status_mib(pid: int | str, field: str) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1]) / 1024
    except FileNotFoundError:
        pass
    return 0.0


def rss_mib(pid: int) -> float:
    """VmRSS of `pid` in MiB (0 when the process is gone)."""
    return _status_mib(pid, "VmRSS:")


def peak_rss_mib(pid: int | str = "self") -> float:
    """VmHWM, the peak resident set, of `pid` (this process by default) in MiB (0 when it is gone)."""
    return _status_mib(pid, "VmHWM:")


def cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds `pid` has used."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / TICKS
