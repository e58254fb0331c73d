"""The admission record a decision leaves on its object, and the slots in the placements format.

Pure: no I/O, no clock (times are passed in).  The Job route writes the record into the Job annotation
`topolet.io/admission`; both routes hand the ledger the decisions they hold as records
(`agent.admission.cluster.capacity`), and both write slots in the `topolet.io/placements` format
that the placement policies (`daemonset/controller/placement-policy.yaml`, the Kueue component's) and
the node's agent (`agent.kube.pods`) read.

Public API:

- `AdmissionRecord` and `record_of(job) -> AdmissionRecord | None` (JobSpecError when the annotation is
  not ours to read); `decode_record(text)`; `AdmissionRecord.encode()`; `SlotPlacement(node, zone)`.
- `placements_value(record, indexed)`: the slots as `topolet.io/placements` ("node:zone" per
  completion index, comma-separated; the zone empty when the slot has none), or None where a
  placement policy cannot use it; `PLACEMENTS_ANNOTATION`, `PLACEMENTS_MAX_CHARS`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agent.admission.gangs.job import ADMISSION_ANNOTATION, JobSpecError
from agent.kube.objects import as_dict, metadata_of
from agent.kube.pods import PLACEMENTS

PLACEMENTS_ANNOTATION = PLACEMENTS  # the agent reads it too (agent.kube.pods)
# Past this the value is not written (pods are patched instead): every pod of the Job carries it
# until the policy strips it, and an object's annotations may total 256 KiB.
PLACEMENTS_MAX_CHARS = 64 * 1024
RESULTS = ("admitted", "rejected")
RECORD_VERSION = 1


@dataclass(frozen=True, slots=True)
class SlotPlacement:
    """Where one slot (completion index, or a numbered place for a non-indexed Job) goes."""

    node: str
    zone: int | None = None


@dataclass(frozen=True, slots=True)
class AdmissionRecord:
    """The decision kept in the Job annotation `topolet.io/admission` (JSON).

    result: admitted | rejected; slots: slot -> placement (admitted only); decision: a unique id;
    time: RFC 3339 UTC; reason: why (rejected), empty otherwise.
    """

    result: str
    decision: str
    time: str
    slots: Mapping[int, SlotPlacement] = field(default_factory=dict)
    reason: str = ""

    def encode(self) -> str:
        """The annotation value: compact, keys sorted, slots keyed by their number as a string."""
        body: dict[str, Any] = {"version": RECORD_VERSION, "result": self.result, "decision": self.decision,
                                "time": self.time}
        if self.result == "admitted":
            body["placement"] = {str(i): ({"node": p.node} if p.zone is None else
                                          {"node": p.node, "zone": p.zone})
                                 for i, p in sorted(self.slots.items())}
        if self.reason:
            body["reason"] = self.reason
        return json.dumps(body, sort_keys=True, separators=(",", ":"))


def decode_record(text: str) -> AdmissionRecord:
    """An annotation value back into a record; JobSpecError when it is not one we wrote."""
    try:
        body = json.loads(text)
    except ValueError as exc:
        raise JobSpecError(f"{ADMISSION_ANNOTATION} is not JSON") from exc
    if not isinstance(body, dict) or body.get("result") not in RESULTS:
        raise JobSpecError(f"{ADMISSION_ANNOTATION} has no result admitted or rejected")
    decision, time = body.get("decision"), body.get("time")
    if not isinstance(decision, str) or not decision or not isinstance(time, str):
        raise JobSpecError(f"{ADMISSION_ANNOTATION} has no decision id or time")
    slots: dict[int, SlotPlacement] = {}
    if body["result"] == "admitted":
        placement = body.get("placement")
        if not isinstance(placement, dict) or not placement:
            raise JobSpecError(f"{ADMISSION_ANNOTATION}: an admitted record needs a placement")
        for key, value in placement.items():
            value = as_dict(value)
            node, zone = value.get("node"), value.get("zone")
            if (not key.isdigit() or not isinstance(node, str) or not node
                    or not (zone is None or (isinstance(zone, int) and not isinstance(zone, bool)
                                             and zone >= 0))):
                raise JobSpecError(f"{ADMISSION_ANNOTATION}: bad placement for slot {key!r}")
            slots[int(key)] = SlotPlacement(node, zone)
    reason = body.get("reason", "")
    return AdmissionRecord(result=body["result"], decision=decision, time=time, slots=slots,
                           reason=reason if isinstance(reason, str) else "")


def record_of(job: Mapping[str, Any]) -> AdmissionRecord | None:
    """The Job's admission record, None when it has none (JobSpecError when it is malformed)."""
    text = as_dict(metadata_of(job).get("annotations")).get(ADMISSION_ANNOTATION)
    if text is None:
        return None
    if not isinstance(text, str):
        raise JobSpecError(f"{ADMISSION_ANNOTATION} is not a string")
    return decode_record(text)


def placements_value(record: AdmissionRecord, indexed: bool) -> str | None:
    """The slots as `topolet.io/placements`: "node:zone" per completion index, in index order.

    None where the placement policy cannot use it: a non-indexed Job (its pods carry no index), slots
    that are not exactly 0..n-1, or a value longer than PLACEMENTS_MAX_CHARS."""
    if not indexed or record.result != "admitted" or sorted(record.slots) != list(range(len(record.slots))):
        return None
    value = ",".join(f"{p.node}:{'' if p.zone is None else p.zone}"
                     for _, p in sorted(record.slots.items()))
    return value if len(value) <= PLACEMENTS_MAX_CHARS else None
