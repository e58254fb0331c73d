"""Jobs as gangs: reading a queued Job into a `Gang`, and the names admission reads and writes.

Pure: no I/O, no clock.  Both routes read pod templates with it (the Job route, and the Kueue route
for each Workload pod set).  `gang_from_job(job, priorities, ...) -> Gang` (one pod set per Job;
`JobSpecError` names what is wrong), `job_pod_spec` (the template as its pods are created, LimitRange
defaults in), `gang_requests`, `priority_classes`, `job_queue`, `job_finished/indexed/suspended`, and
the label and annotation names.  Records are in `record`, slots in `slots`, patches in
`agent.admission.jobs.patches`; agent/admission/gangs/README.md.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import replace
from fractions import Fraction
from typing import Any

from agent.admission.engine.model import (
    NODE_POLICY,
    TAINT_EFFECTS,
    Gang,
    NodeSelectorRequirement,
    PodSet,
    Resources,
    Toleration,
)
from agent.admission.gangs.limitrange import NO_DEFAULTS, ContainerDefaults, with_limit_range_defaults
from agent.api.names import COMPLETION_INDEX, NUMA_ZONE
from agent.api.objects import as_dict, as_list, is_extended_resource, metadata_of, namespaced_name
from agent.api.podrequests import RequestsError, container_requests
from agent.api.podrequests import pod_requests as scheduler_requests
from agent.api.policies import POD_SET_NUMA_POLICIES, NumaPolicy
from agent.api.resources import GPU_RESOURCE, parse_quantity, pod_level_resources
from agent.api.validate import is_dns_subdomain
from agent.errors import TopoletError

QUEUE_LABEL = "topolet.io/queue"
GATE = "topolet.io/placement"
ADMISSION_ANNOTATION = "topolet.io/admission"
NUMA_POLICY_ANNOTATION = "topolet.io/numa-policy"
COLOCATE_ANNOTATION = "topolet.io/colocate"
NUMA_ZONE_ANNOTATION = NUMA_ZONE  # the zone the node's agent pins the pod in (agent.api.placements)
COMPLETION_INDEX_ANNOTATION = COMPLETION_INDEX
HOSTNAME_LABEL = "kubernetes.io/hostname"

MAX_POD_SET = 100_000  # a Job this wide is a typo, not a gang
# The most pods one gang may have: a decision on this many stays well under a second, and its
# admission record (one entry per pod) stays well under what a Job's annotations may hold.
MAX_GANG_PODS = 4096
_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")
_LABEL_NAME = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)")
_MIG_PREFIX = "nvidia.com/mig-"


class JobSpecError(TopoletError):
    """A queued Job (or its `topolet.io/*` annotation) cannot be read as a gang; the message says why."""


def job_queue(job: Mapping[str, Any]) -> str | None:
    """The queue the Job is in (its `topolet.io/queue` label), None when it carries none."""
    value = as_dict(metadata_of(job).get("labels")).get(QUEUE_LABEL)
    return value if isinstance(value, str) and value else None


def job_suspended(job: Mapping[str, Any]) -> bool:
    return as_dict(job.get("spec")).get("suspend") is True


def job_indexed(job: Mapping[str, Any]) -> bool:
    return as_dict(job.get("spec")).get("completionMode") == "Indexed"


def job_finished(job: Mapping[str, Any]) -> bool:
    """True once the Job has a true Complete or Failed condition (its pods hold nothing any more)."""
    for cond in as_list(as_dict(job.get("status")).get("conditions")):
        c = as_dict(cond)
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
    try:
        return container_requests(container, where)
    except RequestsError as exc:
        raise JobSpecError(str(exc)) from None


def pod_requests(pod_spec: Mapping[str, Any]) -> dict[str, Fraction]:
    """What the scheduler counts for one pod (`agent.api.podrequests.pod_requests`): the larger of
    (containers + sidecars) and each init container's peak, pod-level `spec.resources` in place of the
    containers' sum for the resources it sets (or the API server will default), plus the overhead."""
    if not as_list(pod_spec.get("containers")):
        raise JobSpecError("the pod template has no containers")
    try:
        return scheduler_requests(pod_spec)
    except RequestsError as exc:
        raise JobSpecError(str(exc)) from None


def _whole(name: str, value: Fraction) -> int:
    if value.denominator != 1:
        raise JobSpecError(f"{name} must be a whole number, got {float(value)}")
    return int(value)


