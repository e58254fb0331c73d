"""A namespace's LimitRange container defaults on a Job's template (`agent.admission.gangs.limitrange`),
as kubernetes v1.37's LimitRanger admission plugin fills them in each pod, and the gang, the ledger's
requests and the slots' comparison (`gangs.job`, `gangs.slots`, `jobs.jobread`) read through them."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest

from agent.admission.gangs.job import ADMISSION_ANNOTATION, GATE, gang_from_job, gang_requests, pod_requests
from agent.admission.gangs.limitrange import (
    NO_DEFAULTS,
    ContainerDefaults,
    LimitRangeError,
    namespace_defaults,
    read_limit_range,
    with_limit_range_defaults,
)
from agent.admission.gangs.record import AdmissionRecord, SlotPlacement
from agent.admission.gangs.shape import job_shape
from agent.admission.gangs.slots import job_owner
from agent.admission.jobs.jobread import JobReader


def limit_range(*items: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": "lr", "namespace": "team"},
            "spec": {"limits": list(items)}}


def container(**fields: dict[str, str]) -> dict[str, Any]:
    """A container with `requests` / `limits` as given (none: no resources at all)."""
    return {"name": "c", "image": "x", **({"resources": dict(fields)} if fields else {})}


CPU1 = {"type": "Container", "defaultRequest": {"cpu": "1", "memory": "256Mi"}}

# (id, LimitRange items, container, the container's resources after, as the API server creates it)
ROWS: list[tuple[str, list[dict[str, Any]], dict[str, Any], dict[str, Any] | None]] = [
    ("no resources: defaultRequest fills the requests", [CPU1], container(),
     {"requests": {"cpu": "1", "memory": "256Mi"}}),
    ("a request written stays; the other is filled", [CPU1], container(requests={"cpu": "3"}),
     {"requests": {"cpu": "3", "memory": "256Mi"}}),
    ("a limit without its request: the request is the limit (pod defaulting first), not the default",
     [CPU1], container(limits={"cpu": "4"}),
     {"limits": {"cpu": "4"}, "requests": {"cpu": "4", "memory": "256Mi"}}),
    ("default fills limits and, with no defaultRequest, the requests (LimitRange defaulting)",
     [{"type": "Container", "default": {"cpu": "2"}}], container(),
     {"limits": {"cpu": "2"}, "requests": {"cpu": "2"}}),
    ("default and defaultRequest: limits and requests apart",
     [{"type": "Container", "default": {"cpu": "2"}, "defaultRequest": {"cpu": "500m"}}], container(),
     {"limits": {"cpu": "2"}, "requests": {"cpu": "500m"}}),
    ("max stands in for a missing default, min for a missing defaultRequest",
     [{"type": "Container", "max": {"memory": "1Gi"}, "min": {"cpu": "100m"}}], container(),
     {"limits": {"memory": "1Gi"}, "requests": {"cpu": "100m", "memory": "1Gi"}}),
    ("a later Container item of one LimitRange overrides an earlier one",
     [CPU1, {"type": "Container", "defaultRequest": {"cpu": "2"}}], container(),
     {"requests": {"cpu": "2", "memory": "256Mi"}}),
    ("Pod and PersistentVolumeClaim items fill nothing",
     [{"type": "Pod", "max": {"cpu": "8"}}, {"type": "PersistentVolumeClaim", "min": {"storage": "1Gi"}}],
     container(), None),
    ("a container with everything written is left as it is", [CPU1],
     container(requests={"cpu": "2", "memory": "1Gi"}), None),
    ("extended resources are filled as any other",
     [{"type": "Container", "default": {"example.com/dev": "1"}}], container(),
     {"limits": {"example.com/dev": "1"}, "requests": {"example.com/dev": "1"}}),
]


@pytest.mark.parametrize(("items", "before", "after"), [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_container_defaults(items: list[dict[str, Any]], before: dict[str, Any],
                            after: dict[str, Any] | None) -> None:
    spec = {"containers": [before], "initContainers": [dict(before, name="init")]}
    out = with_limit_range_defaults(spec, namespace_defaults([read_limit_range(limit_range(*items))]))
    if after is None:
        assert out is spec
        return
    assert out["containers"][0] == {**before, "resources": after}
    assert out["initContainers"][0] == {**before, "name": "init", "resources": after}  # init containers too
    assert spec["containers"][0] == before  # the template is not changed


def test_the_first_limit_range_by_order_wins_per_resource() -> None:
    first = read_limit_range(limit_range({"type": "Container", "default": {"cpu": "2"}}))
    second = read_limit_range(limit_range({"type": "Container", "defaultRequest": {"cpu": "1",
                                                                                   "memory": "64Mi"}}))
    out = with_limit_range_defaults({"containers": [container()]}, namespace_defaults([first, second]))
    assert out["containers"][0]["resources"] == {"limits": {"cpu": "2"},
                                                 "requests": {"cpu": "2", "memory": "64Mi"}}


def test_pod_level_resources_stay_and_are_defaulted_from_the_filled_containers() -> None:
    """The LimitRanger fills containers only; the pod-level request the API server leaves out is then
    worked out from the filled containers (v1.37 defaults it at create, after admission)."""
    spec = {"resources": {"limits": {"cpu": "4", "memory": "1Gi"}},
            "containers": [container(), container()]}
    out = with_limit_range_defaults(spec, namespace_defaults([read_limit_range(limit_range(CPU1))]))
    assert out["resources"] == spec["resources"]
    assert pod_requests(out)["cpu"] == 2 and pod_requests(out)["memory"] == 512 * 2**20


def test_no_defaults_leave_the_spec_itself() -> None:
    spec = {"containers": [container()]}
    assert with_limit_range_defaults(spec, NO_DEFAULTS) is spec
    assert not NO_DEFAULTS and not namespace_defaults([])
    assert read_limit_range(limit_range()) == NO_DEFAULTS


@pytest.mark.parametrize(("items", "said"), [
    ([{"type": "Container", "defaultRequest": {"cpu": "lots"}}], "spec.limits[0].defaultRequest"),
    ([{"type": "Container", "default": {"memory": "-1Gi"}}], "spec.limits[0].default"),
    ([{"type": "Container", "max": {"cpu": 4}}], "spec.limits[0].max"),
    ([CPU1, {"type": "Container", "min": "1"}], "spec.limits[1].min is not a map"),
    (["Container"], "spec.limits[0] is not a map"),
])
def test_a_malformed_limit_range_is_refused_naming_the_field(items: list[Any], said: str) -> None:
    with pytest.raises(LimitRangeError, match=said.replace("[", r"\[").replace("]", r"\]")):
        read_limit_range(limit_range(*items))


def job(resources: dict[str, Any] | None = None) -> dict[str, Any]:
    c = container(**resources) if resources else container()
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "j", "namespace": "team", "uid": "u1", "resourceVersion": "1",
                         "labels": {"topolet.io/queue": "default"}},
            "spec": {"suspend": True, "parallelism": 2,
                     "template": {"metadata": {"labels": {"batch.kubernetes.io/controller-uid": "u1",
                                                          "batch.kubernetes.io/job-name": "j"}},
                                  "spec": {"restartPolicy": "Never", "containers": [c]}}}}


DEFAULTS = namespace_defaults([read_limit_range(limit_range(CPU1))])


def test_a_gang_is_sized_with_its_namespaces_defaults() -> None:
    (pod_set,) = gang_from_job(job(), {}, limit_defaults=DEFAULTS).pod_sets
    assert (pod_set.requests.cpu_milli, pod_set.requests.memory) == (1000, 256 * 2**20)
    assert gang_requests(job(), DEFAULTS) == pod_set.requests
    (bare,) = gang_from_job(job(), {}).pod_sets
    assert bare.requests.cpu_milli == 0


def test_defaults_that_make_a_container_guaranteed_give_it_the_guaranteed_policy() -> None:
    """The kubelet aligns a container the LimitRange made Guaranteed with whole CPUs: so does the gang."""
    guaranteed = namespace_defaults([read_limit_range(limit_range(
        {"type": "Container", "default": {"cpu": "2", "memory": "1Gi"}}))])
    (pod_set,) = gang_from_job(job(), {}, limit_defaults=guaranteed).pod_sets
    assert pod_set.numa_policy != "none" and pod_set.requests.cpu_milli == 2000
    (bare,) = gang_from_job(job(), {}).pod_sets
    assert bare.numa_policy == "none"


def pod_as_created(resources: dict[str, Any]) -> dict[str, Any]:
    """A pod of `job()` as the Job controller makes it, with `resources` (what the API server wrote)."""
    return {"metadata": {"namespace": "team", "name": "j-abc", "uid": "p1",
                         "labels": {"batch.kubernetes.io/controller-uid": "u1",
                                    "batch.kubernetes.io/job-name": "j"},
                         "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "j",
                                              "uid": "u1", "controller": True}]},
            "spec": {"restartPolicy": "Never", "containers": [{**container(), "resources": resources}]}}


def test_a_pod_the_limit_ranger_filled_is_the_jobs_own() -> None:
    filled = pod_as_created({"requests": {"cpu": "1", "memory": "256Mi"}})
    assert job_owner(job(), DEFAULTS).refusal(filled) is None
    assert "cpu 1 where its template asks 0" in str(job_owner(job()).refusal(filled))
    # More than the defaults is still not the Job's pod.
    more = pod_as_created({"requests": {"cpu": "16", "memory": "256Mi"}})
    assert "cpu 16 where its template asks 1" in str(job_owner(job(), DEFAULTS).refusal(more))


def test_the_reader_reads_a_job_again_when_its_namespaces_defaults_change() -> None:
    reader = JobReader()
    admitted = job()
    record = AdmissionRecord("admitted", "d1", "2026-12-02T10:00:00Z", {0: SlotPlacement("n1", 0)},
                             shape=job_shape(admitted))
    admitted["metadata"]["annotations"] = {ADMISSION_ANNOTATION: record.encode()}
    bare = reader.read(admitted)
    assert reader.read(admitted) is bare
    filled = reader.read(admitted, DEFAULTS)
    assert filled is not bare and filled.limit_defaults == DEFAULTS
    assert reader.read(admitted, DEFAULTS) is filled
    assert filled.owner is not None and bare.owner is not None and filled.owner != bare.owner
    assert filled.distrusted is None  # the shape is the Job's as written: defaults are no re-template
    pod = pod_as_created({"requests": {"cpu": "1", "memory": "256Mi"}})
    pod["spec"]["schedulingGates"] = [{"name": GATE}]
    assert [(p["metadata"]["name"], slot) for p, slot in reader.slots(filled, [pod]).place] == [("j-abc", 0)]
    assert [p["metadata"]["name"] for p, _ in reader.slots(bare, [pod]).refused] == ["j-abc"]


def test_defaults_are_hashable_values() -> None:
    assert hash(DEFAULTS) == hash(ContainerDefaults(DEFAULTS.limits, DEFAULTS.requests))
    assert DEFAULTS.requests == (("cpu", "1"), ("memory", "256Mi"))
    assert pod_requests(with_limit_range_defaults({"containers": [container()]}, DEFAULTS)) == {
        "cpu": Fraction(1), "memory": Fraction(256 * 2**20)}
