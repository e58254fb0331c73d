"""Real Kueue v0.17.0 on the real control plane: webhooks, CRD conversion, the batch/Job integration and
the AdmissionCheck contract the topology-fit check controller relies on."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from agent.errors import KubeAPIError
from tests.controlplane.kueue import (
    CHECK_CONTROLLER,
    NAMESPACE,
    QUEUE_LABEL,
    WEBHOOK_SERVICE,
    KueueScope,
    condition,
    iter_pods,
    job,
    kueue_path,
    wait_for,
)


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _queue(kueue: KueueScope, quota: dict[str, str], checks: tuple[str, ...] = ()) -> tuple[str, str, str]:
    """A namespace, and a LocalQueue there on a new ClusterQueue of one new flavor: (ns, cq, lq)."""
    ns = kueue.namespace()
    flavor, cq, lq = _name("flavor"), _name("cq"), _name("lq")
    kueue.resource_flavor(flavor)
    kueue.cluster_queue(cq, flavor, quota, admission_checks=checks)
    kueue.local_queue(ns, lq, cq)
    return ns, cq, lq


def _status_is(kueue: KueueScope, plural: str, name: str, kind: str, status: str,
               namespace: str | None = None) -> dict[str, Any] | None:
    obj = kueue.get(plural, name, namespace)
    cond = condition(obj, kind)
    return obj if cond is not None and cond["status"] == status else None


def test_webhook_endpoint_is_not_loopback(kueue: KueueScope) -> None:
    """Why the webhook Service's EndpointSlice is on a host address: the API server refuses loopback."""
    body = {"metadata": {"name": _name("loopback")}, "addressType": "IPv4",
            "endpoints": [{"addresses": ["127.0.0.1"]}], "ports": [{"name": "", "port": 9443}]}
    with pytest.raises(KubeAPIError) as refused:
        kueue.api.create(f"/apis/discovery.k8s.io/v1/namespaces/{NAMESPACE}/endpointslices", body)
    assert refused.value.status == 422
    slices = f"/apis/discovery.k8s.io/v1/namespaces/{NAMESPACE}/endpointslices"
    served = kueue.api.get(f"{slices}/{WEBHOOK_SERVICE}")
    (endpoint,) = served["endpoints"]
    assert endpoint["addresses"] == [kueue.kueue.address]
    assert not kueue.kueue.address.startswith("127.")


def test_kueue_injected_its_ca_into_webhooks_and_crds(kueue: KueueScope) -> None:
    """Internal cert management: the serving Secret is filled and every webhook and conversion has its CA."""
    secret = kueue.api.get(f"/api/v1/namespaces/{NAMESPACE}/secrets/kueue-webhook-server-cert")
    assert {"ca.crt", "tls.crt", "tls.key"} <= set(secret.get("data") or {})
    for kind in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations"):
        hooks = kueue.api.get(f"/apis/admissionregistration.k8s.io/v1/{kind}/kueue-"
                              f"{kind[:-len('webhookconfigurations')]}-webhook-configuration")["webhooks"]
        assert hooks and all(h["clientConfig"].get("caBundle") for h in hooks), kind
    crd = kueue.api.get("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/workloads.kueue.x-k8s.io")
    assert crd["spec"]["conversion"]["webhook"]["clientConfig"]["caBundle"]


def test_job_webhook_suspends_a_queued_job(kueue: KueueScope) -> None:
    """The API server reaches Kueue's mutating Job webhook: a queued Job created running is suspended."""
    ns, _cq, lq = _queue(kueue, {"cpu": "1", "memory": "1Gi"})
    made = kueue.create_job(ns, job(_name("job"), lq, suspend=False))
    assert made["spec"]["suspend"] is True
    # A Job of no queue is left alone (manageJobsWithoutQueueName is off).
    plain = job(_name("plain"), lq, suspend=False)
    del plain["metadata"]["labels"][QUEUE_LABEL]
    assert kueue.create_job(ns, plain)["spec"]["suspend"] is False


