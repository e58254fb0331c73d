"""JobSets as gangs on the native route: a queued JobSet read into a `Gang`, and which pod holds which slot.

Pure: no I/O, no clock.  `replicated_jobs(js)` (`JobSpecError` names what is wrong), `gang_from_jobset`,
`jobset_shape`, `jobset_finished`, `blocks` (each replicated Job's slots in the record),
`JobSetOwner` / `jobset_owner` (`.refusal(pod)`, `.slot_of(pod)`), `jobset_slots`, `jobset_keys`,
`pods_of_jobsets`.

A JobSet's gang has one pod set per replicated Job, of replicas × pods per Job (each Job Indexed).
Its pods are told apart as Kueue's TAS ranks them: rank = `jobset.sigs.k8s.io/job-index` × pods per
Job + the completion index; the record numbers the slots replicated Job by replicated Job in name
order (`admitted_record`), so a pod's slot is its replicated Job's first slot plus its rank.
agent/admission/gangs/README.md, "JobSets".
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from agent.admission.engine.model import NODE_POLICY, Gang
from agent.admission.gangs.job import JobSpecError, gang_from_job, job_pod_spec
from agent.admission.gangs.limitrange import NO_DEFAULTS, ContainerDefaults
from agent.admission.gangs.record import AdmissionRecord, SlotPlacement
from agent.admission.gangs.shape import SHAPE_CHARS, job_shape
from agent.admission.gangs.slots import (
    JobOwner,
    SlotAssignment,
    assign_slots,
    owner_of,
    pod_gated,
    pod_live,
    pod_target,
    pods_by,
)
from agent.api.names import COMPLETION_INDEX
from agent.api.objects import as_dict, as_list, metadata_of, namespaced_name
from agent.api.ranks import RankRule
from agent.api.validate import is_dns_label

JOBSET_API_VERSION, JOBSET_KIND = "jobset.x-k8s.io/v1alpha2", "JobSet"
JOBSET = (JOBSET_API_VERSION, JOBSET_KIND)  # as an owner reference or an Event's involved object names it
JOBSET_GROUP, JOBSET_VERSION, JOBSET_PLURAL = "jobset.x-k8s.io", "v1alpha2", "jobsets"
# What the JobSet controller labels each of its Jobs and their pods with (its api/jobset/v1alpha2).
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
JOBSET_UID_LABEL = "jobset.sigs.k8s.io/jobset-uid"
REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
JOB_INDEX_LABEL = "jobset.sigs.k8s.io/job-index"
GANG_PREFIX = "jobset:"
MAX_REPLICATED_JOBS = 64


@dataclass(frozen=True, slots=True)
class ReplicatedJob:
    """One replicated Job of a JobSet: `replicas` Indexed Jobs of `per_job` pods, as a Job (`job`: the
    JobSet's metadata with the replicated Job's Job spec) the Job route's readers read."""

    name: str
    replicas: int
    per_job: int
    job: Mapping[str, Any]

    @property
    def count(self) -> int:
        return self.replicas * self.per_job

    @property
    def rule(self) -> RankRule:
        """How its pods are ranked: job index × pods per Job + completion index."""
        return RankRule(COMPLETION_INDEX, JOB_INDEX_LABEL, self.per_job)


def replicated_jobs(js: Mapping[str, Any]) -> tuple[ReplicatedJob, ...]:
    """The JobSet's replicated Jobs, in spec order; JobSpecError when one cannot be a pod set here."""
    meta = metadata_of(js)
    raw = as_list(as_dict(js.get("spec")).get("replicatedJobs"))
    if not raw or len(raw) > MAX_REPLICATED_JOBS:
        raise JobSpecError(f"spec.replicatedJobs must hold 1 to {MAX_REPLICATED_JOBS} replicated Jobs")
    out: list[ReplicatedJob] = []
    for i, entry in enumerate(raw):
        entry = as_dict(entry)
        name, replicas = entry.get("name"), entry.get("replicas", 1)
        where = f"spec.replicatedJobs[{i}]"
        if not isinstance(name, str) or not is_dns_label(name):
            raise JobSpecError(f"{where}.name must be a DNS label")
        if any(r.name == name for r in out):
            raise JobSpecError(f"{where}.name {name!r} is named twice")
        if isinstance(replicas, bool) or not isinstance(replicas, int) or not 1 <= replicas <= 10_000:
            raise JobSpecError(f"{where}.replicas must be 1 to 10000, got {replicas!r}")
        spec = as_dict(as_dict(entry.get("template")).get("spec"))
        if spec.get("completionMode") != "Indexed":
            raise JobSpecError(f"{where} ({name}) is not Indexed (template.spec.completionMode): its "
                               "pods could not be told apart, one slot each")
        completions, parallelism = spec.get("completions"), spec.get("parallelism", 1)
        if (isinstance(completions, bool) or not isinstance(completions, int) or completions < 1
                or isinstance(parallelism, bool) or not isinstance(parallelism, int) or parallelism < 1):
            raise JobSpecError(f"{where} ({name}) needs positive completions and parallelism")
        if parallelism < completions:
            raise JobSpecError(f"{where} ({name}): parallelism {parallelism} under completions "
                               f"{completions} would run its pods in waves, not as one gang")
        out.append(ReplicatedJob(name, replicas, completions, {"metadata": meta, "spec": spec}))
    return tuple(out)