def resources_of(requests: Mapping[str, Fraction]) -> Resources:
    """Requests in the engine's base units (CPU millicores rounded up, as the scheduler counts them)."""
    hugepages: dict[str, int] = {}
    mig: dict[str, int] = {}
    devices: dict[str, int] = {}
    for name, value in requests.items():
        if name.startswith("hugepages-"):
            hugepages[name] = math.ceil(value)
        elif name.startswith(_MIG_PREFIX):
            mig[name] = _whole(name, value)
        elif name != GPU_RESOURCE and "/" in name:
            prefix = name.partition("/")[0]
            if prefix == "kubernetes.io" or prefix.endswith(".kubernetes.io"):
                continue  # the API's own names are no device
            if not is_extended_resource(name):
                raise JobSpecError(f"invalid extended resource name {name[:300]!r}")
            devices[name] = _whole(name, value)
    gpus = _whole(GPU_RESOURCE, requests.get(GPU_RESOURCE, Fraction(0)))
    return Resources(cpu_milli=math.ceil(requests.get("cpu", Fraction(0)) * 1000),
                     memory=math.ceil(requests.get("memory", Fraction(0))),
                     hugepages={k: v for k, v in sorted(hugepages.items()) if v},
                     gpus=gpus, mig={k: v for k, v in sorted(mig.items()) if v},
                     devices={k: v for k, v in sorted(devices.items()) if v})


def _guaranteed_integer_cpus(pod_spec: Mapping[str, Any]) -> bool:
    """Every container Guaranteed (requests = limits for cpu and memory) with whole CPUs, and no
    pod-level resources: the kubelet's CPU and Memory Managers leave a pod that sets them unaligned
    on the shared pool (`agent.api.resources.pod_level_resources`), and so does the node's agent."""
    if pod_level_resources(as_dict(pod_spec)):
        return False
    for c in as_list(pod_spec.get("containers")) + as_list(pod_spec.get("initContainers")):
        res = as_dict(as_dict(c).get("resources"))
        limits, requests = as_dict(res.get("limits")), as_dict(res.get("requests"))
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
    required = as_dict(as_dict(as_dict(pod_spec.get("affinity")).get("nodeAffinity")).get(
        "requiredDuringSchedulingIgnoredDuringExecution"))
    terms: list[tuple[NodeSelectorRequirement, ...]] = []
    for t, term in enumerate(as_list(required.get("nodeSelectorTerms"))):
        term = as_dict(term)
        if term.get("matchFields"):
            # metadata.name is the only field; a Job pinned to named nodes is not a gang we can place.
            raise JobSpecError(f"nodeSelectorTerms[{t}]: matchFields is not supported")
        reqs = []
        for r in as_list(term.get("matchExpressions")):
            r = as_dict(r)
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
    for i, t in enumerate(as_list(pod_spec.get("tolerations"))):
        t = as_dict(t)
        op = t.get("operator", "Equal") or "Equal"
        effect = t.get("effect", "") or ""
        if op not in ("Equal", "Exists") or (effect and effect not in TAINT_EFFECTS):
            raise JobSpecError(f"tolerations[{i}]: invalid operator {op!r} or effect {effect!r}")
        out.append(Toleration(key=str(t.get("key", "") or ""), operator=op,
                              value=str(t.get("value", "") or ""), effect=effect))
    return tuple(out)


def job_pod_spec(job: Mapping[str, Any],
                 limit_defaults: ContainerDefaults = NO_DEFAULTS) -> Mapping[str, Any]:
    """The spec of the Job's pod template as the API server creates its pods in a namespace whose
    LimitRanges fill in `limit_defaults` (`with_limit_range_defaults`)."""
    pod_spec = as_dict(as_dict(as_dict(job.get("spec")).get("template")).get("spec"))
    return with_limit_range_defaults(pod_spec, limit_defaults)