def test_validating_webhook_refuses_a_bad_cluster_queue(kueue: KueueScope) -> None:
    """Kueue's validating webhook answers: a flavor listing its quotas out of coveredResources' order is
    refused by the webhook (the CRD's own rules only count them)."""
    from tests.controlplane.kueue import cluster_queue

    body = cluster_queue(_name("cq"), _name("flavor"), {"cpu": "1", "memory": "1Gi"})
    flavor = body["spec"]["resourceGroups"][0]["flavors"][0]
    flavor["resources"].reverse()
    with pytest.raises(KubeAPIError) as refused:
        kueue.create(body)
    assert 'admission webhook "vclusterqueue.kb.io" denied the request' in str(refused.value)
    assert "must match the name in coveredResources" in str(refused.value)


def test_conversion_webhook_serves_v1beta1(kueue: KueueScope) -> None:
    """Reading a v1beta2-stored ClusterQueue as v1beta1 goes through Kueue's conversion webhook."""
    _ns, cq, _lq = _queue(kueue, {"cpu": "2", "memory": "1Gi"})
    old = kueue.api.get(f"/apis/kueue.x-k8s.io/v1beta1/clusterqueues/{cq}")
    assert old["apiVersion"] == "kueue.x-k8s.io/v1beta1"
    assert old["spec"]["resourceGroups"][0]["coveredResources"] == ["cpu", "memory"]


def _workload_with(kueue: KueueScope, ns: str, job_uid: str, kind: str, status: str) -> dict[str, Any] | None:
    """The Job's Workload when its condition `kind` has `status`, else None."""
    wl = kueue.workload_of(ns, job_uid)
    cond = condition(wl, kind) if wl is not None else None
    return wl if cond is not None and cond["status"] == status else None


def _suspended(kueue: KueueScope, ns: str, name: str) -> bool:
    return bool(kueue.api.get(f"/apis/batch/v1/namespaces/{ns}/jobs/{name}")["spec"].get("suspend"))


def _bound_pods(kueue: KueueScope, ns: str, name: str, count: int) -> list[dict[str, Any]] | None:
    """The Job's pods once `count` of them are bound to a node, else None."""
    bound = [p for p in iter_pods(kueue.api, ns, name) if p["spec"].get("nodeName")]
    return bound if len(bound) == count else None


def test_queued_job_is_admitted_and_its_pods_bound(kueue: KueueScope) -> None:
    """A suspended Job in a LocalQueue gets a Workload, quota, admission and is unsuspended by Kueue; the
    real scheduler binds its pods; a second Job over the quota waits, suspended."""
    node = _name("kq-node")
    kueue.add_node(node, cpu="8", memory="16Gi")
    ns, cq, lq = _queue(kueue, {"cpu": "2", "memory": "1Gi"})
    small = {"cpu": "1", "memory": "128Mi"}
    first = kueue.create_job(ns, job(_name("first"), lq, parallelism=2, requests=small))
    first_uid, first_name = first["metadata"]["uid"], first["metadata"]["name"]

    wl = wait_for("the first Job's Workload admitted",
                  lambda: _workload_with(kueue, ns, first_uid, "Admitted", "True"), context=kueue.logs)
    assert (condition(wl, "QuotaReserved") or {}).get("status") == "True"
    assert wl["status"]["admission"]["clusterQueue"] == cq
    (pod_set,) = wl["spec"]["podSets"]
    assert pod_set["count"] == 2
    wait_for("the first Job unsuspended", lambda: not _suspended(kueue, ns, first_name), context=kueue.logs)
    pods = wait_for("both pods bound by the scheduler", lambda: _bound_pods(kueue, ns, first_name, 2),
                    context=kueue.logs)
    assert {p["spec"]["nodeName"] for p in pods} == {node}
    # Kueue's own metrics count the admission (what bench/kueue.py may read).
    assert f'kueue_admitted_workloads_total{{cluster_queue="{cq}"' in kueue.kueue.metrics_text()

    # The second Job needs a third CPU of a 2-CPU quota: no quota reserved, the Job stays suspended.
    second = kueue.create_job(ns, job(_name("second"), lq, parallelism=1, requests=small))
    second_uid = second["metadata"]["uid"]
    wait_for("the second Workload left without quota",
             lambda: _workload_with(kueue, ns, second_uid, "QuotaReserved", "False"), context=kueue.logs)
    assert _workload_with(kueue, ns, second_uid, "Admitted", "True") is None
    assert _suspended(kueue, ns, second["metadata"]["name"])


