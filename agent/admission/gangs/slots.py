"""Which pod holds which slot of an admitted gang, read from the pods themselves.

Pure: no I/O.  `JobOwner` / `job_owner` / `owner_of` (`.refusal(pod)`), `claim_pods`, `job_slots`,
`assign_slots`, `owner_keys`, `pods_by`, `pods_by_owner`, `pod_asks`, `unlabelled_job`, and pod readers
(`pod_gated`, `pod_live`, `pod_target`, `completion_index`, `scheduling_gates`).  The rule: only a pod the Job
controller made from the admitted template (owner reference, Job labels and requests, never one
alone) holds or takes a slot; any other costs only itself.
Why, and slot order: agent/admission/gangs/README.md, "Which pod holds a slot".
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from agent.admission.gangs.job import (
    GATE,
    HOSTNAME_LABEL,
    NUMA_ZONE_ANNOTATION,
    JobSpecError,
    container_cpus,
    job_pod_spec,
    pod_requests,
)
from agent.admission.gangs.limitrange import NO_DEFAULTS, ContainerDefaults
from agent.admission.gangs.record import PLACEMENTS_ANNOTATION, SlotPlacement
from agent.api.objects import as_dict, as_list, metadata_of
from agent.api.placements import completion_index as pod_completion_index
from agent.api.placements import parse_numa_zone, placement_entry

JOB_API_VERSION, JOB_KIND = "batch/v1", "Job"  # the Job controller's owner reference names these
# The labels the API server puts in a Job's pod template when it generates the Job's selector (the
# default: `spec.manualSelector` unset), which the Job controller copies onto every pod it creates
# (kubernetes pkg/registry/batch/job/strategy.go `generateSelector`).
CONTROLLER_UID_LABEL = "batch.kubernetes.io/controller-uid"
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
_SAID_MAX = 3  # differences named in a refusal
_NAME_MAX = 63



def scheduling_gates(spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The pod spec's `schedulingGates`, each as a dict."""
    return [as_dict(g) for g in as_list(spec.get("schedulingGates"))]


def pod_gated(pod: Mapping[str, Any]) -> bool:
    """The pod still carries our scheduling gate."""
    return any(g.get("name") == GATE for g in scheduling_gates(as_dict(pod.get("spec"))))


def completion_index(pod: Mapping[str, Any]) -> int | None:
    """The pod's completion index (Indexed Jobs), None when it has none (or not a valid one)."""
    return pod_completion_index(metadata_of(pod))


def pod_target(pod: Mapping[str, Any]) -> SlotPlacement | None:
    """The (node, zone) we pinned the pod to, None if unpinned: our nodeSelector, and the zone
    annotation or (a one-node Job's pod) its completion index's entry in the placements annotation."""
    node = as_dict(as_dict(pod.get("spec")).get("nodeSelector")).get(HOSTNAME_LABEL)
    if not isinstance(node, str) or not node or pod_gated(pod):
        return None
    notes = as_dict(metadata_of(pod).get("annotations"))
    zone = notes.get(NUMA_ZONE_ANNOTATION)
    index = completion_index(pod)
    if zone is None and isinstance(notes.get(PLACEMENTS_ANNOTATION), str) and index is not None:
        entry = placement_entry(notes[PLACEMENTS_ANNOTATION], index)
        return SlotPlacement(node, entry[1] if not isinstance(entry, str) and entry[0] == node else None)
    zone_read = parse_numa_zone(zone)
    return SlotPlacement(node, *zone_read) if zone_read is not None else SlotPlacement(node)


@dataclass(frozen=True, slots=True)
class PodAsks:
    """What one pod asks, as `JobOwner.refusal` compares it: `requests` (name -> amount, none zero) as
    the scheduler counts them less the overhead, `cpus` each container's CPU millicores (several
    containers: what the container scope splits), `runtime_class` (which sets the overhead)."""

    requests: tuple[tuple[str, Fraction], ...]
    cpus: tuple[int, ...]
    runtime_class: str | None


