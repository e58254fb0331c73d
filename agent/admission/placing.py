"""Carrying out an admission: the record on the Job, the patch bodies, and which pod takes which slot.

Pure: no I/O, no clock (times are passed in).  The controller (`agent.admission.controller`) calls
these and sends what they return.

Public API:

- `AdmissionRecord` and `record_of(job) -> AdmissionRecord | None` (JobSpecError when the annotation is
  not ours to read); `AdmissionRecord.encode()`; `SlotPlacement(node, zone)`.
- Patch bodies (JSON merge patches, each carrying the resourceVersion it was computed from so a
  concurrent writer makes it fail instead of being overwritten): `decision_patch(job, record)` pins
  (one node, `one_node_template`) or gates the still-suspended Job's template, records the decision
  and unsuspends the Job, in one write; `unsuspend_patch()` (for a Job admitted but left suspended,
  by an earlier version);
  `reject_patch(job, record)`; `pod_patch(pod, node, zone)` pins a gated pod to its node and
  zone and removes the gate in one write.
- `placements_value(record, indexed)`: the slots as the placement policy reads them (see below).
- `assign_slots(slots, pods, indexed) -> SlotAssignment`: which live pod holds which slot, and which
  gated pod gets which free slot (see `assign_slots`).
- `pod_gated(pod)`, `pod_live(pod)`, `pod_target(pod)`, `completion_index(pod)`, `node_affinity(node)`.
- `still_undecided(job, fresh) -> bool`: whether a decision made on `job` may still be written onto
  its re-read version `fresh` (after a 409).

Three routes to a pinned pod.  A Job placed wholly on one node (most gangs: the engine keeps a gang
on one node where that costs no whole zone) needs no per-pod pin: the decision patch writes the node
into the pod template (`one_node_template`), with the zone as `topolet.io/numa-zone` when all slots
share it, else as `topolet.io/placements` (an Indexed Job; the node's agent reads its own index's
entry), and adds no gate.  The pods are created pinned: no pod write, no policy at work.  For a Job
over several nodes, the decision patch of an Indexed Job also writes the slots into the pod
template's annotation `topolet.io/placements` ("node:zone" per completion index, comma-separated;
the zone empty when the slot has none) and the label `topolet.io/placements-by-index: "true"` (the
policy's objectSelector: other pods never meet the policy).  Where the MutatingAdmissionPolicy
`topolet-placement` (daemonset/controller/placement-policy.yaml) is installed, the API server pins
each pod as the Job controller creates it: node selector (and required node affinity on the
node's name, `node_affinity`) and zone from its index's entry, our gate and the placements
annotation removed.  No pod write by the controller, no second scheduling pass.  Wherever the policy
is absent, fails or does not apply (a non-indexed Job; a value over PLACEMENTS_MAX_CHARS; a pod
without the label), the pod is created gated and the controller pins it with `pod_patch`, which
removes the placements annotation too, so the node's agent never sees it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agent.admission.jobs import (
    ADMISSION_ANNOTATION,
    COMPLETION_INDEX_ANNOTATION,
    GATE,
    HOSTNAME_LABEL,
    NUMA_ZONE_ANNOTATION,
    JobSpecError,
    as_dict,
    as_list,
    job_indexed,
    job_suspended,
    meta_of,
)
from agent.kube.pods import PLACEMENTS, placement_entry

PLACEMENTS_ANNOTATION = PLACEMENTS  # the agent reads it too (agent.kube.pods)
# On the pod template beside PLACEMENTS_ANNOTATION (gated Indexed Jobs): the placement policy's
# objectSelector, so the API server skips the policy outright for every other pod it creates.
BY_INDEX_LABEL = ("topolet.io/placements-by-index", "true")
# Past this the value is not written (pods are patched instead): every pod of the Job carries it
# until the policy strips it, and an object's annotations may total 256 KiB.
PLACEMENTS_MAX_CHARS = 64 * 1024
REQUIRED_AFFINITY = "requiredDuringSchedulingIgnoredDuringExecution"
RESULTS = ("admitted", "rejected")
RECORD_VERSION = 1


# -- the admission record ---------------------------------------------------------------------------

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
    text = as_dict(meta_of(job).get("annotations")).get(ADMISSION_ANNOTATION)
    if text is None:
        return None
    if not isinstance(text, str):
        raise JobSpecError(f"{ADMISSION_ANNOTATION} is not a string")
    return decode_record(text)


# -- patch bodies -----------------------------------------------------------------------------------

def _gates(spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [as_dict(g) for g in as_list(spec.get("schedulingGates"))]


def placements_value(record: AdmissionRecord, indexed: bool) -> str | None:
    """The slots as `topolet.io/placements`: "node:zone" per completion index, in index order.

    None where the placement policy cannot use it: a non-indexed Job (its pods carry no index), slots
    that are not exactly 0..n-1, or a value longer than PLACEMENTS_MAX_CHARS."""
    if not indexed or record.result != "admitted" or sorted(record.slots) != list(range(len(record.slots))):
        return None
    value = ",".join(f"{p.node}:{'' if p.zone is None else p.zone}"
                     for _, p in sorted(record.slots.items()))
    return value if len(value) <= PLACEMENTS_MAX_CHARS else None


def one_node_template(record: AdmissionRecord, pod_spec: Mapping[str, Any],
                      indexed: bool) -> dict[str, Any] | None:
    """The pod template change that pins every pod of a Job placed wholly on one node, with no gate
    (None when the slots span nodes, or their zones differ and the pods carry no completion index).

    The node selector `kubernetes.io/hostname=<node>` (other selectors kept) and, where the template
    has no affinity, the required node affinity on the node's name (`node_affinity`); the zone as
    `topolet.io/numa-zone` when every slot has the same one, else as `topolet.io/placements` (the
    node's agent reads its completion index's entry, `agent.kube.pods`)."""
    places = set(record.slots.values())
    nodes = {p.node for p in places}
    if record.result != "admitted" or len(nodes) != 1:
        return None
    (node,) = nodes
    annotations: dict[str, str] = {}
    if len(places) > 1:
        placements = placements_value(record, indexed)
        if placements is None:
            return None
        annotations[PLACEMENTS_ANNOTATION] = placements
    else:
        (place,) = places
        if place.zone is not None:
            annotations[NUMA_ZONE_ANNOTATION] = str(place.zone)
    spec: dict[str, Any] = {"nodeSelector": {HOSTNAME_LABEL: node}}
    if pod_spec.get("affinity") is None:  # an empty one too is the user's (and the write policy's)
        spec["affinity"] = {"nodeAffinity": node_affinity(node)}
    template: dict[str, Any] = {"spec": spec}
    if annotations:
        template["metadata"] = {"annotations": annotations}
    return template


def decision_patch(job: Mapping[str, Any], record: AdmissionRecord) -> dict[str, Any]:
    """Record the decision on the suspended Job, pin its pod template, and unsuspend, in one write.

    One write makes the decision atomic: a recorded decision always has its Job running.  Job
    validation takes the template change because the *old* Job is suspended and never started.  A Job
    placed on one node gets `one_node_template`: its pods are created pinned.  Any other gets our
    gate, and an Indexed Job's template also `topolet.io/placements` (see the module docstring)."""
    pod_spec = as_dict(as_dict(as_dict(job.get("spec")).get("template")).get("spec"))
    template = one_node_template(record, pod_spec, job_indexed(job))
    if template is None:
        gates = _gates(pod_spec)
        if not any(g.get("name") == GATE for g in gates):
            gates.append({"name": GATE})
        template = {"spec": {"schedulingGates": gates}}
        placements = placements_value(record, job_indexed(job))
        if placements is not None:
            template["metadata"] = {"annotations": {PLACEMENTS_ANNOTATION: placements},
                                    "labels": {BY_INDEX_LABEL[0]: BY_INDEX_LABEL[1]}}
    return {"metadata": {"resourceVersion": meta_of(job).get("resourceVersion"),
                         "annotations": {ADMISSION_ANNOTATION: record.encode()}},
            "spec": {"suspend": False, "template": template}}


