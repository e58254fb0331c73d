"""The Kueue route reads a Workload's pod set templates as the Job's pods are created: with the
namespace's LimitRange container defaults filled in (`agent.admission.gangs.limitrange`), as the Job
route does.  Kueue v0.17 stores the Job's template as written (its LimitRange adjustments are made on
copies, for quota only), and the API server's LimitRanger fills the defaults into each pod: read as
written, the gang was sized without them and the pods the LimitRanger filled held no slot.

Pure: the gang (`workloads.gang_from_workload`), the ledger's requests and the pods that hold slots
(`holds.Holds`, `holds.ready_entries`) and the check's pass (`check.KueueCheck.collect`, its stores
given as lists).  `test_limitrange_kueue_e2e.py` runs it under real Kueue."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import pytest

from agent.admission.engine.model import Placement, PodPlacement, Resources
from agent.admission.gangs.job import HOSTNAME_LABEL
from agent.admission.gangs.limitrange import NO_DEFAULTS, ContainerDefaults, with_limit_range_defaults
from agent.admission.gangs.record import PLACEMENTS_ANNOTATION
from agent.admission.kueue.check import KueueCheck
from agent.admission.kueue.holds import PODSET_LABEL, Holds, ready_entries
from agent.admission.kueue.workloads import (
    BY_COMPLETION_INDEX,
    gang_from_workload,
    pod_set_updates,
    ready_state,
)
from agent.admission.report.metrics import AdmissionMetrics

GiB = 1024**3
INDEXED = BY_COMPLETION_INDEX  # the rule of an Indexed Job's pod sets
MiB = 1024**2
# A namespace's LimitRange: `defaultRequest` cpu 1, memory 256Mi (filled where a container has neither
# the request nor its limit).
REQUESTS = ContainerDefaults(requests=(("cpu", "1"), ("memory", "256Mi")))
# One whose `default` fills the limits (and, with no defaultRequest, the requests): Guaranteed pods.
GUARANTEED = ContainerDefaults(limits=(("cpu", "12"), ("memory", "1Gi")),
                               requests=(("cpu", "12"), ("memory", "1Gi")))
JOB_REF = {"apiVersion": "batch/v1", "kind": "Job", "name": "gang", "uid": "job-uid", "controller": True}


def workload(resources: dict[str, Any] | None, count: int = 2) -> dict[str, Any]:
    """Job gang's Workload as Kueue v0.17 stores it (the template as the Job has it), quota reserved."""
    c: dict[str, Any] = {"name": "c", "image": "x"}
    if resources is not None:
        c["resources"] = resources
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
            "metadata": {"name": "job-gang", "namespace": "team", "uid": "wl-uid", "resourceVersion": "9",
                         "ownerReferences": [dict(JOB_REF)]},
            "spec": {"queueName": "lq", "podSets": [{"name": "main", "count": count, "template": {
                "metadata": {"annotations": {"topolet.io/numa-policy": "single-numa-node"}},
                "spec": {"restartPolicy": "Never", "containers": [c]}}}]},
            "status": {"conditions": [{"type": "QuotaReserved", "status": "True"}],
                       "admission": {"clusterQueue": "cq",
                                     "podSetAssignments": [{"name": "main", "flavors": {"cpu": "default"}}]}}}


# (id, the template's container resources, the namespace's defaults, one pod's requests as sized)
SIZES: list[tuple[str, dict[str, Any] | None, ContainerDefaults, Resources]] = [
    ("no resources, no LimitRange: nothing", None, NO_DEFAULTS, Resources()),
    ("no resources: defaultRequest", None, REQUESTS, Resources(cpu_milli=1000, memory=256 * MiB)),
    ("a request written stays; the missing one is filled", {"requests": {"cpu": "12"}}, REQUESTS,
     Resources(cpu_milli=12000, memory=256 * MiB)),
    ("a limit stands in for its request before the defaults", {"limits": {"cpu": "4"}}, REQUESTS,
     Resources(cpu_milli=4000, memory=256 * MiB)),
    ("default fills limits and requests", None, GUARANTEED, Resources(cpu_milli=12000, memory=GiB)),
    ("a template with every request: the defaults change nothing",
     {"requests": {"cpu": "2", "memory": "1Gi"}}, GUARANTEED, Resources(cpu_milli=2000, memory=GiB)),
]


