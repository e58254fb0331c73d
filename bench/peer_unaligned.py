"""Why the NUMA-aware peer's pods went unaligned, from a run's kept logs.

    bench/admission_api.py --rounds 1 --scopes pod --peer-v 2 --keep-logs DIR ...
    bench/peer_unaligned.py DIR/nrt-pod-0

Reads the peer scheduler's log (`nrt-scheduler.log`, klog at --v=2: its reserve cache logs every
reserve, unreserve and node flush) and the stand-in agents' `placements.json` (each gang pod's node, pin
time and whether a zone held it), and sorts every unaligned pod P on node N by the first cause that
fits:

- "flushed": the cache flushed N after it reserved another pod Q there and before it reserved P,
  while Q was not pinned yet (waiting in Coscheduling's Permit for its gang, or bound and not yet
  started): the flush dropped Q's reservation and N's NRT did not count Q, so P was offered the CPUs
  that Q then took;
- "no reserve logged": P's reserve on N is not in the log (a run without --v=2);
- "other": none of the above.

The aligned pods are sorted the same way, for the base rate. Prints one line per cause and, last,
`peer unaligned: N pods of M, F after a flush (x.x%; of the aligned pods y.y%)`.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from bisect import bisect_left, bisect_right
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path

_KLOG = re.compile(r"^[IWEF](\d\d)(\d\d) (\d\d):(\d\d):(\d\d)\.(\d{6})\s")
_POD = re.compile(r'\bpod="([^"]+)"')
_NODE = re.compile(r'\bnode="([^"]+)"')


def _klog_time(line: str, year: int) -> float | None:
    m = _KLOG.match(line)
    if m is None:
        return None
    mo, d, h, mi, s, us = (int(x) for x in m.groups())
    return datetime(year, mo, d, h, mi, s, us, tzinfo=UTC).timestamp()


def parse_log(lines: list[str], year: int) -> tuple[dict[tuple[str, str], list[float]],
                                                    dict[str, list[float]]]:
    """({(pod, node): reserve times}, {node: flush times}) from the peer's klog lines."""
    reserves: dict[tuple[str, str], list[float]] = defaultdict(list)
    flushes: dict[str, list[float]] = defaultdict(list)
    for line in lines:
        if '"post reserve"' in line:
            kind = "reserve"
        elif '"flushing"' in line:
            kind = "flush"
        else:
            continue
        t, node = _klog_time(line, year), _NODE.search(line)
        if t is None or node is None:
            continue
        if kind == "flush":
            flushes[node.group(1)].append(t)
            continue
        pod = _POD.search(line)
        if pod is not None:
            reserves[(pod.group(1), node.group(1))].append(t)
    return reserves, {n: sorted(ts) for n, ts in flushes.items()}


def _flushed_before(pod: str, node: str, r_p: float, others: list[tuple[str, float]],
                    reserves: dict[tuple[str, str], list[float]], node_flushes: list[float]) -> bool:
    """Whether `node` was flushed after some other pod's last reserve there and before both `r_p` (this
    pod's reserve) and that pod's pinning."""
    for other, other_pinned in others:
        if other == pod:
            continue
        theirs = [t for t in reserves.get((other, node), ()) if t <= other_pinned]
        if not theirs or max(theirs) >= r_p:
            continue
        lo = bisect_right(node_flushes, max(theirs))
        if lo < bisect_left(node_flushes, min(r_p, other_pinned)):
            return True
    return False


def causes(placements: list[tuple[str, str, float, bool]], reserves: dict[tuple[str, str], list[float]],
           flushes: dict[str, list[float]]) -> dict[str, list[str]]:
    """{cause: pods} for every placed pod (see the module docstring); the aligned ones as "aligned, X"
    with the same causes, for the base rate. Pure."""
    by_node: dict[str, list[tuple[str, float]]] = defaultdict(list)  # node -> (pod, pinned at)
    for pod, node, pinned, _ in placements:
        by_node[node].append((pod, pinned))
    out: dict[str, list[str]] = defaultdict(list)
    for pod, node, pinned, aligned in placements:
        prefix = "aligned, " if aligned else ""
        mine = [t for t in reserves.get((pod, node), ()) if t <= pinned]
        if not mine:
            out[prefix + "no reserve logged"].append(pod)
        elif _flushed_before(pod, node, max(mine), by_node[node], reserves, flushes.get(node, [])):
            out[prefix + "flushed"].append(pod)
        else:
            out[prefix + "other"].append(pod)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("run", type=Path, help="one run's kept logs (nrt-scheduler.log, placements.json)")
    args = parser.parse_args(argv)
    placements = [tuple(p) for p in json.loads((args.run / "placements.json").read_text())]
    if not placements:
        print("peer unaligned: no placements recorded")
        return 1
    year = datetime.fromtimestamp(placements[0][2], UTC).year
    lines = (args.run / "nrt-scheduler.log").read_text(errors="replace").splitlines()
    reserves, flushes = parse_log(lines, year)
    by_cause = causes(placements, reserves, flushes)  # type: ignore[arg-type]
    for cause, pods in sorted(by_cause.items()):
        print(f"# {cause}: {len(pods)} (e.g. {', '.join(pods[:3])})")
    total = sum(len(v) for k, v in by_cause.items() if not k.startswith("aligned"))
    flushed = len(by_cause.get("flushed", []))
    base = len(by_cause.get("aligned, flushed", []))
    print(f"peer unaligned: {total} pods of {len(placements)}, {flushed} after a flush "
          f"({100.0 * flushed / total if total else 0.0:.1f}%; of the aligned pods "
          f"{100.0 * base / (len(placements) - total) if len(placements) > total else 0.0:.1f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