def pod_asks(pod_spec: Mapping[str, Any]) -> PodAsks:
    """What a pod (or a pod template's pod) asks; JobSpecError when its requests cannot be read.

    The overhead is left out: the API server writes it into each pod from its RuntimeClass, never into
    a Job's template, so the RuntimeClass is compared instead."""
    spec = {k: v for k, v in pod_spec.items() if k != "overhead"}
    requests = tuple(sorted((k, v) for k, v in pod_requests(spec).items() if v))
    runtime = pod_spec.get("runtimeClassName")
    return PodAsks(requests, container_cpus(spec), runtime if isinstance(runtime, str) else None)


def _resource_fields(pod_spec: Mapping[str, Any]) -> tuple[Any, ...]:
    """The spec's fields `pod_asks` reads, as written (overhead aside: those `pod_requests` and
    `container_cpus` read, and the RuntimeClass): two specs whose fields are equal ask the same."""
    return (tuple(as_dict(c).get("resources") for c in as_list(pod_spec.get("containers"))),
            tuple((as_dict(c).get("resources"), as_dict(c).get("restartPolicy"))
                  for c in as_list(pod_spec.get("initContainers"))),
            pod_spec.get("resources"), pod_spec.get("runtimeClassName"))


def _short(value: object) -> str:
    """A tenant-written value, short, for a message."""
    if isinstance(value, str):
        return repr(value[:_NAME_MAX])
    return "none" if value is None else type(value).__name__


def _amount(value: Fraction) -> str:
    return str(value.numerator) if value.denominator == 1 else f"{float(value):g}"


def _asks_differ(pod: PodAsks, template: PodAsks) -> str:
    """How `pod` differs from `template`, in a few words."""
    if pod.runtime_class != template.runtime_class:
        return f"runtimeClassName {pod.runtime_class!r} where its template has {template.runtime_class!r}"
    mine, theirs = dict(pod.requests), dict(template.requests)
    said = [f"{name[:_NAME_MAX]} {_amount(mine.get(name, Fraction(0)))} where its template asks "
            f"{_amount(theirs.get(name, Fraction(0)))}"
            for name in sorted(set(mine) | set(theirs)) if mine.get(name) != theirs.get(name)]
    if not said:
        return (f"containers' CPUs {', '.join(f'{m}m' for m in pod.cpus[:8]) or 'one container'} where its "
                f"template's are {', '.join(f'{m}m' for m in template.cpus[:8]) or 'one container'}")
    return "; ".join(said[:_SAID_MAX]) + ("; ..." if len(said) > _SAID_MAX else "")


@dataclass(frozen=True, slots=True)
class JobOwner:
    """An admitted Job as the pods that may hold its slots name it (see README.md beside this module); `asks`
    is what each of them must ask, or why the admitted template's requests cannot be read (then no
    pod is the Job's)."""

    namespace: str
    name: str
    uid: str
    asks: PodAsks | str
    # The template's fields `pod_asks` reads, as written: a pod that repeats them (most do) asks the
    # same without being read again.
    written: tuple[Any, ...] | None = field(default=None, compare=False, hash=False)

    def refusal(self, pod: Mapping[str, Any]) -> str | None:
        """Why `pod` is not one the Job controller made for this Job from its admitted template; None
        when it is."""
        meta = metadata_of(pod)
        if meta.get("namespace") != self.namespace:
            return "it is in another namespace than its Job"
        ref = next((as_dict(r) for r in as_list(meta.get("ownerReferences"))
                    if as_dict(r).get("controller") is True), None)
        if ref is None:
            return "it has no controller owner reference"
        said = (ref.get("apiVersion"), ref.get("kind"), ref.get("name"), ref.get("uid"))
        if said != (JOB_API_VERSION, JOB_KIND, self.name, self.uid):
            return (f"its controller owner reference is not the Job controller's for Job {self.name}: "
                    f"apiVersion {_short(said[0])}, kind {_short(said[1])}, name {_short(said[2])}")
        labels = as_dict(meta.get("labels"))
        for key, value in ((CONTROLLER_UID_LABEL, self.uid), (JOB_NAME_LABEL, self.name)):
            if labels.get(key) != value:
                return f"it lacks the Job controller's label {key}: {value}"
        if isinstance(self.asks, str):
            return self.asks
        spec = as_dict(pod.get("spec"))
        if self.written is not None and _resource_fields(spec) == self.written:
            return None
        try:
            asks = pod_asks(spec)
        except (JobSpecError, TypeError, ValueError) as exc:  # whatever its writer put there
            return f"its requests cannot be read: {str(exc)[:200]}"
        if asks != self.asks:
            return f"it asks other than its Job's admitted template: {_asks_differ(asks, self.asks)}"
        return None


