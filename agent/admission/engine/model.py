"""The admission engine's values: what a gang asks for, what the cluster has free, and the answer.

Immutable values with no I/O, so `place.place` is a pure function of `(ClusterView, Gang)`.  Quantities
are integers in base units: CPU in millicores, memory and hugepages in bytes, GPU shares in thousandths
of one GPU (`gpu_milli`), other device plugin resources (`devices`) in counts.  A zone's figures are
what is available now, after the controller's own ledger; what a zone is and which devices are placed
per zone: README.md beside this module.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from agent.api.policies import NumaPolicy, Scope

# A pod set's NUMA policy is one of `agent.api.policies.POD_SET_NUMA_POLICIES`, the kubelet Topology
# Manager's names, each a row of `agent.admission.engine.policies`: single-numa-node must fit one
# zone; restricted must fit the fewest zones an empty node would use; best-effort and none fit node
# totals.

NODE_POLICY = "node"
"""A pod set's NUMA policy when it names none of its own: on each node, that node's kubelet Topology
Manager policy (`Node.topology_policy`), as the node's kubelet would admit it (`PodSet.policy_on`)."""

TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")

_EMPTY: Mapping[str, int] = MappingProxyType({})


def _empty() -> Mapping[str, Any]:
    # A factory, not a default: dataclasses refuse an unhashable default such as a mappingproxy.
    return _EMPTY


@dataclass(frozen=True, slots=True)
class Resources:
    """Amounts of every resource the engine places, in base units.

    cpu_milli: millicores; memory: bytes; hugepages: `hugepages-<size>` -> bytes;
    gpus: whole `nvidia.com/gpu` devices; gpu_milli: a share of one GPU (0 < gpu_milli < 1000), 0 for
    none (a pod takes whole GPUs or one share, never both); mig: `nvidia.com/mig-<profile>` -> count;
    devices: every other extended resource (a device plugin's, e.g. `example.com/nic`) -> count.
    """

    cpu_milli: int = 0
    memory: int = 0
    hugepages: Mapping[str, int] = field(default_factory=_empty)
    gpus: int = 0
    gpu_milli: int = 0
    mig: Mapping[str, int] = field(default_factory=_empty)
    devices: Mapping[str, int] = field(default_factory=_empty)


@dataclass(frozen=True, slots=True)
class Toleration:
    """A pod's toleration, core/v1 semantics (operator Equal or Exists; empty key with Exists = all)."""

    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str = ""
    effect: str = "NoSchedule"


@dataclass(frozen=True, slots=True)
class NodeSelectorRequirement:
    """One requirement of a required node-affinity term (In, NotIn, Exists, DoesNotExist, Gt, Lt)."""

    key: str
    operator: str
    values: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Zone:
    """One NUMA zone of a node with what is available in it now (after the ledger).

    cpu_milli: available exclusive CPU, in millicores (whole CPUs × 1000 as the NRT reports them);
    cpu_capacity_milli: the zone's allocatable CPU when empty (for fragmentation scoring);
    l3_cpus: CPUs per L3 group in this zone, 0 when unknown;
    devices: device plugin resources the zone lists -> available count (listed with 0 when none is
    free: a name in any zone makes that resource zone-level on the node).
    """

    numa: int
    cpu_milli: int = 0
    cpu_capacity_milli: int = 0
    memory: int = 0
    hugepages: Mapping[str, int] = field(default_factory=_empty)
    gpus: int = 0
    mig: Mapping[str, int] = field(default_factory=_empty)
    l3_cpus: int = 0
    devices: Mapping[str, int] = field(default_factory=_empty)


@dataclass(frozen=True, slots=True)
class Node:
    """A node the engine may place on, with its free capacity now.

    free: node-level free resources (allocatable less the requests of bound pods less the ledger);
    zones: its NUMA zones (empty when the node publishes no NRT: such a node takes only pods whose
    policy is best-effort or none);
    gpu_free_milli: per physical GPU, the thousandths still free for sharing (1000 = whole GPU free);
    free_pods: how many more pods the node admits (allocatable pods less bound pods);
    topology_policy: its kubelet's Topology Manager policy (one of POD_SET_NUMA_POLICIES), which pod sets
    of policy NODE_POLICY are placed for on this node;
    topology_scope: its Topology Manager scope (one of `agent.api.policies.TOPOLOGY_MANAGER_SCOPES`):
    under "container" (the kubelet's default) a pod whose containers each fit a zone may be split over
    zones (`agent.admission.engine.scope`), under "pod" it takes one zone whole.
    """

    name: str
    labels: Mapping[str, str] = field(default_factory=_empty)
    taints: tuple[Taint, ...] = ()
    unschedulable: bool = False
    free: Resources = field(default_factory=Resources)
    capacity: Resources = field(default_factory=Resources)
    zones: tuple[Zone, ...] = ()
    gpu_free_milli: tuple[int, ...] = ()
    gpu_model: str = ""
    free_pods: int = 110
    topology_policy: str = NumaPolicy.NONE.value
    topology_scope: str = Scope.CONTAINER.value