@pytest.mark.parametrize(("resources", "defaults", "expected"), [r[1:] for r in SIZES],
                         ids=[r[0] for r in SIZES])
def test_a_workload_is_sized_with_its_namespaces_limit_range(
        resources: dict[str, Any] | None, defaults: ContainerDefaults, expected: Resources) -> None:
    (pod_set,) = gang_from_workload(workload(resources), {}, limit_defaults=defaults).pod_sets
    assert pod_set.requests == expected


def test_the_defaults_make_a_guaranteed_pod_set_numa_aligned() -> None:
    """`default` makes each container Guaranteed with whole CPUs, so the node's policy aligns its pods,
    as it will the pods the LimitRanger fills."""
    wl = workload(None)
    del wl["spec"]["podSets"][0]["template"]["metadata"]["annotations"]["topolet.io/numa-policy"]
    (plain,) = gang_from_workload(wl, {}, "single-numa-node").pod_sets
    (filled,) = gang_from_workload(wl, {}, "single-numa-node", limit_defaults=GUARANTEED).pod_sets
    assert plain.numa_policy == "none" and filled.numa_policy == "single-numa-node"


def ready(wl: dict[str, Any], defaults: ContainerDefaults) -> dict[str, Any]:
    """`wl` Ready with its two pods on n1, zones 0 and 1, decided with `defaults`."""
    wl = copy.deepcopy(wl)
    gang = gang_from_workload(wl, {}, limit_defaults=defaults)
    placement = Placement(gang.key, (PodPlacement("main", 0, "n1", 0), PodPlacement("main", 1, "n1", 1)))
    wl["status"]["admissionChecks"] = [ready_state("fit", gang, placement,
                                                   pod_set_updates(gang, placement, lambda _: INDEXED),
                                                   "2026-12-02T10:00:00Z")]
    return wl


def job_pod(wl: dict[str, Any], index: int, defaults: ContainerDefaults) -> dict[str, Any]:
    """The Job controller's pod `index` of the Workload's Job, as the API server creates it in a
    namespace with `defaults` (the LimitRanger's filled in) and the placement policy pins it."""
    template = wl["spec"]["podSets"][0]["template"]
    spec = dict(with_limit_range_defaults(copy.deepcopy(template["spec"]), defaults))
    spec["nodeSelector"] = {HOSTNAME_LABEL: "n1"}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"gang-{index}", "namespace": "team", "uid": f"p{index}",
                         "resourceVersion": "1", "creationTimestamp": f"2026-12-02T10:00:0{index}Z",
                         "ownerReferences": [dict(JOB_REF)],
                         "labels": {"batch.kubernetes.io/controller-uid": "job-uid",
                                    "batch.kubernetes.io/job-name": "gang", PODSET_LABEL: "main"},
                         "annotations": {"batch.kubernetes.io/job-completion-index": str(index),
                                         PLACEMENTS_ANNOTATION: "n1:0,n1:1"}},
            "spec": spec}


KEY = "workload:team/job-gang/main"

# (id, the template's container resources, the namespace's defaults)
FILLED: list[tuple[str, dict[str, Any] | None, ContainerDefaults]] = [
    ("no resources: defaultRequest", None, REQUESTS),
    ("memory left out", {"requests": {"cpu": "12"}}, REQUESTS),
    ("default: Guaranteed pods", None, GUARANTEED),
]


@pytest.mark.parametrize(("resources", "defaults"), [r[1:] for r in FILLED], ids=[r[0] for r in FILLED])
def test_the_pods_the_limit_ranger_filled_hold_the_slots(
        resources: dict[str, Any] | None, defaults: ContainerDefaults) -> None:
    wl = ready(workload(resources), defaults)
    pods = [job_pod(wl, i, defaults) for i in range(2)]
    entries, slots, refused = Holds().of(wl, "fit", pods, True, defaults)
    assert slots == {"p0": (KEY, "0"), "p1": (KEY, "1")} and refused == []
    ((key, _, requests),) = entries
    assert key == KEY
    sized = gang_from_workload(wl, {}, limit_defaults=defaults).pod_sets[0].requests
    assert requests() == sized != Resources()
    # Read as written (what the route did): the same pods are not the Job's and hold no slot.
    _, slots, refused = Holds().of(wl, "fit", pods, True)
    assert slots == {} and len(refused) == 2
    assert all("it asks other than its Job's admitted template" in why for _, _, why in refused)


