"""The Job route's writes as bodies: the admitting, unsuspending and rejecting Job patches, and the pod pin.

Pure: no I/O, no clock.  `decision_patch`, `reject_patch`, `requeue_patch`, `lost_patch`,
`restart_patch`, `unpin_patch`, `pod_patch`, `node_affinity`, `still_undecided`.  Every body is a
merge patch carrying the resourceVersion it was computed from, so a concurrent writer makes it fail
instead of being overwritten.  The three routes to a pinned pod (one-node template, placement
policy, gated pod): agent/admission/jobs/README.md, "Patches".
"""
from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from agent.admission.gangs.job import (
    ADMISSION_ANNOTATION,
    GATE,
    HOSTNAME_LABEL,
    NUMA_ZONE_ANNOTATION,
    job_indexed,
    job_suspended,
)
from agent.admission.gangs.record import PLACEMENTS_ANNOTATION, AdmissionRecord, placements_value
from agent.admission.gangs.shape import job_shape
from agent.admission.gangs.slots import scheduling_gates
from agent.api.objects import as_dict, metadata_of

MERGE_PATCH = "application/merge-patch+json"
# On the pod template beside PLACEMENTS_ANNOTATION (gated Indexed Jobs): the placement policy's
# objectSelector, so the API server skips the policy outright for every other pod it creates.
BY_INDEX_LABEL = ("topolet.io/placements-by-index", "true")
REQUIRED_AFFINITY = "requiredDuringSchedulingIgnoredDuringExecution"


def one_node_template(record: AdmissionRecord, pod_spec: Mapping[str, Any],
                      indexed: bool) -> dict[str, Any] | None:
    """The pod template change that pins every pod of a Job placed wholly on one node, with no gate
    (None when the slots span nodes, or their zones differ and the pods carry no completion index).

    The node selector `kubernetes.io/hostname=<node>` (other selectors kept) and, where the template
    has no affinity, the required node affinity on the node's name (`node_affinity`); the zone as
    `topolet.io/numa-zone` when every slot has the same one, else as `topolet.io/placements` (the
    node's agent reads its completion index's entry, `agent.api.placements`)."""
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
        value = place.zone_value()
        if value is not None:
            annotations[NUMA_ZONE_ANNOTATION] = value
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
    gate, and an Indexed Job's template also `topolet.io/placements` (see README.md beside this module)."""
    pod_spec = as_dict(as_dict(as_dict(job.get("spec")).get("template")).get("spec"))
    template = one_node_template(record, pod_spec, job_indexed(job))
    if template is None:
        gates = scheduling_gates(pod_spec)
        if not any(g.get("name") == GATE for g in gates):
            gates.append({"name": GATE})
        template = {"spec": {"schedulingGates": gates}}
        placements = placements_value(record, job_indexed(job))
        if placements is not None:
            template["metadata"] = {"annotations": {PLACEMENTS_ANNOTATION: placements},
                                    "labels": {BY_INDEX_LABEL[0]: BY_INDEX_LABEL[1]}}
    # Ours or none: a value the tenant wrote there is removed (null in a merge patch).
    notes: dict[str, str | None] = template.setdefault("metadata", {}).setdefault("annotations", {})
    for key in (PLACEMENTS_ANNOTATION, NUMA_ZONE_ANNOTATION):
        notes.setdefault(key, None)
    return {"metadata": {"resourceVersion": metadata_of(job).get("resourceVersion"),
                         "annotations": {ADMISSION_ANNOTATION: record.encode()}},
            "spec": {"suspend": False, "template": template}}


def still_undecided(job: Mapping[str, Any], fresh: Mapping[str, Any]) -> bool:
    """`fresh` (the Job re-read after a conflict) is still the Job decided on and still undecided.

    Same uid, still suspended, no admission record, same pod template and shape: only something the
    decision does not read moved on (the Job controller writes a suspended Job's status), so the decision may
    be written with `fresh`'s resourceVersion.  A record there means another writer (a replica that
    led before) decided first; a changed template means other requests than the ones placed."""
    if metadata_of(fresh).get("uid") != metadata_of(job).get("uid") or not job_suspended(fresh):
        return False
    if as_dict(metadata_of(fresh).get("annotations")).get(ADMISSION_ANNOTATION) is not None:
        return False
    return (as_dict(fresh.get("spec")).get("template") == as_dict(job.get("spec")).get("template")
            and job_shape(fresh) == job_shape(job))


def requeue_patch(job: Mapping[str, Any]) -> dict[str, Any]:
    """Remove the admission record of the (suspended) Job: the next pass decides it again."""
    return {"metadata": {"resourceVersion": metadata_of(job).get("resourceVersion"),
                         "annotations": {ADMISSION_ANNOTATION: None}}}


