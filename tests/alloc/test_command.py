"""`topolet alloc`: both topology file forms, one answer per request line, a bad line answered not fatal."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

import pytest

from agent.alloc.command import MAX_LINE_BYTES
from agent.alloc.exclusive import allocate
from agent.alloc.request import Request
from agent.alloc.synthetic import synthetic_topology
from agent.alloc.topology_file import MAX_TOPOLOGY_BYTES, load_topology
from agent.cli import main
from agent.errors import TopologyError
from agent.topology.cpuset import CPUSet
from agent.topology.report import to_data

KUBELET = Path(__file__).resolve().parents[1] / "data" / "kubelet-cpumanager" / "topologies.json"


def run(capsys: pytest.CaptureFixture[str], topology: Path, lines: list[str],
        name: str | None = None) -> tuple[int, list[dict[str, Any]]]:
    requests = topology.parent / "requests.jsonl"
    requests.write_text("\n".join(lines) + "\n")
    argv = ["alloc", "--topology", str(topology), "--requests", str(requests)]
    if name:
        argv += ["--name", name]
    rc = main(argv)
    out = capsys.readouterr().out
    return rc, [json.loads(line) for line in out.splitlines()]


@pytest.fixture
def dual_socket(tmp_path: Path) -> Path:
    """kubelet's topoDualSocketHT alone, in the single-topology form."""
    path = tmp_path / "topo.json"
    path.write_text(json.dumps(json.loads(KUBELET.read_text())["topoDualSocketHT"]))
    return path


BAD_LINES = [
    ("not json", "not JSON"),
    ('["free"]', "JSON object"),
    ('{"cpus": 1}', "free must be a cpulist"),
    ('{"free": "0-x", "cpus": 1}', "free"),
    ('{"free": "0-3", "cpus": "2"}', "cpus must be a non-negative integer"),
    ('{"free": "0-3", "cpus": -2}', "cpus must be a non-negative integer"),
    ("[" * 100_000, "nests too deeply"),
    ('{"free": "0-3", "cpus": {"a": ' * 2_000 + "1" + "}" * 2_001, "nests too deeply"),
    ('{"free": "0-3", "cpus": 1, "numa_policy": "packed"}', "unknown numa_policy"),
    ('{"free": "0-3", "cpus": 1, "smt": 2}', "smt must be a string"),
    ('{"free": "0-3", "cpus": 1, "preferred_numa": "0"}', "preferred_numa must be a list"),
    ('{"free": "0-3", "cpus": 1, "reserved": 5}', "reserved must be a cpulist"),
    ('{"free": "0-3", "cpus": 1, "colour": "red"}', "unknown request field(s): colour"),
    ('{"free": "0-3", "cpus": 9}', "not enough free CPUs"),
]


@pytest.mark.parametrize(("line", "message"), BAD_LINES, ids=[m for _, m in BAD_LINES])
def test_a_bad_line_gets_an_error_answer_and_the_next_line_still_runs(
        capsys: pytest.CaptureFixture[str], dual_socket: Path, line: str, message: str) -> None:
    rc, answers = run(capsys, dual_socket, [line, '{"free": "0-11", "cpus": 2}'])
    assert rc == 0
    assert len(answers) == 2
    assert message in answers[0]["error"]
    assert len(CPUSet.parse(answers[1]["cpus"])) == 2


def test_answers_come_in_request_order_and_blank_lines_are_skipped(
        capsys: pytest.CaptureFixture[str], dual_socket: Path) -> None:
    lines = ['{"free": "0-11", "cpus": 1}', "", '{"free": "0-11", "cpus": 12}',
             '{"free": "0,6", "cpus": 2, "smt": "full-cores"}',
             '{"free": "0-11", "cpus": 7, "smt": "full-cores"}',
             '{"free": "0-11", "cpus": 6, "numa_policy": "single-numa-node", "reserved": "0,1"}']
    rc, answers = run(capsys, dual_socket, lines)
    assert rc == 0
    assert [len(CPUSet.parse(a["cpus"])) if "cpus" in a else a["error"][:10] for a in answers] == [
        1, 12, 2, "smt=full-c", "single-num"]


def test_a_table_with_several_topologies_needs_a_name(capsys: pytest.CaptureFixture[str],
                                                       tmp_path: Path) -> None:
    path = tmp_path / "all.json"
    path.write_text(KUBELET.read_text())
    rc, answers = run(capsys, path, ['{"free": "0-287", "cpus": 4, "smt": "full-cores"}'],
                      name="topoQuadSocketFourWayHT")
    assert rc == 0
    assert len(CPUSet.parse(answers[0]["cpus"])) == 4
    with pytest.raises(TopologyError, match="--name"):
        load_topology(str(path))
    with pytest.raises(TopologyError, match="no topology named 'nope'"):
        load_topology(str(path), "nope")
    assert main(["alloc", "--topology", str(path), "--requests", str(tmp_path / "requests.jsonl")]) == 2
    assert "--name" in capsys.readouterr().err


