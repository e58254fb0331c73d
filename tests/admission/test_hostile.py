"""What a tenant may write never stops a decision: every decoder of user-written data is strict and
raises one error type, and a decision pass over hostile objects skips each bad one and goes on."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.admission.cluster.view import BadObject, node_policy, nrt_zones, pod_requests
from agent.admission.controller.loop import Controller, ControllerConfig
from agent.admission.engine.model import (
    NODE_POLICY,
    ClusterView,
    Gang,
    Node,
    Placement,
    PodPlacement,
    PodSet,
    Resources,
)
from agent.admission.engine.place import place
from agent.admission.gangs.job import MAX_GANG_PODS, JobSpecError, gang_from_job, priority_classes
from agent.admission.gangs.record import (
    RECORD_MAX_CHARS,
    AdmissionRecord,
    SlotPlacement,
    decode_record,
    record_too_long,
)
from agent.admission.gangs.slots import assign_slots, completion_index, pod_target, pods_by_owner
from agent.admission.kueue.workloads import WorkloadSpecError, gang_from_workload, records_of_state
from agent.admission.report.metrics import AdmissionMetrics
from agent.api.objects import decimal, json_int, json_object

# -- the strict primitives ----------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "maximum", "want"), [
    ("0", 9, 0), ("7", 9, 7), ("1023", 1023, 1023), ("1024", 1023, None), ("07", 99, None),
    ("²", 9, None), ("٣", 9, None), ("1²", 99, None), ("", 9, None), (" 1", 9, None), ("1 ", 9, None),
    ("+1", 9, None), ("-1", 9, None), ("1_0", 99, None), ("9" * 5000, 10**6, None), (3, 9, None),
    (None, 9, None),
])
def test_decimal(text: object, maximum: int, want: int | None) -> None:
    assert decimal(text, maximum) == want


@pytest.mark.parametrize(("value", "want"), [
    (0, 0), (5, 5), (1023, 1023), (1024, None), (-1, None), (True, None), (1.0, None), ("1", None),
    pytest.param(10**5000, None, id="huge"),
])
def test_json_int(value: object, want: int | None) -> None:
    assert json_int(value, 1023) == want


@pytest.mark.parametrize(("text", "want"), [
    ('{"a": 1}', {"a": 1}),
    ('{"a": "[[[[[[[[["}', {"a": "[[[[[[[[["}),  # brackets in strings do not nest
    ('{"a": {"b": {"c": 1}}}', {"a": {"b": {"c": 1}}}),
    ('{"a": {"b": {"c": {"d": 1}}}}', None),  # too deep
    ("[" * 100_000, None),
    ('"' + "\\\"" * 50_000, None),  # an unterminated string: one linear pass
    ("[1]", None), ("1", None), ("nope", None), ('{"a": 1', None),
    ('{"a": ' + "9" * 5000 + "}", None),  # a number Python will not make an int of
    ('{"a": "' + "x" * 2000 + '"}', None),  # longer than the cap
])
def test_json_object(text: str, want: object) -> None:
    assert json_object(text, 1024, 3) == want


# -- decoders: one error type each, whatever the input ------------------------------------------------

JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
                    max_leaves=20)
DIGITISH = st.sampled_from(["0", "1", "²", "٣", "07", "9" * 5000, "-1", " 2", "", "1e3", "x"])
SLOTS = st.dictionaries(DIGITISH | st.text(max_size=8),
                        st.fixed_dictionaries({"node": st.text(max_size=8) | JSON, "zone": JSON}),
                        max_size=4)


@given(st.text() | JSON.map(json.dumps))
def test_decode_record_raises_only_job_spec_error_on_anything(text: str) -> None:
    try:
        decode_record(text)
    except JobSpecError:
        pass


@given(st.sampled_from(["admitted", "rejected"]), SLOTS, JSON)
def test_decode_record_raises_only_job_spec_error_on_record_shapes(result: str, slots: dict[str, Any],
                                                                   time: Any) -> None:
    text = json.dumps({"version": 1, "result": result, "decision": "d", "time": time, "placement": slots})
    try:
        record = decode_record(text)
    except JobSpecError:
        return
    assert all(isinstance(k, int) and 0 <= k for k in record.slots)


@pytest.mark.parametrize("key", ["²", "9" * 5000, "07", "-1"])
def test_a_record_slot_that_is_not_an_ascii_decimal_is_malformed(key: str) -> None:
    text = json.dumps({"result": "admitted", "decision": "d", "time": "t", "placement": {key: {"node": "n"}}})
    with pytest.raises(JobSpecError):
        decode_record(text)


def test_a_deeply_nested_record_is_malformed_not_a_crash() -> None:
    with pytest.raises(JobSpecError):
        decode_record('{"result": "admitted", "x": ' + "[" * 100_000 + "]" * 100_000 + "}")


ANNOTATIONS = st.dictionaries(
    st.sampled_from(["topolet.io/numa-zone", "topolet.io/placements",
                     "batch.kubernetes.io/job-completion-index", "topolet.io/numa-policy"]),
    DIGITISH | st.text(max_size=12) | st.sampled_from(["n1:²", "n1:0,n1:1", "n1:", ":", "n1:99999"]) | JSON,
    max_size=4)


def hostile_pod(annotations: Mapping[str, Any], node: Any = "n1", gated: bool = False,
                cpu: Any = "1", uid: str = "p") -> dict[str, Any]:
    spec: dict[str, Any] = {"nodeSelector": {"kubernetes.io/hostname": node}, "nodeName": node,
                            "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu},
                                                                       "limits": {"cpu": cpu}}}]}
    if gated:
        spec["schedulingGates"] = [{"name": "topolet.io/placement"}]
    return {"metadata": {"name": uid, "namespace": "t", "uid": uid, "resourceVersion": "1",
                         "annotations": dict(annotations),
                         "ownerReferences": [{"kind": "Job", "name": "j", "uid": "job", "controller": True}]},
            "spec": spec, "status": {"phase": "Running"}}


@given(st.lists(st.tuples(ANNOTATIONS, st.booleans()), max_size=5), st.booleans())
def test_slots_over_hostile_pods_never_raise(pods: list[tuple[dict[str, Any], bool]], indexed: bool) -> None:
    objs = [hostile_pod(notes, gated=gated, uid=f"p{i}") for i, (notes, gated) in enumerate(pods)]
    for pod in objs:
        pod_target(pod)
        completion_index(pod)
    slots = {0: SlotPlacement("n1", 0), 1: SlotPlacement("n1", None)}
    assign_slots(slots, objs, indexed)


def test_a_superscript_zone_or_index_reads_as_none() -> None:
    pod = hostile_pod({"topolet.io/numa-zone": "²"})
    assert pod_target(pod) == SlotPlacement("n1", None)
    pod = hostile_pod({"topolet.io/placements": "n1:0", "batch.kubernetes.io/job-completion-index": "²"})
    assert completion_index(pod) is None and pod_target(pod) == SlotPlacement("n1", None)


RESOURCES = st.dictionaries(st.sampled_from(["cpu", "memory", "nvidia.com/gpu", "hugepages-2Mi", "pods"]),
                            st.sampled_from(["1", "1e33", "²", "9" * 5000, "-1", "1.5", "", "1Ki"]) | JSON,
                            max_size=3)


@given(RESOURCES, JSON)
def test_view_readers_never_raise_but_bad_object(requests: dict[str, Any], zones: Any) -> None:
    pod_requests({"metadata": {"name": "p"}, "spec": {"containers": [{"resources": {"requests": requests}}]}})
    try:
        nrt_zones({"zones": zones})
        nrt_zones({"zones": [{"type": "Node", "name": "node-0", "resources": [
            {"name": k, "available": v, "allocatable": v} for k, v in requests.items()]}]})
    except BadObject:
        pass


def job_obj(template: Mapping[str, Any] | None = None, parallelism: Any = 1,
            **annotations: Any) -> dict[str, Any]:
    return {"metadata": {"name": "j", "namespace": "t", "uid": "job", "resourceVersion": "1",
                         "creationTimestamp": "2026-01-01T00:00:00Z",
                         "labels": {"topolet.io/queue": "default"}, "annotations": annotations},
            "spec": {"suspend": True, "parallelism": parallelism,
                     "template": template or {"spec": {"containers": [{"name": "c"}]}}}}


@given(JSON, JSON, RESOURCES, ANNOTATIONS)
def test_gang_from_job_raises_only_job_spec_error(spec: Any, parallelism: Any, requests: dict[str, Any],
                                                   notes: dict[str, Any]) -> None:
    template = {"metadata": {"annotations": notes},
                "spec": {"containers": [{"name": "c", "resources": {"requests": requests}}],
                         "priorityClassName": spec, "nodeSelector": spec, "tolerations": spec}}
    try:
        gang_from_job(job_obj(template, parallelism), {"high": 10})
    except JobSpecError:
        pass


@given(JSON, JSON)
def test_workload_readers_raise_only_workload_spec_error(pod_sets: Any, updates: Any) -> None:
    wl = {"metadata": {"name": "w", "namespace": "t", "uid": "w"}, "spec": {"podSets": pod_sets}}
    try:
        gang_from_workload(wl, {})
    except WorkloadSpecError:
        pass
    try:
        records_of_state(wl, {"podSetUpdates": updates})
    except WorkloadSpecError:
        pass


# -- bounds -------------------------------------------------------------------------------------------

def test_priority_comes_only_from_priority_classes() -> None:
    """A template's own `priority` (the API server takes it on a Job) never jumps the queue."""
    classes = [{"metadata": {"name": "high"}, "value": 1000},
               {"metadata": {"name": "default"}, "value": 5, "globalDefault": True},
               {"metadata": {"name": "broken"}, "value": "lots"}]
    priorities = priority_classes(classes)
    assert priorities == ({"high": 1000, "default": 5}, 5)
    template = {"spec": {"priority": 2147483647, "containers": [{"name": "c"}]}}
    assert gang_from_job(job_obj(template), *priorities[:1], "none", priorities[1]).priority == 5
    assert gang_from_job(job_obj(template), {}).priority == 0
    named = {"spec": {"priority": 2147483647, "priorityClassName": "high", "containers": [{"name": "c"}]}}
    assert gang_from_job(job_obj(named), priorities[0], "none", priorities[1]).priority == 1000
    assert priority_classes([]) == ({}, 0)