def test_a_limit_range_change_reads_the_ready_workload_again() -> None:
    """The same Workload and pod versions read with other defaults are worked out again, across passes."""
    wl = ready(workload(None), REQUESTS)
    pods = [job_pod(wl, i, REQUESTS) for i in range(2)]
    holds = Holds()
    _, slots, _ = holds.of(wl, "fit", pods, True, NO_DEFAULTS)
    assert slots == {}
    holds.end_pass({("wl-uid", "9")})
    _, slots, refused = holds.of(wl, "fit", pods, True, REQUESTS)
    assert len(slots) == 2 and refused == []
    holds.end_pass({("wl-uid", "9")})
    ((_, _, requests),) = holds.of(wl, "fit", pods, True, GUARANTEED)[0]
    assert requests() == Resources(cpu_milli=12000, memory=GiB)


def test_the_entries_of_a_decision_being_written_count_the_defaults() -> None:
    wl = workload(None)
    gang = gang_from_workload(wl, {}, limit_defaults=REQUESTS)
    placement = Placement(gang.key, (PodPlacement("main", 0, "n1", 0), PodPlacement("main", 1, "n1", 1)))
    ((_, _, requests),) = ready_entries(wl, "fit", gang, placement, "2026-12-02T10:00:00Z", REQUESTS)
    assert requests() == Resources(cpu_milli=1000, memory=256 * MiB)


# -- the check's pass: each Workload read with its own namespace's defaults ---------------------------


class _Store:
    """A Reflector's snapshot, from a list."""

    def __init__(self, items: Sequence[dict[str, Any]]) -> None:
        self.items = list(items)

    def snapshot(self) -> list[dict[str, Any]]:
        return list(self.items)


def check_over(workloads: Sequence[dict[str, Any]]) -> KueueCheck:
    """A KueueCheck whose stores hold our AdmissionCheck "fit" (Active) and `workloads`; no writes."""
    check = KueueCheck.__new__(KueueCheck)
    check.checks = _Store([{"metadata": {"name": "fit", "generation": 1},  # type: ignore[assignment]
                            "spec": {"controllerName": "topolet.io/topology-fit"},
                            "status": {"conditions": [{"type": "Active", "status": "True",
                                                       "observedGeneration": 1}]}}])
    check.workloads = _Store(workloads)  # type: ignore[assignment]
    check.flavors = _Store([])  # type: ignore[assignment]
    check.holds = Holds()
    check.metrics = AdmissionMetrics()

    class _Writes:
        def __init__(self) -> None:
            self.due_at: dict[str, float] = {}

        def in_flight(self) -> dict[str, Any]:
            return {}

        def known_indexed(self, _wl: Any) -> bool:
            return True

        def retain(self, *_: Any) -> None:
            pass

        def read_ahead(self, _wl: Any) -> None:
            pass

        def known_notes(self, _wl: Any) -> dict[str, dict[str, str]]:
            return {}

    check.writes = _Writes()  # type: ignore[assignment]
    return check


def test_the_pass_reads_each_workload_with_its_namespaces_defaults() -> None:
    pending = workload(None)
    pending["metadata"].update(name="job-other", namespace="other", uid="wl-other")
    pending["status"]["admissionChecks"] = [{"name": "fit", "state": "Pending"}]
    held = ready(workload(None), REQUESTS)
    pods = [job_pod(held, i, REQUESTS) for i in range(2)]
    defaults = {"team": REQUESTS, "other": GUARANTEED}
    round_ = check_over([pending, held]).collect(pods, defaults)
    assert round_.pod_slots == {"p0": (KEY, "0"), "p1": (KEY, "1")} and round_.refused == []
    ((_, _, requests),) = round_.admitted
    assert requests() == Resources(cpu_milli=1000, memory=256 * MiB)
    (p,) = round_.pending
    assert p.gang is not None and p.limit_defaults == GUARANTEED
    assert p.gang.pod_sets[0].requests == Resources(cpu_milli=12000, memory=GiB)
    # Without them (the route before): the pods hold nothing and the pending gang asks nothing.
    round_ = check_over([pending, held]).collect(pods)
    assert round_.pod_slots == {} and len(round_.refused) == 2
    assert round_.pending[0].gang is not None and round_.pending[0].gang.pod_sets[0].requests == Resources()
