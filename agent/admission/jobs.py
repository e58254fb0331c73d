"""Jobs as gangs: reading a queued Job into a `Gang`, the admission record, and the patch bodies.

Pure: no I/O, no clock (times are passed in).  The controller (`agent.admission.controller`) reads
API dicts, calls these and sends what they return.

Public API:

- Names: `QUEUE_LABEL` (`topolet.io/queue`), `GATE` (`topolet.io/placement`), `ADMISSION_ANNOTATION`
  (`topolet.io/admission`), `NUMA_POLICY_ANNOTATION`, `COLOCATE_ANNOTATION`, `NUMA_ZONE_ANNOTATION`,
  `COMPLETION_INDEX_ANNOTATION`, `HOSTNAME_LABEL`.
- `job_key(job) -> "namespace/name"`; `job_queue(job) -> str | None`.
- `gang_from_job(job, priorities, guaranteed_policy="none") -> Gang`: one pod set per Job (see
  `gang_from_job`); raises `JobSpecError` naming what is wrong.
- `AdmissionRecord` and `record_of(job) -> AdmissionRecord | None` (JobSpecError when the annotation is
  not ours to read); `AdmissionRecord.encode()`.
- Patch bodies (JSON merge patches, each carrying the resourceVersion it was computed from so a
  concurrent writer makes it fail instead of being overwritten): `decision_patch(job, record)` adds the
  gate to the still-suspended Job's template, records the decision and unsuspends the Job, in one
  write; `unsuspend_patch()` (for a Job admitted but left suspended, by an earlier version);
  `reject_patch(job, record)`; `pod_patch(pod, node, zone)` pins a gated pod to its node and
  zone and removes the gate in one write.
- `assign_slots(slots, pods, indexed) -> SlotAssignment`: which live pod holds which slot, and which
  gated pod gets which free slot (see `assign_slots`).
- `gang_requests(job)`: one pod's requests (Resources) from the template.
- `job_finished(job)`, `job_indexed(job)`, `job_suspended(job)`, `pod_gated(pod)`, `pod_live(pod)`.
- `still_undecided(job, fresh) -> bool`: whether a decision made on `job` may still be written onto
  its re-read version `fresh` (after a 409).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from agent.admission.model import (
    NUMA_POLICIES,
    TAINT_EFFECTS,
    Gang,
    NodeSelectorRequirement,
    PodSet,
    Resources,
    Toleration,
)
from agent.errors import TopoletError
from agent.kube.pods import parse_quantity
from agent.labels.validate import is_dns_subdomain

QUEUE_LABEL = "topolet.io/queue"
GATE = "topolet.io/placement"
ADMISSION_ANNOTATION = "topolet.io/admission"
NUMA_POLICY_ANNOTATION = "topolet.io/numa-policy"
COLOCATE_ANNOTATION = "topolet.io/colocate"
NUMA_ZONE_ANNOTATION = "topolet.io/numa-zone"
COMPLETION_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
HOSTNAME_LABEL = "kubernetes.io/hostname"
MERGE_PATCH = "application/merge-patch+json"

RESULTS = ("admitted", "rejected")
RECORD_VERSION = 1
MAX_POD_SET = 100_000  # a Job this wide is a typo, not a gang
_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")
_LABEL_NAME = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)")
_GPU = "nvidia.com/gpu"
_MIG_PREFIX = "nvidia.com/mig-"


class JobSpecError(TopoletError):
    """A queued Job (or its `topolet.io/*` annotation) cannot be read as a gang; the message says why."""


def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _meta(obj: Mapping[str, Any]) -> dict[str, Any]:
    return _dict(obj.get("metadata"))


def job_key(job: Mapping[str, Any]) -> str:
    """The Job's `namespace/name`."""
    meta = _meta(job)
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def job_queue(job: Mapping[str, Any]) -> str | None:
    """The queue the Job is in (its `topolet.io/queue` label), None when it carries none."""
    value = _dict(_meta(job).get("labels")).get(QUEUE_LABEL)
    return value if isinstance(value, str) and value else None


def job_suspended(job: Mapping[str, Any]) -> bool:
    return _dict(job.get("spec")).get("suspend") is True


def job_indexed(job: Mapping[str, Any]) -> bool:
    return _dict(job.get("spec")).get("completionMode") == "Indexed"