def jobset_queued_key(js: Mapping[str, Any]) -> str:
    """The gang key of a JobSet: apart from a Job's `namespace/name` by its prefix."""
    return f"{GANG_PREFIX}{namespaced_name(js)}"


def part_key(gang_key: str, rjob: str) -> str:
    """The ledger key of one replicated Job's slots of the JobSet gang `gang_key`."""
    return f"{gang_key}/{rjob}"


def jobset_finished(js: Mapping[str, Any]) -> bool:
    """True once the JobSet has a terminal state, or a true Completed or Failed condition."""
    status = as_dict(js.get("status"))
    if status.get("terminalState") in ("Completed", "Failed"):
        return True
    return any(as_dict(c).get("type") in ("Completed", "Failed") and as_dict(c).get("status") == "True"
               for c in as_list(status.get("conditions")))


def gang_from_jobset(js: Mapping[str, Any], priorities: Mapping[str, int],
                     guaranteed_policy: str = NODE_POLICY, default_priority: int = 0,
                     limit_defaults: ContainerDefaults = NO_DEFAULTS, key: str | None = None) -> Gang:
    """The JobSet as a gang (`key`, else `jobset_queued_key`): one pod set per replicated Job (named as
    it is), of replicas × pods per Job, each read as `gang_from_job` reads a Job's template; the
    priority the highest of theirs."""
    pod_sets, priority = [], None
    for rjob in replicated_jobs(js):
        try:
            one = gang_from_job(rjob.job, priorities, guaranteed_policy, default_priority, limit_defaults)
        except JobSpecError as exc:
            raise JobSpecError(f"replicated Job {rjob.name}: {exc}") from None
        pod_sets.append(replace(one.pod_sets[0], name=rjob.name, count=rjob.count))
        priority = one.priority if priority is None else max(priority, one.priority)
    return Gang(key=key or jobset_queued_key(js), pod_sets=tuple(pod_sets), priority=int(priority or 0))


def jobset_shape(js: Mapping[str, Any]) -> str:
    """The fingerprint of the JobSet's uid, its replicated Jobs' names and replicas and each one's Job
    shape (`job_shape`): a record written for another shape is not trusted."""
    try:
        rjobs = replicated_jobs(js)
    except JobSpecError:
        return ""
    body = [metadata_of(js).get("uid"), [[r.name, r.replicas, job_shape(r.job)] for r in rjobs]]
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:SHAPE_CHARS]


def blocks(rjobs: Sequence[ReplicatedJob]) -> dict[str, tuple[int, ReplicatedJob]]:
    """Each replicated Job's first slot in the record, and itself: blocks of `count` slots in name
    order, as `admitted_record` numbers a placement's pods by (pod set, index)."""
    out, base = {}, 0
    for rjob in sorted(rjobs, key=lambda r: r.name):
        out[rjob.name] = (base, rjob)
        base += rjob.count
    return out


def block_record(record: AdmissionRecord, base: int, count: int) -> AdmissionRecord:
    """The slots `base` .. `base + count - 1` of `record`, numbered from 0 (one replicated Job's)."""
    return replace(record, slots={i: record.slots[base + i] for i in range(count)
                                  if base + i in record.slots})


@dataclass(frozen=True)
class JobSetOwner:
    """An admitted JobSet as its pods name it: each made by the Job controller for one of its Jobs
    (`JobOwner.refusal` against that Job, named `<jobset>-<replicated Job>-<job index>`), labelled with
    the JobSet's uid, name and replicated Job, asking what that replicated Job's template asks."""

    namespace: str
    name: str
    uid: str
    parts: Mapping[str, tuple[int, ReplicatedJob, JobOwner]]  # replicated Job -> (first slot, it, asks)

    def _part(self, pod: Mapping[str, Any]) -> tuple[tuple[int, ReplicatedJob, JobOwner] | None, str | None]:
        meta = metadata_of(pod)
        labels = as_dict(meta.get("labels"))
        for key, value in ((JOBSET_UID_LABEL, self.uid), (JOBSET_NAME_LABEL, self.name)):
            if labels.get(key) != value:
                return None, f"it lacks the JobSet controller's label {key}: {value}"
        part = self.parts.get(str(labels.get(REPLICATED_JOB_LABEL)))
        if part is None:
            return None, f"its label {REPLICATED_JOB_LABEL} names no replicated Job of JobSet {self.name}"
        ref = next((as_dict(r) for r in as_list(meta.get("ownerReferences"))
                    if as_dict(r).get("controller") is True), {})
        job = f"{self.name}-{part[1].name}-{labels.get(JOB_INDEX_LABEL)}"
        why = replace(part[2], name=job, uid=str(ref.get("uid"))).refusal(pod)
        return (part, None) if why is None else (None, why)

    def refusal(self, pod: Mapping[str, Any]) -> str | None:
        """Why `pod` is not one of this JobSet's own pods; None when it is."""
        return self._part(pod)[1]

    def slot_of(self, pod: Mapping[str, Any]) -> int | None:
        """The record slot of one of its pods (`refusal` None: not checked again here): its replicated
        Job's first slot plus its rank; None when its indexes cannot be read or are past its
        replicated Job's."""
        part = self.parts.get(str(as_dict(metadata_of(pod).get("labels")).get(REPLICATED_JOB_LABEL)))
        if part is None:
            return None
        base, rjob, _ = part
        rank = rjob.rule.rank(metadata_of(pod))
        return None if rank is None or rank >= rjob.count else base + rank


