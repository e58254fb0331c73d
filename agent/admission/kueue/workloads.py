"""Kueue Workloads as gangs, and the `topolet.io/topology-fit` check's state bodies.

Pure: no I/O, no clock.  `gang_from_workload` (`WorkloadSpecError`), `to_decide`, `checks_to_decide`,
`holding`, `our_checks`, `active_status`, `pod_set_updates`, `records_of_state`, the state bodies
(`ready_state`, `retry_state`, `rejected_state`, `status_apply`) and the names (`CONTROLLER_NAME`,
`KUEUE_GROUP`/`KUEUE_VERSION`, `FAILSAFE_LABEL`); `owner_kind`, `slot_rule` (`RANKED_OWNERS`:
`OPERATOR_OWNERS`, `UNGATED_OWNERS`); `owner_notes`, `pod_group_notes` (the template annotations Kueue
leaves out of a pod group's Workload).  A pod set spread
over several slots needs a rank rule: its pods stay Pending unless the placement policy pins them.
How a Ready Workload's pods land on their slots: agent/admission/kueue/README.md.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from agent.admission.engine.model import NODE_POLICY, Gang, Placement
from agent.admission.gangs.job import (
    HOSTNAME_LABEL,
    NUMA_POLICY_ANNOTATION,
    NUMA_ZONE_ANNOTATION,
    JobSpecError,
    gang_from_job,
)
from agent.admission.gangs.limitrange import NO_DEFAULTS, ContainerDefaults
from agent.admission.gangs.record import (
    PLACEMENTS_ANNOTATION,
    AdmissionRecord,
    SlotPlacement,
    placements_value,
)
from agent.admission.kueue import tas
from agent.api.names import COMPLETION_INDEX
from agent.api.objects import as_dict, as_list, metadata_of, namespaced_name
from agent.api.placements import parse_numa_zone, parse_placement
from agent.api.ranks import RANK_ANNOTATION, RankRule, rank_rule

CONTROLLER_NAME = "topolet.io/topology-fit"
KUEUE_GROUP, KUEUE_VERSION = "kueue.x-k8s.io", "v1beta2"
API_VERSION = f"{KUEUE_GROUP}/{KUEUE_VERSION}"
# Under node-restriction.kubernetes.io/: the NodeRestriction admission plugin refuses it to kubelets,
# the agent's policy (daemonset/admission-policy.yaml) to agents, and the kueue component's
# failsafe-policy.yaml to every writer of Nodes.
FAILSAFE_LABEL = ("node-restriction.kubernetes.io/topolet.awaiting-placement", "true")
# The key before it, no longer written: a Job Kueue started from an older Ready state still carries it
# in its template, so the placement policy pins pods by either key (and refuses it on Nodes) for now.
LEGACY_FAILSAFE_KEY = "topolet.io/awaiting-placement"
RETRY_BASE_SECONDS = 5
RETRY_MAX_SECONDS = 300
MESSAGE_MAX = 1024  # ours are one line; the API allows 32768
JOB_OWNER = ("batch/v1", "Job")
# An Indexed Job's pods are told apart by their completion index: the placement policy's default rule.
BY_COMPLETION_INDEX = RankRule(COMPLETION_INDEX)
NOT_INDEXED = ("its pods have no completion index to tell them apart: make it an Indexed Job "
               "(spec.completionMode: Indexed)")
# The owners whose pods are placed one slot each by the rank rule Kueue writes in each pod set's
# topologyRequest.  An explicit table, not every owner whose pod sets name a podIndexLabel: each kind's
# index labels must be set by something a tenant cannot steer (the fields policy guards them, see
# daemonset/controller/fields-policy.yaml), and each kind's pods must get the placements from a writer
# that policy trusts.  A pod set of any other owner over several slots is refused.
# - OPERATOR_OWNERS: Kueue copies a Ready state's placements onto the object's templates, and its
#   operator (trusted by the fields policy's table byOperator) copies them into the objects that make
#   the pods: pinned as each pod is created.
# - UNGATED_OWNERS: Kueue's pod integration creates their pods behind its scheduling gate and applies
#   the podSetUpdates to each pod as it ungates it (a pod UPDATE by Kueue's manager): pinned on that
#   update.  Their Workloads name the owner without `controller` (the LeaderWorkerSet or StatefulSet,
#   and the pods; a plain pod group only its pods).
OPERATOR_OWNERS = frozenset({("jobset.x-k8s.io/v1alpha2", "JobSet"),
                             ("trainer.kubeflow.org/v1alpha1", "TrainJob"),
                             ("kubeflow.org/v2beta1", "MPIJob")})
POD_OWNER = ("v1", "Pod")
UNGATED_OWNERS = frozenset({("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"),
                            ("apps/v1", "StatefulSet"), POD_OWNER})
RANKED_OWNERS = OPERATOR_OWNERS | UNGATED_OWNERS
# Kueue marks the Workload of a pod group (a LeaderWorkerSet's group, a StatefulSet, plain pods).
GROUP_ANNOTATION = ("kueue.x-k8s.io/is-group-workload", "true")


class WorkloadSpecError(JobSpecError):
    """A Workload cannot be read as a gang, or its placement cannot be carried out; the message says why."""


# -- reading Workloads and AdmissionChecks ----------------------------------------------------------

def gang_key(wl: Mapping[str, Any]) -> str:
    """The gang (and ledger) key of a Workload: apart from a Job's `namespace/name` by its prefix."""
    return f"workload:{namespaced_name(wl)}"


