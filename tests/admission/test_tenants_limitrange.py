"""A Job whose template leaves its requests out, in a namespace with a LimitRange, is sized as its pods
are created and its pods get their slots (issue 34, item 2's follow-up), on the real test cluster with
the tenant's real token (issue 21's Tenant fixture).

The API server's LimitRanger fills the namespace's container defaults into each pod the Job controller
creates, never into the Job's template.  A gang sized from the template as written asked less than its
pods do, and once slots went only to pods that ask what the admitted template asks, its pods waited
gated for ever.  The controller now reads the namespace's LimitRanges and sizes the gang, and compares
its pods, with them filled in (`agent.admission.gangs.limitrange`), as Kueue sizes a Workload.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from tests.admission.test_controller import gang_job, job_pods, pod_zone, record, wait_for
from tests.admission.test_tenants import Tenant, created_job, tenant
from tests.admission.test_tenants_owner import bound_on_slots, foreign_pod_events

__all__ = ["tenant"]

DEFAULTS = {"cpu": "1", "memory": "256Mi"}


def zone_cpus(t: Tenant) -> dict[tuple[str, int], int]:
    """Each (node, zone) of the tenant's nodes and the CPUs its NRT says are available."""
    out = {}
    for node in t.nodes:
        nrt = t.cluster.nrt(node)
        assert nrt is not None
        for zone in nrt["zones"]:
            cpus = [int(r["available"]) for r in zone.get("resources") or [] if r["name"] == "cpu"]
            out[(node, int(zone["name"].rpartition("-")[2]))] = sum(cpus)
    return out


def limit_range(t: Tenant) -> None:
    """The namespace's LimitRange (its administrator's: the tenant may not write one)."""
    t.api.create(f"/api/v1/namespaces/{t.namespace}/limitranges", {
        "apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": "defaults"},
        "spec": {"limits": [{"type": "Container", "defaultRequest": DEFAULTS}]}})


def test_a_gang_without_requests_is_sized_with_the_limit_range_and_its_pods_get_slots(tenant: Tenant) -> None:
    """LimitRange `defaultRequest` cpu 1, memory 256Mi; the Job's template writes no resources.  The
    gang is admitted as pods of 1 CPU: more of them than one zone holds, so it is spread over zones (no
    zone given more pods than its CPUs), its pods are gated, and each gets a slot and binds.  Sized
    from the template as written (0 CPUs), the gang was packed into one zone it overflows."""
    t = tenant
    limit_range(t)
    zones = zone_cpus(t)
    count = max(zones.values()) + 2  # more 1-CPU pods than the largest zone holds
    job: dict[str, Any] = gang_job("bare", count, t.label, indexed=False)
    del job["spec"]["template"]["spec"]["containers"][0]["resources"]
    name = created_job(t, job)
    t.cluster.start_controller("--resync-seconds", "2")
    all_placed(t, name, count, zones)


def test_a_request_the_template_leaves_out_does_not_keep_its_pods_gated(tenant: Tenant) -> None:
    """The same LimitRange; the template asks 12 CPUs and leaves memory out, so two pods take two
    zones and are gated.  Their memory, 256Mi, is the LimitRanger's: compared with the template as
    written (no memory) they were not the Job's pods, got no slot and stayed gated for ever."""
    t = tenant
    limit_range(t)
    zones = zone_cpus(t)
    job: dict[str, Any] = gang_job("cpu-only", 2, t.label, indexed=False)
    job["spec"]["template"]["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "12"}}
    name = created_job(t, job)
    t.cluster.start_controller("--resync-seconds", "2")
    all_placed(t, name, 2, zones, {"cpu": "12", "memory": "256Mi"})


def all_placed(t: Tenant, name: str, count: int, zones: dict[tuple[str, int], int],
               requests: dict[str, str] = DEFAULTS) -> None:
    """The Job admitted over several zones, none given more CPUs than it has, and each of its `count`
    pods (asking `requests`, the LimitRanger's filled in) bound on a slot of its record."""
    cpus = int(requests["cpu"])

    rec = wait_for(lambda: record(t.api, t.namespace, name), "the Job's decision", timeout=90)
    assert rec["result"] == "admitted", rec
    per_zone = Counter((p["node"], p["zone"]) for p in rec["placement"].values())
    assert len(per_zone) > 1, per_zone
    assert all(n * cpus <= zones[slot] for slot, n in per_zone.items()), (per_zone, zones)

    def placed() -> list[dict[str, Any]]:
        return job_pods(t.api, t.namespace, name)

    wait_for(lambda: len(pods := placed()) == count and bound_on_slots(t, name, pods),
             "every pod of the Job bound on a slot of its record", timeout=180)
    for pod in placed():
        asked = pod["spec"]["containers"][0]["resources"]["requests"]
        assert asked == requests, asked  # the LimitRanger's filled in, as the gang was sized
        assert (pod["spec"]["nodeName"], pod_zone(pod)) in per_zone
    assert not foreign_pod_events(t, name)