@pytest.mark.parametrize(("attributes", "want"), [
    (None, "none"),  # no NRT
    ([], "none"),
    ([{"name": "topologyManagerPolicy", "value": "single-numa-node"}], "single-numa-node"),
    ([{"name": "topologyManagerScope", "value": "pod"},
      {"name": "topologyManagerPolicy", "value": "restricted"}], "restricted"),
    ([{"name": "topologyManagerPolicy", "value": "bogus"}], "none"),  # it concerns that node alone
    ([{"name": "topologyManagerPolicy", "value": ["single-numa-node"]}], "none"),
    ("²", "none"),
])
def test_node_policy_is_each_nodes_own(attributes: object, want: str) -> None:
    nrt = None if attributes is None else {"attributes": attributes}
    assert node_policy(nrt) == want


@pytest.mark.parametrize(("nrt", "want"), [
    # Older publishers (NFD's topology updater before the attributes) fill only the deprecated list.
    ({"topologyPolicies": ["SingleNUMANodeContainerLevel"]}, "single-numa-node"),
    ({"topologyPolicies": ["SingleNUMANodePodLevel"]}, "single-numa-node"),
    ({"topologyPolicies": ["RestrictedPodLevel"]}, "restricted"),
    ({"topologyPolicies": ["BestEffortContainerLevel"]}, "best-effort"),
    ({"topologyPolicies": ["None"]}, "none"),
    ({"topologyPolicies": ["Bogus"]}, "none"),
    ({"topologyPolicies": [{"x": 1}]}, "none"),
    ({"topologyPolicies": "SingleNUMANodePodLevel"}, "none"),  # not a list
    ({"topologyPolicies": []}, "none"),
    # The attribute wins where both are given.
    ({"topologyPolicies": ["SingleNUMANodePodLevel"],
      "attributes": [{"name": "topologyManagerPolicy", "value": "best-effort"}]}, "best-effort"),
])
def test_node_policy_reads_the_deprecated_list_without_the_attribute(nrt: dict[str, Any], want: str) -> None:
    assert node_policy(nrt) == want