def controller_ref(wl: Mapping[str, Any]) -> dict[str, Any] | None:
    """The Workload's controlling owner reference (Kueue's: the object whose pods it admits)."""
    for ref in as_list(metadata_of(wl).get("ownerReferences")):
        if as_dict(ref).get("controller") is True:
            return as_dict(ref)
    return None


def owner_uid(wl: Mapping[str, Any]) -> str | None:
    """The uid of the Workload's controlling owner (the Job whose pods it admits), None without one."""
    uid = as_dict(controller_ref(wl)).get("uid")
    return uid if isinstance(uid, str) else None


def _kind_of(ref: Mapping[str, Any]) -> tuple[str, str]:
    return str(ref.get("apiVersion")), str(ref.get("kind"))


def group_owner(wl: Mapping[str, Any]) -> dict[str, Any] | None:
    """The owner reference of a pod group's Workload (GROUP_ANNOTATION, no controlling owner) that is not
    a pod: its LeaderWorkerSet or StatefulSet; None for any other Workload, or with no one such owner."""
    if (controller_ref(wl) is not None
            or as_dict(metadata_of(wl).get("annotations")).get(GROUP_ANNOTATION[0]) != GROUP_ANNOTATION[1]):
        return None
    others = [as_dict(r) for r in as_list(metadata_of(wl).get("ownerReferences"))
              if _kind_of(as_dict(r)) != POD_OWNER]
    return others[0] if len({_kind_of(r) for r in others}) == 1 and len(others) == 1 else None


def owner_kind(wl: Mapping[str, Any]) -> tuple[str, str] | None:
    """(apiVersion, kind) of the Workload's owner, None without one: its controlling owner, else for a
    pod group's Workload (GROUP_ANNOTATION) the one owner that is not a pod (`group_owner`: a
    LeaderWorkerSet, a StatefulSet), or POD_OWNER when only pods own it."""
    ref = controller_ref(wl) or group_owner(wl)
    if ref is not None:
        return _kind_of(ref)
    if as_dict(metadata_of(wl).get("annotations")).get(GROUP_ANNOTATION[0]) != GROUP_ANNOTATION[1]:
        return None
    owners = {_kind_of(as_dict(r)) for r in as_list(metadata_of(wl).get("ownerReferences"))}
    return POD_OWNER if owners == {POD_OWNER} else None


# Where Kueue's pod integration leaves a pod set's template annotations out of the Workload, the
# owner's templates they come from: (apiVersion, kind) -> pod set name -> path of the template.
OWNER_TEMPLATES: dict[tuple[str, str], dict[str, tuple[str, ...]]] = {
    ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"): {
        "leader": ("spec", "leaderWorkerTemplate", "leaderTemplate"),
        "worker": ("spec", "leaderWorkerTemplate", "workerTemplate"),
        "main": ("spec", "leaderWorkerTemplate", "workerTemplate")},
    ("apps/v1", "StatefulSet"): {"main": ("spec", "template")},
}