def owner_of(namespace: str, name: str, uid: str, pod_spec: Mapping[str, Any]) -> JobOwner:
    """The Job `namespace/name` (`uid`) admitted with pods of `pod_spec`."""
    try:
        asks: PodAsks | str = pod_asks(pod_spec)
    except (JobSpecError, TypeError, ValueError) as exc:
        asks = f"its Job's admitted template cannot be read: {str(exc)[:200]}"
    return JobOwner(namespace, name, uid, asks, _resource_fields(pod_spec))


def job_owner(job: Mapping[str, Any], limit_defaults: ContainerDefaults = NO_DEFAULTS) -> JobOwner:
    """The admitted `job` as its pods must name it (its template: the one admitted, which the record's
    shape vouches for, with `limit_defaults` filled in as the API server fills them in its pods)."""
    meta = metadata_of(job)
    return owner_of(str(meta.get("namespace")), str(meta.get("name")), str(meta.get("uid")),
                    job_pod_spec(job, limit_defaults))


def unlabelled_job(job: Mapping[str, Any]) -> str | None:
    """Why the Job's pods would not carry the Job controller's labels (`spec.manualSelector: true` and
    a template without them), so none of them could hold a slot; None when they will (the API server
    puts them in the template of every Job whose selector it generates)."""
    if as_dict(job.get("spec")).get("manualSelector") is not True:
        return None
    meta = metadata_of(job)
    labels = as_dict(metadata_of(as_dict(as_dict(job.get("spec")).get("template"))).get("labels"))
    for key, value in ((CONTROLLER_UID_LABEL, meta.get("uid")), (JOB_NAME_LABEL, meta.get("name"))):
        if labels.get(key) != value:
            return (f"its pod template lacks the label {key}: {str(value)[:_NAME_MAX]} (a manual "
                    f"selector?), so its pods could not be told from pods others create in the namespace")
    return None


@dataclass(frozen=True, slots=True)
class ClaimedPods:
    """pods: the Job's own; refused: (pod, why) for each other live pod that is gated or pinned."""

    pods: tuple[Mapping[str, Any], ...]
    refused: tuple[tuple[Mapping[str, Any], str], ...]


def claim_pods(owner: JobOwner, pods: Iterable[Mapping[str, Any]]) -> ClaimedPods:
    """The pods that are `owner`'s (`JobOwner.refusal`), and why each other would-be slot holder is not
    (a pod neither gated nor pinned holds and takes nothing either way: not named)."""
    mine: list[Mapping[str, Any]] = []
    refused: list[tuple[Mapping[str, Any], str]] = []
    for pod in pods:
        why = owner.refusal(pod)
        if why is None:
            mine.append(pod)
        elif pod_live(pod) and (pod_gated(pod) or pod_target(pod) is not None):
            refused.append((pod, why))
    return ClaimedPods(tuple(mine), tuple(refused))


@dataclass(frozen=True, slots=True)
class SlotAssignment:
    """held: pod uid -> the slot it holds; place: (gated pod, slot) pairs to patch, in order; refused:
    (pod, why) for the pods that hold and take no slot as they are not the Job's (`job_slots`)."""

    held: Mapping[str, int]
    place: tuple[tuple[Mapping[str, Any], int], ...]
    refused: tuple[tuple[Mapping[str, Any], str], ...] = ()