def job_finished(job: Mapping[str, Any]) -> bool:
    """True once the Job has a true Complete or Failed condition (its pods hold nothing any more)."""
    for cond in _list(_dict(job.get("status")).get("conditions")):
        c = _dict(cond)
        if c.get("type") in ("Complete", "Failed") and c.get("status") == "True":
            return True
    return False


# -- Job -> Gang ------------------------------------------------------------------------------------

def _count(spec: Mapping[str, Any], indexed: bool) -> int:
    """Pods the Job runs at once: parallelism (default 1), for Indexed Jobs at most completions."""
    parallelism = spec.get("parallelism", 1)
    if isinstance(parallelism, bool) or not isinstance(parallelism, int) or parallelism < 1:
        raise JobSpecError(f"spec.parallelism must be a positive integer, got {parallelism!r}")
    if indexed:
        completions = spec.get("completions")
        if isinstance(completions, bool) or not isinstance(completions, int) or completions < 1:
            raise JobSpecError(f"an Indexed Job needs positive spec.completions, got {completions!r}")
        parallelism = min(parallelism, completions)
    if parallelism > MAX_POD_SET:
        raise JobSpecError(f"spec.parallelism {parallelism} is over {MAX_POD_SET}")
    return int(parallelism)


def _requests(container: Mapping[str, Any], where: str) -> dict[str, Fraction]:
    """A container's requests (limits stand in for missing requests, as the API server defaults them)."""
    res = _dict(container.get("resources"))
    merged = {**_dict(res.get("limits")), **_dict(res.get("requests"))}
    out: dict[str, Fraction] = {}
    for name, text in merged.items():
        value = parse_quantity(text)
        if value is None or value < 0:
            raise JobSpecError(f"{where}: resource {name} has an invalid quantity {text!r}")
        out[str(name)] = value
    return out


def _add(a: Mapping[str, Fraction], b: Mapping[str, Fraction]) -> dict[str, Fraction]:
    return {k: a.get(k, Fraction(0)) + b.get(k, Fraction(0)) for k in set(a) | set(b)}


def _max(a: Mapping[str, Fraction], b: Mapping[str, Fraction]) -> dict[str, Fraction]:
    return {k: max(a.get(k, Fraction(0)), b.get(k, Fraction(0))) for k in set(a) | set(b)}


def pod_requests(pod_spec: Mapping[str, Any]) -> dict[str, Fraction]:
    """What the scheduler counts for one pod: the larger of (containers + sidecars) and each init
    container's peak (it plus the sidecars started before it), plus the pod overhead."""
    containers = _list(pod_spec.get("containers"))
    if not containers:
        raise JobSpecError("the pod template has no containers")
    total: dict[str, Fraction] = {}
    for i, c in enumerate(containers):
        total = _add(total, _requests(_dict(c), f"containers[{i}]"))
    sidecars: dict[str, Fraction] = {}
    init_peak: dict[str, Fraction] = {}
    for i, c in enumerate(_list(pod_spec.get("initContainers"))):
        req = _requests(_dict(c), f"initContainers[{i}]")
        if _dict(c).get("restartPolicy") == "Always":  # a sidecar runs beside everything after it
            sidecars = _add(sidecars, req)
            init_peak = _max(init_peak, sidecars)
        else:
            init_peak = _max(init_peak, _add(req, sidecars))
    effective = _max(_add(total, sidecars), init_peak)
    for name, text in _dict(pod_spec.get("overhead")).items():
        value = parse_quantity(text)
        if value is None or value < 0:
            raise JobSpecError(f"overhead {name} has an invalid quantity {text!r}")
        effective[str(name)] = effective.get(str(name), Fraction(0)) + value
    return effective


def _whole(name: str, value: Fraction) -> int:
    if value.denominator != 1:
        raise JobSpecError(f"{name} must be a whole number, got {float(value)}")
    return int(value)


