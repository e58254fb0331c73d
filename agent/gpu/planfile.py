"""`mig-plan.json`: the MIG plan the applier intends, written before it acts so a restart can finish it.

`write_plan_file(state_dir, body)` writes it atomically with a SHA-256 of its body;
`read_plan_file(state_dir)` reads a file that fails its checksum as absent (the applier re-plans from
live NVML state).  The body: `plan_body(desired, plan, status, error)`, `with_status`,
`recorded_gpus(body)` (ConfigError when the record is not one we wrote).  Its fields: README.md, "The
plan file".
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.errors import ConfigError
from agent.gpu.planner import Instance, MigPlan

FILENAME = "mig-plan.json"
VERSION = 1


def _digest(body: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def write_plan_file(state_dir: str | os.PathLike[str], body: dict[str, Any]) -> Path:
    """Atomically replace `<state_dir>/mig-plan.json` with `body` (plus version and checksum)."""
    folder = Path(state_dir)
    folder.mkdir(parents=True, exist_ok=True)
    doc = {"version": VERSION, "body": body, "sha256": _digest(body)}
    target = folder / FILENAME
    tmp = folder / f".{FILENAME}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, sort_keys=True, indent=1)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, target)
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return target


def read_plan_file(state_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The recorded body, or None when the file is missing, unreadable, foreign or corrupt."""
    try:
        doc = json.loads((Path(state_dir) / FILENAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("version") != VERSION:
        return None
    body = doc.get("body")
    if not isinstance(body, dict) or doc.get("sha256") != _digest(body):
        return None
    return body


def plan_body(desired: dict[str, Any], plan: MigPlan | None, status: str, error: str) -> dict[str, Any]:
    """The body recording `plan` (None: no plan made) toward `desired` (`Desired.to_json()`)."""
    body: dict[str, Any] = {"status": status, "desired": desired}
    if plan is not None:
        body["gpus"] = [{"index": g.index,
                         "create": [i.to_json() for i in g.create],
                         "destroy": [{"profile": i.profile, "start": i.start, "size": i.size,
                                      "gi_id": i.gi_id} for i in g.destroy],
                         "layout": [i.to_json() for i in g.layout]} for g in plan.gpus]
    if error:
        body["error"] = error
    return body


def with_status(body: dict[str, Any], status: str, error: str) -> dict[str, Any]:
    """`body` with `status`, and `error` (none when "")."""
    updated = {k: v for k, v in body.items() if k != "error"}
    updated["status"] = status
    if error:
        updated["error"] = error
    return updated


@dataclass(frozen=True, slots=True)
class RecordedGPU:
    """One GPU's part of a recorded plan, keyed by (profile, start)."""

    index: int
    layout: dict[tuple[str, int], Instance]
    create: dict[tuple[str, int], Instance]
    destroy: dict[tuple[str, int], Instance]


def _instances(items: Any) -> dict[tuple[str, int], Instance]:
    if not isinstance(items, list):
        raise ConfigError("recorded MIG plan: instance list expected")
    out: dict[tuple[str, int], Instance] = {}
    for item in items:
        inst = Instance(int(item["start"]), int(item["size"]), str(item["profile"]))
        out[(inst.profile, inst.start)] = inst
    return out


def recorded_gpus(body: Mapping[str, Any]) -> list[RecordedGPU]:
    """The per-GPU steps of a recorded plan; ConfigError when the record is not one we wrote."""
    try:
        return [RecordedGPU(int(g["index"]), _instances(g["layout"]), _instances(g["create"]),
                            _instances(g["destroy"])) for g in body.get("gpus", [])]
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"recorded MIG plan is malformed: {exc!r}") from None
