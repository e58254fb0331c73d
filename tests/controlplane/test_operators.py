"""The training operators (tests/controlplane/operators.py) under real Kueue: for each kind, Kueue's
Workload and the `topologyRequest` it fills per podSet (the contract a topology-aware admission check
reads: which pod label carries a pod's index within its podSet, which one its sub-group's index, and how
many sub-groups), and after admission the children the operator creates, with the index labels on the
pods where this cluster creates pods (it runs no StatefulSet controller, so none for LWS).

Each object has 2 sub-groups of 3 pods: a JobSet of 2 Jobs x 3, a TrainJob of 6 nodes, an MPIJob of a
launcher and 6 workers, a LeaderWorkerSet of 2 groups of 3."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from tests.controlplane.fixtures import kueue, kueue_session, operators
from tests.controlplane.kueue import KueueScope, condition, kueue_path, wait_for
from tests.controlplane.operators import Operators, collection_path, jobset, leaderworkerset, mpijob, trainjob

__all__ = ["kueue", "kueue_session", "operators"]

pytestmark = pytest.mark.integration

JOB_INDEX = "jobset.sigs.k8s.io/job-index"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
REPLICA_INDEX = "training.kubeflow.org/replica-index"
WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"
QUOTA = {"cpu": "20", "memory": "8Gi"}


@dataclass(frozen=True)
class Kind:
    """One operator's kind: its body builder, the Workloads' podSets Kueue should write (name -> count
    and the topologyRequest fields), what the operator makes once admitted, and the pods' index labels."""

    kind: str
    body: Callable[[str, str], dict[str, Any]]
    workloads: int  # Kueue makes one per LeaderWorkerSet group, else one per object
    podsets: dict[str, tuple[int, dict[str, Any]]]
    children: Callable[[Any, str, str], bool]  # api, namespace, name -> whether they exist
    pod_selector: str | None  # `{name}` formatted: the pods the operator's children make, if any
    pod_labels: dict[str, set[str]]  # index label -> the values the pods carry


def _listed(api: Any, path: str, selector: str) -> list[dict[str, Any]]:
    return list(api.list(path, {"labelSelector": selector}).get("items") or [])


def _jobs_of_jobset(count: int) -> Callable[[Any, str, str], bool]:
    def made(api: Any, namespace: str, name: str) -> bool:
        jobs = _listed(api, f"/apis/batch/v1/namespaces/{namespace}/jobs",
                       f"jobset.sigs.k8s.io/jobset-name={name}")
        return len(jobs) == count and not any(j["spec"].get("suspend") for j in jobs)
    return made


def _jobset_of_trainjob(api: Any, namespace: str, name: str) -> bool:
    from agent.errors import KubeAPIError

    try:
        child = api.get(f"{collection_path('JobSet', namespace)}/{name}")
    except KubeAPIError:
        return False
    owners = {o["kind"] for o in child["metadata"].get("ownerReferences") or []}
    unsuspended = "TrainJob" in owners and not child["spec"].get("suspend")
    return unsuspended and _jobs_of_jobset(1)(api, namespace, name)


def _mpi_children(api: Any, namespace: str, name: str) -> bool:
    """Six worker pods (the operator's own) and the launcher Job (whose pod the Job controller makes)."""
    from agent.errors import KubeAPIError

    workers = _listed(api, f"/api/v1/namespaces/{namespace}/pods",
                      f"training.kubeflow.org/job-name={name},training.kubeflow.org/job-role=worker")
    try:
        launcher = api.get(f"/apis/batch/v1/namespaces/{namespace}/jobs/{name}-launcher")
    except KubeAPIError:
        return False
    owners = {o["kind"] for o in launcher["metadata"].get("ownerReferences") or []}
    return len(workers) == 6 and "MPIJob" in owners


def _lws_children(api: Any, namespace: str, name: str) -> bool:
    from agent.errors import KubeAPIError

    try:
        leaders = api.get(f"/apis/apps/v1/namespaces/{namespace}/statefulsets/{name}")
    except KubeAPIError:
        return False
    return bool(leaders["spec"]["replicas"] == 2)


def _jobset_request(replicas: int) -> dict[str, Any]:
    return {"podIndexLabel": COMPLETION_INDEX, "subGroupIndexLabel": JOB_INDEX, "subGroupCount": replicas}


