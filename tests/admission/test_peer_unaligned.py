"""bench/peer_unaligned.py: sorting the peer's unaligned pods by cause, from its klog lines and the
stand-in agents' placements (table tests on hand-written logs)."""

from __future__ import annotations

import sys

import pytest

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "bench"))

from peer_unaligned import causes, parse_log  # noqa: E402

YEAR = 2026


def _line(second: float, message: str, **values: str) -> str:
    whole, frac = int(second), round((second % 1) * 1e6)
    kv = " ".join(f'{k}="{v}"' for k, v in values.items())
    return f'I1204 10:00:{whole:02d}.{frac:06d}   4242 overreserve.go:185] "{message}" {kv}'


def _t(second: float) -> float:
    return parse_log([_line(second, "flushing", node="n")], YEAR)[1]["n"][0]


def test_parse_log_reads_reserves_and_flushes_and_skips_the_rest() -> None:
    lines = [
        _line(1.5, "post reserve", pod="bench/a", podUID="u", node="n1", assumedResources="x"),
        _line(2.0, "flushing", node="n1"),
        _line(3.0, "post unreserve", pod="bench/a", node="n1"),
        "not a klog line",
        'I1204 10:00:04.000000 1 x.go:1] "flushing"',  # no node: skipped
    ]
    reserves, flushes = parse_log(lines, YEAR)
    assert reserves == {("bench/a", "n1"): [_t(1.5)]}
    assert flushes == {"n1": [_t(2.0)]}
    assert _t(2.0) - _t(1.5) == pytest.approx(0.5)


# (name, log lines, placements as (pod, node, pinned second, aligned), expected {cause: pods})
CASES = [
    ("flush between Q's reserve and P's, Q not pinned yet",
     [_line(1, "post reserve", pod="q", node="n"), _line(2, "flushing", node="n"),
      _line(3, "post reserve", pod="p", node="n")],
     [("q", "n", 4, True), ("p", "n", 5, False)],
     {"flushed": ["p"], "aligned, other": ["q"]}),
    ("the flush came after Q was pinned: its NRT counted Q",
     [_line(1, "post reserve", pod="q", node="n"), _line(3, "flushing", node="n"),
      _line(4, "post reserve", pod="p", node="n")],
     [("q", "n", 2, True), ("p", "n", 5, False)],
     {"other": ["p"], "aligned, other": ["q"]}),
    ("a flush of another node does not count",
     [_line(1, "post reserve", pod="q", node="n"), _line(2, "flushing", node="m"),
      _line(3, "post reserve", pod="p", node="n")],
     [("q", "n", 4, True), ("p", "n", 5, False)],
     {"other": ["p"], "aligned, other": ["q"]}),
    ("no reserve of P in the log",
     [_line(1, "post reserve", pod="q", node="n")],
     [("q", "n", 4, True), ("p", "n", 5, False)],
     {"no reserve logged": ["p"], "aligned, other": ["q"]}),
    ("Q's earlier reserve, given up before the flush, is not its last",
     [_line(1, "post reserve", pod="q", node="n"), _line(2, "flushing", node="n"),
      _line(3, "post reserve", pod="p", node="n"), _line(6, "post reserve", pod="q", node="n")],
     [("p", "n", 5, False), ("q", "n", 7, True)],
     {"other": ["p"], "aligned, other": ["q"]}),
]


@pytest.mark.parametrize(("lines", "placements", "expected"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_causes(lines: list[str], placements: list[tuple[str, str, float, bool]],
                expected: dict[str, list[str]]) -> None:
    reserves, flushes = parse_log(lines, YEAR)
    pinned = [(pod, node, _t(second), aligned) for pod, node, second, aligned in placements]
    assert dict(causes(pinned, reserves, flushes)) == expected
