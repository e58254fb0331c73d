"""kubelet's CPU manager tables replayed: every answer at least as good as kubelet's (41/41)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from agent.alloc.exclusive import allocate
from agent.alloc.request import Request
from agent.alloc.topology_file import topology_from_kubelet_table
from agent.errors import AllocationError
from agent.topology.cpuset import CPUSet

DATA = Path(__file__).resolve().parents[1] / "data" / "kubelet-cpumanager"
REPO = Path(__file__).resolve().parents[2]
CASES: list[dict[str, Any]] = json.loads((DATA / "cases.json").read_text())
TOPOLOGIES: dict[str, dict[str, Any]] = json.loads((DATA / "topologies.json").read_text())


def _grader() -> ModuleType:
    spec = importlib.util.spec_from_file_location("kubelet_tables", DATA / "kubelet_tables.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GRADER = _grader()


def test_the_tables_are_all_there() -> None:
    assert len(CASES) == 41
    assert {c["topology"] for c in CASES} <= set(TOPOLOGIES)


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_case_at_least_as_good_as_kubelet(case: dict[str, Any]) -> None:
    topo = TOPOLOGIES[case["topology"]]
    policy = "spread" if case["options"].get("distribute_across_numa") else "best-effort"
    free = CPUSet(GRADER.parse(case["available"]))
    try:
        request = Request(cpus=case["request"], numa_policy=policy)
        got = allocate(topology_from_kubelet_table(topo), free, request)
        answer = {"cpus": got.cpulist()}
    except AllocationError as exc:
        answer = {"error": str(exc)}
    assert GRADER.judge(topo, case, answer) == "ok"


def test_grader_replay_through_the_cli() -> None:
    """The grader itself, driving `topolet alloc` once per topology, ends with 41/41."""
    cmd = [sys.executable, str(DATA / "kubelet_tables.py"), "--cases", str(DATA / "cases.json"),
           "--topologies", str(DATA / "topologies.json"), "--",
           sys.executable, "-m", "agent.cli", "alloc", "--topology", "{topology}", "--requests", "{requests}"]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=REPO)
    last = p.stdout.strip().splitlines()[-1] if p.stdout.strip() else p.stderr
    assert last == "kubelet tables: 41/41 cases at least as good as kubelet", p.stdout[-2000:]
    assert p.returncode == 0
