"""A pod's requests as the scheduler reads them, pod-level `spec.resources` included (issue 34, finding 1):
the one reading (`agent.api.podrequests`) as the view counts bound pods and as a gang sizes its pods.

Semantics from k8s.io/component-helpers v0.37.2 `resource.PodRequests` (containers and init
containers aggregated, then each pod-level request of cpu, memory or hugepages-* in place of that
aggregate, then the overhead) and the API server's defaulting of pod-level requests
(kubernetes v1.37.2 `pkg/api/pod` `DefaultPodLevelResources`).  `test_tenants_podlevel.py` checks the
defaulting rows against the real API server."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest

from agent.admission.cluster.ledger import Ledger, agent_pins, job_slot
from agent.admission.cluster.podindex import PodIndex
from agent.admission.cluster.view import BadObject, build_view, pod_requests, read_pod_requests
from agent.admission.engine.model import NODE_POLICY, Resources
from agent.admission.gangs.job import JobSpecError, gang_from_job, gang_requests, resources_of
from agent.admission.gangs.job import pod_requests as template_requests
from agent.api.podrequests import RequestsError
from agent.api.podrequests import pod_requests as spec_requests

GI = 1 << 30
MI = 1 << 20
NIC = "example.com/nic"
HP = "hugepages-2Mi"


def ctr(name: str = "c", requests: dict[str, str] | None = None,
        limits: dict[str, str] | None = None, **extra: Any) -> dict[str, Any]:
    res: dict[str, Any] = {}
    if requests is not None:
        res["requests"] = requests
    if limits is not None:
        res["limits"] = limits
    return {"name": name, "image": "registry.k8s.io/pause:3.10", "resources": res, **extra}


def spec(*containers: dict[str, Any], init: tuple[dict[str, Any], ...] = (),
         requests: dict[str, str] | None = None, limits: dict[str, str] | None = None,
         overhead: dict[str, str] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"containers": list(containers or (ctr(),))}
    if init:
        out["initContainers"] = list(init)
    if requests is not None or limits is not None:
        out["resources"] = {k: v for k, v in (("requests", requests), ("limits", limits)) if v is not None}
    if overhead is not None:
        out["overhead"] = overhead
    return out


G = {"cpu": "2", "memory": "1Gi"}

# (id, pod spec, cpu millicores, memory bytes, the rest of the Resources as keyword arguments)
ROWS: list[tuple[str, dict[str, Any], int, int, dict[str, Any]]] = [
    ("containers only: their sum", spec(ctr("a", G, G), ctr("b", {"cpu": "500m"})), 2500, GI, {}),
    ("limits stand in for missing requests", spec(ctr(limits={"cpu": "3", "memory": "2Gi"})),
     3000, 2 * GI, {}),
    ("the biggest init container wins", spec(ctr(requests={"cpu": "1"}), init=(ctr("i", {"cpu": "4"}),)),
     4000, 0, {}),
    ("a sidecar runs beside the app and the later init containers",
     spec(ctr(requests={"cpu": "1"}), init=(ctr("s", {"cpu": "1"}, restartPolicy="Always"),
                                            ctr("i", {"cpu": "3"}))), 4000, 0, {}),
    ("pod-level requests only (containers ask nothing)",
     spec(ctr(), requests={"cpu": "15", "memory": "1Gi"}, limits={"cpu": "15", "memory": "1Gi"}),
     15_000, GI, {}),
    ("pod-level cpu above the containers' sum replaces it; memory stays the containers'",
     spec(ctr("a", {"cpu": "1", "memory": "64Mi"}), ctr("b", {"cpu": "1"}), requests={"cpu": "8"}),
     8000, 64 * MI, {}),
    ("pod-level cpu replaces the init containers' peak too",
     spec(ctr(requests={"cpu": "1"}), init=(ctr("i", {"cpu": "6"}),), requests={"cpu": "8"}), 8000, 0, {}),
    ("pod-level limits only: the API server defaults the requests to them",
     spec(ctr(), limits={"cpu": "12", "memory": "2Gi"}), 12_000, 2 * GI, {}),
    ("pod-level limit, a container names cpu: the containers' sum is the default",
     spec(ctr(requests={"cpu": "1"}), limits={"cpu": "12"}), 1000, 0, {}),
    ("a container's cpu of 0 still names it: the default is 0, not the pod-level limit",
     spec(ctr(requests={"cpu": "0"}), limits={"cpu": "12"}), 0, 0, {}),
    ("pod-level memory limit, the containers name cpu only",
     spec(ctr(requests={"cpu": "1"}), limits={"memory": "2Gi"}), 1000, 2 * GI, {}),
    ("pod-level hugepages limit: the request defaults to it (hugepages are not overcommitted)",
     spec(ctr(limits={HP: "4Mi", "memory": "64Mi", "cpu": "1"}), limits={HP: "8Mi"}),
     1000, 64 * MI, {"hugepages": {HP: 8 * MI}}),
    ("an explicit pod-level request wins over its limit",
     spec(ctr(), requests={"cpu": "2"}, limits={"cpu": "4"}), 2000, 0, {}),
    ("names pod-level resources do not cover are not read there (devices stay the containers')",
     spec(ctr(requests={"cpu": "1", NIC: "1"}), requests={"cpu": "4", NIC: "9"}), 4000, 0,
     {"devices": {NIC: 1}}),
    ("overhead is added after the pod-level figure",
     spec(ctr(), requests={"cpu": "4"}, overhead={"cpu": "250m", "memory": "10Mi"}), 4250, 10 * MI, {}),
    ("empty pod-level resources change nothing", spec(ctr("a", G, G)) | {"resources": {}}, 2000, GI, {}),
]


@pytest.mark.parametrize(("pod_spec", "cpu", "memory", "rest"), [r[1:] for r in ROWS],
                         ids=[r[0] for r in ROWS])
def test_one_reading_for_bound_pods_and_templates(pod_spec: dict[str, Any], cpu: int, memory: int,
                                                  rest: dict[str, Any]) -> None:
    want = Resources(cpu_milli=cpu, memory=memory, **rest)
    assert pod_requests({"metadata": {"name": "p"}, "spec": pod_spec}) == want  # the view's
    assert resources_of(template_requests(pod_spec)) == want  # a gang's pod
    assert gang_requests({"spec": {"template": {"spec": pod_spec}}}) == want


@pytest.mark.parametrize(("pod_spec", "where"), [
    (spec(ctr(), requests={"cpu": "lots"}), "resources.requests: resource cpu"),
    (spec(ctr(), limits={"memory": "1e33"}), "resources.limits: resource memory"),
    (spec(ctr(), requests={HP: "-2Mi"}), f"resources.requests: resource {HP}"),
    (spec(ctr(requests={"cpu": "²"})), "containers[0]: resource cpu"),
    (spec(ctr(), overhead={"cpu": "9" * 100}), "overhead: resource cpu"),
])
def test_a_pod_that_cannot_be_sized_says_why(pod_spec: dict[str, Any], where: str) -> None:
    with pytest.raises(RequestsError, match=where.replace("[", r"\[").replace("]", r"\]")):
        spec_requests(pod_spec)
    with pytest.raises(JobSpecError, match="invalid quantity"):
        template_requests(pod_spec)
    pod = {"metadata": {"name": "p"}, "spec": pod_spec}
    assert pod_requests(pod) is None
    with pytest.raises(BadObject, match="invalid quantity"):
        read_pod_requests(pod)


def test_an_unread_pod_level_name_is_not_an_error() -> None:
    """Upstream reads cpu, memory and hugepages-* there only; the API server refuses the others."""
    assert spec_requests(spec(ctr(), requests={"example.com/x": "lots"})) == {}


def test_a_node_filled_with_pod_level_pods_has_no_room_left() -> None:
    """Finding 1: pods sized at pod level only used to count as empty, so the node looked free."""
    node = {"metadata": {"name": "a", "uid": "uid-a"},
            "status": {"allocatable": {"cpu": "64", "memory": "64Gi", "pods": "110"}}}
    fill = {"cpu": "15", "memory": "64Mi"}
    pods = [{"metadata": {"name": f"fill-{i}", "namespace": "t", "uid": f"u{i}", "resourceVersion": "1"},
             "spec": spec(ctr(), requests=fill, limits=fill) | {"nodeName": "a"},
             "status": {"phase": "Running"}} for i in range(4)]
    view, out = build_view([node], [], pods, Ledger(), 0.0)
    assert out == {}
    assert view.nodes[0].free.cpu_milli == 4000 and view.nodes[0].free_pods == 106


def test_a_pod_level_resize_is_read_again() -> None:
    """The index keeps a pod's requests across versions whose request fields are unchanged (a bind): a
    change of the pod-level figures is such a field."""
    pod: dict[str, Any] = {"metadata": {"name": "p", "namespace": "t", "uid": "u", "resourceVersion": "1"},
                           "spec": spec(ctr(), requests={"cpu": "2"}) | {"nodeName": "a"},
                           "status": {"phase": "Running"}}
    index = PodIndex(pod_requests, agent_pins).update([pod], job_slot)
    assert index.used("a").requests.cpu_milli == 2000
    resized = {**pod, "metadata": {**pod["metadata"], "resourceVersion": "2"},
               "spec": spec(ctr(), requests={"cpu": "6"}) | {"nodeName": "a"}}
    assert index.update([resized], job_slot).used("a").requests.cpu_milli == 6000


def job(pod_spec: dict[str, Any], annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "j", "namespace": "t"},
            "spec": {"parallelism": 2, "template": {"metadata": {"annotations": annotations or {}},
                                                    "spec": pod_spec}}}


@pytest.mark.parametrize(("pod_spec", "policy", "cpu_aligned", "containers"), [
    # Guaranteed containers with whole CPUs: aligned on the node's policy, split by container
    (spec(ctr("a", G, G), ctr("b", G, G)), NODE_POLICY, True, (2000, 2000)),
    # the same with pod-level resources: the kubelet's CPU manager leaves it on the shared pool
    (spec(ctr("a", G, G), ctr("b", G, G), requests={"cpu": "4", "memory": "2Gi"},
          limits={"cpu": "4", "memory": "2Gi"}), "none", True, ()),
    (spec(ctr(), limits={"cpu": "12", "memory": "1Gi"}), "none", True, ()),
    # devices are still aligned by the device manager, CPUs not
    (spec(ctr(limits={NIC: "1"}), limits={"cpu": "12", "memory": "1Gi"}), NODE_POLICY, False, ()),
])
def test_a_gang_of_pod_level_pods_is_sized_and_not_cpu_aligned(pod_spec: dict[str, Any], policy: str,
                                                               cpu_aligned: bool,
                                                               containers: tuple[int, ...]) -> None:
    (ps,) = gang_from_job(job(pod_spec), {}).pod_sets
    assert ps.requests == resources_of(template_requests(pod_spec)) and ps.requests.cpu_milli > 0
    assert (ps.numa_policy, ps.cpu_aligned, ps.containers) == (policy, cpu_aligned, containers)


def test_a_template_that_cannot_be_sized_is_a_job_spec_error() -> None:
    with pytest.raises(JobSpecError, match=r"resources\.limits: resource cpu has an invalid quantity"):
        gang_from_job(job(spec(ctr(), limits={"cpu": "lots"})), {})


def test_exact_sums_round_up_once() -> None:
    """Quantities add exactly and round up once, as the scheduler's MilliValue of the sum."""
    two = spec(ctr("a", {"cpu": "1n"}), ctr("b", {"cpu": "1n"}))
    assert spec_requests(two) == {"cpu": Fraction(2, 10**9)}
    assert pod_requests({"spec": two}) == Resources(cpu_milli=1)