KINDS = [
    Kind("JobSet", jobset, 1, {"workers": (6, _jobset_request(2))}, _jobs_of_jobset(2),
         "jobset.sigs.k8s.io/jobset-name={name}",
         {JOB_INDEX: {"0", "1"}, COMPLETION_INDEX: {"0", "1", "2"}}),
    Kind("TrainJob", trainjob, 1, {"node": (6, _jobset_request(1))}, _jobset_of_trainjob,
         "jobset.sigs.k8s.io/jobset-name={name}",
         {JOB_INDEX: {"0"}, COMPLETION_INDEX: {str(i) for i in range(6)}}),
    Kind("MPIJob", mpijob, 1, {"launcher": (1, {"podIndexLabel": REPLICA_INDEX}),
                               "worker": (6, {"podIndexLabel": REPLICA_INDEX})}, _mpi_children,
         "training.kubeflow.org/job-name={name},training.kubeflow.org/job-role=worker",
         {REPLICA_INDEX: {str(i) for i in range(6)}}),
    # No leaderTemplate: leader and workers share one template, so one podSet per group's Workload.
    Kind("LeaderWorkerSet", leaderworkerset, 2, {"main": (3, {"podIndexLabel": WORKER_INDEX})},
         _lws_children, None, {}),
]


def _workloads_of(kueue: KueueScope, namespace: str, uid: str) -> list[dict[str, Any]]:
    listed = kueue.api.list(kueue_path("workloads", namespace=namespace)).get("items") or []
    return [w for w in listed if any(o.get("uid") == uid for o in w["metadata"].get("ownerReferences") or [])]


def _topology_fields(podset: dict[str, Any]) -> dict[str, Any]:
    request = podset.get("topologyRequest") or {}
    return {k: request[k] for k in ("podIndexLabel", "subGroupIndexLabel", "subGroupCount") if k in request}


@pytest.mark.parametrize("case", KINDS, ids=[k.kind for k in KINDS])
def test_admitted_by_kueue_then_run_by_operator(kueue: KueueScope, operators: Operators, case: Kind) -> None:
    """Kueue's Workload carries each podSet's topologyRequest; once admitted, the operator makes children."""
    ns = kueue.namespace()
    tag = uuid.uuid4().hex[:8]
    flavor, cq, lq = f"flavor-{tag}", f"cq-{tag}", f"lq-{tag}"
    kueue.resource_flavor(flavor)
    kueue.cluster_queue(cq, flavor, QUOTA)
    kueue.local_queue(ns, lq, cq)
    name = f"{case.kind.lower()}-{tag}"
    context = lambda: f"{kueue.logs()}\n{operators.logs()}"  # noqa: E731
    made = kueue.api.create(collection_path(case.kind, ns), case.body(name, lq))

    workloads = wait_for(f"{case.workloads} Workload(s) of the {case.kind}",
                         lambda: (lambda w: w if len(w) == case.workloads else None)(
                             _workloads_of(kueue, ns, made["metadata"]["uid"])),
                         timeout_s=60, context=context)
    for workload in workloads:
        podsets = {p["name"]: (p["count"], _topology_fields(p)) for p in workload["spec"]["podSets"]}
        print(f"{case.kind} Workload {workload['metadata']['name']} podSets: {podsets}")
        assert podsets == case.podsets

    def admitted() -> bool:
        return all((c := condition(kueue.get("workloads", w["metadata"]["name"], ns), "Admitted")) is not None
                   and c["status"] == "True" for w in workloads)

    wait_for(f"Kueue to admit the {case.kind}'s Workloads", admitted, timeout_s=60, context=context)
    wait_for(f"the {case.kind}'s children", lambda: case.children(kueue.api, ns, name), timeout_s=90,
             context=context)
    if case.pod_selector is None:
        return
    selector = case.pod_selector.format(name=name)
    pods = wait_for(f"the {case.kind}'s pods", lambda: (lambda p: p if len(p) == 6 else None)(
        _listed(kueue.api, f"/api/v1/namespaces/{ns}/pods", selector)), timeout_s=90, context=context)
    for label, values in case.pod_labels.items():
        carried = {p["metadata"]["labels"].get(label) for p in pods}
        print(f"{case.kind} pods' {label}: {sorted(carried, key=str)}")
        assert carried == values
