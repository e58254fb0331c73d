"""The command tests run under `topolet exec`: reports what the kernel says about it, then may hold.

`python -m tests.standalone.reporter OUT [hold]` writes one JSON object to OUT (atomically): its pid,
`Cpus_allowed_list`, `Mems_allowed_list`, cpuset cgroup and TOPOLET_* environment.  With `hold` it
then sleeps until a signal ends it, so a test can watch a running allocation.
"""

from __future__ import annotations

import json
import os
import signal
import sys


def status_fields(pid: int | str = "self") -> dict[str, str]:
    """The `key: value` lines of /proc/PID/status."""
    out: dict[str, str] = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            out[key] = value.strip()
    return out


def main(out: str, mode: str = "once") -> None:
    if mode == "hold":  # before the report: a test may send SIGTERM as soon as it reads it
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    fields = status_fields()
    with open("/proc/self/cpuset") as f:
        cgroup = f.read().strip()
    report = {
        "pid": os.getpid(),
        "cpus_allowed": fields["Cpus_allowed_list"],
        "mems_allowed": fields["Mems_allowed_list"],
        "cgroup": cgroup,
        "env": {k: v for k, v in os.environ.items() if k.startswith("TOPOLET_")},
    }
    tmp = f"{out}.tmp"
    with open(tmp, "w") as f:
        json.dump(report, f)
    os.replace(tmp, out)
    if mode == "hold":
        while True:
            signal.pause()


if __name__ == "__main__":
    main(*sys.argv[1:])
