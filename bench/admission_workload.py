"""The admission benchmark's workload: seeded nodes (Node + NRT + filler pods, as API dicts) and gangs.

Public API (the in-process bench and the through-the-API run share it, so both see the same objects):

- `topologies(dest, names=DUMPS) -> list[tuple[str, Topology]]`: those hwloc dumps unpacked under
  `dest` and discovered (`agent.topology.discover`).
- `cluster(count, topos, seed, scope="pod") -> Cluster` (`cluster_parts(..., size)`: the same, `size`
  nodes at a time): `count` nodes named `node-00000`..., each one of the topologies in turn, partly
  filled: a seeded share (`FILL`, 15–55%) of its CPUs is held by exclusive single-numa-node allocations
  made with `agent.alloc.allocate` (so the free CPUs are fragmented
  as on a real node).  `Cluster.nodes` are Node dicts (allocatable cpu/memory/pods, labels
  `kubernetes.io/hostname` and `RACK_LABEL`, 64 nodes a rack), `Cluster.nrts` the NRTs
  `agent.kube.publish.nrt.nrt_object` builds from that state (policy single-numa-node, topologyManagerScope
  `scope`; the same seed gives the same nodes whatever the scope), `Cluster.pods` one bound Guaranteed
  filler pod per allocation (so node totals agree with the NRT).
- `gangs(count, seed) -> list[Gang]`: gangs of 2, 4 or 8 single-numa-node pods in the pod-count mix
  of Kueue's `tas` scheduler performance test (kubernetes-sigs/kueue,
  test/performance/scheduler/configs/tas/generator.yaml at commit cc13fff8: per queue 350
  workloads of 2 pods, 100 of 4 and 50 of 8, i.e. 70/20/10%).  The test's rack constraints are not
  reproduced (no colocation).

Why these sizes.  Kueue's test asks 500m, 1250m and 2500m per pod; as whole CPUs (1, 2, 3) against
zones of 10 to 32 CPUs nearly every zone holds nearly every pod, so the plain scheduler, which
checks node totals only, aligned 100% too and the bench showed nothing.  The failure appears when a
pod is a sizable part of a zone and the node's free CPUs are split over its zones: here gangs of 2,
4 and 8 pods ask 4, 6 and 8 CPUs a pod (larger gangs, larger pods, as in Kueue's mix), with 1 GiB of
memory per CPU, on machines whose zones hold 10 to 32 CPUs (`DUMPS`: the dumps with 2-pod-a-zone
room; 4-CPU zones could hold no 6-CPU pod at all), already 15–55% held in fragments of 1–8 CPUs.
The fill stops at 55% so that the 8,840 pods of 3,000 gangs fit the 1,000 nodes of the API run (about
49,000 CPUs asked of about 60,000 free): both runs then bind every pod, and the wall times compare
the same work.  With this mix a best-fit placer on node totals puts about 6.5% of its pods where no
zone of the node holds them (bench/admission.py prints the figure).
"""

from __future__ import annotations

import math
import random
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.admission.engine.model import Gang, PodSet, Resources
from agent.alloc.exclusive import allocate
from agent.alloc.request import Request
from agent.enforce.state import Allocation, Owner, State
from agent.errors import AllocationError
from agent.kube.publish.nrt import nrt_object
from agent.topology.cpuset import EMPTY
from agent.topology.model import Topology

REPO = Path(__file__).resolve().parent.parent
DUMP_DIR = REPO / "tests" / "data" / "hwloc" / "dumps"
# Machines with 2 to 8 NUMA nodes of 10 to 32 CPUs each (the bench's "up to 8 zones"; see above).
DUMPS = (
    "256ppc-8n8s4t",
    "96em64t-4no4pa3ca2co",
    "64fake-4n2s2ca2c2t",
    "40intel64-4n10c+pci-conflicts",
    "32em64t-2n8c+dax+nvme+mic+dimms",
)
RACK_LABEL = "topolet.io/rack"
NODES_PER_RACK = 64
MAX_PODS = 110
GIB = 1 << 30
# (pods per gang, CPUs per pod, share of gangs): Kueue tas test's pod-count mix, sizes chosen above.
GANG_MIX = ((2, 4, 0.70), (4, 6, 0.20), (8, 8, 0.10))
# Distinct fill states made per topology; nodes draw from them (allocating per node is slow).
_STATES_PER_TOPOLOGY = 48
_FILL_SIZES = (1, 2, 2, 3, 4, 4, 6, 8)
FILL = (0.15, 0.55)  # share of a node's CPUs held by fillers, drawn uniformly per fill state


@dataclass(frozen=True)
class Cluster:
    """Nodes, their NRTs and the filler pods bound to them, as the API returns them."""

    nodes: list[dict[str, Any]]
    nrts: list[dict[str, Any]]
    pods: list[dict[str, Any]]


