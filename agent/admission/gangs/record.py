"""The admission record a decision leaves on its object, and the slots in the placements format.

Pure: no I/O, no clock.  `AdmissionRecord` (`.encode()`, `decode_record`, `record_of(job)`),
`admitted_record`, `record_too_long`, `SlotPlacement(node, zone).zone_value()`, `placements_value`.
The `topolet.io/placements` format is read by the placement policies and `agent.api.placements`:
change all three together.  Formats and limits: agent/admission/gangs/README.md.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agent.admission.engine.model import Placement
from agent.admission.gangs.job import ADMISSION_ANNOTATION, JobSpecError
from agent.api.names import PLACEMENTS
from agent.api.objects import as_dict, decimal, json_int, json_object, metadata_of
from agent.api.placements import MAX_CONTAINER_ZONES, MAX_NUMA_ZONE, numa_zone_value

PLACEMENTS_ANNOTATION = PLACEMENTS  # the agent reads it too (agent.api.placements)
# Past this the value is not written (pods are patched instead): every pod of the Job carries it
# until the policy strips it, and an object's annotations may total 256 KiB.
PLACEMENTS_MAX_CHARS = 64 * 1024
RESULTS = ("admitted", "rejected")
# The record is one of the Job's annotations, which may total 256 KiB: a gang whose record would be
# longer than RECORD_MAX_CHARS is not admitted (`record_too_long`), so it fits beside the tenant's
# own; one read back may be as long as the API server lets it be.
RECORD_MAX_CHARS = 128 * 1024
_READ_MAX_CHARS = 256 * 1024
MAX_SLOTS = 100_000  # agent.admission.gangs.job.MAX_POD_SET
_RECORD_DEPTH = 4  # {"placement": {"0": {"node": ..., "zones": [...]}}}
_SHORT = 64  # a decision id, a time
_NODE_NAME_MAX = 253  # a DNS subdomain
RECORD_VERSION = 1


@dataclass(frozen=True, slots=True)
class SlotPlacement:
    """Where one slot (completion index, or a numbered place for a non-indexed Job) goes; `zones`: a
    pod the container scope split, each container's zone in spec order (`zone` None)."""

    node: str
    zone: int | None = None
    zones: tuple[int, ...] = ()

    def zone_value(self) -> str | None:
        """The slot's `topolet.io/numa-zone` value (`agent.api.placements.numa_zone_value`), None for none."""
        return numa_zone_value(self.zone, self.zones)


@dataclass(frozen=True, slots=True)
class AdmissionRecord:
    """The decision kept in the Job annotation `topolet.io/admission` (JSON).

    result: admitted | rejected; slots: slot -> placement (admitted only); decision: a unique id;
    time: RFC 3339 UTC; reason: why (rejected), empty otherwise; shape: the fingerprint of the Job
    it was written for (`agent.admission.gangs.shape.job_shape`; empty on a record without one).
    """

    result: str
    decision: str
    time: str
    slots: Mapping[int, SlotPlacement] = field(default_factory=dict)
    reason: str = ""
    shape: str = ""

    def encode(self) -> str:
        """The annotation value: compact, keys sorted, slots keyed by their number as a string."""
        body: dict[str, Any] = {"version": RECORD_VERSION, "result": self.result, "decision": self.decision,
                                "time": self.time}
        if self.result == "admitted":
            body["placement"] = {str(i): _slot_body(p) for i, p in sorted(self.slots.items())}
        if self.reason:
            body["reason"] = self.reason
        if self.shape:
            body["shape"] = self.shape
        return json.dumps(body, sort_keys=True, separators=(",", ":"))


def _slot_body(p: SlotPlacement) -> dict[str, Any]:
    """One slot in the record: its node, and its zone or (a split pod) its containers' zones (a key
    older readers do not know is written only then)."""
    if p.zones:
        return {"node": p.node, "zones": list(p.zones)}
    return {"node": p.node} if p.zone is None else {"node": p.node, "zone": p.zone}