@dataclass(frozen=True, slots=True)
class ClusterView:
    """Every node the engine may use, in a fixed order (name order), plus the empty-cluster capacity.

    nodes: the nodes with their free capacity now (NRT available, less the ledger);
    empty: the same nodes as if nothing ran on them (capacity/allocatable), used to tell a "never"
    refusal from a "not now" one;
    gpu_mix: the typical GPU pod mix, (request, popularity) pairs whose popularities sum to 1, that
    the fragmentation score of shared GPUs is measured against (FGD's "target workload"); empty
    means plain best fit for GPUs;
    gpu_mix_models: parallel to gpu_mix, the GPU models (`Node.gpu_model`) each type may use, None
    for any; empty means no type is constrained.
    """

    nodes: tuple[Node, ...]
    empty: tuple[Node, ...] = ()
    gpu_mix: tuple[tuple[Resources, float], ...] = ()
    gpu_mix_models: tuple[frozenset[str] | None, ...] = ()


@dataclass(frozen=True, slots=True)
class PodSet:
    """`count` identical pods of one gang.

    colocate_label: when set, every pod of the set (and of every other set of the gang that names the
    same label) lands on nodes that share one value of that label (a rack or a block);
    numa_policy: one of POD_SET_NUMA_POLICIES, or NODE_POLICY (each node's own);
    cpu_aligned: False for pods that are not Guaranteed with whole CPUs: the kubelet aligns their
    devices (its device manager gives NUMA hints whatever the QoS) but not their CPU and memory, so
    under single-numa-node and restricted only their devices (GPUs, MIG, `devices`) are placed in
    zones and their CPU and memory are counted at node level.
    """

    name: str
    count: int
    requests: Resources
    numa_policy: str = NumaPolicy.NONE.value
    node_selector: Mapping[str, str] = field(default_factory=_empty)
    required_affinity: tuple[tuple[NodeSelectorRequirement, ...], ...] = ()
    tolerations: tuple[Toleration, ...] = ()
    colocate_label: str | None = None
    # CPU millicores of each regular container of a pod with several, in spec order (empty for one):
    # what a node of the container scope aligns one by one (`Node.topology_scope`).
    containers: tuple[int, ...] = ()
    cpu_aligned: bool = True

    def policy_on(self, node: Node) -> str:
        """The NUMA policy its pods are placed for on `node`: its own, else the node's."""
        return node.topology_policy if self.numa_policy == NODE_POLICY else self.numa_policy


@dataclass(frozen=True, slots=True)
class Gang:
    """A workload admitted all or nothing: one or more pod sets."""

    key: str
    pod_sets: tuple[PodSet, ...]
    priority: int = 0


@dataclass(frozen=True, slots=True)
class PodPlacement:
    """Where one pod goes: `pod_set` name, its index within the set, the node and the zone counted on.

    zone is the NUMA id the engine counted the pod's CPUs (and devices) against, None for pods placed
    on node totals (best-effort/none); gpu_index is the physical GPU of a shared-GPU pod, else None;
    zones: a pod the container scope split over zones (zone None): each container's NUMA id, in the
    order of `PodSet.containers`.
    """

    pod_set: str
    index: int
    node: str
    zone: int | None = None
    gpu_index: int | None = None
    zones: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Placement:
    """Every pod of the gang placed; `score` is the engine's fragmentation figure for the result."""

    gang: str
    pods: tuple[PodPlacement, ...]
    score: float = 0.0


REFUSAL_KINDS = ("not-now", "never")


@dataclass(frozen=True, slots=True)
class Refusal:
    """The gang does not fit: kind "not-now" (it would on a less busy cluster) or "never" (not even on
    the empty cluster); reason names the binding constraint in one line."""

    gang: str
    kind: str
    reason: str