def gang_from_job(job: Mapping[str, Any], priorities: Mapping[str, int],
                  guaranteed_policy: str = NODE_POLICY, default_priority: int = 0,
                  limit_defaults: ContainerDefaults = NO_DEFAULTS) -> Gang:
    """The Job as a gang of one pod set (named "main").

    The pod template is read as its pods will be created (`job_pod_spec`: the namespace's LimitRange
    container defaults, `limit_defaults`, filled in, as Kueue sizes a Workload); count: `parallelism`
    (Indexed: min(parallelism, completions)); requests: the pod template's, as
    the scheduler counts them; NUMA policy: the template annotation `topolet.io/numa-policy`, else
    `guaranteed_policy` (by default NODE_POLICY: on each node, that node's kubelet Topology Manager
    policy) when every container is Guaranteed with whole CPUs and the pod sets no pod-level
    resources; else, for a pod that asks for devices
    (GPUs, MIG, any device plugin resource), `guaranteed_policy` for its devices alone
    (`cpu_aligned` False: the kubelet aligns devices whatever the QoS, CPU and memory only for
    Guaranteed pods); else "none"; priority: the template's
    priorityClassName looked up in `priorities` (unknown class: JobSpecError), else
    `default_priority` (the cluster's globalDefault PriorityClass, else 0), never the template's own
    `priority`; the Job annotation `topolet.io/colocate: <label key>` keeps every pod within one value
    of that label.
    """
    meta = metadata_of(job)
    if not meta.get("name") or not meta.get("namespace"):
        raise JobSpecError("the Job has no namespace or name")
    spec = as_dict(job.get("spec"))
    template = as_dict(spec.get("template"))
    pod_spec = job_pod_spec(job, limit_defaults)
    count = _count(spec, job_indexed(job))
    requests = resources_of(pod_requests(pod_spec))
    if requests.gpus and requests.mig:
        raise JobSpecError("a pod takes whole GPUs or MIG devices, not both")
    annotations = as_dict(metadata_of(template).get("annotations"))
    policy = annotations.get(NUMA_POLICY_ANNOTATION)
    cpu_aligned = True
    if policy is None:
        if _guaranteed_integer_cpus(pod_spec):
            policy = guaranteed_policy
        elif requests.gpus or requests.mig or requests.devices:
            policy, cpu_aligned = guaranteed_policy, False
        else:
            policy = NumaPolicy.NONE.value
    elif policy not in POD_SET_NUMA_POLICIES:
        raise JobSpecError(f"{NUMA_POLICY_ANNOTATION} must be one of {', '.join(POD_SET_NUMA_POLICIES)}, "
                           f"got {policy!r}")
    colocate = as_dict(meta.get("annotations")).get(COLOCATE_ANNOTATION)
    if colocate is not None:
        colocate = _label_key(colocate, COLOCATE_ANNOTATION)
    # Only the cluster's PriorityClasses set a priority: the API server takes any `priority` in a
    # Job's template (its Priority admission plugin refuses only the pods), so one there is ignored.
    class_name = pod_spec.get("priorityClassName")
    if class_name:
        if not isinstance(class_name, str) or class_name not in priorities:
            raise JobSpecError(f"PriorityClass {str(class_name)[:253]!r} does not exist")
        priority = priorities[class_name]
    else:
        priority = default_priority
    pod_set = PodSet(name="main", count=count, requests=requests, numa_policy=str(policy),
                     node_selector=_node_selector(pod_spec), required_affinity=_required_affinity(pod_spec),
                     tolerations=_tolerations(pod_spec), colocate_label=colocate, cpu_aligned=cpu_aligned)
    pod_set = replace(pod_set, containers=container_cpus(pod_spec))  # what the container scope splits
    return Gang(key=namespaced_name(job), pod_sets=(pod_set,), priority=int(priority))


def container_cpus(pod_spec: Mapping[str, Any]) -> tuple[int, ...]:
    """CPU millicores of each regular container (spec order) of a pod with several, as `PodSet.containers`
    holds them; () for a pod of one container (both Topology Manager scopes align it alike) and for
    one with pod-level resources (the kubelet aligns none of its containers' CPUs)."""
    containers = as_list(pod_spec.get("containers"))
    if len(containers) < 2 or pod_level_resources(as_dict(pod_spec)):
        return ()
    return tuple(math.ceil(_requests(as_dict(c), f"containers[{i}]").get("cpu", Fraction(0)) * 1000)
                 for i, c in enumerate(containers))


def priority_classes(classes: Iterable[Mapping[str, Any]]) -> tuple[dict[str, int], int]:
    """PriorityClass objects as {name: value}, and the value a pod without a class gets: the
    globalDefault class's (the lowest name of several), else 0."""
    values: dict[str, int] = {}
    default: tuple[str, int] | None = None
    for pc in classes:
        name, value = metadata_of(pc).get("name"), pc.get("value")
        if not isinstance(name, str) or isinstance(value, bool) or not isinstance(value, int):
            continue
        values[name] = value
        if pc.get("globalDefault") is True and (default is None or name < default[0]):
            default = (name, value)
    return values, default[1] if default is not None else 0


def gang_requests(job: Mapping[str, Any], limit_defaults: ContainerDefaults = NO_DEFAULTS) -> Resources:
    """One pod's requests from the Job's template, as `gang_from_job` counts them."""
    return resources_of(pod_requests(job_pod_spec(job, limit_defaults)))