def _zones(value: object) -> tuple[int, ...] | None:
    """A slot's `zones` list read strictly: 2 to MAX_CONTAINER_ZONES NUMA ids; None when it is not one."""
    if not isinstance(value, list) or not 2 <= len(value) <= MAX_CONTAINER_ZONES:
        return None
    zones = tuple(json_int(z, MAX_NUMA_ZONE) for z in value)
    return None if any(z is None for z in zones) else tuple(z for z in zones if z is not None)


def decode_record(text: str) -> AdmissionRecord:
    """An annotation value back into a record; JobSpecError when it is not one we wrote.

    Strict, as a tenant may write anything there: at most 256 KiB of JSON nested as the record is,
    slot numbers ASCII decimals below MAX_SLOTS, zones NUMA ids, short strings."""
    body = json_object(text, _READ_MAX_CHARS, _RECORD_DEPTH)
    if body is None:
        raise JobSpecError(f"{ADMISSION_ANNOTATION} is not a JSON object of at most "
                           f"{_READ_MAX_CHARS // 1024} KiB")
    if body.get("result") not in RESULTS:
        raise JobSpecError(f"{ADMISSION_ANNOTATION} has no result admitted or rejected")
    decision, time = body.get("decision"), body.get("time")
    if not _short(decision) or not isinstance(time, str) or len(time) > _SHORT:
        raise JobSpecError(f"{ADMISSION_ANNOTATION} has no decision id or time")
    slots: dict[int, SlotPlacement] = {}
    if body["result"] == "admitted":
        placement = body.get("placement")
        if not isinstance(placement, dict) or not placement or len(placement) > MAX_SLOTS:
            raise JobSpecError(f"{ADMISSION_ANNOTATION}: an admitted record needs a placement "
                               f"of 1 to {MAX_SLOTS} slots")
        for key, value in placement.items():
            value = as_dict(value)
            slot, node, zone = decimal(key, MAX_SLOTS - 1), value.get("node"), value.get("zone")
            zones = _zones(value["zones"]) if "zones" in value else ()
            if (slot is None or not isinstance(node, str) or not node or len(node) > _NODE_NAME_MAX
                    or not (zone is None or json_int(zone, MAX_NUMA_ZONE) is not None)
                    or zones is None or (zones and zone is not None)):
                raise JobSpecError(f"{ADMISSION_ANNOTATION}: bad placement for slot {key[:16]!r}")
            slots[slot] = SlotPlacement(node, zone, zones)
    reason, shape = body.get("reason", ""), body.get("shape", "")
    return AdmissionRecord(result=body["result"], decision=str(decision), time=time, slots=slots,
                           reason=reason if isinstance(reason, str) else "",
                           shape=shape if _short(shape) else "")


def _short(value: object) -> bool:
    return isinstance(value, str) and 0 < len(value) <= _SHORT


def admitted_record(placement: Placement, decision: str, time: str, shape: str = "") -> AdmissionRecord:
    """The record of an admission: slots numbered in (pod set, index) order; `shape`, the Job's."""
    pods = sorted(placement.pods, key=lambda p: (p.pod_set, p.index))
    return AdmissionRecord("admitted", decision, time, {i: SlotPlacement(p.node, p.zone, p.zones)
                                                        for i, p in enumerate(pods)}, shape=shape)


def record_too_long(placement: Placement) -> str | None:
    """Why the record of `placement` cannot be written (longer than RECORD_MAX_CHARS), else None."""
    chars = len(admitted_record(placement, "0" * 32, "2000-01-01T00:00:00Z").encode())
    if chars <= RECORD_MAX_CHARS:
        return None
    return (f"its admission record would take {chars // 1024} KiB for {len(placement.pods)} pods, "
            f"over the {RECORD_MAX_CHARS // 1024} KiB a Job annotation may hold here: split the gang")


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
    that are not exactly 0..n-1, a slot split per container (its pods are pinned one by one), or a
    value longer than PLACEMENTS_MAX_CHARS."""
    if not indexed or record.result != "admitted" or sorted(record.slots) != list(range(len(record.slots))):
        return None
    if any(p.zones for p in record.slots.values()):
        return None
    value = ",".join(f"{p.node}:{'' if p.zone is None else p.zone}"
                     for _, p in sorted(record.slots.items()))
    return value if len(value) <= PLACEMENTS_MAX_CHARS else None
