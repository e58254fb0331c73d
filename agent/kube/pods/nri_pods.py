"""What NRI says of a container, read as the pod watch would read its pod: pure, no I/O, no clock.

`kubelet_container` names the container as the agent does (pod uid, name, cgroup);
`nri_pod_object` rebuilds the parts of the Pod that `agent.api.podplan.plan_pod` reads from what the
kubelet gave the runtime: QoS from the cgroup path, whole CPUs from `cpu.shares` and the CFS quota,
memory and hugepages from limits.  The rules and what NRI cannot say: README.md, "What NRI says".
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from agent.api.podplan import ContainerPlan, PodError, PodPlan, plan_pod
from agent.api.qos import QOSClass
from agent.api.resources import format_quantity
from agent.enforce.kubepods import Runtime, container_cgroup_path, read_runtime_cgroups_path
from agent.errors import EnforcementError
from agent.nri import api_pb2

SHARES_PER_CPU = 1024  # kubelet: MilliCPUToShares = milli × 1024 / 1000
_QOS_NAMES = {QOSClass.GUARANTEED: "Guaranteed", QOSClass.BURSTABLE: "Burstable",
              QOSClass.BESTEFFORT: "BestEffort"}
_ID_SCHEMES = {Runtime.CONTAINERD: "containerd", Runtime.CRIO: "cri-o"}
_HUGEPAGE_SIZES = {"KB": "Ki", "MB": "Mi", "GB": "Gi"}


@dataclass(frozen=True, slots=True)
class KubeletContainer:
    """A runtime container of a kubelet pod, named as the agent names it."""

    pod_uid: str
    namespace: str
    pod_name: str
    name: str  # the container's name in the pod spec
    container_id: str  # with its runtime scheme ("containerd://<id>"), as a pod status gives it
    cgroup: str  # relative to the cpuset root: agent.enforce.kubepods.container_cgroup_path
    qos: QOSClass


def kubelet_container(pod: api_pb2.PodSandbox, container: api_pb2.Container,
                      root: str = "") -> KubeletContainer | None:
    """The container as the agent names it; None when it is no kubelet pod's container we can pin
    (no pod identity, or a `cgroupsPath` that is not the kubelet's under the agent's cgroup root,
    `root` as `agent.enforce.cgroup.hierarchy_path` spells it: "" at the hierarchy's top)."""
    if not (pod.uid and pod.namespace and pod.name and container.name):
        return None
    cgroups_path = container.linux.cgroups_path
    if root:
        if not cgroups_path.startswith(root + "/"):
            return None
        cgroups_path = cgroups_path[len(root):]
    path = read_runtime_cgroups_path(cgroups_path)
    if path is None or not path.names_pod(pod.uid) or path.container_id != container.id:
        return None
    uri = f"{_ID_SCHEMES[path.runtime]}://{path.container_id}"
    try:
        rel = container_cgroup_path(pod.uid, path.qos, uri, None, path.driver)
    except EnforcementError:
        return None
    return KubeletContainer(pod.uid, pod.namespace, pod.name, container.name, uri, rel, path.qos)


def requested_cpus(cpu: api_pb2.LinuxCPU) -> tuple[Fraction | None, Fraction | None]:
    """(request, limit) in CPUs as the kubelet set them (the module docstring's rule); a request that
    is not a whole number comes back as a non-whole stand-in, an unknown one as None."""
    limit: Fraction | None = None
    if cpu.HasField("quota") and cpu.HasField("period") and cpu.quota.value > 0 and cpu.period.value > 0:
        limit = Fraction(cpu.quota.value, cpu.period.value)
    if not cpu.HasField("shares"):
        return None, limit
    shares = cpu.shares.value
    request = Fraction(shares, SHARES_PER_CPU)
    if request.denominator == 1 and limit is not None and limit != request:
        # Shares and quota disagree: no whole request can be read (a non-whole stand-in).
        return request + Fraction(1, SHARES_PER_CPU), limit
    return request, limit


def nri_pod_object(pod: api_pb2.PodSandbox, container: api_pb2.Container, ref: KubeletContainer,
                   node: str) -> dict[str, Any]:
    """The API Pod, as far as `plan_pod` reads it, that the kubelet made `container` from: this one
    container, running, with the requests and limits its resources say."""
    resources = container.linux.resources
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    request, limit = requested_cpus(resources.cpu)
    if request is not None:
        requests["cpu"] = format_quantity(request)
    if limit is not None:
        limits["cpu"] = format_quantity(limit)
    if resources.memory.HasField("limit") and resources.memory.limit.value > 0:
        requests["memory"] = limits["memory"] = str(resources.memory.limit.value)
    for page in resources.hugepage_limits:
        unit = page.page_size[-2:]
        if unit in _HUGEPAGE_SIZES and page.page_size[:-2].isdigit() and page.limit > 0:
            name = f"hugepages-{page.page_size[:-2]}{_HUGEPAGE_SIZES[unit]}"
            requests[name] = limits[name] = str(page.limit)
    spec_resources: dict[str, Any] = {}
    if requests:
        spec_resources["requests"] = requests
    if limits:
        spec_resources["limits"] = limits
    return {
        "metadata": {"uid": pod.uid, "namespace": pod.namespace, "name": pod.name,
                     "annotations": dict(pod.annotations), "labels": dict(pod.labels)},
        "spec": {"nodeName": node, "containers": [{"name": ref.name, "resources": spec_resources}]},
        "status": {"phase": "Pending", "qosClass": _QOS_NAMES[ref.qos],
                   "containerStatuses": [{"name": ref.name, "containerID": ref.container_id,
                                          "state": {"running": {}}}]},
    }


def plan_from_nri(pod: api_pb2.PodSandbox, container: api_pb2.Container, ref: KubeletContainer,
                  node: str) -> tuple[PodPlan, ContainerPlan]:
    """The pod watch's decision for this container, made from what NRI gives."""
    try:
        plan = plan_pod(nri_pod_object(pod, container, ref, node))
    except PodError as exc:  # kubelet_container checked the identity; a defect if it gets here
        raise ValueError(f"NRI pod {pod.namespace}/{pod.name}: {exc}") from exc
    (decided,) = plan.containers
    return plan, decided


def cached_decision(plan: PodPlan, ref: KubeletContainer) -> ContainerPlan | None:
    """The watch's decision for this container, when its cached plan has the container (running or
    waiting to run), given the runtime's container id; None when the plan does not name it."""
    for c in (*plan.containers, *plan.waiting):
        if c.name == ref.name:
            return dataclasses.replace(c, container_id=ref.container_id)
    return None
