"""Pod → pinning decision: which running containers of a pod get exclusive CPUs, under which policy.

Pure: a decoded Pod object (the API's JSON, as a dict) in, a `PodPlan` out; no I/O, no clock.
The kubelet's rule (a Guaranteed pod's whole-CPU containers) refined by the `topolet.io/` annotations
and the controller's `numa-zone` / `placements` pins; sizes come from what the kubelet granted.
The one rule: any bad annotation puts the whole pod on the shared pool with a warning, never a wrong
pin.  Every rule, in full: agent/api/README.md, "Which containers are pinned" (docs/design.md, "Pods").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from agent.api.names import (
    ANNOTATION_PREFIX,
    COMPLETION_INDEX,
    CPU_POLICY,
    MEMORY_BINDING,
    NUMA_POLICY,
    NUMA_ZONE,
    PLACEMENTS,
    SMT,
)
from agent.api.objects import as_dict, as_list, is_extended_resource
from agent.api.placements import MAX_NUMA_ZONE, completion_index, parse_numa_zone, placement_entry
from agent.api.policies import (
    ANNOTATION_NUMA_POLICIES,
    DEFAULT_NUMA_POLICY,
    DEFAULT_SMT,
    SMT_POLICIES,
    NumaPolicy,
)
from agent.api.qos import QOSClass
from agent.api.resources import HUGEPAGES_PREFIX, parse_quantity, pod_level_resources

_CHOICES: dict[str, tuple[str, ...]] = {
    CPU_POLICY: ("exclusive", "shared"),
    NUMA_POLICY: ANNOTATION_NUMA_POLICIES,
    SMT: SMT_POLICIES,
    MEMORY_BINDING: ("true", "false"),
}

REASON_INVALID = "InvalidAnnotation"
REASON_NOT_ELIGIBLE = "NotEligible"

_MAX_EXCLUSIVE = 1 << 16  # no node has more CPUs; a bigger request is garbage, not a pin


@dataclass(frozen=True, slots=True)
class PodWarning:
    """Something to tell the pod's owner (a Kubernetes Event of type Warning)."""

    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class ContainerPlan:
    """One running container: where it runs.  `cpus == 0` means the shared pool."""

    name: str
    container_id: str  # as in the status, with its runtime scheme ("containerd://<id>")
    cpus: int = 0
    numa_policy: str = DEFAULT_NUMA_POLICY
    smt: str = DEFAULT_SMT
    memory_binding: bool = False
    # The extended resources it asks for (GPUs, NICs...): their devices' locality is worth a lookup.
    device_names: frozenset[str] = frozenset()
    numa_zone: int | None = None  # the NUMA node the admission controller placed it on (numa-zone)
    # Requests of `memory` and `hugepages-<size>` in bytes, sorted by name (requests, else limits as
    # the API server defaults them): what a memory-bound allocation holds on its zones.
    memory: tuple[tuple[str, int], ...] = ()

    @property
    def exclusive(self) -> bool:
        return self.cpus > 0

    @property
    def wants_devices(self) -> bool:
        return bool(self.device_names)


@dataclass(frozen=True, slots=True)
class PodPlan:
    """A pod's decision: its identity, QoS class, running containers and warnings to publish."""

    uid: str
    namespace: str
    name: str
    qos: QOSClass
    containers: tuple[ContainerPlan, ...]
    warnings: tuple[PodWarning, ...] = ()
    # Regular containers of the spec the status does not list running (yet), each decided as it will
    # be once it runs (container_id ""): what the NRI route answers when the runtime creates one.
    waiting: tuple[ContainerPlan, ...] = ()
    # Names of the waiting ones whose status says terminated (exited, not waiting to start again).
    exited: frozenset[str] = frozenset()


class PodError(ValueError):
    """The object is not a pod we can read (missing or mistyped identity fields)."""