def job_slots(owner: JobOwner, slots: Mapping[int, SlotPlacement], pods: Iterable[Mapping[str, Any]],
              indexed: bool) -> SlotAssignment:
    """`assign_slots` over the pods that are `owner`'s (`claim_pods`); the others are `refused`."""
    claimed = claim_pods(owner, pods)
    assignment = assign_slots(slots, claimed.pods, indexed)
    return SlotAssignment(assignment.held, assignment.place, claimed.refused)


def _creation(pod: Mapping[str, Any]) -> tuple[str, str]:
    meta = metadata_of(pod)
    return (str(meta.get("creationTimestamp") or ""), str(meta.get("name") or ""))


def assign_slots(slots: Mapping[int, SlotPlacement], pods: Sequence[Mapping[str, Any]],
                 indexed: bool, index_of: Callable[[Mapping[str, Any]], int | None] | None = None,
                 ) -> SlotAssignment:
    """Which slot each live pod of an admitted Job holds, and which free slot each gated one gets;
    `pods` are the Job's own (`claim_pods`: `job_slots` is both steps).

    A live pod we pinned holds a slot with its (node, zone): its completion index's slot when that
    matches, else the lowest free slot that does.  A gated pod gets its completion index's slot when
    that is free, else the lowest free slot, oldest pod first; more gated pods than free slots (an old
    pod still terminating) wait.  A replacement pod therefore gets the slot of the pod it replaces.
    `index_of` reads a pod's own slot where it is not its completion index (a JobSet's pod: by rank).
    """
    index_of = index_of or completion_index
    live = sorted((p for p in pods if pod_live(p)), key=_creation)
    free = dict(sorted(slots.items()))
    held: dict[str, int] = {}
    for pod in live:
        target = pod_target(pod)
        if target is None:
            continue
        index = index_of(pod) if indexed else None
        slot = index if index in free and free[index] == target else next(
            (i for i, p in free.items() if p == target), None)
        if slot is not None:
            held[str(metadata_of(pod).get("uid"))] = slot
            del free[slot]
    gated = [p for p in live if pod_gated(p)]
    chosen: dict[str, int] = {}
    if indexed:  # own index first, so a pod beyond the slots does not take another pod's index
        for pod in gated:
            index = index_of(pod)
            if index is not None and index in free:
                chosen[str(metadata_of(pod).get("uid"))] = index
                del free[index]
    place = []
    for pod in gated:
        uid = str(metadata_of(pod).get("uid"))
        if uid not in chosen:
            if not free:
                continue
            chosen[uid] = next(iter(free))
            del free[chosen[uid]]
        place.append((pod, chosen[uid]))
        held[uid] = chosen[uid]
    return SlotAssignment(held, tuple(place))


def owner_keys(pod: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """(namespace, its controller's uid) of a pod: a pod names its owner by uid alone, and an owner
    lives in the pod's namespace, so a pod in another namespace never counts as a Job's.  A candidate
    only: whoever writes the pod writes its owner reference, so `claim_pods` decides."""
    meta = metadata_of(pod)
    refs = map(as_dict, as_list(meta.get("ownerReferences")))
    namespace = str(meta.get("namespace"))
    return tuple((namespace, str(ref.get("uid"))) for ref in refs if ref.get("controller") is True)


def pods_by(pods: Iterable[Mapping[str, Any]],
            keys_of: Callable[[Mapping[str, Any]], Iterable[tuple[str, str]]],
            ) -> dict[tuple[str, str], list[Mapping[str, Any]]]:
    """Pods by each key `keys_of` finds them by (`owner_keys`, `jobset_keys`); the controller's pod
    store keeps the same as indexes, as pods come and go."""
    out: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for pod in pods:
        for key in keys_of(pod):
            out.setdefault(key, []).append(pod)
    return out


def pods_by_owner(pods: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], list[Mapping[str, Any]]]:
    """Pods by `owner_keys`."""
    return pods_by(pods, owner_keys)


def pod_live(pod: Mapping[str, Any]) -> bool:
    """Not being deleted and not finished: the pod still holds (or will hold) its slot's resources."""
    if metadata_of(pod).get("deletionTimestamp"):
        return False
    return as_dict(pod.get("status")).get("phase") not in ("Succeeded", "Failed")