def lost_patch(job: Mapping[str, Any]) -> dict[str, Any]:
    """Suspend an admitted Job whose pods cannot be placed (a node of its record is gone) and remove
    its record, in one write: the Job controller removes its pods and the Job is queued again."""
    return {"metadata": {"resourceVersion": metadata_of(job).get("resourceVersion"),
                         "annotations": {ADMISSION_ANNOTATION: None}},
            "spec": {"suspend": True}}


def restart_patch(job: Mapping[str, Any]) -> dict[str, Any]:
    """The status patch that clears a queued Job's `status.startTime` (the Job was admitted before):
    the API server takes a change of a Job's pod template only while it is suspended and not
    started, and a new decision changes it."""
    return {"metadata": {"resourceVersion": metadata_of(job).get("resourceVersion")},
            "status": {"startTime": None}}


def job_started(job: Mapping[str, Any]) -> bool:
    """Whether the Job's `status.startTime` is set (it ran since it was last queued)."""
    return as_dict(job.get("status")).get("startTime") is not None


def unpin_patch(job: Mapping[str, Any], nodes: Collection[str]) -> dict[str, Any] | None:
    """Remove from a queued Job's pod template what an earlier decision of ours left there, so it is
    decided afresh (None when nothing is left): our gate, the placements, zone and `placements-by-index`
    label, and a node selector `kubernetes.io/hostname` naming a node not among `nodes` (gone) with
    the node affinity `one_node_template` wrote beside it."""
    template = as_dict(as_dict(job.get("spec")).get("template"))
    meta, pod_spec = metadata_of(template), as_dict(template.get("spec"))
    out: dict[str, Any] = {}
    gates = scheduling_gates(pod_spec)
    if any(g.get("name") == GATE for g in gates):
        out["schedulingGates"] = [g for g in gates if g.get("name") != GATE] or None
    node = as_dict(pod_spec.get("nodeSelector")).get(HOSTNAME_LABEL)
    if isinstance(node, str) and node not in nodes:
        out["nodeSelector"] = {HOSTNAME_LABEL: None}
        if pod_spec.get("affinity") == {"nodeAffinity": node_affinity(node)}:
            out["affinity"] = None
    notes = {k: None for k in (PLACEMENTS_ANNOTATION, NUMA_ZONE_ANNOTATION)
             if k in as_dict(meta.get("annotations"))}
    labels = {BY_INDEX_LABEL[0]: None} if BY_INDEX_LABEL[0] in as_dict(meta.get("labels")) else {}
    if not (out or notes or labels):
        return None
    body: dict[str, Any] = {"spec": out} if out else {}
    if notes or labels:
        body["metadata"] = {k: v for k, v in (("annotations", notes), ("labels", labels)) if v}
    return {"metadata": {"resourceVersion": metadata_of(job).get("resourceVersion")},
            "spec": {"template": body}}


def reject_patch(job: Mapping[str, Any], record: AdmissionRecord) -> dict[str, Any]:
    """Record a "never" refusal; the Job stays suspended."""
    return {"metadata": {"resourceVersion": metadata_of(job).get("resourceVersion"),
                         "annotations": {ADMISSION_ANNOTATION: record.encode()}}}


def pod_patch(pod: Mapping[str, Any], node: str, zone: int | str | None) -> dict[str, Any]:
    """Pin a gated pod to `node` (and NUMA `zone`: a node id, or a `topolet.io/numa-zone` value,
    `SlotPlacement.zone_value`) and remove our gate, in one write.

    Only what the node and the scheduler read: no annotation of our own beside the zone (the node's
    agent refuses a pod with a `topolet.io/` annotation it does not know), so a pod's slot is found
    again by `assign_slots`; the placements annotation the template gave it is removed.  A pod with no
    required node affinity also gets one on the node's name (`node_affinity`)."""
    spec = as_dict(pod.get("spec"))
    gates = [g for g in scheduling_gates(spec) if g.get("name") != GATE]
    body: dict[str, Any] = {
        "metadata": {"resourceVersion": metadata_of(pod).get("resourceVersion")},
        "spec": {"nodeSelector": {HOSTNAME_LABEL: node}, "schedulingGates": gates or None}}
    if not as_dict(as_dict(spec.get("affinity")).get("nodeAffinity")).get(REQUIRED_AFFINITY):
        body["spec"]["affinity"] = {"nodeAffinity": node_affinity(node)}
    annotations: dict[str, str | None] = {}
    if PLACEMENTS_ANNOTATION in as_dict(metadata_of(pod).get("annotations")):
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
