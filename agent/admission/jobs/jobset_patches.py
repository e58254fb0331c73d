"""The JobSet and TrainJob admitting writes as bodies, and whether each may still be written after a conflict.

Pure: no I/O, no clock.  `jobset_decision_patch(js, record)`, `jobset_still_undecided(js, fresh)`,
`trainjob_placement_patch(tj, js, record)` then `trainjob_decision_patch(tj, js, record)`,
`trainjob_still_undecided(tj, fresh)`.
The rejecting and re-queueing writes are the Job route's (`reject_patch`, `requeue_patch`: metadata
only).  How a JobSet's pods land on their slots: agent/admission/jobs/README.md, "JobSets and TrainJobs".
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from agent.admission.gangs.job import ADMISSION_ANNOTATION, GATE, NUMA_ZONE_ANNOTATION, job_suspended
from agent.admission.gangs.jobset import block_record, blocks, jobset_shape, replicated_jobs
from agent.admission.gangs.record import PLACEMENTS_ANNOTATION, AdmissionRecord, placements_value
from agent.admission.jobs.patches import BY_INDEX_LABEL
from agent.api.objects import as_dict, as_list, metadata_of
from agent.api.ranks import RANK_ANNOTATION

# Ours or none in each replicated Job's pod template: a value a tenant put there is dropped.
_OURS = (PLACEMENTS_ANNOTATION, RANK_ANNOTATION, NUMA_ZONE_ANNOTATION)


def jobset_decision_patch(js: Mapping[str, Any], record: AdmissionRecord) -> dict[str, Any]:
    """Record the decision on the suspended JobSet, hold and place each replicated Job's pods, and
    unsuspend it, in one write (a merge patch: `spec.replicatedJobs` is sent whole, as read at the
    resourceVersion it carries).

    Each replicated Job's pod template gets our scheduling gate and, where the placement policy can
    pin its pods, its slots in `topolet.io/placements` (by rank), the rank rule in
    `topolet.io/placement-rank` and the label `topolet.io/placements-by-index`.  The JobSet webhook
    takes these while the JobSet is suspended (the fields Kueue writes too), and the JobSet controller
    copies them into its suspended Jobs as it resumes them."""
    rjobs = {r.name: r for r in replicated_jobs(js)}
    spans = blocks(list(rjobs.values()))
    out = copy.deepcopy(as_list(as_dict(js.get("spec")).get("replicatedJobs")))
    for entry in out:
        base, rjob = spans[entry["name"]]
        job_spec = entry.setdefault("template", {}).setdefault("spec", {})
        template = job_spec.setdefault("template", {})
        meta = template.setdefault("metadata", {})
        notes = {k: v for k, v in as_dict(meta.get("annotations")).items() if k not in _OURS}
        labels = {k: v for k, v in as_dict(meta.get("labels")).items() if k != BY_INDEX_LABEL[0]}
        placements = placements_value(block_record(record, base, rjob.count), True)
        if placements is not None:
            notes.update({PLACEMENTS_ANNOTATION: placements, RANK_ANNOTATION: rjob.rule.value()})
            labels[BY_INDEX_LABEL[0]] = BY_INDEX_LABEL[1]
        meta["annotations"], meta["labels"] = notes, labels
        pod_spec = template.setdefault("spec", {})
        gates = [as_dict(g) for g in as_list(pod_spec.get("schedulingGates"))]
        if not any(g.get("name") == GATE for g in gates):
            gates.append({"name": GATE})
        pod_spec["schedulingGates"] = gates
    return {"metadata": {"resourceVersion": metadata_of(js).get("resourceVersion"),
                         "annotations": {ADMISSION_ANNOTATION: record.encode()}},
            "spec": {"suspend": False, "replicatedJobs": out}}


def jobset_still_undecided(js: Mapping[str, Any], fresh: Mapping[str, Any]) -> bool:
    """`fresh` (the JobSet re-read after a conflict) is still the JobSet decided on and still
    undecided: same uid, suspended, no admission record, the same replicated Jobs (the JobSet
    controller writes a suspended JobSet's status meanwhile)."""
    if metadata_of(fresh).get("uid") != metadata_of(js).get("uid") or not job_suspended(fresh):
        return False
    if as_dict(metadata_of(fresh).get("annotations")).get(ADMISSION_ANNOTATION) is not None:
        return False
    return (as_dict(fresh.get("spec")).get("replicatedJobs") == as_dict(js.get("spec")).get("replicatedJobs")
            and jobset_shape(fresh) == jobset_shape(js))


# The runtime patch of ours on a TrainJob (its `manager`, as Kueue's is "kueue.x-k8s.io/manager").
RUNTIME_PATCH_MANAGER = "topolet.io/controller"


def trainjob_placement_patch(tj: Mapping[str, Any], js: Mapping[str, Any],
                             record: AdmissionRecord) -> dict[str, Any]:
    """The first of a TrainJob's two admitting writes, while it stays suspended (Trainer's webhook
    takes a runtime patch only then): our runtime patch (`RUNTIME_PATCH_MANAGER`) gives each replicated
    Job of `js`, the JobSet Kubeflow Trainer made for it, our gate and, where the placement policy can
    pin its pods, its slots and rank rule (as `jobset_decision_patch` writes them into a JobSet);
    Trainer merges it into the JobSet as it resumes it, the JobSet controller into its Jobs.  Other
    managers' patches are kept.  No record yet: a TrainJob left here by a crash is decided again."""
    spans = blocks(replicated_jobs(js))
    entries = []
    for name, (base, rjob) in spans.items():
        placements = placements_value(block_record(record, base, rjob.count), True)
        meta: dict[str, Any] = {}
        if placements is not None:
            meta = {"annotations": {PLACEMENTS_ANNOTATION: placements, RANK_ANNOTATION: rjob.rule.value()},
                    "labels": {BY_INDEX_LABEL[0]: BY_INDEX_LABEL[1]}}
        entries.append({"name": name, "template": {"spec": {"template": {
            "metadata": meta, "spec": {"schedulingGates": [{"name": GATE}]}}}}})
    ours = {"manager": RUNTIME_PATCH_MANAGER,
            "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": entries}}}}
    patches = [p for p in as_list(as_dict(tj.get("spec")).get("runtimePatches"))
               if as_dict(p).get("manager") != RUNTIME_PATCH_MANAGER]
    return {"metadata": {"resourceVersion": metadata_of(tj).get("resourceVersion")},
            "spec": {"runtimePatches": [*patches, ours]}}


def trainjob_decision_patch(tj: Mapping[str, Any], js: Mapping[str, Any],
                            record: AdmissionRecord) -> dict[str, Any]:
    """The second: record the decision and unsuspend the TrainJob, in one write (a recorded decision
    always has its TrainJob running, as a Job's)."""
    del js
    return {"metadata": {"resourceVersion": metadata_of(tj).get("resourceVersion"),
                         "annotations": {ADMISSION_ANNOTATION: record.encode()}},
            "spec": {"suspend": False}}


def trainjob_still_undecided(tj: Mapping[str, Any], fresh: Mapping[str, Any]) -> bool:
    """`fresh` (the TrainJob re-read after a conflict) is still the one decided on: same uid, the same
    spec but for the runtime patches (ours is written first), suspended, no admission record (Trainer
    writes its status and each patch's time meanwhile)."""
    if metadata_of(fresh).get("uid") != metadata_of(tj).get("uid") or not job_suspended(fresh):
        return False
    if as_dict(metadata_of(fresh).get("annotations")).get(ADMISSION_ANNOTATION) is not None:
        return False

    def rest(obj: Mapping[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in as_dict(obj.get("spec")).items() if k != "runtimePatches"}
    return rest(fresh) == rest(tj)