def jobset_owner(js: Mapping[str, Any], limit_defaults: ContainerDefaults = NO_DEFAULTS) -> JobSetOwner:
    """The admitted JobSet as its pods must name it (JobSpecError when it cannot be read)."""
    meta = metadata_of(js)
    ns, uid = str(meta.get("namespace")), str(meta.get("uid"))
    parts = {}
    for name, (base, rjob) in blocks(replicated_jobs(js)).items():
        parts[name] = (base, rjob, owner_of(ns, "", "", job_pod_spec(rjob.job, limit_defaults)))
    return JobSetOwner(ns, str(meta.get("name")), uid, parts)


def jobset_slots(owner: JobSetOwner, slots: Mapping[int, SlotPlacement],
                 pods: Iterable[Mapping[str, Any]]) -> SlotAssignment:
    """Which slot each of the JobSet's live pods holds and which gated one gets which (`assign_slots`
    one replicated Job at a time, by rank); the pods that name it but are not its own are `refused`."""
    by_part: dict[str, list[Mapping[str, Any]]] = {name: [] for name in owner.parts}
    refused = []
    for pod in pods:
        why = owner.refusal(pod)
        if why is None:
            by_part[str(as_dict(metadata_of(pod).get("labels")).get(REPLICATED_JOB_LABEL))].append(pod)
        elif pod_live(pod) and (pod_gated(pod) or pod_target(pod) is not None):
            refused.append((pod, why))
    held: dict[str, int] = {}
    place: list[tuple[Mapping[str, Any], int]] = []
    for name, (base, rjob, _) in owner.parts.items():
        mine = {i: slots[i] for i in range(base, base + rjob.count) if i in slots}
        done = assign_slots(mine, by_part[name], True, index_of=owner.slot_of)
        held.update(done.held)
        place += done.place
    return SlotAssignment(held, tuple(place), tuple(refused))


def jobset_keys(pod: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """(namespace, the JobSet uid a pod is labelled with): a candidate only, `JobSetOwner` decides."""
    meta = metadata_of(pod)
    uid = as_dict(meta.get("labels")).get(JOBSET_UID_LABEL)
    return ((str(meta.get("namespace")), uid),) if isinstance(uid, str) and uid else ()


def pods_of_jobsets(pods: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], list[Mapping[str, Any]]]:
    """Pods by `jobset_keys`."""
    return pods_by(pods, jobset_keys)


# -- TrainJobs: queued on the TrainJob, shaped by the JobSet Kubeflow Trainer makes for it -------------

TRAINJOB_API_VERSION, TRAINJOB_KIND = "trainer.kubeflow.org/v1alpha1", "TrainJob"
TRAINJOB = (TRAINJOB_API_VERSION, TRAINJOB_KIND)
TRAINJOB_GROUP, TRAINJOB_VERSION, TRAINJOB_PLURAL = "trainer.kubeflow.org", "v1alpha1", "trainjobs"
TRAINJOB_PREFIX = "trainjob:"


def trainjob_key(tj: Mapping[str, Any]) -> str:
    """The gang key of a TrainJob."""
    return f"{TRAINJOB_PREFIX}{namespaced_name(tj)}"


def trainjob_finished(tj: Mapping[str, Any]) -> bool:
    """True once the TrainJob has a true Complete or Failed condition."""
    return any(as_dict(c).get("type") in ("Complete", "Failed") and as_dict(c).get("status") == "True"
               for c in as_list(as_dict(tj.get("status")).get("conditions")))


def controlled_by(obj: Mapping[str, Any], kind: tuple[str, str]) -> dict[str, Any] | None:
    """`obj`'s controller owner reference when it is of `kind` (apiVersion, kind), else None."""
    for ref in as_list(metadata_of(obj).get("ownerReferences")):
        ref = as_dict(ref)
        if ref.get("controller") is True and (ref.get("apiVersion"), ref.get("kind")) == kind:
            return ref
    return None


def controller_uid(obj: Mapping[str, Any], kind: tuple[str, str]) -> str | None:
    """The uid of `obj`'s controller owner when it is of `kind` (apiVersion, kind), else None."""
    uid = as_dict(controlled_by(obj, kind)).get("uid")
    return uid if isinstance(uid, str) else None