def test_admission_check_gates_the_cluster_queue(kueue: KueueScope) -> None:
    """The contract of topolet's check: a ClusterQueue listing an AdmissionCheck of controllerName
    topolet.io/topology-fit is inactive until the check is Active; then a Workload reserves quota with the
    check Pending, and is admitted (its Job unsuspended) only once the check's state is Ready."""
    check = _name("topology-fit")
    kueue.admission_check(check)
    assert kueue.get("admissionchecks", check)["spec"]["controllerName"] == CHECK_CONTROLLER
    ns, cq, lq = _queue(kueue, {"cpu": "4", "memory": "1Gi"}, checks=(check,))
    wait_for("the ClusterQueue inactive for its check",
             lambda: _status_is(kueue, "clusterqueues", cq, "Active", "False"), context=kueue.logs)
    made = kueue.create_job(ns, job(_name("gated"), lq, parallelism=1))
    uid, name = made["metadata"]["uid"], made["metadata"]["name"]
    # An inactive queue reserves no quota, so the check's controller never sees the Workload.
    wait_for("the Workload held by the inactive queue",
             lambda: _workload_with(kueue, ns, uid, "QuotaReserved", "False"), context=kueue.logs)
    assert _status_is(kueue, "clusterqueues", cq, "Active", "False") is not None

    kueue.set_check_active(check)
    wait_for("the ClusterQueue active", lambda: _status_is(kueue, "clusterqueues", cq, "Active", "True"),
             context=kueue.logs)
    wl = wait_for("quota reserved", lambda: _workload_with(kueue, ns, uid, "QuotaReserved", "True"),
                  context=kueue.logs)
    (state,) = wl["status"]["admissionChecks"]
    assert (state["name"], state["state"]) == (check, "Pending")
    assert _workload_with(kueue, ns, uid, "Admitted", "True") is None
    assert _suspended(kueue, ns, name)

    # What the check's controller does when the gang fits: state Ready, server-side applied as its owner.
    wl_name = wl["metadata"]["name"]
    kueue.api.apply(kueue_path("workloads", wl_name, namespace=ns, subresource="status"), {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
        "metadata": {"name": wl_name, "namespace": ns},
        "status": {"admissionChecks": [{"name": check, "state": "Ready", "message": "fits",
                                        "lastTransitionTime": state["lastTransitionTime"]}]},
    }, CHECK_CONTROLLER)
    wait_for("the Workload admitted", lambda: _workload_with(kueue, ns, uid, "Admitted", "True"),
             context=kueue.logs)
    wait_for("the Job unsuspended", lambda: not _suspended(kueue, ns, name), context=kueue.logs)


def test_kueue_down_refuses_queued_jobs_and_restarts(kueue: KueueScope) -> None:
    """The API server really depends on Kueue's webhooks (failurePolicy Fail): with Kueue stopped a queued
    Job is refused; started again on the same cluster (its cert Secret kept), it serves and admits again."""
    ns, _cq, lq = _queue(kueue, {"cpu": "2", "memory": "1Gi"})
    kueue.kueue.stop()
    assert not kueue.kueue.running()
    with pytest.raises(KubeAPIError) as refused:
        kueue.create_job(ns, job(_name("refused"), lq))
    assert 'failed calling webhook "mjob.kb.io"' in str(refused.value)

    kueue.kueue.start()
    assert kueue.kueue.running() and kueue.kueue.ready_seconds is not None
    made = kueue.create_job(ns, job(_name("after"), lq, suspend=False))
    assert made["spec"]["suspend"] is True
    wait_for("the Job admitted after the restart",
             lambda: _workload_with(kueue, ns, made["metadata"]["uid"], "Admitted", "True"),
             context=kueue.logs)
