"""`topolet mig plan` through the CLI entry point."""

from __future__ import annotations

import json

import pytest

from agent.cli import main
from agent.gpu.profiles import H100_80GB, Placement


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, object]]:
    rc = main(["mig", "plan", *argv])
    return rc, json.loads(capsys.readouterr().out)


def test_plan_json(capsys: pytest.CaptureFixture[str]) -> None:
    rc, doc = run(capsys, "--gpu-model", "NVIDIA H100 80GB HBM3", "--demand", "3g.40gb=1,2g.20gb=2")
    assert rc == 0
    (g,) = doc["gpus"]  # type: ignore[misc]
    assert g["index"] == 0
    got = sorted((i["profile"], i["start"], i["size"]) for i in g["instances"])
    assert [p for p, _, _ in got] == ["2g.20gb", "2g.20gb", "3g.40gb"]
    for p, s, z in got:
        assert Placement(s, z) in H100_80GB.profile(p).placements


def test_plan_error_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    rc, doc = run(capsys, "--gpu-model", "H100-80GB", "--demand", "3g.40gb=3")
    assert rc == 1 and doc == {"error": "3g.40gb=3 exceeds max 2 per GPU on H100-80GB × 1"}


def test_unknown_model(capsys: pytest.CaptureFixture[str]) -> None:
    rc, doc = run(capsys, "--gpu-model", "NVIDIA L4", "--demand", "1g.5gb=1")
    assert rc == 1 and "unknown GPU model" in str(doc["error"])


def test_named_layout_per_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    rc, doc = run(capsys, "--gpu-model", "H200-141GB", "--demand", "all-balanced", "--gpus", "3")
    assert rc == 0
    gpus = doc["gpus"]
    assert isinstance(gpus, list) and len(gpus) == 3
    for g in gpus:
        assert sorted(i["profile"] for i in g["instances"]) == ["1g.18gb", "1g.18gb", "2g.35gb", "3g.71gb"]


@pytest.mark.parametrize("gpus", ["0", "33", "300", "600"])
def test_gpus_past_what_a_node_holds_is_refused(capsys: pytest.CaptureFixture[str], gpus: str) -> None:
    rc, doc = run(capsys, "--gpu-model", "H100-80GB", "--demand", "1g.10gb=1", "--gpus", gpus)
    assert rc == 1 and doc == {"error": f"--gpus must be 1 to 32 (the most one node holds), got {gpus}"}


def test_the_most_gpus_a_node_holds_are_planned_full(capsys: pytest.CaptureFixture[str]) -> None:
    rc, doc = run(capsys, "--gpu-model", "H100-80GB", "--demand", "1g.10gb=224", "--gpus", "32")
    assert rc == 0
    assert [len(g["instances"]) for g in doc["gpus"]] == [7] * 32  # type: ignore[attr-defined]
