"""What each Ready Workload holds in the ledger: its entries, one per pod set, and its pods' slots.

Pure: no I/O.  `Holds().of(wl, check, pods, indexed, limit_defaults)` -> (entries, pod slots,
refused), recomputed only when something it read changed; `.end_pass(live)`; `entries`,
`ready_entries`; `Held`, `Refused`, `PODSET_LABEL`.  Templates are read with the namespace's
LimitRange defaults, as on the Job route; only the pods the Job controller made from the pod set's
template hold its slots, and of a pod group's Workload (a LeaderWorkerSet's, a StatefulSet's, plain
pods') only its member pods (`group_members`), by rank.  agent/admission/kueue/README.md, "Templates
and LimitRanges".
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from agent.admission.engine.model import Gang, Placement, Resources
from agent.admission.gangs.job import JobSpecError, gang_requests
from agent.admission.gangs.jobset import controlled_by, jobset_owner, jobset_slots
from agent.admission.gangs.limitrange import NO_DEFAULTS, ContainerDefaults, with_limit_range_defaults
from agent.admission.gangs.record import AdmissionRecord, SlotPlacement
from agent.admission.gangs.slots import (
    JOB_API_VERSION,
    JOB_KIND,
    JobOwner,
    PodAsks,
    assign_slots,
    job_slots,
    owner_of,
    pod_asks,
)
from agent.admission.kueue import workloads
from agent.admission.kueue.workloads import WorkloadSpecError
from agent.api.objects import as_dict, as_list, metadata_of, object_key
from agent.api.ranks import RANK_ANNOTATION, RankRule, parse_rank_rule

log = logging.getLogger(__name__)

PODSET_LABEL = "kueue.x-k8s.io/podset"  # Kueue labels each pod with its pod set's name
Held = tuple[str, AdmissionRecord, Callable[[], Resources]]  # one pod set's entry in the ledger
# A Ready Workload's (uid, resourceVersion, check, Job indexed, its pods' (uid, resourceVersion), its
# namespace's LimitRange defaults, its JobSet's resourceVersion).
HoldKey = tuple[str, str, str, bool, tuple[tuple[str, str], ...], ContainerDefaults, str | None]
Refused = tuple[JobOwner, Mapping[str, Any], str]  # a pod that names the Job but holds no slot, and why
Hold = tuple[list[Held], dict[str, tuple[str, str]], list[Refused]]


class Holds:
    """The Ready Workloads' ledger entries and pod slots by version: a pass on a big queue reads them
    from here (see README.md beside this module)."""

    def __init__(self) -> None:
        # `_read` collects those read this pass, which replace `_held` at its end.
        self._held: dict[HoldKey, Hold] = {}
        self._read: dict[HoldKey, Hold] = {}
        self._unreadable: set[tuple[str, str]] = set()  # (uid, resourceVersion) logged once

    def of(self, wl: dict[str, Any], check: str, pods: list[Mapping[str, Any]], indexed: bool,
           limit_defaults: ContainerDefaults = NO_DEFAULTS, jobset: Mapping[str, Any] | None = None) -> Hold:
        """The Workload's ledger entries, its pods' slots and the pods refused one, held under our
        Ready `check`, its pods created where the LimitRanges fill in `limit_defaults`; `jobset`: the
        JobSet whose pods they are (the Workload's owner, or a TrainJob's), which tells them apart."""
        meta = metadata_of(wl)
        version = (str(meta.get("uid")), str(meta.get("resourceVersion")), check, indexed,
                   tuple(sorted((str(metadata_of(p).get("uid")), str(metadata_of(p).get("resourceVersion")))
                                for p in pods)), limit_defaults,
                   None if jobset is None else str(metadata_of(jobset).get("resourceVersion")))
        held = self._held.get(version)
        if held is None:
            held = self._now(wl, check, pods, indexed, limit_defaults, jobset)
        self._read[version] = held
        return held

    def end_pass(self, live: set[tuple[str, str]]) -> None:
        """Keep what this pass read, and the unreadable Workload versions still `live`."""
        self._unreadable &= live  # bounded by the Workloads there are
        self._held, self._read = self._read, {}

    def _now(self, wl: dict[str, Any], check: str, pods: list[Mapping[str, Any]], indexed: bool,
             limit_defaults: ContainerDefaults, jobset: Mapping[str, Any] | None = None) -> Hold:
        """A Ready Workload's ledger entries, the slot each of its Job's live pods holds (pod uid ->
        (gang key, slot)) and the pods refused one; none when its state cannot be read (said once per
        Workload version)."""
        state = workloads.check_state(wl, check) or {}
        try:
            records = workloads.records_of_state(wl, state)
        except WorkloadSpecError as exc:
            version = (str(metadata_of(wl).get("uid")), str(metadata_of(wl).get("resourceVersion")))
            if version not in self._unreadable:
                self._unreadable.add(version)
                log.warning("Workload %s: %s; its capacity is not counted", object_key(wl), exc)
            return [], {}, []
        held = entries(wl, records, limit_defaults)
        slots: dict[str, tuple[str, str]] = {}
        refused: list[Refused] = []
        job = _job_of(wl)
        if job is None:  # a pod group's members and a JobSet's pods hold by rank; no other owner's
            if group_members(wl):
                slots.update(_group_slots(wl, state, held, pods, limit_defaults))
            elif jobset is not None:
                slots.update(jobset_held(held, pods, jobset, limit_defaults))
            elif workloads.owner_kind(wl) == MPIJOB:  # the MPI operator's: its workers and launcher
                slots.update(_group_slots(wl, state, held, pods, limit_defaults, mpijob_pods(wl, pods)))
            return held, slots, refused
        templates = _templates(wl)
        for key, record, _ in held:
            pod_set = key.rsplit("/", 1)[1]
            mine = pods if len(records) == 1 else [
                p for p in pods if as_dict(metadata_of(p).get("labels")).get(PODSET_LABEL) == pod_set]
            pod_spec = with_limit_range_defaults(as_dict(templates.get(pod_set, {}).get("spec")),
                                                 limit_defaults)
            owner = owner_of(str(metadata_of(wl).get("namespace")), job[0], job[1], pod_spec)
            assignment = job_slots(owner, record.slots, mine, indexed)
            slots.update({uid: (key, str(slot)) for uid, slot in assignment.held.items()})
            refused += [(owner, pod, why) for pod, why in assignment.refused]
        return held, slots, refused


def group_members(wl: Mapping[str, Any]) -> frozenset[str]:
    """The uids of the pods of a pod group's Workload (a LeaderWorkerSet's, a StatefulSet's, plain
    pods'): Kueue names each member pod among the Workload's owners (a tenant cannot write Workloads);
    none for any other Workload."""
    if workloads.owner_kind(wl) not in workloads.UNGATED_OWNERS:
        return frozenset()
    return frozenset(str(as_dict(r).get("uid")) for r in as_list(metadata_of(wl).get("ownerReferences"))
                     if (as_dict(r).get("apiVersion"), as_dict(r).get("kind")) == workloads.POD_OWNER)


def _group_slots(wl: Mapping[str, Any], state: Mapping[str, Any], held: list[Held],
                 pods: list[Mapping[str, Any]], limit_defaults: ContainerDefaults,
                 members: frozenset[str] | None = None) -> dict[str, tuple[str, str]]:
    """The slot each live member pod of a pod group's Workload holds (pod uid -> (ledger key, slot)): a
    member pod of the pod set (PODSET_LABEL) that asks what its template asks, pinned to the slot of
    its rank (the Ready state's rule), or, in a pod set of one slot, to that slot.  `members`: the pods
    that may hold them (default: the members the Workload names, `group_members`)."""
    members = group_members(wl) if members is None else members
    templates = _templates(wl)
    updates = {str(as_dict(u).get("name")): as_dict(u) for u in as_list(state.get("podSetUpdates"))}
    out: dict[str, tuple[str, str]] = {}
    for key, record, _ in held:
        pod_set = key.rsplit("/", 1)[1]
        template = as_dict(templates.get(pod_set, {}).get("spec"))
        asks = _asks(with_limit_range_defaults(template, limit_defaults))
        if asks is None:
            continue
        mine = [p for p in pods if str(metadata_of(p).get("uid")) in members
                and as_dict(metadata_of(p).get("labels")).get(PODSET_LABEL) == pod_set
                and _asks(as_dict(p.get("spec"))) == asks]
        rule = parse_rank_rule(as_dict(updates.get(pod_set, {}).get("annotations")).get(RANK_ANNOTATION))
        index_of: Callable[[Mapping[str, Any]], int | None] | None = None
        if rule is not None:
            index_of = partial(_rank_of, rule)
        assignment = assign_slots(record.slots, mine, rule is not None, index_of)
        out.update({uid: (key, str(slot)) for uid, slot in assignment.held.items()})
    return out


def _asks(pod_spec: Mapping[str, Any]) -> PodAsks | None:
    try:
        return pod_asks(pod_spec)
    except JobSpecError:
        return None


def _rank_of(rule: RankRule, pod: Mapping[str, Any]) -> int | None:
    return rule.rank(metadata_of(pod))


def _job_of(wl: Mapping[str, Any]) -> tuple[str, str] | None:
    """(name, uid) of the batch/v1 Job that controls the Workload (Kueue's reference, which a tenant
    cannot write: Workloads are Kueue's), None for any other owner."""
    for ref in as_list(metadata_of(wl).get("ownerReferences")):
        ref = as_dict(ref)
        if ref.get("controller") is True:
            name, uid = ref.get("name"), ref.get("uid")
            if (ref.get("apiVersion"), ref.get("kind")) != (JOB_API_VERSION, JOB_KIND) or not (
                    isinstance(name, str) and isinstance(uid, str)):
                return None
            return name, uid
    return None


def _templates(wl: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The Workload's pod set templates by pod set name: what Kueue admitted (its copy of the Job's
    template as written: without the LimitRange defaults the API server gives the pods, which the
    callers fill in)."""
    return {str(as_dict(ps).get("name")): as_dict(as_dict(ps).get("template"))
            for ps in as_list(as_dict(wl.get("spec")).get("podSets"))}


def _ledger_key(wl: Mapping[str, Any], pod_set: str) -> str:
    """The ledger's gang key of one pod set of a Workload (the ledger takes one request per gang)."""
    return f"{workloads.gang_key(wl)}/{pod_set}"


def entries(wl: Mapping[str, Any], records: Mapping[str, AdmissionRecord],
            limit_defaults: ContainerDefaults = NO_DEFAULTS) -> list[Held]:
    """The ledger entries of a Workload's decision, one per pod set, each pod's requests those of its
    template with `limit_defaults` filled in."""
    templates = _templates(wl)
    return [(_ledger_key(wl, pod_set), record,
             partial(gang_requests, {"spec": {"template": templates.get(pod_set, {})}}, limit_defaults))
            for pod_set, record in records.items()]


def ready_entries(wl: Mapping[str, Any], check: str, gang: Gang, placement: Placement, now: str,
                  limit_defaults: ContainerDefaults = NO_DEFAULTS) -> list[Held]:
    """The ledger entries the Ready state for `placement` will carry once written (the same records
    `records_of_state` reads back from it); none when it cannot be written (Rejected instead)."""
    try:
        updates = workloads.pod_set_updates(gang, placement, lambda _: workloads.BY_COMPLETION_INDEX)
        state = workloads.ready_state(check, gang, placement, updates, now)
        return entries(wl, workloads.records_of_state(wl, state), limit_defaults)
    except WorkloadSpecError:
        return []


def jobset_held(held: list[Held], pods: list[Mapping[str, Any]], js: Mapping[str, Any],
                limit_defaults: ContainerDefaults = NO_DEFAULTS) -> dict[str, tuple[str, str]]:
    """The slot each live pod of the JobSet `js` (a JobSet's or a TrainJob's Workload) holds, pod uid ->
    (ledger key, slot): one the Job controller made for one of its Jobs from that replicated Job's
    template (`agent.admission.gangs.jobset.JobSetOwner`), pinned to its rank's slot of its pod set
    (a replicated Job).  A pod set split over TAS domains holds none (its ledger keys are per domain)."""
    try:
        owner = jobset_owner(js, limit_defaults)
    except JobSpecError:
        return {}
    slots: dict[int, SlotPlacement] = {}
    where: dict[int, tuple[str, int]] = {}  # the JobSet's slot -> (ledger key, the pod set's slot)
    for key, record, _ in held:
        part = owner.parts.get(key.rsplit("/", 1)[1])
        if part is None or len(record.slots) != part[1].count:
            continue
        for i, place in record.slots.items():
            slots[part[0] + i] = place
            where[part[0] + i] = (key, i)
    assignment = jobset_slots(owner, slots, pods)
    return {uid: (where[slot][0], str(where[slot][1])) for uid, slot in assignment.held.items()}


MPIJOB = ("kubeflow.org/v2beta1", "MPIJob")


MPI_JOB_NAME_LABEL = "training.kubeflow.org/job-name"  # the MPI operator's, on its workers and launcher


def mpijob_pods(wl: Mapping[str, Any], pods: list[Mapping[str, Any]]) -> frozenset[str]:
    """The uids of the pods the MPI operator made for the MPIJob that owns `wl`, among `pods`: its
    workers (their controller the MPIJob) and its launcher (its controller the batch/v1 Job
    `<mpijob>-launcher`, labelled with the MPIJob's name and the launcher role)."""
    ref = workloads.controller_ref(wl) or {}
    name, uid = ref.get("name"), ref.get("uid")
    out: set[str] = set()
    if not isinstance(name, str) or not isinstance(uid, str):
        return frozenset()
    for pod in pods:
        meta = metadata_of(pod)
        labels = as_dict(meta.get("labels"))
        launcher = as_dict(controlled_by(pod, (JOB_API_VERSION, JOB_KIND)))
        if (as_dict(controlled_by(pod, MPIJOB)).get("uid") == uid
                or (launcher.get("name") == f"{name}-launcher" and labels.get(MPI_JOB_NAME_LABEL) == name
                    and labels.get("training.kubeflow.org/job-role") == "launcher")):
            out.add(str(meta.get("uid")))
    return frozenset(out)