def test_kubelet_topology_keeps_kubelet_cores_and_explicit_uncore_groups(tmp_path: Path) -> None:
    tables = json.loads(KUBELET.read_text())
    smt = load_topology(str(KUBELET), "topoUncoreSingleSocketSMT")
    fixture = tables["topoUncoreSingleSocketSMT"]["cpus"]
    assert len(smt.cores) == len({(c["socket"], c["core"]) for c in fixture})
    assert len(smt.l3_groups) == len({c["uncore"] for c in fixture})
    # Without explicit uncore ids the fixture's zeros are Go defaults: one L3 group per socket instead.
    dual = load_topology(str(KUBELET), "topoDualSocketHT")
    assert len(dual.l3_groups) == len(dual.packages) == 2


def test_discover_json_round_trips_into_the_same_answers(capsys: pytest.CaptureFixture[str],
                                                         tmp_path: Path) -> None:
    topo = synthetic_topology(2, 2, 3, 4, 2)
    path = tmp_path / "discovered.json"
    path.write_text(json.dumps(to_data(topo)))
    loaded = load_topology(str(path))
    assert loaded == topo
    lines = [json.dumps({"free": "0-95", "cpus": n, "numa_policy": p, "smt": "full-cores",
                         "preferred_numa": [3]})
             for n in (2, 8, 24, 50) for p in ("best-effort", "spread", "restricted", "single-numa-node")]
    rc, answers = run(capsys, path, lines)
    assert rc == 0
    for line, got in zip(lines, answers, strict=True):
        req = json.loads(line)
        try:
            want: dict[str, str] = {"cpus": allocate(topo, CPUSet.parse(req["free"]), Request(
                cpus=req["cpus"], numa_policy=req["numa_policy"], smt=req["smt"],
                preferred_numa=frozenset(req["preferred_numa"]))).cpulist()}
        except Exception as exc:  # noqa: BLE001 - compare the error text whatever its type
            want = {"error": str(exc)}
        assert got == want


