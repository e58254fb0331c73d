"""Who holds which CPUs, from `topolet status`'s data (`status_data`, the `--format json` shape).

Pure: the data in, the `Usage` a status picture colours and the names its legend shows out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agent.enforce.state import printable
from agent.render.layout import Holder, Usage
from agent.topology.cpuset import CPUSet


def owner_name(alloc: Mapping[str, Any]) -> str:
    """`pod UID/container`, `pid N (id)`, or the allocation id when the owner is unknown."""
    aid = str(alloc["id"])
    uid = alloc.get("pod_uid")
    if uid:
        # A pod container's allocation id is `pod-<uid>.<container>` (agent/kube/pods/pinner.py: alloc_id).
        prefix = f"pod-{uid}."
        container = aid[len(prefix):] if aid.startswith(prefix) else ""
        name = f"pod {uid}/{container}" if container else f"pod {uid} ({aid})"
    elif alloc.get("pid"):
        name = f"pid {alloc['pid']} ({aid})"
    else:
        name = f"{aid} (owner unknown)"
    return printable(name + ("" if alloc.get("alive", True) else ", gone"))


def usage_of(data: Mapping[str, Any]) -> Usage:
    """The holders (in the state's order) and reserved CPUs of a `status_data` result."""
    holders = tuple(Holder(owner_name(a), CPUSet.parse(a["cpus"])) for a in data["allocations"])
    return Usage(holders, CPUSet.parse(data["reserved"]))
