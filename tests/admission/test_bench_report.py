"""The admission API bench's per-run lines read back by bench/admission_combine.py: runs printed by two
invocations give the same table and last line as one invocation would (round trip, no cluster)."""

from __future__ import annotations

import sys

import pytest

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "bench"))

from admission_combine import combine, parse  # noqa: E402
from admission_report import (  # noqa: E402
    CONTROLLER,
    PLAIN,
    ApiRun,
    counts_line,
    last_line,
    print_table,
    timing_line,
    usage_line,
)

PEER = "NRT plugin, scope pod"


def _run(name: str, wall: float, bound: int = 10, aligned: int = 10, partial: int = 0) -> ApiRun:
    cpu = {"kube-apiserver": wall * 2, "bench (this process)": 1.5}
    return ApiRun(name, 10, bound, wall, aligned, one_node=4, cpu_s=sum(cpu.values()), gangs=3,
                  whole=3 - partial, partial=partial, cpu=cpu, rss_mib={"kube-apiserver": 812.0})


def _printed(runs: dict[str, list[ApiRun]], capsys: pytest.CaptureFixture[str]) -> list[str]:
    """What one invocation prints for `runs`: each run's lines, then the table."""
    for mine in zip(*runs.values(), strict=False):
        for run in mine:
            print(timing_line(run.name, 1.0, 2.0, run.wall_s))
            print("# progress lines and warnings between are skipped")
            print(usage_line(run.name, run.cpu, run.rss_mib))
            print(counts_line(run))
    print_table(runs, max(len(v) for v in runs.values()))
    return capsys.readouterr().out.splitlines()


def test_two_invocations_read_back_as_one(capsys: pytest.CaptureFixture[str]) -> None:
    first = {PLAIN: [_run(PLAIN, 12.0, aligned=9)], CONTROLLER: [_run(CONTROLLER, 10.0)],
             PEER: [_run(PEER, 100.0, bound=8, aligned=7, partial=1)]}
    second = {CONTROLLER: [_run(CONTROLLER, 11.0), _run(CONTROLLER, 9.0)],
              PLAIN: [_run(PLAIN, 10.0, aligned=9), _run(PLAIN, 9.0, aligned=10)]}
    read = combine([parse(_printed(first, capsys)), parse(_printed(second, capsys))])
    assert list(read) == [PLAIN, CONTROLLER, PEER]
    assert [r.wall_s for r in read[CONTROLLER]] == [10.0, 11.0, 9.0]
    assert [r.aligned for r in read[PLAIN]] == [9, 9, 10]
    (peer,) = read[PEER]
    assert (peer.bound, peer.aligned, peer.whole, peer.partial, peer.one_node) == (8, 7, 2, 1, 4)
    assert peer.cpu == {"kube-apiserver": 200.0, "bench (this process)": 1.5}
    assert peer.cpu_s == pytest.approx(201.5)
    assert peer.rss_mib == {"kube-apiserver": 812.0}
    line = last_line(read)
    # the controller's wall over the plain scheduler's, per round: 10/12, 11/10, 9/9 -> median 1.00;
    # over the peer's: the one round it ran, 10/100
    assert line == ("admission: 10 pods aligned 100.0% vs scheduler-only 93.3% vs NRT-plugin 87.5%; "
                    "wall with controller / scheduler-only = 1.00, / NRT-plugin = 0.10")
    out = capsys.readouterr().out
    assert "round 1: NRT plugin, scope pod left 1 gangs partly bound" in out
    assert "NRT plugin, scope pod bound 8 pods" in out


def test_a_run_without_its_counts_is_left_out(capsys: pytest.CaptureFixture[str]) -> None:
    lines = [timing_line(PLAIN, 1.0, 2.0, 12.0), usage_line(PLAIN, {"etcd": 1.0}, {})]
    assert parse(lines) == {}
    assert "a run without its counts" in capsys.readouterr().err
