"""`mig-plan.json`: the MIG plan the applier intends, written before it acts so a restart can finish it.

Written atomically (temp file, fsync, rename, fsync the folder) with a SHA-256 of its body; a file
that fails its checksum reads as absent (the applier re-plans from live NVML state, never trusts it).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

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