def still_undecided(job: Mapping[str, Any], fresh: Mapping[str, Any]) -> bool:
    """`fresh` (the Job re-read after a conflict) is still the Job decided on and still undecided.

    Same uid, still suspended, no admission record, same pod template: only something the decision
    does not read moved on (the Job controller writes a suspended Job's status), so the decision may
    be written with `fresh`'s resourceVersion.  A record there means another writer (a replica that
    led before) decided first; a changed template means other requests than the ones placed."""
    if meta_of(fresh).get("uid") != meta_of(job).get("uid") or not job_suspended(fresh):
        return False
    if as_dict(meta_of(fresh).get("annotations")).get(ADMISSION_ANNOTATION) is not None:
        return False
    return as_dict(fresh.get("spec")).get("template") == as_dict(job.get("spec")).get("template")


def unsuspend_patch() -> dict[str, Any]:
    """Let the Job controller create the (gated) pods."""
    return {"spec": {"suspend": False}}


def reject_patch(job: Mapping[str, Any], record: AdmissionRecord) -> dict[str, Any]:
    """Record a "never" refusal; the Job stays suspended."""
    return {"metadata": {"resourceVersion": meta_of(job).get("resourceVersion"),
                         "annotations": {ADMISSION_ANNOTATION: record.encode()}}}


def pod_gated(pod: Mapping[str, Any]) -> bool:
    """The pod still carries our scheduling gate."""
    return any(g.get("name") == GATE for g in _gates(as_dict(pod.get("spec"))))


