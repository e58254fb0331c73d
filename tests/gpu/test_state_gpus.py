"""Held GPUs in the state file: recorded with the CPUs, validated, and old files without them still load."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from agent.enforce.state import Allocation, Owner, State
from agent.enforce.state_file import StateFile
from agent.errors import StateError
from agent.topology.cpuset import CPUSet

A18, A2A = "0000:18:00.0", "0000:2a:00.0"


def alloc(name: str, cpus: list[int], gpus: tuple[str, ...] = ()) -> Allocation:
    return Allocation(name, CPUSet(cpus), CPUSet(), f"topolet/{name}", Owner(pid=100, start_time=7),
                      "exec best-effort/any", 1.0, gpus)


def _doc(allocations: list[dict[str, Any]]) -> bytes:
    """A state file written by hand from the documented format (not by the code under test)."""
    body = {"generation": 1, "reserved": "", "allocations": allocations}
    canon = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return json.dumps({"version": 1, "checksum": "sha256:" + hashlib.sha256(canon.encode()).hexdigest(),
                       "body": body}).encode()


def _alloc_json(name: str = "a", cpus: str = "0", **extra: Any) -> dict[str, Any]:
    return {"id": name, "cpus": cpus, "mems": "", "cgroup": f"topolet/{name}",
            "owner": {"pid": 10, "start_time": 5, "pod_uid": None, "container": None},
            "policy": "exec", "created_at": 1.5, **extra}


def test_gpus_round_trip_through_the_file(tmp_path: Path) -> None:
    sf = StateFile(str(tmp_path))
    written = sf.commit(State((alloc("a", [0], (A18, "GPU-1234")), alloc("b", [1]))))
    loaded = sf.load()
    assert loaded == written
    assert loaded.get("a").gpus == (A18, "GPU-1234")  # type: ignore[union-attr]
    assert loaded.held_gpus() == {A18, "GPU-1234"}
    body = json.loads((tmp_path / "state.json").read_text())["body"]
    by_id = {a["id"]: a for a in body["allocations"]}
    assert by_id["a"]["gpus"] == [A18, "GPU-1234"]
    assert "gpus" not in by_id["b"]  # a file without GPUs stays readable by a topolet without the field


@pytest.mark.parametrize("extra", [{}, {"gpus": []}], ids=["key-missing", "empty-list"])
def test_files_without_gpus_load(tmp_path: Path, extra: dict[str, Any]) -> None:
    (tmp_path / "state.json").write_bytes(_doc([_alloc_json(**extra)]))
    state = StateFile(str(tmp_path)).load()
    assert state.allocations[0].gpus == () and state.held_gpus() == frozenset()


BAD = [
    ("GPU in two allocations", [_alloc_json("a", "0", gpus=[A18]), _alloc_json("b", "1", gpus=[A18])]),
    ("GPU twice in one", [_alloc_json(gpus=[A18, A18])]),
    ("gpus not a list", [_alloc_json(gpus=A18)]),
    ("gpu not text", [_alloc_json(gpus=[18])]),
    ("empty gpu name", [_alloc_json(gpus=[""])]),
    ("gpu name with a slash", [_alloc_json(gpus=["../x"])]),
]


@pytest.mark.parametrize(("name", "allocations"), BAD, ids=[b[0] for b in BAD])
def test_bad_gpu_records_are_refused_and_rebuilt(tmp_path: Path, name: str,
                                                 allocations: list[dict[str, Any]]) -> None:
    sf = StateFile(str(tmp_path))
    (tmp_path / "state.json").write_bytes(_doc(allocations))
    with pytest.raises(StateError):
        sf.load()
    rebuilt = sf.load_or_rebuild(lambda: State())
    assert rebuilt.allocations == () and len(sf.corrupt_copies()) == 1


def test_a_held_gpu_cannot_be_given_again() -> None:
    state = State((alloc("a", [0], (A18,)),))
    with pytest.raises(StateError, match="GPUs"):
        state.with_allocation(alloc("b", [1], (A2A, A18)))
    assert state.with_allocation(alloc("b", [1], (A2A,))).held_gpus() == {A18, A2A}
    assert state.without("a").held_gpus() == frozenset()  # releasing the allocation frees its GPUs


@pytest.mark.parametrize("gpus", [[A18], ("",), (A18, A18), (1,)])
def test_allocation_validates_its_gpus(gpus: Any) -> None:
    with pytest.raises(StateError):
        alloc("a", [0], gpus)
