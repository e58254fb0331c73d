"""The Kueue bench's gangs as the training kinds make them: one object per gang, named `<kind>-NNNNN`.

`gangs(count, seed, kinds)` takes bench/admission_workload.py's gangs (2, 4 or 8 single-numa-node pods
of 4, 6 or 8 CPUs, Kueue's tas pod-count mix) and makes each a kind of `kinds` in turn within its size
(so every kind gets gangs of every size), shaped as that kind's Workload has its pod sets:

- job: an Indexed batch/v1 Job of N pods (pod set `main`);
- jobset: a JobSet of one replicatedJob `workers`, 2 Jobs of N/2 pods (pod set `workers` of N);
- trainjob: a TrainJob of N nodes on the tests' ClusterTrainingRuntime (pod set `node`);
- mpijob: an MPIJob of a launcher and N-1 workers, all of the same size (pod sets `launcher`, `worker`);
- lws: a LeaderWorkerSet of one group of N pods, a leader and N-1 workers on one template (Kueue
  makes one Workload per group, with one pod set `main` of N).

`body(gang, queue, required_topology)` is the object (tests/controlplane/operators.py's builders), to
create in `path(gang, namespace)`: Guaranteed pods annotated `topolet.io/numa-policy:
single-numa-node`, and with a level in `required_topology`, `kueue.x-k8s.io/podset-required-topology`
on every pod set, as Kueue's Topology Aware Scheduling docs tell training users to ask for it.
`gang_of(name)` is the gang a pod or Workload owner of that name belongs to: every kind names its
children after the object.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import admission_workload as workload

from agent.admission.engine.model import Gang, PodSet
from tests.controlplane.kueue import job
from tests.controlplane.operators import (
    annotate_pods,
    collection_path,
    jobset,
    leaderworkerset,
    mpijob,
    trainjob,
)

KINDS = ("job", "jobset", "trainjob", "mpijob", "lws")
# The operators (tests/controlplane/operators.py's names) each kind needs: Trainer makes JobSets.
OPERATORS = {"job": (), "jobset": ("jobset",), "trainjob": ("jobset", "trainer"), "mpijob": ("mpi-operator",),
             "lws": ("lws",)}
NUMA = {"topolet.io/numa-policy": "single-numa-node"}
REQUIRED_TOPOLOGY = "kueue.x-k8s.io/podset-required-topology"
_API_KIND = {"jobset": "JobSet", "trainjob": "TrainJob", "mpijob": "MPIJob", "lws": "LeaderWorkerSet"}


@dataclass(frozen=True)
class KindGang:
    """One gang: the object `name` of `kind`, and its pod sets as Kueue's Workload has them."""

    name: str
    kind: str
    gang: Gang

    @property
    def pods(self) -> int:
        return sum(ps.count for ps in self.gang.pod_sets)


def operators(kinds: tuple[str, ...]) -> tuple[str, ...]:
    """The operators `kinds` need, each once, in tests/controlplane/operators.py's order."""
    return tuple(dict.fromkeys(name for kind in kinds for name in OPERATORS[kind]))


def _pod_sets(kind: str, template: PodSet) -> tuple[PodSet, ...]:
    def named(name: str, count: int) -> PodSet:
        return PodSet(name=name, count=count, requests=template.requests, numa_policy=template.numa_policy)

    n = template.count
    if kind == "mpijob":
        return named("launcher", 1), named("worker", n - 1)
    return (named({"job": "main", "jobset": "workers", "trainjob": "node", "lws": "main"}[kind], n),)


def gangs(count: int, seed: int, kinds: tuple[str, ...] = KINDS) -> list[KindGang]:
    """`count` gangs of bench/admission_workload.py's mix, the kinds taken in turn within each size."""
    seen: Counter[int] = Counter()
    out = []
    for index, base in enumerate(workload.gangs(count, seed)):
        (template,) = base.pod_sets
        kind = kinds[seen[template.count] % len(kinds)]
        seen[template.count] += 1
        name = f"{kind}-{index:05d}"
        out.append(KindGang(name, kind, Gang(key=f"bench/{name}", pod_sets=_pod_sets(kind, template))))
    return out


def gang_of(name: str) -> str:
    """The gang (`<kind>-NNNNN`) a pod, child or Workload owner named `name` belongs to."""
    return "-".join(name.split("-")[:2])


def path(gang: KindGang, namespace: str) -> str:
    """The collection `gang`'s object is created in."""
    if gang.kind == "job":
        return f"/apis/batch/v1/namespaces/{namespace}/jobs"
    return collection_path(_API_KIND[gang.kind], namespace)


def collections(namespace: str) -> list[str]:
    """Every kind's collection in `namespace`, the operators' kinds before the Jobs some of them make."""
    return [*(collection_path(kind, namespace) for kind in _API_KIND.values()),
            f"/apis/batch/v1/namespaces/{namespace}/jobs"]


def body(gang: KindGang, queue: str, required_topology: str | None = None) -> dict[str, Any]:
    """The object of `gang`, for LocalQueue `queue`."""
    template = gang.gang.pod_sets[-1]
    n = gang.pods
    requests = {"cpu": str(template.requests.cpu_milli // 1000), "memory": str(template.requests.memory)}
    annotations = dict(NUMA)
    if required_topology is not None:
        annotations[REQUIRED_TOPOLOGY] = required_topology
    if gang.kind == "job":
        obj = job(gang.name, queue, parallelism=n, requests=requests, indexed=True)
        obj["spec"]["backoffLimit"] = 0
        return annotate_pods(obj, annotations)
    if gang.kind == "jobset":
        obj = jobset(gang.name, queue, replicas=2, pods=n // 2, requests=requests)
    elif gang.kind == "trainjob":
        obj = trainjob(gang.name, queue, nodes=n, requests=requests)
        obj["spec"]["trainer"]["resourcesPerNode"]["limits"] = dict(requests)  # Guaranteed, as the others
    elif gang.kind == "mpijob":
        obj = mpijob(gang.name, queue, workers=n - 1, requests=requests)
    else:
        obj = leaderworkerset(gang.name, queue, replicas=1, size=n, requests=requests)
    return annotate_pods(obj, annotations)
