"""The state file's bytes: `{"version": 1, "checksum": "sha256:<hex>", "body": {...}}`, read strictly.

The checksum is taken over the canonical JSON of the body (sorted keys, no spaces).  Decoding checks
the version, the checksum and every field of the body (keys, types, cpulists; no NaN or Infinity)
and builds the values, which check themselves; anything off is a StateError.

Public API: `encode(state) -> bytes`, `decode(data) -> State`, `VERSION`.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from agent.enforce.state import Allocation, Owner, State
from agent.errors import CPUListError, StateError
from agent.topology.cpuset import CPUSet

VERSION = 1


def _body(state: State) -> dict[str, Any]:
    """The JSON body of `state` (what the checksum covers).

    `gpus` is written only when an allocation holds GPUs, and `affinity` (NUMA node ids) only under
    the pod scope, so a file without either still loads in a topolet that predates the field.
    """
    return {
        "generation": state.generation,
        "reserved": state.reserved.cpulist(),
        "allocations": [
            {
                **({"gpus": list(a.gpus)} if a.gpus else {}),
                **({"affinity": a.affinity.cpulist()} if a.affinity else {}),
                "id": a.id,
                "cpus": a.cpus.cpulist(),
                "mems": a.mems.cpulist(),
                "cgroup": a.cgroup,
                "owner": {
                    "pid": a.owner.pid,
                    "start_time": a.owner.start_time,
                    "pod_uid": a.owner.pod_uid,
                    "container": a.owner.container,
                },
                "policy": a.policy,
                "created_at": a.created_at,
            }
            for a in state.allocations
        ],
    }


def _state(body: object) -> State:
    """Validate a decoded JSON body field by field; raises StateError on anything off."""
    b = _obj(body, "body", {"generation", "reserved", "allocations"})
    allocs = b["allocations"]
    if not isinstance(allocs, list):
        raise StateError("allocations is not a list")
    return State(
        allocations=tuple(_allocation(a, i) for i, a in enumerate(allocs)),
        reserved=_cpulist(b["reserved"], "reserved"),
        generation=_int(b["generation"], "generation"),
    )


def _obj(value: object, what: str, keys: set[str], optional: frozenset[str] = frozenset()) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise StateError(f"{what} is not an object")
    if not keys <= set(value) <= keys | optional:
        raise StateError(f"{what} has keys {sorted(value)}, expected {sorted(keys)}")
    return value


def _int(value: object, what: str, *, optional: bool = False) -> Any:
    if value is None and optional:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise StateError(f"{what} is not an integer")
    return value


def _str(value: object, what: str, *, optional: bool = False) -> Any:
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise StateError(f"{what} is not a string")
    return value


def _cpulist(value: object, what: str) -> CPUSet:
    text = _str(value, what)
    try:
        return CPUSet.parse(text)
    except CPUListError as exc:
        raise StateError(f"{what}: {exc}") from exc


def _allocation(value: object, index: int) -> Allocation:
    what = f"allocations[{index}]"
    a = _obj(value, what, {"id", "cpus", "mems", "cgroup", "owner", "policy", "created_at"},
             frozenset({"gpus", "affinity"}))
    o = _obj(a["owner"], f"{what}.owner", {"pid", "start_time", "pod_uid", "container"})
    created = a["created_at"]
    if not isinstance(created, int | float) or isinstance(created, bool):
        raise StateError(f"{what}.created_at is not a number")
    gpus = a.get("gpus", [])
    if not isinstance(gpus, list):
        raise StateError(f"{what}.gpus is not a list")
    return Allocation(
        id=_str(a["id"], f"{what}.id"),
        cpus=_cpulist(a["cpus"], f"{what}.cpus"),
        mems=_cpulist(a["mems"], f"{what}.mems"),
        cgroup=_str(a["cgroup"], f"{what}.cgroup"),
        owner=Owner(
            pid=_int(o["pid"], f"{what}.owner.pid", optional=True),
            start_time=_int(o["start_time"], f"{what}.owner.start_time", optional=True),
            pod_uid=_str(o["pod_uid"], f"{what}.owner.pod_uid", optional=True),
            container=_str(o["container"], f"{what}.owner.container", optional=True),
        ),
        policy=_str(a["policy"], f"{what}.policy"),
        created_at=float(created),
        gpus=tuple(_str(g, f"{what}.gpus[{i}]") for i, g in enumerate(gpus)),
        affinity=_cpulist(a["affinity"], f"{what}.affinity") if "affinity" in a else CPUSet(),
    )


def _canonical(body: object) -> bytes:
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return text.encode()


def encode(state: State) -> bytes:
    """The file's bytes for `state`."""
    body = _body(state)
    checksum = "sha256:" + hashlib.sha256(_canonical(body)).hexdigest()
    doc = {"version": VERSION, "checksum": checksum, "body": body}
    return (json.dumps(doc, sort_keys=True, indent=1, allow_nan=False) + "\n").encode()


def _no_constants(name: str) -> object:
    raise StateError(f"non-finite number {name} in the state file")


def decode(data: bytes) -> State:
    """Parse and check a state file's bytes; raises StateError for anything but a valid version-1 file."""
    try:
        doc = json.loads(data.decode("utf-8"), parse_constant=_no_constants)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise StateError(f"not a JSON document: {exc}") from exc
    if not isinstance(doc, dict):
        raise StateError("not a JSON object")
    version = doc.get("version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise StateError("no version")
    if version != VERSION:
        raise StateError(f"unknown state file version {version}")
    _obj(doc, "state file", {"version", "checksum", "body"})
    want = doc["checksum"]
    got = "sha256:" + hashlib.sha256(_canonical(doc["body"])).hexdigest()
    if want != got:
        raise StateError("checksum mismatch")
    return _state(doc["body"])
