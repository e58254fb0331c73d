"""An Indexed Job whose template leaves its resources out, in a namespace with a LimitRange, through
real Kueue v0.17.0 and the `topolet.io/topology-fit` check (`kueue` fixture, as `test_check_e2e.py`).

Kueue stores the Job's template in the Workload as written: it applies the namespace's LimitRange
only to in-memory copies, for its quota.  The API server's LimitRanger fills the container defaults
into each pod the Job controller creates.  The check read the Workload's template as written, so it
sized a gang of 12-CPU pods as asking nothing (both in one zone) and then refused its pods as not the
Job's (`ForeignPod`), leaving the ledger holding their slots.  Now it reads the template with the
namespace's defaults filled in (`agent.admission.gangs.limitrange`), as the Job route does."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.admission.test_controller import metric, scrape
from tests.controlplane.harness import free_port
from tests.controlplane.kueue import KueueScope, job
from tests.kube.kubelet_standin import wait_for
from tests.kueue.test_check import slots
from tests.kueue.test_check_e2e import NUMA, Setup

DEFAULT = {"cpu": "12", "memory": "64Mi"}  # the LimitRange's `default`: Guaranteed pods of 12 CPUs


def foreign_pod_events(s: Setup, name: str) -> list[str]:
    """The controller's ForeignPod Events on Job `name`: their messages."""
    out = s.api.list(f"/api/v1/namespaces/{s.ns}/events",
                     {"fieldSelector": f"involvedObject.kind=Job,involvedObject.name={name}"})
    return [e["message"] for e in out.get("items") or []
            if e.get("reportingComponent") == "topolet.io/controller" and e["reason"] == "ForeignPod"]


def test_a_limit_range_defaulted_indexed_job_is_placed_and_counted(
        kueue: KueueScope, dump_root: Callable[[str], Path]) -> None:
    """LimitRange `default` cpu 12, memory 64Mi; the Job's template writes no resources, so each of its
    two pods is created Guaranteed with 12 CPUs: the gang takes two zones, each pod runs pinned in its
    own, and both hold their slots, so the ledger lets go of them once the NRTs show them (its own
    timeout, an hour here, never does) and no pod is told it is not the Job's."""
    port = free_port()
    s = Setup(kueue, dump_root, 200, "--listen", f"127.0.0.1:{port}", "--ledger-timeout-seconds", "3600")
    s.api.create(f"/api/v1/namespaces/{s.ns}/limitranges", {
        "apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": "defaults"},
        "spec": {"limits": [{"type": "Container", "default": DEFAULT}]}})
    body: dict[str, Any] = job("bare", "lq", parallelism=2, indexed=True, annotations=NUMA)
    del body["spec"]["template"]["spec"]["containers"][0]["resources"]
    uid = s.kueue.create_job(s.ns, body)["metadata"]["uid"]

    wl_template = wait_for(lambda: s.workload(uid).get("spec", {}).get("podSets"), "the Workload")
    # What this test is about: Kueue's copy of the template has no requests for the check to read.
    assert not wl_template[0]["template"]["spec"]["containers"][0].get("resources"), wl_template

    state = wait_for(lambda: s.state(uid) if s.state(uid).get("state") == "Ready" else None, "bare Ready",
                     timeout=120)
    placed = slots(state)
    assert len(placed) == 2 and len(set(placed)) == 2, placed  # 12 CPUs each: two zones, never one
    wait_for(lambda: s.running_as_decided("bare", uid, 2), "bare's two pods running pinned", timeout=180)
    for pod in s.pods("bare"):
        container = pod["spec"]["containers"][0]["resources"]
        assert container == {"limits": DEFAULT, "requests": DEFAULT}, container  # the LimitRanger's
    wait_for(lambda: metric(scrape(port)[1], "topolet_admission_ledger_entries") == 0,
             "the ledger to let go of bare's slots as its pods hold them", timeout=90)
    assert foreign_pod_events(s, "bare") == []
    assert metric(scrape(port)[1], 'topolet_admission_invalid_objects_total{kind="Pod"}') == 0
