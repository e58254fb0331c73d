"""Pod-level requests on the real test cluster (issue 34, finding 1): pods whose requests are written as
Kubernetes' pod-level `spec.resources` (beta, on by default since 1.34) count as the scheduler counts
them, in the controller's view of a node and in a gang's own size; a pod the controller cannot size
costs only itself and is told so once.

A tenant acts under its own token (`tests/admission/test_tenants.py`'s fixture: the controller's part of
the base applied, two nodes of DUMP: 64 CPUs each, 4 NUMA zones of 16).  Each test failed before its
fix: pod-level requests were read as nothing."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from agent.admission.cluster.view import pod_requests
from agent.api.resources import pod_level_resource
from tests.admission.test_controller import events, gang_job, get_job, job_pods, record, wait_for
from tests.admission.test_pod_requests import ROWS
from tests.admission.test_tenants import Tenant, created_job, tenant

__all__ = ["tenant"]  # the fixture


def pod_level_pod(name: str, node: str, cpu: str, *, bound: bool = False) -> dict[str, Any]:
    """A tenant's own pod whose requests are pod-level only (its container asks nothing): scheduled onto
    `node`, or created `bound` to it."""
    res = {"cpu": cpu, "memory": "64Mi"}
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
                            "resources": {"requests": res, "limits": res},
                            "automountServiceAccountToken": False}
    if bound:
        spec["nodeName"] = node
    else:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def create_pod(t: Tenant, pod: dict[str, Any]) -> dict[str, Any]:
    status, out = t.request("POST", "api/v1/namespaces/{ns}/pods", pod)
    assert status == 201, out
    return out


def node_of(t: Tenant, name: str) -> str | None:
    return t.api.get(f"/api/v1/namespaces/{t.namespace}/pods/{name}")["spec"].get("nodeName")


def pod_level_job(name: str, count: int, label: str, limits: dict[str, str]) -> dict[str, Any]:
    """A gang whose pods are sized at pod level only (limits; the API server defaults the requests),
    with no NUMA policy of its own."""
    job = gang_job(name, count, label)
    template = job["spec"]["template"]
    template["metadata"]["annotations"].pop("topolet.io/numa-policy")
    template["spec"]["containers"][0].pop("resources")
    template["spec"]["resources"] = {"limits": limits}
    return job


def bound_as_recorded(t: Tenant, name: str, count: int) -> list[str] | None:
    """The nodes of the Job's pods once every one is bound where its admission record's slot says."""
    rec = record(t.api, t.namespace, name)
    pods = job_pods(t.api, t.namespace, name)
    if rec is None or rec["result"] != "admitted" or len(pods) != count:
        return None
    nodes = []
    for pod in pods:
        index = pod["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]
        if pod["spec"].get("nodeName") != rec["placement"][index]["node"]:
            return None
        nodes.append(pod["spec"]["nodeName"])
    return sorted(nodes)


def waits(t: Tenant, name: str) -> None:
    """The controller tells the Job it waits, and leaves it suspended without a record."""
    wait_for(lambda: "Waiting" in events(t.api, t.namespace, name), f"{name} told it waits", timeout=60)
    assert record(t.api, t.namespace, name) is None
    assert get_job(t.api, t.namespace, name)["spec"]["suspend"] is True


def test_a_node_full_of_pod_level_pods_takes_no_gang(tenant: Tenant) -> None:
    """The finding: a tenant fills a node with pods sized at pod level only (4 x 15 of its 64 CPUs,
    which the scheduler counts); a gang that needs both nodes then waits instead of being admitted onto
    it (its pods would stay Unschedulable for ever), and a gang that fits the other node goes there."""
    t = tenant
    full, other = t.nodes
    for i in range(4):
        create_pod(t, pod_level_pod(f"fill-{i}", full, "15"))
    for i in range(4):
        wait_for(lambda n=f"fill-{i}": node_of(t, n) == full, f"fill-{i} bound by the scheduler")
    proc = t.cluster.start_controller("--listen", "127.0.0.1:0", "--resync-seconds", "2")
    created_job(t, gang_job("both", 8, t.label))  # 8 x 12 CPUs: every zone of both nodes
    waits(t, "both")
    created_job(t, gang_job("four", 4, t.label))  # 4 x 12 CPUs: one node's zones
    nodes = wait_for(lambda: bound_as_recorded(t, "four", 4), "gang four admitted and bound", timeout=150)
    assert nodes == [other] * 4
    assert record(t.api, t.namespace, "both") is None
    proc.stop()
    assert proc.popen.returncode == 0, proc.log_tail()


def test_a_gang_sized_at_pod_level_is_counted_as_its_pods(tenant: Tenant) -> None:
    """A gang whose template has pod-level limits only (24 CPUs a pod, requests defaulted from them):
    two pods a node, and a further gang of two waits (16 CPUs are left on each node)."""
    t = tenant
    proc = t.cluster.start_controller("--listen", "127.0.0.1:0", "--resync-seconds", "2")
    limits = {"cpu": "24", "memory": "64Mi"}
    created_job(t, pod_level_job("wide", 4, t.label, limits))
    nodes = wait_for(lambda: bound_as_recorded(t, "wide", 4), "gang wide admitted and bound", timeout=150)
    assert nodes == sorted(t.nodes * 2)
    created_job(t, pod_level_job("more", 2, t.label, limits))
    waits(t, "more")
    assert not job_pods(t.api, t.namespace, "more")
    proc.stop()
    assert proc.popen.returncode == 0, proc.log_tail()


def invalid_requests_events(t: Tenant, pod: str) -> list[dict[str, Any]]:
    out = t.api.list(f"/api/v1/namespaces/{t.namespace}/events",
                     {"fieldSelector": f"involvedObject.kind=Pod,involvedObject.name={pod}"})
    return [e for e in out.get("items") or []
            if e.get("reportingComponent") == "topolet.io/controller"
            and e.get("reason") == "InvalidRequests"]


def test_a_pod_that_cannot_be_sized_costs_only_itself_and_is_told_once(tenant: Tenant) -> None:
    """A tenant's pod bound to a node with a pod-level cpu of 1e33 (the API server takes it; no reader
    of ours does): the node still takes gangs, and the pod gets one InvalidRequests Event saying why,
    not one a pass."""
    t = tenant
    create_pod(t, pod_level_pod("huge", t.nodes[0], "1e33", bound=True))
    proc = t.cluster.start_controller("--listen", "127.0.0.1:0", "--resync-seconds", "2")
    created_job(t, gang_job("victim", 8, t.label))  # every zone of both nodes
    wait_for(lambda: bound_as_recorded(t, "victim", 8), "the victim gang admitted and bound", timeout=150)
    (told,) = wait_for(lambda: invalid_requests_events(t, "huge"), "the pod's InvalidRequests Event")
    assert "resources.requests: resource cpu" in told["message"] and told["type"] == "Warning"
    # Many passes later (a gang decided after it), still one.
    created_job(t, gang_job("later", 1, t.label))
    waits(t, "later")
    assert len(invalid_requests_events(t, "huge")) == 1
    proc.stop()
    assert proc.popen.returncode == 0, proc.log_tail()


# The rows the API server takes: pod-level names it covers, and no overhead without a RuntimeClass.
DEFAULTED = [r for r in ROWS if "resources" in r[1] and "overhead" not in r[1]
             and all(pod_level_resource(name) for part in r[1]["resources"].values() for name in part)]


@pytest.mark.parametrize("pod_spec", [r[1] for r in DEFAULTED], ids=[r[0] for r in DEFAULTED])
def test_a_pod_is_sized_as_the_api_server_defaults_it(tenant: Tenant, pod_spec: dict[str, Any]) -> None:
    """Each pod-level row of test_pod_requests.py, created (dry run) through the real API server: the
    pod it stores, pod-level requests defaulted, reads as the spec it was sent (a Job's template is
    never defaulted so: its pods are)."""
    sent = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "sized"}, "spec": copy.deepcopy(pod_spec)}
    status, stored = tenant.request("POST", "api/v1/namespaces/{ns}/pods?dryRun=All", sent)
    assert status == 201, stored
    if "limits" in pod_spec["resources"]:
        assert stored["spec"]["resources"].get("requests"), "the API server defaulted no pod-level request"
    assert pod_requests(stored) == pod_requests(sent)
