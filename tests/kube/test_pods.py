"""Pod → decision table (agent.api.podplan): kubelet's rule, annotations, bad input, container states."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.api.podplan import PodError, plan_pod, qos_of
from agent.api.qos import QOSClass
from agent.api.resources import parse_quantity
from tests.conftest import examples

CID = "containerd://" + "ab" * 32


def pod(containers: list[dict[str, Any]], *, qos: str | None = None,
        annotations: dict[str, Any] | None = None, running: tuple[str, ...] | None = None,
        phase: str = "Running",
        init: list[dict[str, Any]] | None = None, init_running: tuple[str, ...] = ()) -> dict[str, Any]:
    names = [c["name"] for c in containers]
    run = names if running is None else list(running)
    status: dict[str, Any] = {
        "phase": phase,
        "containerStatuses": [{"name": n, "containerID": CID, "state": {"running": {}}} for n in run]
        + [{"name": n, "containerID": CID, "state": {"waiting": {"reason": "X"}}}
           for n in names if n not in run],
        "initContainerStatuses": [{"name": n, "containerID": CID, "state": {"running": {}}}
                                  for n in init_running],
    }
    if qos is not None:
        status["qosClass"] = qos
    return {"metadata": {"uid": "u-1", "namespace": "ns", "name": "p", "annotations": annotations or {}},
            "spec": {"containers": containers, "initContainers": init or []}, "status": status}


def c(name: str = "c", cpu: str | None = None, mem: str | None = None, *, limit_cpu: str | None = None,
      limit_mem: str | None = None) -> dict[str, Any]:
    req = {k: v for k, v in (("cpu", cpu), ("memory", mem)) if v is not None}
    lim = {k: v for k, v in (("cpu", limit_cpu), ("memory", limit_mem)) if v is not None}
    return {"name": name, "resources": {"requests": req, "limits": lim}}


def g(name: str = "c", cpu: str = "2", mem: str = "1Gi") -> dict[str, Any]:
    return c(name, cpu, mem, limit_cpu=cpu, limit_mem=mem)


EXCL = {"topolet.io/cpu-policy": "exclusive"}

# (description, pod, {container: cpus}, warning reasons)
CASES: list[tuple[str, dict[str, Any], dict[str, int], tuple[str, ...]]] = [
    ("guaranteed integer", pod([g(cpu="2")], qos="Guaranteed"), {"c": 2}, ()),
    ("guaranteed millicores integer", pod([g(cpu="3000m")], qos="Guaranteed"), {"c": 3}, ()),
    ("guaranteed fractional", pod([g(cpu="1500m")], qos="Guaranteed"), {"c": 0}, ()),
    ("guaranteed, qos derived", pod([g(cpu="1")]), {"c": 1}, ()),
    ("burstable", pod([c(cpu="2", mem="1Gi")], qos="Burstable"), {"c": 0}, ()),
    ("besteffort", pod([c()], qos="BestEffort"), {"c": 0}, ()),
    ("opt out", pod([g(cpu="2")], qos="Guaranteed", annotations={"topolet.io/cpu-policy": "shared"}),
     {"c": 0}, ()),
    ("opt in, cpu req == limit", pod([c(cpu="2", mem="1Gi", limit_cpu="2")], qos="Burstable",
                                     annotations={"topolet.io/cpu-policy": "exclusive"}), {"c": 2}, ()),
    ("opt in without limit", pod([c(cpu="2", mem="1Gi")], qos="Burstable",
                                 annotations=EXCL), {"c": 0}, ("NotEligible",)),
    ("opt in fractional", pod([c(cpu="500m", limit_cpu="500m")], qos="Burstable",
                              annotations=EXCL), {"c": 0}, ("NotEligible",)),
    ("guaranteed fractional asks exclusive", pod([g(cpu="1500m")], qos="Guaranteed",
                                                 annotations={"topolet.io/cpu-policy": "exclusive"}),
     {"c": 0}, ("NotEligible",)),
    ("bad value", pod([g()], qos="Guaranteed", annotations={"topolet.io/numa-policy": "nearest"}),
     {"c": 0}, ("InvalidAnnotation",)),
    ("wrong type", pod([g()], qos="Guaranteed", annotations={"topolet.io/memory-binding": True}),
     {"c": 0}, ("InvalidAnnotation",)),
    ("unknown topolet key", pod([g()], qos="Guaranteed", annotations={"topolet.io/cpus": "3"}),
     {"c": 0}, ("InvalidAnnotation",)),
    ("foreign annotation ignored", pod([g()], qos="Guaranteed", annotations={"example.com/x": "y"}),
     {"c": 2}, ()),
    ("not running yet", pod([g()], qos="Guaranteed", running=()), {}, ()),
    ("succeeded", pod([g()], qos="Guaranteed", phase="Succeeded"), {}, ()),
    ("two containers, one fractional", pod([g("a", cpu="1"), g("b", cpu="250m")], qos="Guaranteed"),
     {"a": 1, "b": 0}, ()),
    ("init container runs shared", pod([g("a", cpu="1")], qos="Guaranteed", init=[g("i", cpu="1")],
                                       init_running=("i",), running=()), {"i": 0}, ()),
]


@pytest.mark.parametrize(("pod_obj", "want", "reasons"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_decisions(pod_obj: dict[str, Any], want: dict[str, int], reasons: tuple[str, ...]) -> None:
    plan = plan_pod(pod_obj)
    assert {x.name: x.cpus for x in plan.containers} == want
    assert tuple(w.reason for w in plan.warnings) == reasons
    for x in plan.containers:
        assert x.container_id == CID


def test_waiting_containers_are_decided_ahead_and_warned_of_once_running() -> None:
    """What the NRI route answers for a container the runtime creates before the status lists it."""
    obj = pod([g("a", cpu="2"), g("b", cpu="1500m")], qos="Guaranteed", running=("b",),
              annotations={"topolet.io/cpu-policy": "exclusive", "topolet.io/smt": "full-cores"})
    plan = plan_pod(obj)
    assert [(x.name, x.cpus) for x in plan.containers] == [("b", 0)]
    assert [(x.name, x.container_id, x.cpus, x.smt) for x in plan.waiting] == [("a", "", 2, "full-cores")]
    said = ["container b: exclusive CPUs need a whole-number CPU request"]
    assert [w.message for w in plan.warnings] == said
    ahead = plan_pod(pod([g("a", cpu="1500m")], qos="Guaranteed", running=(), annotations=EXCL))
    assert ahead.warnings == () and [(x.name, x.cpus) for x in ahead.waiting] == [("a", 0)]


def test_refinements_are_carried() -> None:
    plan = plan_pod(pod([g(cpu="4")], qos="Guaranteed", annotations={
        "topolet.io/numa-policy": "single-numa-node", "topolet.io/smt": "full-cores",
        "topolet.io/memory-binding": "true"}))
    (x,) = plan.containers
    assert (x.cpus, x.numa_policy, x.smt, x.memory_binding) == (4, "single-numa-node", "full-cores", True)
    shared = plan_pod(pod([c(cpu="1")], qos="Burstable", annotations={"topolet.io/memory-binding": "true"}))
    assert not shared.containers[0].memory_binding  # binding means nothing on the pool


@pytest.mark.parametrize(("pod_obj", "qos"), [
    (pod([g()]), QOSClass.GUARANTEED),
    (pod([c(cpu="1", mem="1Gi", limit_cpu="2", limit_mem="1Gi")]), QOSClass.BURSTABLE),
    (pod([c()]), QOSClass.BESTEFFORT),
    (pod([g()], qos="BestEffort"), QOSClass.BESTEFFORT),  # the status wins: it is what kubelet used
])
def test_qos(pod_obj: dict[str, Any], qos: QOSClass) -> None:
    assert qos_of(pod_obj) == qos


@pytest.mark.parametrize(("text", "value"), [
    ("2", Fraction(2)), ("2000m", Fraction(2)), ("1500m", Fraction(3, 2)), ("0.5", Fraction(1, 2)),
    ("1Gi", Fraction(2**30)), ("1e3", Fraction(1000)), ("1k", Fraction(1000)), (".5", Fraction(1, 2)),
    ("", None), ("abc", None), ("1x", None), (True, None), (None, None), ("1..2", None),
])
def test_quantity(text: object, value: Fraction | None) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("obj", [None, [], "pod", {}, {"metadata": {"uid": 3, "namespace": "n", "name": "x"}},
                                 {"metadata": {"uid": "", "namespace": "n", "name": "x"}}])
def test_unreadable_identity_is_a_pod_error(obj: object) -> None:
    with pytest.raises(PodError):
        plan_pod(obj)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=12)


@settings(max_examples=examples(300), deadline=None)
@given(spec=json_values, status=json_values, annotations=json_values)
def test_garbage_never_raises_anything_but_pod_error_and_never_pins(spec: object, status: object,
                                                                    annotations: object) -> None:
    obj = {"metadata": {"uid": "u", "namespace": "n", "name": "p", "annotations": annotations},
           "spec": spec, "status": status}
    plan = plan_pod(obj)
    # Garbage cannot name a running container with a whole CPU request in a Guaranteed pod by chance
    # often; whatever it yields must at least be well-formed.
    for x in plan.containers:
        assert x.cpus >= 0 and isinstance(x.container_id, str)


@settings(max_examples=examples(200), deadline=None)
@given(value=st.text(max_size=12))
def test_any_bad_annotation_value_keeps_the_pod_shared(value: str) -> None:
    obj = pod([g(cpu="2")], qos="Guaranteed", annotations={"topolet.io/smt": value})
    plan = plan_pod(obj)
    if value in ("full-cores", "any"):
        assert plan.containers[0].cpus == 2
    else:
        assert plan.containers[0].cpus == 0
        assert [w.reason for w in plan.warnings] == ["InvalidAnnotation"]


@pytest.mark.parametrize("resource, wants", [
    ("nvidia.com/gpu", True),
    ("nvidia.com/mig-1g.10gb", True),
    ("example.com/fpga", True),  # every device plugin resource: CPUs follow all of its devices
    ("rdma/hca_shared_devices_a", True),
    ("kubernetes.io/something", False),  # not an extended resource
    ("hugepages-2Mi", False),
    (None, False),
])
def test_containers_asking_for_devices_are_marked_for_a_lookup(resource: str | None, wants: bool) -> None:
    spec = g()
    if resource is not None:
        spec["resources"]["limits"][resource] = "1"
    (plan,) = plan_pod(pod([spec])).containers
    assert plan.wants_devices is wants
    assert plan.cpus == 2  # an extended resource does not change the CPU decision


def resized(obj: dict[str, Any], container: str = "c", *, allocated: dict[str, str] | None = None,
            requests: dict[str, str] | None = None, limits: dict[str, str] | None = None) -> dict[str, Any]:
    """`obj` with the kubelet's view of `container` in its status: `allocatedResources` and the
    `resources` the runtime was given (each left out when None)."""
    for cs in obj["status"]["containerStatuses"]:
        if cs["name"] == container:
            if allocated is not None:
                cs["allocatedResources"] = allocated
            if requests is not None or limits is not None:
                given = (("requests", requests), ("limits", limits))
                cs["resources"] = {k: v for k, v in given if v is not None}
    return obj


TWO = {"cpu": "2", "memory": "1Gi"}
SIX = {"cpu": "6", "memory": "1Gi"}

# (description, pod, {container: cpus}, warning reasons): the status says what the kubelet granted.
RESIZE_CASES: list[tuple[str, dict[str, Any], dict[str, int], tuple[str, ...]]] = [
    ("deferred resize 2 -> 6 keeps 2", resized(pod([g(cpu="6")], qos="Guaranteed"), allocated=TWO,
                                               requests=TWO, limits=TWO), {"c": 2}, ()),
    ("deferred resize, allocatedResources alone", resized(pod([g(cpu="6")], qos="Guaranteed"),
                                                          allocated=TWO), {"c": 2}, ()),
    ("deferred resize, status resources alone", resized(pod([g(cpu="6")], qos="Guaranteed"),
                                                        requests=TWO, limits=TWO), {"c": 2}, ()),
    ("accepted resize not yet actuated: the allocation counts",
     resized(pod([g(cpu="6")], qos="Guaranteed"), allocated=SIX, requests=TWO, limits=TWO), {"c": 6}, ()),
    ("shrink 6 -> 2 allocated", resized(pod([g(cpu="2")], qos="Guaranteed"), allocated=TWO,
                                        requests=SIX, limits=SIX), {"c": 2}, ()),
    ("resize to a fraction: shared", resized(pod([g(cpu="2")], qos="Guaranteed"),
                                             allocated={"cpu": "1500m", "memory": "1Gi"}), {"c": 0}, ()),
    ("status without cpu: the spec fills in", resized(pod([g(cpu="4")], qos="Guaranteed"),
                                                      allocated={"memory": "1Gi"}), {"c": 4}, ()),
    ("unreadable allocation: shared, never the spec's size",
     resized(pod([g(cpu="6")], qos="Guaranteed"), allocated={"cpu": "lots"}), {"c": 0}, ()),
    ("opt-in, deferred resize keeps the granted size",
     resized(pod([c(cpu="4", mem="1Gi", limit_cpu="4")], qos="Burstable", annotations=EXCL),
             allocated={"cpu": "2", "memory": "1Gi"}, requests={"cpu": "2"}, limits={"cpu": "2"}),
     {"c": 2}, ()),
    ("opt-in, granted request below the runtime's limit: not eligible",
     resized(pod([c(cpu="4", mem="1Gi", limit_cpu="4")], qos="Burstable", annotations=EXCL),
             allocated={"cpu": "2"}, limits={"cpu": "4"}), {"c": 0}, ("NotEligible",)),
    ("only the resized container changes", resized(pod([g("a", cpu="6"), g("b", cpu="3")], qos="Guaranteed"),
                                                   "a", allocated=TWO), {"a": 2, "b": 3}, ()),
]


@pytest.mark.parametrize(("pod_obj", "want", "reasons"), [c[1:] for c in RESIZE_CASES],
                         ids=[c[0] for c in RESIZE_CASES])
def test_resized_pods_are_planned_from_what_the_kubelet_granted(pod_obj: dict[str, Any], want: dict[str, int],
                                                               reasons: tuple[str, ...]) -> None:
    before = repr(pod_obj)
    plan = plan_pod(pod_obj)
    assert {x.name: x.cpus for x in plan.containers} == want
    assert tuple(w.reason for w in plan.warnings) == reasons
    assert repr(pod_obj) == before  # the watch's object is read, never changed


def test_memory_held_is_the_granted_memory() -> None:
    obj = resized(pod([g(cpu="2", mem="1Gi")], qos="Guaranteed"), allocated={"cpu": "2", "memory": "512Mi"})
    (x,) = plan_pod(obj).containers
    assert x.memory == (("memory", 512 * 2**20),)


BIND = {"topolet.io/memory-binding": "true"}

# (description, pod, cpus, bound, warning reasons): memory is bound only where the kubelet's Memory
# Manager would bind it, in Guaranteed pods.
BINDING_CASES: list[tuple[str, dict[str, Any], int, bool, tuple[str, ...]]] = [
    ("guaranteed is bound", pod([g(cpu="2")], qos="Guaranteed", annotations=BIND), 2, True, ()),
    ("guaranteed, qos derived", pod([g(cpu="2")], annotations=BIND), 2, True, ()),
    ("burstable opt-in without memory limit: pinned, unbound",
     pod([c(cpu="2", mem="1Gi", limit_cpu="2")], qos="Burstable", annotations={**EXCL, **BIND}),
     2, False, ("NotEligible",)),
    ("burstable opt-in with memory limit above request: unbound",
     pod([c(cpu="2", mem="1Gi", limit_cpu="2", limit_mem="2Gi")], qos="Burstable",
         annotations={**EXCL, **BIND}), 2, False, ("NotEligible",)),
    ("burstable on the pool", pod([c(cpu="1", mem="1Gi")], qos="Burstable", annotations=BIND), 0, False,
     ("NotEligible",)),
    ("besteffort", pod([c()], qos="BestEffort", annotations=BIND), 0, False, ("NotEligible",)),
    ("burstable, binding off", pod([c(cpu="2", mem="1Gi", limit_cpu="2")], qos="Burstable",
                                   annotations={**EXCL, "topolet.io/memory-binding": "false"}), 2, False, ()),
]


@pytest.mark.parametrize(("pod_obj", "cpus", "bound", "reasons"), [c[1:] for c in BINDING_CASES],
                         ids=[c[0] for c in BINDING_CASES])
def test_memory_binding_only_for_guaranteed_pods(pod_obj: dict[str, Any], cpus: int, bound: bool,
                                                 reasons: tuple[str, ...]) -> None:
    plan = plan_pod(pod_obj)
    (x,) = plan.containers
    assert (x.cpus, x.memory_binding) == (cpus, bound)
    assert tuple(w.reason for w in plan.warnings) == reasons
