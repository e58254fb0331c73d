"""Every script of bench/ at its smallest size: it exits 0 and its last line parses, so no bench breaks
unseen (issue 35, item 6).

One case per script (`BENCHES`; `test_every_bench_has_a_smoke_test` fails for a script without one).
Figures are never judged (tests never assert on timings), only the last line's shape, numbers where
numbers go.  A subprocess hides what a bench reaches from tests/conftest.py, so the tier is set here:
`integration` for root, cgroups, the control plane, Kueue, the peer, NRI's runtime or lstopo; `slow` for
a pure bench of many seconds; `make unit` keeps the rest.  `bench/cold_make_test.sh` takes an hour:
it runs with `--check` (its inputs checked, nothing run, the same last line).  `admission_combine.py`
and `peer_unaligned.py` read what `admission_api.py` printed and kept, so they run on that run's output.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO

BENCH = REPO / "bench"
N = r"(\d+(?:\.\d+)?)"  # a figure (never nan, never negative)
D = r"(-?\d+(?:\.\d+)?)"  # a difference of two figures (a noisy one may be negative)
API = "admission_api.py"


@dataclass(frozen=True)
class Bench:
    """A script, its smallest-size arguments ({dumps}, {out}, {api_out}, {api_logs} filled in) and the
    pattern its last line must match whole."""

    script: str
    args: tuple[str, ...]
    last: str
    timeout_s: float = 120.0


def case(script: str, args: str, last: str, tier: str | None = None, timeout_s: float = 120.0,
         name: str | None = None) -> Any:
    marks = [getattr(pytest.mark, tier)] if tier else []
    return pytest.param(Bench(script, tuple(args.split()), last, timeout_s), marks=marks, id=name or script)


INTEGRATION, SLOW = "integration", "slow"
ADMISSION = (rf"admission: {N} pods aligned {N}% vs scheduler-only {N}% vs NRT-plugin {N}%; "
             rf"wall with controller / scheduler-only = {N}, / NRT-plugin = {N}")
BENCHES = [
    case("fgd.py", "--seeds 42 --nodes 8",
         rf"fgd trace unallocated GPU at 100% arrived: topolet {N}% \| FGD \(same run\) {N}% \| "
         rf"paper FGD {N}%"),
    case("alloc.py", "--requests 1 --dumps 1", rf"allocation p99: {N} ms \(worst topology\)", SLOW),
    case("admission.py", "--nodes 1 --gangs 1 --api-nodes 0 --dumps {dumps}",
         rf"admission engine: {N} decisions/s, p99 {N} ms \({N} nodes, {N} gangs\), peak RSS {N} MiB", SLOW),
    case("discover.py", "--numa-scale --rounds 1",
         rf"discover growth 3000 vs 1000 memory-only nodes: {N} \(scan alone {N}, linear 3\.00\)", SLOW,
         name="discover.py--numa-scale"),
    case("discover.py", "--rounds 1 --scans-per-round 1 --dumps {dumps}",
         rf"discover whole process vs lstopo on [\w.+-]+: {N} \(target at most 1\.25\)", INTEGRATION, 300),
    case("footprint.py", "--seconds 1 --settle 1 --reconcile-seconds 1",
         rf"install footprint: chart {N} objects \(base {N}\); image MiB compressed/unpacked: "
         rf"(?:none built|(?:amd64|arm64) {N}/{N}(?:, arm64 {N}/{N})?)", INTEGRATION, 300),
    case("pin.py", "-n 1", rf"pin latency p99: {N} ms", INTEGRATION),
    case("lists.py", "--pods 600",
         rf"lists: 600 pods: largest response unpaged {N} MiB vs paged {N} MiB; peak RSS during relist "
         rf"{N} MiB vs {N} MiB; wall {N} s vs {N} s", INTEGRATION, 300),
    case("nri.py", "--creates 1 --rounds 1 --shared 1",
         rf"agent NRIPinning, 1 shared, (?:reserved ahead|state on disk|state on tmpfs): "
         rf"CreateContainer p99 {N} ms \(worst round; budget 10 ms\)", INTEGRATION, 300),
    case("kube.py", "--exclusive 1 --shared 1 --steady-seconds 0",
         rf"agent RSS with 2 pods: {N} MiB  \(target < 60 MiB; reference: interpreter with the same "
         rf"imports {N} MiB\)", INTEGRATION, 300),
    case("kube.py", "--real-node --pods 1 --burstable-every 1",
         rf"real node: first instruction pinned {N}/{N} nri, {N}/{N} pod-cgroup "
         rf"\(kubelet static {N}/{N}\) \| created->Running p99 with/static {N}(?: nri, {N} pod-cgroup)? "
         rf"\| create->pinned p99 {N} ms(?: nri, {N} ms pod-cgroup)? \| agent memory {N} MiB "
         rf"\| image (?:{N}|n/a) MiB", INTEGRATION, 600, name="kube.py--real-node"),
    case("held.py", "--nodes 1 --arg-bytes 100000 --many 200",
         rf"held: per pod {N} -> {N}, per node {N} -> {N}, per NRT {N} -> {N}, per Job {N} -> {N}; "
         rf"1 MB-args pod {N} -> {N}; among 200 pods {N} -> {N} shared", INTEGRATION, 300),
    case("hostile.py", "--pods 3 --node-pods 2 --pod-bytes 200000 --page-pods 20",
         rf"hostile: controller peak RSS {N} MiB clean vs {N} MiB with 3 pods of {N} MB; agent peak RSS {N} "
         rf"MiB clean vs {N} MiB with 2 on its node; decode of a 20-pod page with/without the hook {N}",
         INTEGRATION, 300),
    case("fleet.py", "--nodes 2 --idle 5 --churn 5 --settle 2",
         rf"fleet: 2 agents, per node per minute idle {D} requests \({N} writes, {D} watches held\), "
         rf"churn {D} requests at {N} pod changes \({N} writes per pod change\); 5000 agents: idle {D}/min, "
         rf"churn {D}/min, 5000\*{D} = {D} watches held", INTEGRATION, 300),
    case("scale.py", "--nodes 6 --shared 2 --gangs 4 --idle 1 --engine-nodes 6 --engine-gangs 4 "
         "--dumps {dumps}",
         rf"scale: 6 nodes, {N} pods: controller peak RSS {N} MiB, start->first decision {N} s, aligned "
         rf"100\.0% vs plain {N}%, wall with controller / plain {N}; engine 6 nodes {N}/s p99 {N} ms "
         rf"RSS {N} MiB",
         INTEGRATION, 600),
    case("waiting.py", "--nodes 4 --waiting 5 --window 2",
         rf"waiting: 5 gangs not now: pass mean {N} s vs {N} s with none; a fitting gang admitted in {N} s "
         rf"vs {N} s with none; refusals reused {N}", INTEGRATION, 300),
    case("kueue.py", "--nodes 2 --gangs 5 --rounds 2 --dumps {dumps} --keep-logs {out}/logs",
         rf"workloads: aligned {N}% with check vs {N}% Kueue alone vs {N}% Kueue TAS; "
         rf"kinds job,jobset,trainjob,mpijob,lws; p99 with/no-op check = {N}", INTEGRATION, 600),
    case(API, "--nodes 2 --gangs 2 --rounds 1 --scopes pod --peer-v 2 --dumps {dumps} --keep-logs {api_logs}",
         ADMISSION, INTEGRATION, 600),
    case("admission_combine.py", "{api_out}", ADMISSION, INTEGRATION),
    case("peer_unaligned.py", "{api_logs}/nrt-pod-0",
         rf"peer unaligned: {N} pods of {N}, {N} after a flush \({N}%; of the aligned pods {N}%\)",
         INTEGRATION),
    case("cold_make_test.sh", "--check", r"make test cold: rc 0, wall 0 s \(--check: nothing run\)",
         INTEGRATION),
]


def run_bench(script: str, args: list[str], timeout_s: float) -> list[str]:
    """The script's stdout lines; a non-zero exit or a timeout fails with the end of its output.  It runs in
    a session of its own, so that a timeout ends the clusters and nodes it started too."""
    argv = ["bash" if script.endswith(".sh") else sys.executable, str(BENCH / script), *args]
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
        pytest.fail(f"{script} ran past {timeout_s:.0f} s:\n{out[-3000:]}\n{err[-3000:]}")
    assert proc.returncode == 0, f"{script} exited {proc.returncode}:\n{out[-3000:]}\n{err[-3000:]}"
    lines = out.splitlines()
    assert lines, f"{script} printed nothing:\n{err[-3000:]}"
    return lines


def assert_last_line(bench: Bench, lines: list[str]) -> None:
    last = lines[-1].strip()
    found = re.fullmatch(bench.last, last)
    assert found, f"{bench.script}'s last line has not the shape {bench.last!r}:\n{last}"


@dataclass(frozen=True)
class ApiRun:
    """bench/admission_api.py's run at its smallest size: its stdout (a file) and its kept logs."""

    lines: list[str]
    out: Path
    logs: Path