def zone_named(name: str) -> dict[str, Any]:
    return {"type": "Node", "name": name,
            "resources": [{"name": "cpu", "available": "1", "allocatable": "1"}]}


def test_zone_ids_have_the_bound_the_agent_writes_with() -> None:
    """One bound for the agent's NRT writer and the controller's reader: Linux's 1024 NUMA nodes."""
    from agent.api.nrt import MAX_ZONE_ID
    from agent.api.placements import MAX_NUMA_ZONE

    assert MAX_ZONE_ID == MAX_NUMA_ZONE == 1023
    now, _ = nrt_zones({"zones": [zone_named("node-1023")]})
    assert [z.numa for z in now] == [1023]
    with pytest.raises(BadObject, match="above 1023"):
        nrt_zones({"zones": [zone_named("node-1024")]})


def test_a_guaranteed_gang_without_a_policy_takes_each_nodes() -> None:
    pod_spec = {"containers": [{"name": "c", "resources": {"limits": {"cpu": "2", "memory": "1Gi"}}}]}
    job = {"metadata": {"name": "j", "namespace": "t"},
           "spec": {"parallelism": 1, "template": {"spec": pod_spec}}}
    assert gang_from_job(job, {}).pod_sets[0].numa_policy == NODE_POLICY


def test_pods_are_a_jobs_only_in_its_own_namespace() -> None:
    mine, other = hostile_pod({}, uid="a"), hostile_pod({}, uid="b")
    other["metadata"]["namespace"] = "elsewhere"
    by_owner = pods_by_owner([mine, other])
    assert by_owner[("t", "job")] == [mine] and by_owner[("elsewhere", "job")] == [other]