def pod_patch(pod: Mapping[str, Any], node: str, zone: int | None) -> dict[str, Any]:
    """Pin a gated pod to `node` (and NUMA `zone`) and remove our gate, in one write.

    Only what the node and the scheduler read: no annotation of our own beside the zone (the node's
    agent refuses a pod with a `topolet.io/` annotation it does not know), so a pod's slot is found
    again by `assign_slots`; the placements annotation the template gave it is removed.  A pod with no
    required node affinity also gets one on the node's name (`node_affinity`)."""
    spec = as_dict(pod.get("spec"))
    gates = [g for g in _gates(spec) if g.get("name") != GATE]
    body: dict[str, Any] = {
        "metadata": {"resourceVersion": meta_of(pod).get("resourceVersion")},
        "spec": {"nodeSelector": {HOSTNAME_LABEL: node}, "schedulingGates": gates or None}}
    if not as_dict(as_dict(spec.get("affinity")).get("nodeAffinity")).get(REQUIRED_AFFINITY):
        body["spec"]["affinity"] = {"nodeAffinity": node_affinity(node)}
    annotations: dict[str, str | None] = {}
    if PLACEMENTS_ANNOTATION in as_dict(meta_of(pod).get("annotations")):
        annotations[PLACEMENTS_ANNOTATION] = None
    if zone is not None:
        annotations[NUMA_ZONE_ANNOTATION] = str(zone)
    if annotations:
        body["metadata"]["annotations"] = annotations
    return body


def node_affinity(node: str) -> dict[str, Any]:
    """Required node affinity on the node's name, beside the hostname selector: the same node, but the
    scheduler's NodeAffinity PreFilter narrows a pod with a `metadata.name` field term to that one
    node, where a label selector makes it filter every node of the cluster to find it."""
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    return {REQUIRED_AFFINITY: {"nodeSelectorTerms": [term]}}


def completion_index(pod: Mapping[str, Any]) -> int | None:
    """The pod's completion index (Indexed Jobs), None when it has none."""
    text = as_dict(meta_of(pod).get("annotations")).get(COMPLETION_INDEX_ANNOTATION)
    return int(text) if isinstance(text, str) and text.isdigit() else None


def pod_target(pod: Mapping[str, Any]) -> SlotPlacement | None:
    """The (node, zone) we pinned the pod to, None if unpinned: our nodeSelector, and the zone
    annotation or (a one-node Job's pod) its completion index's entry in the placements annotation."""
    node = as_dict(as_dict(pod.get("spec")).get("nodeSelector")).get(HOSTNAME_LABEL)
    if not isinstance(node, str) or not node or pod_gated(pod):
        return None
    notes = as_dict(meta_of(pod).get("annotations"))
    zone = notes.get(NUMA_ZONE_ANNOTATION)
    index = completion_index(pod)
    if zone is None and isinstance(notes.get(PLACEMENTS_ANNOTATION), str) and index is not None:
        entry = placement_entry(notes[PLACEMENTS_ANNOTATION], index)
        return SlotPlacement(node, entry[1] if not isinstance(entry, str) and entry[0] == node else None)
    return SlotPlacement(node, int(zone) if isinstance(zone, str) and zone.isdigit() else None)


@dataclass(frozen=True, slots=True)
class SlotAssignment:
    """held: pod uid -> the slot it holds; place: (gated pod, slot) pairs to patch, in order."""

    held: Mapping[str, int]
    place: tuple[tuple[Mapping[str, Any], int], ...]


def _creation(pod: Mapping[str, Any]) -> tuple[str, str]:
    meta = meta_of(pod)
    return (str(meta.get("creationTimestamp") or ""), str(meta.get("name") or ""))


def assign_slots(slots: Mapping[int, SlotPlacement], pods: Sequence[Mapping[str, Any]],
                 indexed: bool) -> SlotAssignment:
    """Which slot each live pod of an admitted Job holds, and which free slot each gated one gets.

    A live pod we pinned holds a slot with its (node, zone): its completion index's slot when that
    matches, else the lowest free slot that does.  A gated pod gets its completion index's slot when
    that is free, else the lowest free slot, oldest pod first; more gated pods than free slots (an old
    pod still terminating) wait.  A replacement pod therefore gets the slot of the pod it replaces.
    """
    live = sorted((p for p in pods if pod_live(p)), key=_creation)
    free = dict(sorted(slots.items()))
    held: dict[str, int] = {}
    for pod in live:
        target = pod_target(pod)
        if target is None:
            continue
        index = completion_index(pod) if indexed else None
        slot = index if index in free and free[index] == target else next(
            (i for i, p in free.items() if p == target), None)
        if slot is not None:
            held[str(meta_of(pod).get("uid"))] = slot
            del free[slot]
    gated = [p for p in live if pod_gated(p)]
    chosen: dict[str, int] = {}
    if indexed:  # own index first, so a pod beyond the slots does not take another pod's index
        for pod in gated:
            index = completion_index(pod)
            if index is not None and index in free:
                chosen[str(meta_of(pod).get("uid"))] = index
                del free[index]
    place = []
    for pod in gated:
        uid = str(meta_of(pod).get("uid"))
        if uid not in chosen:
            if not free:
                continue
            chosen[uid] = next(iter(free))
            del free[chosen[uid]]
        place.append((pod, chosen[uid]))
        held[uid] = chosen[uid]
    return SlotAssignment(held, tuple(place))


def pod_live(pod: Mapping[str, Any]) -> bool:
    """Not being deleted and not finished: the pod still holds (or will hold) its slot's resources."""
    if meta_of(pod).get("deletionTimestamp"):
        return False
    return as_dict(pod.get("status")).get("phase") not in ("Succeeded", "Failed")