# A plain pod group's pods: Kueue names the group (its Workload) by this label and each pod's role (its
# pod set) by this annotation.
POD_GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
ROLE_HASH_ANNOTATION = "kueue.x-k8s.io/role-hash"


def pod_group_notes(pods: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], dict[str, dict[str, str]]]:
    """What Kueue leaves out of a plain pod group's Workload, from the pods themselves: by (namespace,
    group name), each role's `topolet.io/numa-policy` (of its first pod by name that carries one)."""
    out: dict[tuple[str, str], dict[str, dict[str, str]]] = {}
    for pod in sorted(pods, key=lambda p: str(metadata_of(p).get("name"))):
        meta = metadata_of(pod)
        group = as_dict(meta.get("labels")).get(POD_GROUP_LABEL)
        notes = as_dict(meta.get("annotations"))
        role, policy = notes.get(ROLE_HASH_ANNOTATION), notes.get(NUMA_POLICY_ANNOTATION)
        if isinstance(group, str) and isinstance(role, str) and isinstance(policy, str):
            out.setdefault((str(meta.get("namespace")), group), {}).setdefault(
                role, {NUMA_POLICY_ANNOTATION: policy})
    return out


def owner_notes(owner: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """The annotations of each pod set's template in the Workload's owner object `owner` (a
    LeaderWorkerSet, a StatefulSet: OWNER_TEMPLATES), by pod set name; none for another kind."""
    out: dict[str, dict[str, str]] = {}
    for pod_set, path in OWNER_TEMPLATES.get(_kind_of(owner), {}).items():
        template: Any = owner
        for key in path:
            template = as_dict(template).get(key)
        notes = as_dict(metadata_of(as_dict(template)).get("annotations"))
        out[pod_set] = {str(k): v for k, v in notes.items() if isinstance(v, str)}
    return out


def slot_rule(wl: Mapping[str, Any], pod_set: str, job_indexed: Callable[[], bool]) -> RankRule | str:
    """How the pods of the Workload's `pod_set` are told apart, to give each its own slot: the rank rule,
    or why they cannot be.  A batch/v1 Job's pods by their completion index (`job_indexed()`: the Job is
    Indexed); a RANKED_OWNERS kind's by the pod set's `topologyRequest` (`agent.api.ranks`)."""
    owner = owner_kind(wl)
    if owner == JOB_OWNER:
        return BY_COMPLETION_INDEX if job_indexed() else NOT_INDEXED
    if owner not in RANKED_OWNERS:
        kind = "no owner" if owner is None else f"a {owner[1][:63]} ({owner[0][:63]})"
        return (f"its owner is {kind}, whose pods topolet does not tell apart (one slot each: batch/v1 Job, "
                f"{', '.join('pod group' if o == POD_OWNER else o[1] for o in sorted(RANKED_OWNERS))})")
    assignments = _assignments(wl)
    pod_sets = [as_dict(raw) for raw in as_list(as_dict(wl.get("spec")).get("podSets"))]
    for raw in pod_sets:
        if raw.get("name") == pod_set:
            count = assignments.get(pod_set, {}).get("count", raw.get("count"))
            if isinstance(count, bool) or not isinstance(count, int) or count < 1:
                break
            request = as_dict(raw.get("topologyRequest"))
            # Kueue's TAS ranks a pod set group (a LeaderWorkerSet's leader and workers, an MPIJob's
            # launcher and workers, so marked) across its pod sets: not by this pod set's labels alone.
            if request.get("podSetGroupName") is not None:
                return (f"its pods cannot be told apart: its pod set is ranked with others in the pod set "
                        f"group {str(request['podSetGroupName'])[:63]!r}")
            # A plain pod group's index (Kueue's kueue.x-k8s.io/pod-group-pod-index) runs across the
            # whole group, whatever role (pod set) a pod has.
            if owner == POD_OWNER and len(pod_sets) > 1:
                return (f"its pods cannot be told apart: its pod group has {len(pod_sets)} roles, and a "
                        f"pod group's index runs across them all")
            rule = rank_rule(request, count)
            return rule if isinstance(rule, RankRule) else f"its pods cannot be told apart: {rule}"
    return f"the Workload has no pod set {pod_set[:63]!r} with a count"


def condition_true(obj: Mapping[str, Any], kind: str) -> bool:
    """Whether `obj`'s status has condition `kind` with status True."""
    return any(as_dict(c).get("type") == kind and as_dict(c).get("status") == "True"
               for c in as_list(as_dict(obj.get("status")).get("conditions")))


def check_state(wl: Mapping[str, Any], name: str) -> dict[str, Any] | None:
    """The Workload's `status.admissionChecks` entry named `name`, None when it has none."""
    for state in as_list(as_dict(wl.get("status")).get("admissionChecks")):
        if as_dict(state).get("name") == name:
            return as_dict(state)
    return None


def our_checks(admission_checks: Iterable[Mapping[str, Any]]) -> tuple[str, ...]:
    """The names of the AdmissionChecks whose controllerName is ours, sorted."""
    return tuple(sorted(str(metadata_of(ac).get("name")) for ac in admission_checks
                        if as_dict(ac.get("spec")).get("controllerName") == CONTROLLER_NAME))


def check_active(ac: Mapping[str, Any]) -> bool:
    """The AdmissionCheck has Active=True for its current generation."""
    generation = metadata_of(ac).get("generation")
    for cond in as_list(as_dict(ac.get("status")).get("conditions")):
        cond = as_dict(cond)
        if cond.get("type") == "Active":
            return cond.get("status") == "True" and cond.get("observedGeneration") == generation
    return False


def active_status(ac: Mapping[str, Any], now: str) -> dict[str, Any]:
    """The server-side apply body (on admissionchecks/status) that sets Active=True."""
    meta = metadata_of(ac)
    return {"apiVersion": API_VERSION, "kind": "AdmissionCheck", "metadata": {"name": meta.get("name")},
            "status": {"conditions": [{
                "type": "Active", "status": "True", "reason": "Active",
                "message": "topolet controller decides by NUMA, GPU and MIG fit",
                "lastTransitionTime": now, "observedGeneration": meta.get("generation")}]}}


def to_decide(wl: Mapping[str, Any], names: Sequence[str]) -> str | None:
    """The first of our checks on the Workload that waits for a decision: quota reserved, check Pending,
    the Workload neither finished, deactivated nor being evicted (Kueue resets our check to Pending as
    it evicts, before it releases the quota; a new reservation clears Evicted)."""
    if not condition_true(wl, "QuotaReserved") or condition_true(wl, "Finished"):
        return None
    if condition_true(wl, "Evicted"):
        return None
    if as_dict(wl.get("spec")).get("active") is False:
        return None
    for name in names:
        state = check_state(wl, name)
        if state is not None and state.get("state") == "Pending":
            return name
    return None


def checks_to_decide(wl: Mapping[str, Any], names: Sequence[str]) -> tuple[str, ...]:
    """Every one of our checks on the Workload that waits for a decision (`to_decide`'s rule), in name
    order: one decision sets them all, so each of them lets Kueue admit it."""
    if to_decide(wl, names) is None:
        return ()
    return tuple(n for n in names if as_dict(check_state(wl, n)).get("state") == "Pending")


def holding(wl: Mapping[str, Any], names: Sequence[str]) -> str | None:
    """The first of our checks that is Ready while the Workload holds its quota and has not finished:
    its slots count in the ledger.  Eviction, preemption, deactivation and deletion take the quota
    away (and Kueue resets the check to Pending), so they free the slots."""
    if not condition_true(wl, "QuotaReserved") or condition_true(wl, "Finished"):
        return None
    for name in names:
        state = check_state(wl, name)
        if state is not None and state.get("state") == "Ready":
            return name
    return None


# -- Workload -> Gang -------------------------------------------------------------------------------

def _assignments(wl: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    admission = as_dict(as_dict(wl.get("status")).get("admission"))
    return {str(as_dict(a).get("name")): as_dict(a) for a in as_list(admission.get("podSetAssignments"))}


def _flavor_selector(assignment: Mapping[str, Any], flavor_labels: Mapping[str, Mapping[str, str]],
                     where: str) -> dict[str, str]:
    """The node labels of the ResourceFlavors Kueue assigned to a pod set (Kueue adds them to its pods)."""
    out: dict[str, str] = {}
    for flavor in sorted({str(f) for f in as_dict(assignment.get("flavors")).values()}):
        for key, value in as_dict(flavor_labels.get(flavor)).items():
            if out.get(key, value) != value:
                raise WorkloadSpecError(f"{where}: flavors disagree on node label {key}")
            out[key] = value
    return out


def gang_from_workload(wl: Mapping[str, Any], flavor_labels: Mapping[str, Mapping[str, str]],
                       guaranteed_policy: str = NODE_POLICY,
                       limit_defaults: ContainerDefaults = NO_DEFAULTS,
                       template_notes: Mapping[str, Mapping[str, str]] | None = None) -> Gang:
    """The Workload as a gang: one pod set per Workload PodSet, named as it.

    count: the admitted count (partial admission), else the PodSet's; requests, NUMA policy (template
    annotation `topolet.io/numa-policy`, else `guaranteed_policy`, by default each node's own, for
    Guaranteed whole-CPU pods), node
    selector, required node affinity and tolerations: the pod template's, read as a Job's
    (`gang_from_job`), with `limit_defaults` (the namespace's LimitRange container defaults) filled
    in as the API server fills them in each pod: Kueue stores the Job's template as written, without
    them; the node labels of the assigned ResourceFlavors join the node selector;
    priority: spec.priority (Kueue orders the queue; kept for the record).  `template_notes` (pod set
    -> annotations; `owner_notes`) stand in for the template annotations Kueue left out of the
    Workload; those it kept win."""
    meta = metadata_of(wl)
    if not meta.get("name") or not meta.get("namespace"):
        raise WorkloadSpecError("the Workload has no namespace or name")
    spec = as_dict(wl.get("spec"))
    pod_sets = as_list(spec.get("podSets"))
    if not pod_sets:
        raise WorkloadSpecError("the Workload has no podSets")
    assignments = _assignments(wl)
    out = []
    for i, raw in enumerate(pod_sets):
        raw = as_dict(raw)
        name = raw.get("name")
        if not isinstance(name, str) or not name:
            raise WorkloadSpecError(f"podSets[{i}] has no name")
        assignment = assignments.get(name, {})
        count = assignment.get("count", raw.get("count"))
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise WorkloadSpecError(f"podSets[{i}] ({name}): count must be a positive integer, got {count!r}")
        template = dict(as_dict(raw.get("template")))
        notes = as_dict((template_notes or {}).get(name))
        if notes:
            meta_of = dict(as_dict(template.get("metadata")))
            meta_of["annotations"] = {**notes, **as_dict(meta_of.get("annotations"))}
            template["metadata"] = meta_of
        pod_spec = dict(as_dict(template.get("spec")))
        # Kueue resolved the priority already (spec.priority); the class need not exist here.
        pod_spec.pop("priorityClassName", None)
        selector = {**as_dict(pod_spec.get("nodeSelector")),
                    **_flavor_selector(assignment, flavor_labels, f"podSets[{i}] ({name})")}
        if selector:
            pod_spec["nodeSelector"] = selector
        template["spec"] = pod_spec
        job = {"metadata": {"name": meta["name"], "namespace": meta["namespace"]},
               "spec": {"parallelism": count, "template": template}}
        try:
            (pod_set,) = gang_from_job(job, {}, guaranteed_policy, limit_defaults=limit_defaults).pod_sets
        except JobSpecError as exc:
            raise WorkloadSpecError(f"podSets[{i}] ({name}): {exc}") from exc
        # One podSetUpdate carries a pod set's zone: a set of several pods, which may take several
        # slots, is never split per container (the placements format holds one zone a slot).
        pod_set = replace(pod_set, name=name, containers=pod_set.containers if count == 1 else ())
        if assignment.get("topologyAssignment") is None:
            out.append(pod_set)
            continue
        # Kueue's TAS chose each rank's domain, and its ungater pins the pod there: placed inside it.
        try:
            out.extend(tas.split(pod_set, tas.tas_domains(assignment["topologyAssignment"])))
        except tas.TASError as exc:
            raise WorkloadSpecError(f"podSets[{i}] ({name}): its topologyAssignment: {exc}") from exc
    priority = spec.get("priority", 0)
    return Gang(key=gang_key(wl), pod_sets=tuple(out),
                priority=priority if isinstance(priority, int) and not isinstance(priority, bool) else 0)


# -- the decision on the Workload -------------------------------------------------------------------

def _slots_by_set(placement: Placement) -> dict[str, list[SlotPlacement]]:
    """Each Workload pod set's slots by rank (the parts of one TAS split joined again)."""
    by_set: dict[str, list[tuple[int, SlotPlacement]]] = {}
    for p in placement.pods:
        name, offset = tas.whole(p.pod_set)
        by_set.setdefault(name, []).append((offset + p.index, SlotPlacement(p.node, p.zone, p.zones)))
    return {name: [s for _, s in sorted(slots, key=lambda x: x[0])] for name, slots in by_set.items()}


def pod_set_updates(gang: Gang, placement: Placement, rule: Callable[[str], RankRule | str]
                    ) -> list[dict[str, Any]]:
    """The podSetUpdates that put `placement` on the pods (see README.md beside this module).

    `rule(pod_set)` says how that pod set's pods are told apart (`slot_rule`), or why they cannot be:
    then a pod set over several slots cannot be pinned per pod (WorkloadSpecError).  A rule other than
    the completion index travels with the slots as `topolet.io/placement-rank`."""
    slots = _slots_by_set(placement)
    updates = []
    for name in dict.fromkeys(tas.whole(ps.name)[0] for ps in gang.pod_sets):
        mine = slots.get(name, [])
        if len(set(mine)) == 1:
            (one,) = set(mine)
            update: dict[str, Any] = {"name": name, "nodeSelector": {HOSTNAME_LABEL: one.node}}
            value = one.zone_value()
            if value is not None:
                update["annotations"] = {NUMA_ZONE_ANNOTATION: value}
            updates.append(update)
            continue
        told = rule(name)
        if isinstance(told, str):
            nodes = sorted({s.node for s in mine})
            raise WorkloadSpecError(
                f"pod set {name} fits only over {len(set(mine))} node/zone slots ({', '.join(nodes[:4])}"
                f"{', ...' if len(nodes) > 4 else ''}) and {told}")
        record = AdmissionRecord("admitted", "-", "-", dict(enumerate(mine)))
        value = placements_value(record, indexed=True)
        if value is None:
            raise WorkloadSpecError(f"pod set {name}: {len(mine)} slots do not fit one annotation")
        notes = {PLACEMENTS_ANNOTATION: value}
        if told != BY_COMPLETION_INDEX:
            notes[RANK_ANNOTATION] = told.value()
        updates.append({"name": name, "annotations": notes,
                        "nodeSelector": {FAILSAFE_LABEL[0]: FAILSAFE_LABEL[1]}})
    return updates


def parse_placements(text: str) -> list[SlotPlacement]:
    """A `topolet.io/placements` value back into slots; WorkloadSpecError when it is not one."""
    out = []
    for i, entry in enumerate(text.split(",")):
        parsed = parse_placement(entry)
        if parsed is None:
            raise WorkloadSpecError(f"{PLACEMENTS_ANNOTATION}: bad entry {i}: {entry!r}")
        out.append(SlotPlacement(*parsed))
    return out


def records_of_state(wl: Mapping[str, Any], state: Mapping[str, Any]) -> dict[str, AdmissionRecord]:
    """The decision a Ready state of ours carries, per pod set, as the ledger takes it: slots numbered
    by completion index within the pod set; decision: a digest of the Workload's uid, the state's time
    and its podSetUpdates (the same on every read, new on every new decision); time: the state's
    lastTransitionTime.

    WorkloadSpecError when the state does not say where every pod goes."""
    updates = {str(as_dict(u).get("name")): as_dict(u) for u in as_list(state.get("podSetUpdates"))}
    assignments = _assignments(wl)
    time = str(state.get("lastTransitionTime") or "")
    digest = hashlib.sha256(json.dumps([metadata_of(wl).get("uid"), time, state.get("podSetUpdates")],
                                       sort_keys=True).encode()).hexdigest()[:32]
    out: dict[str, AdmissionRecord] = {}
    for raw in as_list(as_dict(wl.get("spec")).get("podSets")):
        raw = as_dict(raw)
        name = str(raw.get("name"))
        count = assignments.get(name, {}).get("count", raw.get("count"))
        update = updates.get(name)
        if update is None or isinstance(count, bool) or not isinstance(count, int):
            raise WorkloadSpecError(f"Ready state {state.get('name')}: no placement for pod set {name}")
        text = as_dict(update.get("annotations")).get(PLACEMENTS_ANNOTATION)
        if isinstance(text, str):
            mine = parse_placements(text)
        else:
            node = as_dict(update.get("nodeSelector")).get(HOSTNAME_LABEL)
            zone = as_dict(update.get("annotations")).get(NUMA_ZONE_ANNOTATION)
            if not isinstance(node, str) or not node:
                raise WorkloadSpecError(f"Ready state {state.get('name')}: pod set {name} has no node")
            numa = parse_numa_zone(zone) if zone is not None else None
            mine = [SlotPlacement(node, *numa) if numa is not None else SlotPlacement(node)] * count
        out[name] = AdmissionRecord("admitted", digest, time, dict(enumerate(mine)))
    return out


def retry_after(retry_count: int) -> int:
    """Seconds before Kueue tries a Workload again after its `retry_count`-th Retry: doubling from
    RETRY_BASE_SECONDS up to RETRY_MAX_SECONDS."""
    return int(min(RETRY_BASE_SECONDS * 2 ** min(max(retry_count, 0), 16), RETRY_MAX_SECONDS))


def ready_state(name: str, gang: Gang, placement: Placement, updates: list[dict[str, Any]],
                now: str) -> dict[str, Any]:
    """Our check Ready, with the podSetUpdates that pin the pods."""
    nodes = sorted({p.node for p in placement.pods})
    message = (f"{len(placement.pods)} pods fit on {len(nodes)} nodes ({', '.join(nodes[:8])}"
               f"{', ...' if len(nodes) > 8 else ''})")
    return {"name": name, "state": "Ready", "message": message[:MESSAGE_MAX], "lastTransitionTime": now,
            "podSetUpdates": updates}


def retry_state(name: str, reason: str, retry_count: int, now: str) -> dict[str, Any]:
    """Our check Retry: the binding constraint and when Kueue should try again (exponential backoff)."""
    after = retry_after(retry_count)
    return {"name": name, "state": "Retry", "lastTransitionTime": now, "requeueAfterSeconds": after,
            "message": f"does not fit now: {reason}; next try in {after}s"[:MESSAGE_MAX]}


def rejected_state(name: str, reason: str, now: str) -> dict[str, Any]:
    """Our check Rejected: the gang can never fit (Kueue deactivates the Workload)."""
    return {"name": name, "state": "Rejected", "lastTransitionTime": now,
            "message": f"can never fit this cluster: {reason}"[:MESSAGE_MAX]}


def retry_count(wl: Mapping[str, Any], name: str) -> int:
    """How many times Kueue counted our check's Retry on this Workload (its retryCount)."""
    count = as_dict(check_state(wl, name)).get("retryCount", 0)
    return count if isinstance(count, int) and not isinstance(count, bool) and count >= 0 else 0


def status_apply(wl: Mapping[str, Any], states: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The server-side apply body (on workloads/status, field manager CONTROLLER_NAME) that sets our
    checks' states, carrying the resourceVersion it was decided on so a stale decision fails (409)."""
    meta = metadata_of(wl)
    return {"apiVersion": API_VERSION, "kind": "Workload",
            "metadata": {"name": meta.get("name"), "namespace": meta.get("namespace"),
                         "resourceVersion": meta.get("resourceVersion")},
            "status": {"admissionChecks": [dict(s) for s in states]}}