def topologies(dest: Path, names: tuple[str, ...] = DUMPS) -> list[tuple[str, Topology]]:
    """The `names` machines (of DUMP_DIR), unpacked under `dest` and discovered."""
    from agent.topology.discover import discover

    out = []
    for name in names:
        folder = dest / name
        if not folder.exists():
            with tarfile.open(DUMP_DIR / f"{name}.tar.bz2") as tar:
                tar.extractall(folder, filter="tar")
        (root,) = [p for p in folder.iterdir() if p.is_dir()]
        out.append((name, discover(str(root))))
    return out


def _fill(topo: Topology, rng: random.Random, tag: str) -> tuple[State, list[int]]:
    """A state holding a random share (`FILL`) of the CPUs in single-numa-node allocations."""
    target = int(len(topo.cpus) * rng.uniform(*FILL))
    free = topo.cpus
    allocations: list[Allocation] = []
    sizes: list[int] = []
    while len(topo.cpus) - len(free) < target:
        n = rng.choice(_FILL_SIZES)
        try:
            got = allocate(topo, free, Request(cpus=n, numa_policy="single-numa-node"))
        except AllocationError:
            break
        aid = f"{tag}-{len(allocations)}"
        allocations.append(Allocation(id=aid, cpus=got, mems=EMPTY, cgroup=f"topolet/{aid}",
                                      owner=Owner(pod_uid=f"uid-{aid}", container="main"),
                                      policy="single-numa-node", created_at=0.0))
        sizes.append(n)
        free = free - got
    return State(allocations=tuple(allocations)), sizes


def _memory(topo: Topology) -> int:
    return sum(n.memory_bytes for n in topo.numa_nodes if n.cpus)


def cluster(count: int, topos: list[tuple[str, Topology]], seed: int, scope: str = "pod") -> Cluster:
    """`count` partly filled nodes cycling over `topos`, NRTs of topologyManagerScope `scope` (see the
    module docstring)."""
    (whole,) = cluster_parts(count, topos, seed, scope, size=max(count, 1))
    return whole


def cluster_parts(count: int, topos: list[tuple[str, Topology]], seed: int, scope: str = "pod",
                  size: int = 5000) -> Iterator[Cluster]:
    """`cluster(count, ...)` `size` nodes at a time (each part with its nodes' NRTs and pods), the same
    nodes as the whole: a bench reads a large cluster a part at a time."""
    rng = random.Random(seed)
    states = [[_fill(topo, rng, f"{name}-{k}") for k in range(_STATES_PER_TOPOLOGY)]
              for name, topo in topos]
    nodes: list[dict[str, Any]] = []
    nrts: list[dict[str, Any]] = []
    pods: list[dict[str, Any]] = []
    for i in range(count):
        if len(nodes) == size:
            yield Cluster(nodes, nrts, pods)
            nodes, nrts, pods = [], [], []
        t = i % len(topos)
        _, topo = topos[t]
        state, sizes = states[t][rng.randrange(_STATES_PER_TOPOLOGY)]
        name, uid = f"node-{i:05d}", f"uid-node-{i:05d}"
        nodes.append({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "uid": uid,
                         "labels": {"kubernetes.io/hostname": name,
                                    RACK_LABEL: f"rack-{i // NODES_PER_RACK:03d}"}},
            "status": {"allocatable": {"cpu": str(len(topo.cpus)), "memory": str(_memory(topo)),
                                       "pods": str(MAX_PODS)},
                       "capacity": {"cpu": str(len(topo.cpus)), "memory": str(_memory(topo)),
                                    "pods": str(MAX_PODS)},
                       "conditions": [{"type": "Ready", "status": "True"}]},
        })
        nrts.append(nrt_object((name, uid), topo, state, topology_manager_policy="single-numa-node",
                               topology_manager_scope=scope))
        for k, n in enumerate(sizes):
            pods.append(_filler(f"fill-{i:05d}-{k}", name, n))
    yield Cluster(nodes, nrts, pods)


def _filler(name: str, node: str, cpus: int) -> dict[str, Any]:
    res = {"cpu": str(cpus), "memory": f"{cpus}Gi"}
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "filler", "uid": f"uid-{name}"},
        "spec": {"nodeName": node,
                 "containers": [{"name": "main", "resources": {"requests": res, "limits": res}}]},
        "status": {"phase": "Running"},
    }


def gangs(count: int, seed: int) -> list[Gang]:
    """`count` gangs of single-numa-node pods in the Kueue tas pod-count mix."""
    rng = random.Random(seed)
    weights = [w for _, _, w in GANG_MIX]
    out = []
    for k in range(count):
        pods, cpus, _ = rng.choices(GANG_MIX, weights)[0]
        req = Resources(cpu_milli=cpus * 1000, memory=cpus * GIB)
        out.append(Gang(key=f"bench/gang-{k:05d}", pod_sets=(
            PodSet(name="workers", count=pods, requests=req, numa_policy="single-numa-node"),)))
    return out


def gang_cpus(gang: Gang) -> int:
    """Whole CPUs a gang asks for, in total."""
    return sum(math.ceil(ps.requests.cpu_milli / 1000) * ps.count for ps in gang.pod_sets)