@pytest.mark.parametrize(("content", "message"), [
    ("{", "not JSON"),
    ("[]", "must be a JSON object"),
    ('{"something": 1}', "neither"),
    ('{"cpus": [{"cpu": 0, "core": 0, "socket": 0}]}', "'numa' must be a non-negative integer"),
    ('{"cpus": [{"cpu": 0, "core": 0, "socket": 0, "numa": 0},'
     ' {"cpu": 0, "core": 1, "socket": 0, "numa": 0}]}', "appears twice"),
    ('{"cpus": "0-3", "cores": [{"cpus": "0-x"}]}', "cores[0]"),
])
def test_a_bad_topology_file_is_a_topology_error(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "t.json"
    path.write_text(content)
    with pytest.raises(TopologyError, match=message.replace("[", r"\[").replace("(", r"\(")) as info:
        load_topology(str(path))
    assert str(path) in str(info.value)


def test_missing_files_exit_2(capsys: pytest.CaptureFixture[str], dual_socket: Path, tmp_path: Path) -> None:
    assert main(["alloc", "--topology", str(tmp_path / "none.json"), "--requests", "x"]) == 2
    assert "cannot read topology file" in capsys.readouterr().err
    assert main(["alloc", "--topology", str(dual_socket), "--requests", str(tmp_path / "none")]) == 2
    assert "cannot read requests" in capsys.readouterr().err


def run_bytes(capsys: pytest.CaptureFixture[str], topology: Path,
              data: bytes) -> tuple[int, list[dict[str, Any]]]:
    requests = topology.parent / "requests.jsonl"
    requests.write_bytes(data)
    rc = main(["alloc", "--topology", str(topology), "--requests", str(requests)])
    out = capsys.readouterr().out
    return rc, [json.loads(line) for line in out.splitlines()]


GOOD = b'{"free": "0-11", "cpus": 2}\n'


def test_zero_cpus_is_the_empty_set_kubelet_answers_and_says_so(
        capsys: pytest.CaptureFixture[str], dual_socket: Path) -> None:
    rc, answers = run(capsys, dual_socket, ['{"free": "0-11", "cpus": 0}', '{"free": "", "cpus": 0}'])
    assert rc == 0
    assert answers == [{"cpus": "", "warning": "cpus is 0: nothing allocated"}] * 2


def test_a_line_that_is_not_utf8_is_answered_and_the_stream_goes_on(
        capsys: pytest.CaptureFixture[str], dual_socket: Path) -> None:
    rc, answers = run_bytes(capsys, dual_socket, b'{"free": "0-3", "cpus": 1, "smt": "\xff\xfe"}\n' + GOOD)
    assert rc == 0
    assert [list(a) for a in answers] == [["error"], ["cpus"]]
    assert "not UTF-8" in answers[0]["error"]


@pytest.mark.parametrize("size", [1_000_000, MAX_LINE_BYTES + 1, 3 * MAX_LINE_BYTES])
def test_an_overlong_line_is_one_error_never_echoed_and_the_stream_goes_on(
        capsys: pytest.CaptureFixture[str], dual_socket: Path, size: int) -> None:
    field = b'{"free": "0-3", "cpus": "' + b"9" * size + b'"}\n'
    rc, answers = run_bytes(capsys, dual_socket, field + GOOD + field.rstrip(b"\n"))
    assert rc == 0
    assert [list(a) for a in answers] == [["error"], ["cpus"], ["error"]]
    assert "longer than" in answers[0]["error"]
    assert len(answers[0]["error"]) < 200


def test_a_long_bad_field_under_the_line_cap_is_named_not_echoed(
        capsys: pytest.CaptureFixture[str], dual_socket: Path) -> None:
    for line in ['{"free": "0-3", "cpus": "' + "9" * 100_000 + '"}',
                 '{"free": "0-3", "cpus": 1, "' + "k" * 100_000 + '": 1}',
                 '{"free": "0-' + "9" * 100_000 + '", "cpus": 1}']:
        rc, answers = run(capsys, dual_socket, [line, GOOD.decode().strip()])
        assert rc == 0
        assert len(answers) == 2 and "cpus" in answers[1]
        assert 0 < len(answers[0]["error"]) < 400


def test_requests_from_stdin_are_read_as_bytes(capsys: pytest.CaptureFixture[str], dual_socket: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"\xff\n" + GOOD)))
    assert main(["alloc", "--topology", str(dual_socket), "--requests", "-"]) == 0
    answers = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [list(a) for a in answers] == [["error"], ["cpus"]]


def test_a_device_is_refused_as_requests_or_topology(capsys: pytest.CaptureFixture[str],
                                                      dual_socket: Path) -> None:
    assert main(["alloc", "--topology", str(dual_socket), "--requests", "/dev/zero"]) == 2
    assert "cannot read requests: not a regular file, pipe or terminal: /dev/zero" in capsys.readouterr().err
    with pytest.raises(TopologyError, match="not a regular file"):
        load_topology("/dev/zero")
    assert main(["alloc", "--topology", "/dev/zero", "--requests", "/dev/zero"]) == 2
    assert "cannot read topology file" in capsys.readouterr().err


def test_a_huge_topology_file_is_refused_by_size(tmp_path: Path) -> None:
    path = tmp_path / "huge.json"
    with open(path, "wb") as f:
        f.truncate(50 << 30)  # a sparse 50 GiB file: only the cap's worth is ever read
    with pytest.raises(TopologyError, match=f"larger than {MAX_TOPOLOGY_BYTES >> 20} MiB"):
        load_topology(str(path))


def test_a_topology_through_a_pipe_is_read(capsys: pytest.CaptureFixture[str], dual_socket: Path) -> None:
    # What `--topology <(topolet discover --format json)` hands over: a pipe, not a file.
    r, w = os.pipe()
    os.write(w, dual_socket.read_bytes())
    os.close(w)
    try:
        topo = load_topology(f"/proc/self/fd/{r}")
    finally:
        os.close(r)
    assert topo == load_topology(str(dual_socket))


@pytest.mark.parametrize(("content", "message"), [
    (b"[" * 100_000, "nests too deeply"),
    (b'{"cpus": "\xff"}', "not UTF-8"),
    (b'{"cpus": [{"cpu": "' + b"7" * 100_000 + b'", "core": 0, "socket": 0, "numa": 0}]}', "chars)"),
])
def test_a_hostile_topology_file_is_a_short_topology_error(tmp_path: Path, content: bytes,
                                                           message: str) -> None:
    path = tmp_path / "t.json"
    path.write_bytes(content)
    with pytest.raises(TopologyError, match=message.replace("(", r"\(").replace(")", r"\)")) as info:
        load_topology(str(path))
    assert len(str(info.value)) < 500
