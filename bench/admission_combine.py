"""The table and last line of bench/admission_api.py over the rounds of several invocations.

    bench/admission_api.py --rounds 1 --scopes pod,container > one.log
    bench/admission_api.py --rounds 2 --first-round 1 --scopes pod > two.log
    bench/admission_combine.py one.log two.log

A run of the NUMA-aware peer takes many times the others' wall on a small machine, so the default
rounds do not always fit one sitting; each invocation prints, per run, the lines read back here (its
wall, CPU seconds and peak RSS by component, pods bound, aligned and in a gang on one node, gangs
whole and partly bound). Runs are taken per placer in the order the files
and their lines give; a placer with fewer runs (a peer scope run in fewer invocations) is compared over
the rounds it has. A run that died before its counts were printed is left out, with a warning.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from admission_report import ApiRun, last_line, print_table  # noqa: E402

_NAME = r"^# (?P<name>[^:]+): "
_WALL = re.compile(_NAME + r"Jobs created after [\d.]+ s, .*the last bind after (?P<wall>[\d.]+) s")
_CPU = re.compile(_NAME + r"CPU seconds while binding: (?P<cpu>.*); peak RSS MiB: (?P<rss>.*)$")
_COUNTS = re.compile(_NAME + r"(?P<bound>\d+)/(?P<pods>\d+) pods bound, (?P<aligned>\d+) aligned, "
                     r"(?P<one>\d+) in a gang on one node; "
                     r"gangs (?P<whole>\d+)/(?P<gangs>\d+) wholly bound, (?P<partial>\d+) partly")


def _pairs(text: str) -> dict[str, float]:
    """"kube-apiserver 109.9, bench (this process) 42.7" -> {name: value}."""
    out: dict[str, float] = {}
    for part in text.split(", "):
        name, _, value = part.rpartition(" ")
        if name:
            out[name] = float(value)
    return out


def parse(lines: list[str]) -> dict[str, list[ApiRun]]:
    """{placer: its runs in order} from one invocation's output; pure."""
    wall: dict[str, float] = {}  # placer -> the wall of its run in progress
    cpu: dict[str, dict[str, float]] = {}
    rss: dict[str, dict[str, float]] = {}
    runs: dict[str, list[ApiRun]] = defaultdict(list)
    for line in lines:
        if m := _WALL.match(line):
            wall[m["name"]] = float(m["wall"])
        elif m := _CPU.match(line):
            cpu[m["name"]], rss[m["name"]] = _pairs(m["cpu"]), _pairs(m["rss"])
        elif (m := _COUNTS.match(line)) and m["name"] in wall:
            name = m["name"]
            used = cpu.pop(name, {})
            runs[name].append(ApiRun(name, int(m["pods"]), int(m["bound"]), wall.pop(name), int(m["aligned"]),
                                     int(m["one"]), sum(used.values()), int(m["gangs"]), int(m["whole"]),
                                     int(m["partial"]), used, rss.pop(name, {})))
    for name in wall:
        print(f"# WARNING: {name}: a run without its counts (it died?), left out", file=sys.stderr)
    return dict(runs)


def combine(parts: list[dict[str, list[ApiRun]]]) -> dict[str, list[ApiRun]]:
    """The invocations' runs joined per placer, in order (first seen placer first)."""
    out: dict[str, list[ApiRun]] = {}
    for part in parts:
        for name, mine in part.items():
            out.setdefault(name, []).extend(mine)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("logs", type=Path, nargs="+", help="bench/admission_api.py outputs, in round order")
    args = parser.parse_args(argv)
    runs = combine([parse(p.read_text(errors="replace").splitlines()) for p in args.logs])
    if not runs:
        print("no runs found", file=sys.stderr)
        return 1
    print_table(runs, max(len(v) for v in runs.values()))
    print(last_line(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
