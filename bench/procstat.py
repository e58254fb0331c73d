"""What the benches read of a running process from /proc: resident memory and CPU time."""

from __future__ import annotations

import os

TICKS = os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    """VmRSS of `pid` in MiB (0 when the process is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except FileNotFoundError:
        pass
    return 0.0


def cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds `pid` has used."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / TICKS