@pytest.fixture(scope="module")
def api_run(tmp_path_factory: pytest.TempPathFactory, dumps_dir: Path) -> ApiRun:
    work = tmp_path_factory.mktemp("admission-api")
    (bench,) = [p.values[0] for p in BENCHES if p.values[0].script == API]
    args = [a.format(dumps=dumps_dir, api_logs=work / "logs") for a in bench.args]
    lines = run_bench(API, args, bench.timeout_s)
    (work / "api.out").write_text("\n".join(lines) + "\n")
    return ApiRun(lines, work / "api.out", work / "logs")


@pytest.mark.parametrize("bench", BENCHES)
def test_bench_runs_at_its_smallest_size(bench: Bench, request: pytest.FixtureRequest, tmp_path: Path,
                                         dumps_dir: Path) -> None:
    if bench.script == API:
        assert_last_line(bench, request.getfixturevalue("api_run").lines)
        return
    values: dict[str, object] = {"dumps": dumps_dir, "out": tmp_path}
    if any("{api_" in a for a in bench.args):
        run: ApiRun = request.getfixturevalue("api_run")
        values.update(api_out=run.out, api_logs=run.logs)
    lines = run_bench(bench.script, [a.format(**values) for a in bench.args], bench.timeout_s)
    assert_last_line(bench, lines)


def test_every_bench_has_a_smoke_test() -> None:
    # The scripts: every shell script, and every Python file that runs as one (the rest are their modules).
    scripts = {p.name for p in BENCH.glob("*.sh")} | {
        p.name for p in BENCH.glob("*.py") if 'if __name__ == "__main__":' in p.read_text()}
    assert scripts == {p.values[0].script for p in BENCHES}
