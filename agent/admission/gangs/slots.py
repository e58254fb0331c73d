"""Which pod holds which slot of an admitted gang, read from the pods themselves.

Pure: no I/O.  A pod we pinned names its slot by its node selector and zone (and, for Indexed Jobs,
its completion index); a gated pod is one waiting for a slot.  Both routes and the cluster picture
read pods so: the Job route's pass (`agent.admission.jobs.jobread`, `agent.admission.controller`), the
Kueue route's Ready Workloads (`agent.admission.kueue.holds`).

Public API:

- `assign_slots(slots, pods, indexed) -> SlotAssignment`: which live pod holds which slot, and which
  gated pod gets which free slot (see `assign_slots`).
- `pods_by_owner(pods)`: pods by (namespace, controller uid).
- `pod_gated(pod)`, `pod_live(pod)`, `pod_target(pod)`, `completion_index(pod)`;
  `scheduling_gates(spec)`: a pod spec's scheduling gates.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agent.admission.gangs.job import GATE, HOSTNAME_LABEL, NUMA_ZONE_ANNOTATION
from agent.admission.gangs.record import PLACEMENTS_ANNOTATION, SlotPlacement
from agent.kube.objects import as_dict, as_list, metadata_of
from agent.kube.pods import completion_index as pod_completion_index
from agent.kube.pods import parse_numa_zone, placement_entry


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
class SlotAssignment:
    """held: pod uid -> the slot it holds; place: (gated pod, slot) pairs to patch, in order."""

    held: Mapping[str, int]
    place: tuple[tuple[Mapping[str, Any], int], ...]


def _creation(pod: Mapping[str, Any]) -> tuple[str, str]:
    meta = metadata_of(pod)
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
            held[str(metadata_of(pod).get("uid"))] = slot
            del free[slot]
    gated = [p for p in live if pod_gated(p)]
    chosen: dict[str, int] = {}
    if indexed:  # own index first, so a pod beyond the slots does not take another pod's index
        for pod in gated:
            index = completion_index(pod)
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


def pods_by_owner(pods: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], list[Mapping[str, Any]]]:
    """Pods by (namespace, their controller's uid): a pod names its owner by uid alone, and an owner
    lives in the pod's namespace, so a pod in another namespace never counts as a Job's."""
    out: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for pod in pods:
        meta = metadata_of(pod)
        for ref in as_list(meta.get("ownerReferences")):
            ref = as_dict(ref)
            if ref.get("controller") is True:
                out.setdefault((str(meta.get("namespace")), str(ref.get("uid"))), []).append(pod)
    return out


def pod_live(pod: Mapping[str, Any]) -> bool:
    """Not being deleted and not finished: the pod still holds (or will hold) its slot's resources."""
    if metadata_of(pod).get("deletionTimestamp"):
        return False
    return as_dict(pod.get("status")).get("phase") not in ("Succeeded", "Failed")
