"""What NRI says of a container, read as the pod watch would read its pod: pure, no I/O, no clock.

The NRI route meets a container before the pod watch may have seen its pod (the pod is bound seconds
before its containers exist, but the watch can lag).  `kubelet_container` names the container the
way the agent does (pod uid, container name, its cgroup through `agent.enforce.kubepods`);
`nri_pod_object` rebuilds, from what the kubelet gave the runtime, the parts of the API's Pod that
`agent.api.podplan.plan_pod` reads, so the NRI route decides with the very rules of the watch path.

What the runtime knows, and the rule read from it (kubelet `pkg/kubelet/cm/helpers_linux.go` and
`pkg/kubelet/kuberuntime/kuberuntime_container_linux.go`, `cpuManagerPolicy: none`):

- The QoS class is the one the kubelet chose: it names the pod's cgroup (`kubepods/pod<uid>` for
  Guaranteed, `kubepods/burstable/...`, `kubepods/besteffort/...`), which the container's
  `cgroupsPath` carries.
- CPU request: the kubelet sets `cpu.shares` = milliCPU × 1024 / 1000 (rounded down, at least 2), so
  the shares are a multiple of 1024 exactly when the request is a whole number of CPUs: the request
  is shares / 1024 then.  Otherwise the request is not whole (its exact value does not matter to
  any rule).
- CPU limit: with CFS quota on, `cpu.quota` = milliCPU × period / 1000 over `cpu.period` (100000 µs);
  the limit is quota / period.  No quota (CFS quota off, or no limit) leaves the limit unknown.
- A Guaranteed pod has request = limit for every container, so a Guaranteed container asks for N
  exclusive CPUs exactly when shares = N × 1024 and, where a quota is set, quota = N × period.  A
  quota that says otherwise leaves the request unread as whole: the container stays shared.
- Memory: the runtime gets the limit only (`memory.limit`); requests are taken equal to limits,
  which is exact for Guaranteed pods, the only ones whose memory the agent binds.  Hugepages come
  from `hugepage_limits` ("2MB" → `hugepages-2Mi`).
- Pod annotations and labels reach the runtime whole (the kubelet copies them into the sandbox
  config): `topolet.io/*` annotations are read exactly as the watch reads them.  `spec.nodeName` is
  this node's (a placement naming another node is refused alike).

What the runtime cannot say: whether the container is an init container (NRI-built plans treat every
container as regular; the pod watch's plan, preferred where it has one, does not), and its GPU
requests (no NUMA preference from GPUs until the watch has the pod).
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