def resources_of(requests: Mapping[str, Fraction]) -> Resources:
    """Requests in the engine's base units (CPU millicores rounded up, as the scheduler counts them)."""
    hugepages: dict[str, int] = {}
    mig: dict[str, int] = {}
    for name, value in requests.items():
        if name.startswith("hugepages-"):
            hugepages[name] = math.ceil(value)
        elif name.startswith(_MIG_PREFIX):
            mig[name] = _whole(name, value)
    gpus = _whole(_GPU, requests.get(_GPU, Fraction(0)))
    return Resources(cpu_milli=math.ceil(requests.get("cpu", Fraction(0)) * 1000),
                     memory=math.ceil(requests.get("memory", Fraction(0))),
                     hugepages={k: v for k, v in sorted(hugepages.items()) if v},
                     gpus=gpus, mig={k: v for k, v in sorted(mig.items()) if v})


def _guaranteed_integer_cpus(pod_spec: Mapping[str, Any]) -> bool:
    """Every container Guaranteed (requests = limits for cpu and memory) with whole CPUs."""
    for c in _list(pod_spec.get("containers")) + _list(pod_spec.get("initContainers")):
        res = _dict(_dict(c).get("resources"))
        limits, requests = _dict(res.get("limits")), _dict(res.get("requests"))
        for name in ("cpu", "memory"):
            limit = parse_quantity(limits.get(name))
            request = parse_quantity(requests.get(name, limits.get(name)))
            if limit is None or request != limit:
                return False
        cpu = parse_quantity(limits.get("cpu"))
        if cpu is None or cpu.denominator != 1 or cpu < 1:
            return False
    return True


def _label_key(key: object, where: str) -> str:
    """A valid label key (optional DNS-subdomain prefix, then a name of at most 63 characters)."""
    if not isinstance(key, str):
        raise JobSpecError(f"{where}: label key {key!r} is not a string")
    prefix, _, name = key.rpartition("/")
    if (prefix and not is_dns_subdomain(prefix)) or not _LABEL_NAME.fullmatch(name):
        raise JobSpecError(f"{where}: invalid label key {key!r}")
    return key


def _node_selector(pod_spec: Mapping[str, Any]) -> dict[str, str]:
    raw = pod_spec.get("nodeSelector")
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise JobSpecError("nodeSelector is not a map")
    out = {}
    for k, v in raw.items():
        if not isinstance(v, str):
            raise JobSpecError(f"nodeSelector {k!r} has a non-string value")
        out[_label_key(k, "nodeSelector")] = v
    return dict(sorted(out.items()))


def _required_affinity(pod_spec: Mapping[str, Any]) -> tuple[tuple[NodeSelectorRequirement, ...], ...]:
    required = _dict(_dict(_dict(pod_spec.get("affinity")).get("nodeAffinity")).get(
        "requiredDuringSchedulingIgnoredDuringExecution"))
    terms: list[tuple[NodeSelectorRequirement, ...]] = []
    for t, term in enumerate(_list(required.get("nodeSelectorTerms"))):
        term = _dict(term)
        if term.get("matchFields"):
            # metadata.name is the only field; a Job pinned to named nodes is not a gang we can place.
            raise JobSpecError(f"nodeSelectorTerms[{t}]: matchFields is not supported")
        reqs = []
        for r in _list(term.get("matchExpressions")):
            r = _dict(r)
            op = r.get("operator")
            if op not in _OPERATORS:
                raise JobSpecError(f"nodeSelectorTerms[{t}]: unknown operator {op!r}")
            values = r.get("values") or []
            if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
                raise JobSpecError(f"nodeSelectorTerms[{t}]: values must be strings")
            reqs.append(NodeSelectorRequirement(_label_key(r.get("key"), f"nodeSelectorTerms[{t}]"),
                                                str(op), tuple(values)))
        terms.append(tuple(reqs))
    return tuple(terms)


def _tolerations(pod_spec: Mapping[str, Any]) -> tuple[Toleration, ...]:
    out = []
    for i, t in enumerate(_list(pod_spec.get("tolerations"))):
        t = _dict(t)
        op = t.get("operator", "Equal") or "Equal"
        effect = t.get("effect", "") or ""
        if op not in ("Equal", "Exists") or (effect and effect not in TAINT_EFFECTS):
            raise JobSpecError(f"tolerations[{i}]: invalid operator {op!r} or effect {effect!r}")
        out.append(Toleration(key=str(t.get("key", "") or ""), operator=op,
                              value=str(t.get("value", "") or ""), effect=effect))
    return tuple(out)