def _resources(container: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    res = as_dict(container.get("resources"))
    limits = as_dict(res.get("limits"))
    requests = dict(as_dict(res.get("requests")))
    # The API defaults a missing request to its limit; do the same for objects that skipped defaulting.
    for key, value in limits.items():
        requests.setdefault(key, value)
    return requests, limits


def _granted(container: dict[str, Any], status: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The container's (requests, limits) as the kubelet granted them, the spec filling what its
    status leaves out.

    After an in-place resize the spec says what was asked, not what was given: a deferred or
    infeasible resize leaves the kubelet's allocation as it was.  Requests come from
    `allocatedResources` (what the kubelet counts against the node), then the status's `resources`
    (what the runtime was given), then the spec; limits from the status's `resources`, then the spec.
    """
    requests, spec_limits = _resources(container)
    limits = dict(spec_limits)  # a copy: the pod object is the watch's, never changed here
    given = as_dict(status.get("resources"))
    limits.update(as_dict(given.get("limits")))
    requests.update(as_dict(given.get("requests")))
    requests.update(as_dict(status.get("allocatedResources")))
    for key, value in limits.items():
        requests.setdefault(key, value)
    return requests, limits


def qos_of(pod: dict[str, Any]) -> QOSClass:
    """The pod's QoS class: `status.qosClass` when set (what kubelet used for its cgroup), else
    derived from the containers' requests and limits as the API server does (from the pod-level
    ones alone when the pod sets pod-level resources)."""
    given = as_dict(pod.get("status")).get("qosClass")
    if isinstance(given, str):
        try:
            return QOSClass(given)
        except ValueError:
            pass
    spec = as_dict(pod.get("spec"))
    if pod_level_resources(spec):  # then the pod-level figures alone decide (the API server's rule)
        containers = [{"resources": spec.get("resources")}]
    else:
        containers = [as_dict(c) for key in ("containers", "initContainers") for c in as_list(spec.get(key))]
    any_set = False
    guaranteed = bool(containers)
    for c in containers:
        requests, limits = _resources(c)
        if requests or limits:
            any_set = True
        for key in ("cpu", "memory"):
            lim, req = parse_quantity(limits.get(key)), parse_quantity(requests.get(key))
            if lim is None or req is None or lim != req:
                guaranteed = False
    if guaranteed:
        return QOSClass.GUARANTEED
    return QOSClass.BURSTABLE if any_set else QOSClass.BESTEFFORT


def _annotations(meta: dict[str, Any]) -> tuple[dict[str, str], list[PodWarning]]:
    """Our annotations with defaults applied, and a warning for each bad one."""
    raw = as_dict(meta.get("annotations"))
    out: dict[str, str] = {}
    warnings: list[PodWarning] = []
    for key, value in raw.items():
        if not isinstance(key, str) or not key.startswith(ANNOTATION_PREFIX):
            continue
        if key == NUMA_ZONE:
            if parse_numa_zone(value) is not None:
                out[key] = str(value)
            else:
                warnings.append(PodWarning(REASON_INVALID, f"{key}={repr(value)[:64]}: expected a NUMA "
                                        f"node id (0..{MAX_NUMA_ZONE}), or one per container"))
            continue
        if key == PLACEMENTS:
            if isinstance(value, str):
                out[key] = value  # read against the pod's node and index in `_placed_zone`
            else:
                warnings.append(PodWarning(REASON_INVALID, f"{key}: expected a string"))
            continue
        if key not in _CHOICES:
            warnings.append(PodWarning(REASON_INVALID, f"unknown annotation {key}"))
            continue
        if not isinstance(value, str) or value not in _CHOICES[key]:
            shown = repr(value)[:64]
            warnings.append(PodWarning(REASON_INVALID, f"{key}={shown}: expected one of "
                                    f"{'|'.join(_CHOICES[key])}"))
            continue
        out[key] = value
    return out, warnings


def _placed_zone(pod: dict[str, Any], meta: dict[str, Any], text: str) -> tuple[int | None, str]:
    """The zone `topolet.io/placements` gives this pod: (zone or None, "") or (None, why it cannot)."""
    index = completion_index(meta)
    if index is None:
        return None, f"{PLACEMENTS}: the pod has no {COMPLETION_INDEX} to read its entry by"
    entry = placement_entry(text, index)
    if isinstance(entry, str):
        return None, entry
    node, zone = entry
    here = as_dict(pod.get("spec")).get("nodeName")
    if node != here:
        return None, f"{PLACEMENTS}: entry {index} places the pod on {node[:64]}, it runs on {str(here)[:64]}"
    return zone, ""


def _running(status: dict[str, Any]) -> dict[str, tuple[str, dict[str, Any]]]:
    """Container name → (container ID, its status) of every container the status says is running."""
    out: dict[str, tuple[str, dict[str, Any]]] = {}
    for cs in as_list(status.get("containerStatuses")):
        cs = as_dict(cs)
        name, cid = cs.get("name"), cs.get("containerID")
        if isinstance(name, str) and isinstance(cid, str) and cid and "running" in as_dict(cs.get("state")):
            out[name] = (cid, cs)
    return out


def _terminated(status: dict[str, Any]) -> set[str]:
    """Names of the regular containers the status says have terminated."""
    return {str(cs.get("name")) for cs in map(as_dict, as_list(status.get("containerStatuses")))
            if "terminated" in as_dict(cs.get("state"))}


def _running_others(status: dict[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for key in ("initContainerStatuses", "ephemeralContainerStatuses"):
        for cs in as_list(status.get(key)):
            cs = as_dict(cs)
            name, cid = cs.get("name"), cs.get("containerID")
            running = "running" in as_dict(cs.get("state"))
            if isinstance(name, str) and isinstance(cid, str) and cid and running:
                out[name] = cid
    return out


def _whole_cpus(value: object) -> int | None:
    q = parse_quantity(value)
    if q is None or q.denominator != 1 or not 0 < q <= _MAX_EXCLUSIVE:
        return None
    return int(q)


def _memory_requests(requests: dict[str, Any], limits: dict[str, Any]) -> tuple[tuple[str, int], ...]:
    """(resource, bytes) of memory and hugepages a container asks for; unreadable values left out."""
    out: dict[str, int] = {}
    for name in {*requests, *limits}:
        if not isinstance(name, str) or not (name == "memory" or name.startswith(HUGEPAGES_PREFIX)):
            continue
        q = parse_quantity(requests.get(name, limits.get(name)))
        if q is not None and q > 0:
            out[name] = math.ceil(q)
    return tuple(sorted(out.items()))


def plan_pod(pod: object) -> PodPlan:
    """Decide, for every running container of `pod`, exclusive CPUs or the shared pool.

    Raises PodError only when the pod has no readable identity (uid, namespace, name); anything
    else malformed degrades to the shared pool.
    """
    if not isinstance(pod, dict):
        raise PodError("not an object")
    meta = as_dict(pod.get("metadata"))
    uid, namespace, name = meta.get("uid"), meta.get("namespace"), meta.get("name")
    if not (isinstance(uid, str) and uid and isinstance(namespace, str) and isinstance(name, str)):
        raise PodError("pod without uid, namespace or name")
    status = as_dict(pod.get("status"))
    qos = qos_of(pod)
    notes, warnings = _annotations(meta)
    phase = status.get("phase")
    if phase in ("Succeeded", "Failed"):
        return PodPlan(uid, namespace, name, qos, (), tuple(warnings))
    running = _running(status)
    others = _running_others(status)
    policy = notes.get(CPU_POLICY)
    numa = notes.get(NUMA_POLICY, DEFAULT_NUMA_POLICY)
    zone: int | None = None
    per_container: tuple[int, ...] = ()  # a zone per container (a pod split by the container scope)
    if NUMA_ZONE in notes:
        zone, per_container = parse_numa_zone(notes[NUMA_ZONE]) or (None, ())
    count = len(as_list(as_dict(pod.get("spec")).get("containers")))
    if per_container and len(per_container) != count:
        warnings.append(PodWarning(REASON_INVALID, f"{NUMA_ZONE}: {len(per_container)} zones for "
                                   f"{count} containers"))
    if NUMA_ZONE not in notes and PLACEMENTS in notes:
        zone, why = _placed_zone(pod, meta, notes[PLACEMENTS])
        if why:
            warnings.append(PodWarning(REASON_INVALID, why))
    if zone is not None or per_container:
        # The controller counted the pod (or each container) against one zone.
        numa = NumaPolicy.SINGLE_NUMA_NODE.value
    smt = notes.get(SMT, DEFAULT_SMT)
    binding = notes.get(MEMORY_BINDING) == "true"
    pinning_allowed = not warnings  # a bad annotation: the whole pod stays on the shared pool
    if pod_level_resources(as_dict(pod.get("spec"))):
        # The kubelet's static CPU and Memory Managers leave such a pod on the shared pool unless its
        # PodLevelResourceManagers gate is on (beta, off by default in 1.37): so does topolet.
        pinning_allowed = False
        if running and (policy == "exclusive" or binding):
            warnings.append(PodWarning(REASON_NOT_ELIGIBLE, "the pod sets pod-level resources "
                                       "(spec.resources), which get no exclusive CPUs or bound memory "
                                       "(as the kubelet's CPU and Memory Managers do); left on the "
                                       "shared pool"))
        binding = False
    if binding and qos is not QOSClass.GUARANTEED:
        # A pod without a memory limit bound to one node can fill it and starve every pod there.
        warnings.append(PodWarning(REASON_NOT_ELIGIBLE,
                                   f"{MEMORY_BINDING}=true: memory is bound only for Guaranteed pods "
                                   "(as the kubelet's Memory Manager does); left unbound"))
        binding = False
    plans: list[ContainerPlan] = []
    waiting: list[ContainerPlan] = []
    for k, c in enumerate(as_list(as_dict(pod.get("spec")).get("containers"))):
        c = as_dict(c)
        cname = c.get("name")
        if per_container and pinning_allowed:
            zone = per_container[k]
        if not isinstance(cname, str):
            continue
        cid, cstatus = running.get(cname, ("", {}))
        requests, limits = _granted(c, cstatus)
        devices = frozenset(k for k in (*requests, *limits) if is_extended_resource(k))
        cpus = 0
        if pinning_allowed and policy != "shared":
            # Warnings are told once the container runs, as before the NRI route asked ahead.
            said = warnings if cid else []
            whole = _whole_cpus(requests.get("cpu"))
            if qos is QOSClass.GUARANTEED:
                cpus = whole or 0
                if not cpus and policy == "exclusive":
                    said.append(PodWarning(REASON_NOT_ELIGIBLE, f"container {cname}: exclusive CPUs "
                                           "need a whole-number CPU request"))
            elif policy == "exclusive":
                limit = parse_quantity(limits.get("cpu"))
                if whole is not None and limit == whole:
                    cpus = whole
                else:
                    said.append(PodWarning(REASON_NOT_ELIGIBLE, f"container {cname}: exclusive CPUs "
                                           "need a whole-number CPU request equal to its CPU limit"))
        plan = ContainerPlan(cname, cid, cpus, numa, smt, binding and cpus > 0, devices,
                             zone if cpus > 0 else None, _memory_requests(requests, limits))
        (plans if cid else waiting).append(plan)
    for cname, cid in sorted(others.items()):
        if cname not in running:
            plans.append(ContainerPlan(cname, cid))
    exited = frozenset(c.name for c in waiting if c.name in _terminated(status))
    return PodPlan(uid, namespace, name, qos, tuple(plans), tuple(warnings), tuple(waiting), exited)