def test_a_record_too_long_for_an_annotation_is_said() -> None:
    def placement(pods: int, node: str) -> Placement:
        return Placement("t/j", tuple(PodPlacement("main", i, node, 0) for i in range(pods)))

    assert record_too_long(placement(100, "n" * 20)) is None
    why = record_too_long(placement(MAX_GANG_PODS, "n" * 200))
    assert why is not None and f"{RECORD_MAX_CHARS // 1024} KiB" in why
    record = AdmissionRecord("admitted", "d", "t", {i: SlotPlacement("n" * 20, 0) for i in range(100)})
    assert decode_record(record.encode()) == record


def test_a_big_gang_that_does_not_fit_is_refused_without_deep_recursion() -> None:
    """The search backtracks on a stack of its own: thousands of pods are thousands of levels."""
    node = Node("n1", free=Resources(cpu_milli=64_000), capacity=Resources(cpu_milli=64_000), free_pods=5000)
    view = ClusterView(nodes=(node,), empty=(node,))
    gang = Gang("t/big", (PodSet("main", 3000, Resources(cpu_milli=100)),))
    assert not isinstance(place(view, gang), Placement)


# -- the decision pass over hostile Jobs and pods -------------------------------------------------------

class FakeKube:
    """Answers every write with the object written (a patch is merged shallowly), records nothing."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}

    def get(self, path: str, query: Any = None, **_: Any) -> dict[str, Any]:
        return self.objects.get(path, {})

    def create(self, path: str, body: Mapping[str, Any], **_: Any) -> dict[str, Any]:
        return dict(body)

    def patch(self, path: str, body: Mapping[str, Any], content_type: str, **_: Any) -> dict[str, Any]:
        obj = self.objects.setdefault(path, {})
        for key, value in body.items():
            obj[key] = value
        meta = obj.setdefault("metadata", {})
        meta["resourceVersion"] = str(int(meta.get("resourceVersion") or 1) + 1)
        return obj


def controller_over(jobs: list[dict[str, Any]], pods: list[dict[str, Any]]) -> Controller:
    ctl = Controller(FakeKube(), ControllerConfig(identity="test"), AdmissionMetrics())  # type: ignore[arg-type]
    node = {"metadata": {"name": "n1", "uid": "n1", "resourceVersion": "1"},
            "status": {"allocatable": {"cpu": "64", "memory": "256Gi", "pods": "110"}}}
    nrt = {"metadata": {"name": "n1", "resourceVersion": "1"},
           "attributes": [{"name": "topologyManagerPolicy", "value": "single-numa-node"}],
           "zones": [{"type": "Node", "name": f"node-{z}", "resources": [
               {"name": "cpu", "available": "32", "allocatable": "32", "capacity": "32"},
               {"name": "memory", "available": "128Gi", "allocatable": "128Gi", "capacity": "128Gi"}]}
               for z in (0, 1)]}
    ctl.nodes.put(node)
    ctl.nrts.put(nrt)
    for i, job in enumerate(jobs):
        job["metadata"]["uid"] = job["metadata"]["name"] = f"j{i}"
        ctl.jobs.put(job)
    for pod in pods:
        ctl.pods.put(pod)
    return ctl


def invalid_count(ctl: Controller, kind: str) -> float:
    value = ctl.metrics.registry.get_sample_value("topolet_admission_invalid_objects_total", {"kind": kind})
    return value or 0.0


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(ANNOTATIONS, JSON, RESOURCES), min_size=1, max_size=4),
       st.lists(st.tuples(ANNOTATIONS, st.booleans(), RESOURCES), max_size=4))
def test_a_pass_over_hostile_objects_never_raises(
        jobs: list[tuple[dict[str, Any], Any, dict[str, Any]]],
        pods: list[tuple[dict[str, Any], bool, dict[str, Any]]]) -> None:
    objs = []
    for notes, record, requests in jobs:
        template = {"metadata": {"annotations": notes},
                    "spec": {"containers": [{"name": "c", "resources": {"requests": requests}}]}}
        job = job_obj(template)
        if record is not None:
            job["metadata"]["annotations"]["topolet.io/admission"] = json.dumps(record)
        objs.append(job)
    pod_objs = []
    for i, (notes, gated, requests) in enumerate(pods):
        pod = hostile_pod(notes, gated=gated, uid=f"p{i}")
        pod["spec"]["containers"][0]["resources"] = {"requests": requests}
        pod["metadata"]["ownerReferences"][0]["uid"] = "j0"
        pod_objs.append(pod)
    victim = job_obj({"spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]}})
    ctl = controller_over([*objs, victim], pod_objs)
    ctl.decide_once()
    ctl.writes.shutdown()


def test_a_poison_job_costs_only_itself() -> None:
    """An admitted Job whose pod says zone "²", beside a victim gang: the victim is admitted, the
    poison is skipped with an Event and counted."""
    record = AdmissionRecord("admitted", "d", "2026-01-01T00:00:00Z", {0: SlotPlacement("n1", 0)}).encode()
    poison = job_obj(**{"topolet.io/admission": record})
    poison["spec"]["suspend"] = False
    forged = job_obj(**{"topolet.io/admission": json.dumps(
        {"result": "admitted", "decision": "d", "time": "t", "placement": {"²": {"node": "n1"}}})})
    pod = hostile_pod({"topolet.io/numa-zone": "²"}, uid="poison-pod")
    victim = job_obj({"spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]}})
    ctl = controller_over([poison, forged, victim], [pod])
    pod["metadata"]["ownerReferences"][0]["uid"] = "j0"
    ctl.decide_once()
    ctl.writes.shutdown()
    assert ctl.metrics.registry.get_sample_value("topolet_admission_decisions_total",
                                                 {"result": "admitted"}) == 1
    assert invalid_count(ctl, "Job") >= 1
