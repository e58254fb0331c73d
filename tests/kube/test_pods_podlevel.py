"""Pods that set pod-level resources (`spec.resources`) in the agent's plan (issue 34, finding 1).

The kubelet's static CPU manager (kubernetes v1.37.2 `pkg/kubelet/cm/cpumanager/policy_static.go`,
`allocateForAdd` and the hint functions) gives a pod whose pod-level resources are set
(`IsPodLevelResourcesSet`: cpu, memory or hugepages-* in its requests or limits) no exclusive CPUs and
no hints while the `PodLevelResourceManagers` gate is off, its default in 1.37; its Memory Manager
likewise.  The agent's plan agrees: such a pod runs wholly on the shared pool."""

from __future__ import annotations

from typing import Any

import pytest

from agent.admission.cluster.ledger import agent_pins
from agent.api.podplan import plan_pod, qos_of
from agent.api.qos import QOSClass
from agent.api.resources import pod_level_resources
from tests.kube.test_pods import EXCL, c, g, pod


def with_pod_level(obj: dict[str, Any], requests: dict[str, str] | None = None,
                   limits: dict[str, str] | None = None) -> dict[str, Any]:
    res = {k: v for k, v in (("requests", requests), ("limits", limits)) if v is not None}
    obj["spec"]["resources"] = res
    return obj


PL = {"cpu": "4", "memory": "2Gi"}

# (description, pod, {container: cpus}, warning reasons)
CASES: list[tuple[str, dict[str, Any], dict[str, int], tuple[str, ...]]] = [
    ("guaranteed containers with whole CPUs, pod-level set: shared",
     with_pod_level(pod([g("a", cpu="2"), g("b", cpu="2")], qos="Guaranteed"), PL, PL), {"a": 0, "b": 0}, ()),
    ("pod-level only, containers ask nothing",
     with_pod_level(pod([c("a")], qos="Guaranteed"), PL, PL), {"a": 0}, ()),
    ("pod-level limits only", with_pod_level(pod([g(cpu="2")], qos="Guaranteed"), limits=PL), {"c": 0}, ()),
    ("pod-level hugepages only",
     with_pod_level(pod([g(cpu="2")], qos="Guaranteed"), limits={"hugepages-2Mi": "4Mi"}), {"c": 0}, ()),
    ("asks exclusive: told it is not eligible",
     with_pod_level(pod([g(cpu="2")], qos="Guaranteed", annotations=EXCL), PL, PL), {"c": 0},
     ("NotEligible",)),
    ("asks memory binding: told it is not eligible",
     with_pod_level(pod([g(cpu="2")], qos="Guaranteed", annotations={"topolet.io/memory-binding": "true"}),
                    PL, PL), {"c": 0}, ("NotEligible",)),
    ("placed in a zone: still shared (the zone holds only exclusive CPUs)",
     with_pod_level(pod([g(cpu="2")], qos="Guaranteed", annotations={"topolet.io/numa-zone": "1"}), PL, PL),
     {"c": 0}, ()),
    # not pod-level resources: the kubelet reads a pod-level name it does not cover as unset
    ("a pod-level name they do not cover",
     with_pod_level(pod([g(cpu="2")], qos="Guaranteed"), limits={"example.com/nic": "1"}), {"c": 2}, ()),
    ("empty pod-level resources", with_pod_level(pod([g(cpu="2")], qos="Guaranteed"), {}, {}), {"c": 2}, ()),
]


@pytest.mark.parametrize(("pod_obj", "want", "reasons"), [x[1:] for x in CASES], ids=[x[0] for x in CASES])
def test_pod_level_resources_run_on_the_shared_pool(pod_obj: dict[str, Any], want: dict[str, int],
                                                    reasons: tuple[str, ...]) -> None:
    plan = plan_pod(pod_obj)
    assert {x.name: x.cpus for x in plan.containers} == want
    assert tuple(w.reason for w in plan.warnings) == reasons
    assert not any(x.memory_binding for x in plan.containers)
    assert agent_pins(pod_obj) == any(want.values())  # what the controller's ledger reads of it


def test_waiting_containers_of_a_pod_level_pod_are_decided_shared() -> None:
    """What the NRI route answers for a container created before the status lists it, and no warning
    until something runs."""
    plan = plan_pod(with_pod_level(pod([g(cpu="2")], qos="Guaranteed", running=(), annotations=EXCL), PL, PL))
    assert [(x.name, x.cpus) for x in plan.waiting] == [("c", 0)] and plan.warnings == ()


@pytest.mark.parametrize(("spec", "set_"), [
    ({}, False), ({"resources": {}}, False), ({"resources": {"requests": {}}}, False),
    ({"resources": {"limits": {"example.com/nic": "1"}}}, False), ({"resources": "cpu"}, False),
    ({"resources": {"requests": {"cpu": "1"}}}, True), ({"resources": {"limits": {"memory": "1Gi"}}}, True),
    ({"resources": {"limits": {"hugepages-1Gi": "1Gi"}}}, True),
])
def test_pod_level_resources_set(spec: dict[str, Any], set_: bool) -> None:
    assert pod_level_resources(spec) is set_


@pytest.mark.parametrize(("pod_obj", "qos"), [
    # without a status QoS class: the pod-level figures alone decide, as the API server's
    (with_pod_level(pod([c(cpu="1")]), PL, PL), QOSClass.GUARANTEED),
    (with_pod_level(pod([g()]), {"cpu": "1", "memory": "2Gi"}, PL), QOSClass.BURSTABLE),
])
def test_qos_of_a_pod_level_pod(pod_obj: dict[str, Any], qos: QOSClass) -> None:
    assert qos_of(pod_obj) == qos
