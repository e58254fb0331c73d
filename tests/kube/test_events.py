"""Events on pods against a real API server: events.k8s.io/v1, aggregated instead of repeated, best effort."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from agent.errors import ConfigError
from agent.kube.publish.events import MAX_MESSAGE, REPORTING_CONTROLLER, EventRecorder
from tests.controlplane.harness import ControlPlane

NODE = "events-node"


class Clock:
    """A settable wall clock starting now."""

    def __init__(self) -> None:
        self.now = float(int(time.time()))

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def api(control_plane: ControlPlane) -> Iterator[Any]:
    with control_plane.client() as client:
        yield client


@pytest.fixture
def pod(api: Any) -> Any:
    """A pod bound to NODE in a fresh namespace (with the default service account the admission
    plugin asks for, since no controller-manager creates it here)."""
    from kubernetes import client as k8s

    core = k8s.CoreV1Api(api)
    ns = f"events-{uuid.uuid4().hex[:8]}"
    core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=ns)))
    account = k8s.V1ServiceAccount(metadata=k8s.V1ObjectMeta(name="default"))
    core.create_namespaced_service_account(ns, account)
    return core.create_namespaced_pod(ns, k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name="worker", annotations={"topolet.io/cpu-policy": "sometimes"}),
        spec=k8s.V1PodSpec(node_name=NODE, automount_service_account_token=False,
                           containers=[k8s.V1Container(name="main", image="busybox")])))


def events_of(api: Any, pod: Any) -> list[Any]:
    from kubernetes import client as k8s

    found = k8s.CoreV1Api(api).list_namespaced_event(
        pod.metadata.namespace, field_selector=f"involvedObject.uid={pod.metadata.uid}")
    return sorted(found.items, key=lambda e: (e.reason, e.metadata.name))


def count(event: Any) -> int:
    """How many occurrences an Event stands for: its series' count, 1 without a series."""
    return int(event.series.count) if event.series else 1


def test_warning_event_on_the_pod(api: Any, pod: Any) -> None:
    rec = EventRecorder(api, NODE)
    assert rec.warn(pod, "InvalidAnnotation", "topolet.io/cpu-policy=sometimes: want exclusive or shared")
    (event,) = events_of(api, pod)
    assert (event.type, event.reason, count(event)) == ("Warning", "InvalidAnnotation", 1)
    assert event.message == "topolet.io/cpu-policy=sometimes: want exclusive or shared"
    assert (event.involved_object.kind, event.involved_object.name) == ("Pod", "worker")
    assert (event.involved_object.uid, event.involved_object.namespace) == (pod.metadata.uid,
                                                                            pod.metadata.namespace)
    assert (event.reporting_component, event.reporting_instance) == (REPORTING_CONTROLLER, NODE)
    assert event.event_time is not None and event.action
    assert rec.writes == 1


def test_written_through_events_k8s_io(api: Any, pod: Any) -> None:
    """The Event is the events.k8s.io/v1 kind (the only one the agent's RBAC grants), note cut to 1 kB."""
    from kubernetes import client as k8s

    rec = EventRecorder(api, NODE)
    assert rec.warn(pod, "InvalidAnnotation", "é" * MAX_MESSAGE)  # two bytes each in UTF-8
    found: list[Any] = k8s.EventsV1Api(api).list_namespaced_event(pod.metadata.namespace).items
    (event,) = [e for e in found if e.regarding.uid == pod.metadata.uid]
    assert (event.reporting_controller, event.reporting_instance) == (REPORTING_CONTROLLER, NODE)
    assert (event.regarding.api_version, event.regarding.kind) == ("v1", "Pod")
    assert event.note == "é" * (MAX_MESSAGE // 2)


def test_repeats_are_aggregated_not_spammed(api: Any, pod: Any) -> None:
    clock = Clock()
    rec = EventRecorder(api, NODE, interval_seconds=300, clock=clock)
    message = "topolet.io/numa-policy=strict: unknown policy"
    assert rec.warn(pod, "InvalidAnnotation", message)
    for _ in range(3):
        clock.now += 10
        assert rec.warn(pod, "InvalidAnnotation", message) is False
    assert rec.aggregated == 3 and rec.writes == 1
    (event,) = events_of(api, pod)
    assert count(event) == 1

    # After the interval the same Event is updated with every occurrence counted; no second Event.
    clock.now += 300
    assert rec.warn(pod, "InvalidAnnotation", message) is True
    (event,) = events_of(api, pod)
    assert count(event) == 5
    assert event.series.last_observed_time > event.event_time

    # Another reason on the same pod is another Event, and Normal events are recorded as such.
    assert rec.normal(pod, "SharedPool", "left in the shared CPU pool")
    normal = [e for e in events_of(api, pod) if e.reason == "SharedPool"]
    assert [(e.type, count(e)) for e in normal] == [("Normal", 1)]


def test_an_expired_event_is_created_again(api: Any, pod: Any) -> None:
    from kubernetes import client as k8s

    clock = Clock()
    rec = EventRecorder(api, NODE, interval_seconds=60, clock=clock)
    assert rec.warn(pod, "InvalidAnnotation", "bad")
    (first,) = events_of(api, pod)
    k8s.CoreV1Api(api).delete_namespaced_event(first.metadata.name, first.metadata.namespace)
    clock.now += 61
    assert rec.warn(pod, "InvalidAnnotation", "bad") is True
    (second,) = events_of(api, pod)
    assert second.metadata.name != first.metadata.name
    assert count(second) == 2


def test_api_outage_is_not_an_error_for_the_caller(control_plane: ControlPlane, api: Any, pod: Any) -> None:
    rec = EventRecorder(api, NODE)
    control_plane.stop_apiserver()
    try:
        assert rec.warn(pod, "InvalidAnnotation", "while the API is down") is False
        assert rec.failures == 1
    finally:
        control_plane.start_apiserver()
    # Nothing was remembered for the failed one: it is written once the API is back.
    assert rec.warn(pod, "InvalidAnnotation", "while the API is down") is True
    assert [e.message for e in events_of(api, pod)] == ["while the API is down"]


def test_pod_as_a_dict(api: Any, pod: Any) -> None:
    as_dict = {"metadata": {"namespace": pod.metadata.namespace, "name": pod.metadata.name,
                            "uid": pod.metadata.uid}}
    assert EventRecorder(api, NODE).warn(as_dict, "InvalidAnnotation", "from a watch event")
    assert [e.message for e in events_of(api, pod)] == ["from a watch event"]


@pytest.mark.parametrize(("pod", "reason"), [
    ({"metadata": {"name": "p", "namespace": "ns"}}, "not a reason"),
    ({"metadata": {"name": "p", "namespace": "ns"}}, ""),
    ({"metadata": {"name": "p"}}, "InvalidAnnotation"),
    (object(), "InvalidAnnotation"),
])
def test_invalid_calls_are_refused(pod: object, reason: str) -> None:
    with pytest.raises(ConfigError):
        EventRecorder(None, NODE).warn(pod, reason, "message")


def test_tracked_keys_are_bounded(api: Any, pod: Any) -> None:
    rec = EventRecorder(api, NODE, max_tracked=2)
    for i in range(3):
        assert rec.warn(pod, "InvalidAnnotation", f"message {i}")
    # The oldest key was forgotten: it is written again rather than aggregated.
    assert rec.warn(pod, "InvalidAnnotation", "message 0") is True
    assert rec.warn(pod, "InvalidAnnotation", "message 2") is False