def gang_from_job(job: Mapping[str, Any], priorities: Mapping[str, int],
                  guaranteed_policy: str = "none") -> Gang:
    """The Job as a gang of one pod set (named "main").

    count: `parallelism` (Indexed: min(parallelism, completions)); requests: the pod template's, as
    the scheduler counts them; NUMA policy: the template annotation `topolet.io/numa-policy`, else
    `guaranteed_policy` (the nodes' kubelet Topology Manager policy, passed by the caller) when every
    container is Guaranteed with whole CPUs, else "none"; priority: the template's priorityClassName
    looked up in `priorities` (unknown class: JobSpecError), else its `priority`, else 0; the Job
    annotation `topolet.io/colocate: <label key>` keeps every pod within one value of that label.
    """
    meta = _meta(job)
    if not meta.get("name") or not meta.get("namespace"):
        raise JobSpecError("the Job has no namespace or name")
    spec = _dict(job.get("spec"))
    template = _dict(spec.get("template"))
    pod_spec = _dict(template.get("spec"))
    count = _count(spec, job_indexed(job))
    requests = resources_of(pod_requests(pod_spec))
    if requests.gpus and requests.mig:
        raise JobSpecError("a pod takes whole GPUs or MIG devices, not both")
    annotations = _dict(_meta(template).get("annotations"))
    policy = annotations.get(NUMA_POLICY_ANNOTATION)
    if policy is None:
        policy = guaranteed_policy if _guaranteed_integer_cpus(pod_spec) else "none"
    if policy not in NUMA_POLICIES:
        raise JobSpecError(f"{NUMA_POLICY_ANNOTATION} must be one of {', '.join(NUMA_POLICIES)}, "
                           f"got {policy!r}")
    colocate = _dict(meta.get("annotations")).get(COLOCATE_ANNOTATION)
    if colocate is not None:
        colocate = _label_key(colocate, COLOCATE_ANNOTATION)
    class_name = pod_spec.get("priorityClassName")
    if class_name:
        if class_name not in priorities:
            raise JobSpecError(f"PriorityClass {class_name!r} does not exist")
        priority = priorities[class_name]
    else:
        raw = pod_spec.get("priority", 0)
        priority = raw if isinstance(raw, int) and not isinstance(raw, bool) else 0
    pod_set = PodSet(name="main", count=count, requests=requests, numa_policy=str(policy),
                     node_selector=_node_selector(pod_spec), required_affinity=_required_affinity(pod_spec),
                     tolerations=_tolerations(pod_spec), colocate_label=colocate)
    return Gang(key=job_key(job), pod_sets=(pod_set,), priority=int(priority))


def gang_requests(job: Mapping[str, Any]) -> Resources:
    """One pod's requests from the Job's template, as `gang_from_job` counts them."""
    pod_spec = _dict(_dict(_dict(job.get("spec")).get("template")).get("spec"))
    return resources_of(pod_requests(pod_spec))


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
            value = _dict(value)
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
    text = _dict(_meta(job).get("annotations")).get(ADMISSION_ANNOTATION)
    if text is None:
        return None
    if not isinstance(text, str):
        raise JobSpecError(f"{ADMISSION_ANNOTATION} is not a string")
    return decode_record(text)


# -- patch bodies -----------------------------------------------------------------------------------

def _gates(spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [_dict(g) for g in _list(spec.get("schedulingGates"))]


def decision_patch(job: Mapping[str, Any], record: AdmissionRecord) -> dict[str, Any]:
    """Add our gate to the suspended Job's pod template, record the decision and unsuspend, in one write.

    One write makes the decision atomic: a recorded decision always has its Job running.  Job
    validation takes the template change because the *old* Job is suspended and never started."""
    pod_spec = _dict(_dict(_dict(job.get("spec")).get("template")).get("spec"))
    gates = _gates(pod_spec)
    if not any(g.get("name") == GATE for g in gates):
        gates.append({"name": GATE})
    return {"metadata": {"resourceVersion": _meta(job).get("resourceVersion"),
                         "annotations": {ADMISSION_ANNOTATION: record.encode()}},
            "spec": {"suspend": False, "template": {"spec": {"schedulingGates": gates}}}}


def still_undecided(job: Mapping[str, Any], fresh: Mapping[str, Any]) -> bool:
    """`fresh` (the Job re-read after a conflict) is still the Job decided on and still undecided.

    Same uid, still suspended, no admission record, same pod template: only something the decision
    does not read moved on (the Job controller writes a suspended Job's status), so the decision may
    be written with `fresh`'s resourceVersion.  A record there means another writer (a replica that
    led before) decided first; a changed template means other requests than the ones placed."""
    if _meta(fresh).get("uid") != _meta(job).get("uid") or not job_suspended(fresh):
        return False
    if _dict(_meta(fresh).get("annotations")).get(ADMISSION_ANNOTATION) is not None:
        return False
    return _dict(fresh.get("spec")).get("template") == _dict(job.get("spec")).get("template")


def unsuspend_patch() -> dict[str, Any]:
    """Let the Job controller create the (gated) pods."""
    return {"spec": {"suspend": False}}


def reject_patch(job: Mapping[str, Any], record: AdmissionRecord) -> dict[str, Any]:
    """Record a "never" refusal; the Job stays suspended."""
    return {"metadata": {"resourceVersion": _meta(job).get("resourceVersion"),
                         "annotations": {ADMISSION_ANNOTATION: record.encode()}}}


def pod_gated(pod: Mapping[str, Any]) -> bool:
    """The pod still carries our scheduling gate."""
    return any(g.get("name") == GATE for g in _gates(_dict(pod.get("spec"))))


def pod_patch(pod: Mapping[str, Any], node: str, zone: int | None) -> dict[str, Any]:
    """Pin a gated pod to `node` (and NUMA `zone`) and remove our gate, in one write.

    Only what the node and the scheduler read: no annotation of our own (the node's agent refuses a
    pod with a `topolet.io/` annotation it does not know, and the controller's admission policy lets
    it write annotations nowhere else), so a pod's slot is found again by `assign_slots`."""
    spec = _dict(pod.get("spec"))
    gates = [g for g in _gates(spec) if g.get("name") != GATE]
    body: dict[str, Any] = {
        "metadata": {"resourceVersion": _meta(pod).get("resourceVersion")},
        "spec": {"nodeSelector": {HOSTNAME_LABEL: node}, "schedulingGates": gates or None}}
    if zone is not None:
        body["metadata"]["annotations"] = {NUMA_ZONE_ANNOTATION: str(zone)}
    return body


def completion_index(pod: Mapping[str, Any]) -> int | None:
    """The pod's completion index (Indexed Jobs), None when it has none."""
    text = _dict(_meta(pod).get("annotations")).get(COMPLETION_INDEX_ANNOTATION)
    return int(text) if isinstance(text, str) and text.isdigit() else None


def pod_target(pod: Mapping[str, Any]) -> SlotPlacement | None:
    """The (node, zone) we pinned the pod to (our nodeSelector and zone annotation), None if unpinned."""
    node = _dict(_dict(pod.get("spec")).get("nodeSelector")).get(HOSTNAME_LABEL)
    if not isinstance(node, str) or not node or pod_gated(pod):
        return None
    zone = _dict(_meta(pod).get("annotations")).get(NUMA_ZONE_ANNOTATION)
    return SlotPlacement(node, int(zone) if isinstance(zone, str) and zone.isdigit() else None)


@dataclass(frozen=True, slots=True)
class SlotAssignment:
    """held: pod uid -> the slot it holds; place: (gated pod, slot) pairs to patch, in order."""

    held: Mapping[str, int]
    place: tuple[tuple[Mapping[str, Any], int], ...]


def _creation(pod: Mapping[str, Any]) -> tuple[str, str]:
    meta = _meta(pod)
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
            held[str(_meta(pod).get("uid"))] = slot
            del free[slot]
    gated = [p for p in live if pod_gated(p)]
    chosen: dict[str, int] = {}
    if indexed:  # own index first, so a pod beyond the slots does not take another pod's index
        for pod in gated:
            index = completion_index(pod)
            if index is not None and index in free:
                chosen[str(_meta(pod).get("uid"))] = index
                del free[index]
    place = []
    for pod in gated:
        uid = str(_meta(pod).get("uid"))
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
    if _meta(pod).get("deletionTimestamp"):
        return False
    return _dict(pod.get("status")).get("phase") not in ("Succeeded", "Failed")
