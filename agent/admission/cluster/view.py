"""The cluster view the engine places on, built from API objects as plain dicts.

`build_view(nodes, nrts, pods, ledger, now, ...) -> (ClusterView, left out: node -> reason)` never
raises on bad input: a node whose objects cannot be read is left out with a reason.  Also
`pod_requests(pod)` (None when malformed; `read_pod_requests` raises BadObject), `node_policy`,
`nrt_zones`, `node_allocatable`.  A bound pod whose requests cannot be read costs only itself.
What each node's figures are, and when a node is left out: agent/admission/cluster/README.md.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from agent.admission.cluster.ledger import Entry, Ledger, SlotOf, agent_pins, job_slot
from agent.admission.cluster.podindex import NodeUse, PodIndex
from agent.admission.engine.model import (
    ClusterView,
    Node,
    Resources,
    Taint,
    Zone,
)
from agent.admission.gangs.job import JobSpecError, resources_of
from agent.api.nrt import ZONE_TYPE, policy_of_legacy, scope_of_legacy
from agent.api.objects import as_list, as_mapping, is_extended_resource
from agent.api.placements import MAX_NUMA_ZONE
from agent.api.podrequests import RequestsError
from agent.api.podrequests import pod_requests as spec_requests
from agent.api.policies import POD_SET_NUMA_POLICIES, TOPOLOGY_MANAGER_SCOPES, NumaPolicy, Scope
from agent.api.resources import GPU_RESOURCE, MIG_RESOURCE_PREFIX, parse_quantity

HUGEPAGES_PREFIX = "hugepages-"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
DEFAULT_MAX_PODS = 110  # kubelet's maxPods when a Node states no allocatable pods
_ZONE_NAME = re.compile(r"node-(0|[1-9][0-9]{0,3})")


class BadObject(ValueError):
    """An API object the view cannot read; the message is the reason the node is left out."""


def _quantity(name: str, value: object, what: str) -> Fraction:
    q = parse_quantity(value)
    if q is None or q < 0:
        raise BadObject(f"{what}: malformed quantity {name}={value!r}")
    return q


@dataclass(slots=True)
class _Amounts:
    """Mutable resource amounts in base units while a node's figures are summed."""

    cpu: int = 0
    memory: int = 0
    gpus: int = 0
    pods: int = 0
    hugepages: dict[str, int] | None = None
    mig: dict[str, int] | None = None
    devices: dict[str, int] | None = None

    def add(self, r: Resources, sign: int = 1) -> None:
        self.cpu += sign * r.cpu_milli
        self.memory += sign * r.memory
        self.gpus += sign * r.gpus
        for attr, extra in (("hugepages", r.hugepages), ("mig", r.mig), ("devices", r.devices)):
            if extra:
                d = getattr(self, attr)
                if d is None:
                    d = {}
                    setattr(self, attr, d)
                for k, v in extra.items():
                    d[k] = d.get(k, 0) + sign * v

    def resources(self) -> Resources:
        return Resources(cpu_milli=max(0, self.cpu), memory=max(0, self.memory),
                         gpus=max(0, self.gpus),
                         hugepages={k: max(0, v) for k, v in (self.hugepages or {}).items()},
                         mig={k: max(0, v) for k, v in (self.mig or {}).items()},
                         devices={k: max(0, v) for k, v in (self.devices or {}).items()})


def _count(name: str, value: object, what: str) -> int:
    q = _quantity(name, value, what)
    if q.denominator != 1:
        raise BadObject(f"{what}: {name}={value!r} is not a whole number of devices")
    return int(q)


def _kubernetes_own(name: str) -> bool:
    """A `kubernetes.io` resource name: not an extended resource, and not a device."""
    prefix = name.partition("/")[0]
    return prefix == "kubernetes.io" or prefix.endswith(".kubernetes.io")


def _resources(amounts: Mapping[str, Any], what: str) -> tuple[Resources, int]:
    """(Resources, pods) of a resource list ({"cpu": "4", ...}); other names without a domain (and
    kubernetes.io's own) are ignored, extended resources read strictly (BadObject)."""
    a = _Amounts()
    hp: dict[str, int] = {}
    mig: dict[str, int] = {}
    dev: dict[str, int] = {}
    for name, value in amounts.items():
        if not isinstance(name, str):
            continue
        if name == "cpu":
            a.cpu = int(_quantity(name, value, what) * 1000)
        elif name == "memory":
            a.memory = int(_quantity(name, value, what))
        elif name == "pods":
            a.pods = int(_quantity(name, value, what))
        elif name == GPU_RESOURCE:
            a.gpus = int(_quantity(name, value, what))
        elif name.startswith(HUGEPAGES_PREFIX):
            hp[name] = int(_quantity(name, value, what))
        elif name.startswith(MIG_RESOURCE_PREFIX):
            mig[name] = int(_quantity(name, value, what))
        elif "/" in name and not _kubernetes_own(name):
            if not is_extended_resource(name):
                raise BadObject(f"{what}: invalid extended resource name {name[:300]!r}")
            dev[name] = _count(name, value, what)
    a.hugepages, a.mig, a.devices = hp, mig, dev
    return a.resources(), a.pods


def read_pod_requests(pod: Mapping[str, Any]) -> Resources:
    """A pod's requests as the scheduler counts them (`agent.api.podrequests`, pod-level resources
    included); BadObject, saying why, when they cannot be read."""
    try:
        return resources_of(spec_requests(as_mapping(pod.get("spec"))))
    except (RequestsError, JobSpecError) as exc:
        raise BadObject(str(exc)) from None


def pod_requests(pod: Mapping[str, Any]) -> Resources | None:
    """A pod's requests as the scheduler counts them; None when they are malformed."""
    try:
        return read_pod_requests(pod)
    except BadObject:
        return None


def _ready(node: Mapping[str, Any]) -> bool:
    for cond in as_list(as_mapping(node.get("status")).get("conditions")):
        if as_mapping(cond).get("type") == "Ready":
            return as_mapping(cond).get("status") == "True"
    return True


def _taints(spec: Mapping[str, Any]) -> tuple[Taint, ...]:
    out = []
    for t in as_list(spec.get("taints")):
        t = as_mapping(t)
        key, effect = t.get("key"), t.get("effect", "NoSchedule")
        if not isinstance(key, str) or effect not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
            raise BadObject(f"malformed taint {t!r}")
        out.append(Taint(key=key, value=str(t.get("value") or ""), effect=effect))
    return tuple(out)


def nrt_zones(nrt: Mapping[str, Any]) -> tuple[tuple[Zone, ...], tuple[Zone, ...]]:
    """(zones with available figures, zones with allocatable figures) of an NRT; BadObject when one
    cannot be read."""
    now: list[Zone] = []
    empty: list[Zone] = []
    for z in as_list(nrt.get("zones")):
        z = as_mapping(z)
        if z.get("type") != ZONE_TYPE:
            continue  # other zone types are not NUMA nodes (consumers skip them)
        m = _ZONE_NAME.fullmatch(str(z.get("name")))
        if m is None:
            raise BadObject(f"zone name {z.get('name')!r} is not node-<N>")
        numa = int(m.group(1))
        if numa > MAX_NUMA_ZONE:  # the agent's writer publishes no zone past it either
            raise BadObject(f"zone name {z.get('name')!r}: NUMA node id above {MAX_NUMA_ZONE}")
        available: dict[str, Any] = {}
        allocatable: dict[str, Any] = {}
        for res in as_list(z.get("resources")):
            res = as_mapping(res)
            name = res.get("name")
            if not isinstance(name, str):
                raise BadObject(f"zone node-{numa}: resource without a name")
            available[name] = res.get("available")
            allocatable[name] = res.get("allocatable")
        what = f"NRT zone node-{numa}"
        free, _ = _resources(available, what)
        cap, _ = _resources(allocatable, what)
        now.append(Zone(numa=numa, cpu_milli=free.cpu_milli, cpu_capacity_milli=cap.cpu_milli,
                        memory=free.memory, hugepages=free.hugepages, gpus=free.gpus, mig=free.mig,
                        devices=free.devices))
        empty.append(Zone(numa=numa, cpu_milli=cap.cpu_milli, cpu_capacity_milli=cap.cpu_milli,
                          memory=cap.memory, hugepages=cap.hugepages, gpus=cap.gpus, mig=cap.mig,
                          devices=cap.devices))
    if len({z.numa for z in now}) != len(now):
        raise BadObject("NRT names a zone twice")
    order = sorted(range(len(now)), key=lambda k: now[k].numa)
    return tuple(now[k] for k in order), tuple(empty[k] for k in order)


def node_allocatable(node: Mapping[str, Any]) -> tuple[Resources, int]:
    """A Node's `status.allocatable` and how many pods it takes; BadObject when it cannot be read."""
    allocatable = as_mapping(as_mapping(node.get("status")).get("allocatable"))
    alloc, max_pods = _resources(allocatable, "allocatable")
    return alloc, (max_pods if "pods" in allocatable else DEFAULT_MAX_PODS)


def _stale(nrt: Mapping[str, Any], uid: str) -> bool:
    for ref in as_list(as_mapping(nrt.get("metadata")).get("ownerReferences")):
        ref = as_mapping(ref)
        if ref.get("kind") == "Node" and ref.get("uid") != uid:
            return True
    return False


def _less_zone(zone: Zone, r: Resources) -> Zone:
    def minus(have: Mapping[str, int], want: Mapping[str, int]) -> dict[str, int]:
        out = dict(have)
        for k, v in want.items():
            out[k] = max(0, out.get(k, 0) - v)
        return out
    return Zone(numa=zone.numa, cpu_milli=max(0, zone.cpu_milli - r.cpu_milli),
                cpu_capacity_milli=zone.cpu_capacity_milli, memory=max(0, zone.memory - r.memory),
                hugepages=minus(zone.hugepages, r.hugepages), gpus=max(0, zone.gpus - r.gpus),
                mig=minus(zone.mig, r.mig), l3_cpus=zone.l3_cpus,
                devices=minus(zone.devices, {k: v for k, v in r.devices.items() if k in zone.devices}))


def build_view(nodes: Iterable[Mapping[str, Any]], nrts: Iterable[Mapping[str, Any]],
               pods: Iterable[Mapping[str, Any]], ledger: Ledger, now: float,
               gpu_mix: tuple[tuple[Resources, float], ...] = (),
               slot_of: SlotOf = job_slot,
               requests_of: Callable[[Mapping[str, Any]], Resources | None] = pod_requests,
               zones_of: Callable[[Mapping[str, Any]], tuple[tuple[Zone, ...], tuple[Zone, ...]]] = nrt_zones,
               allocatable_of: Callable[[Mapping[str, Any]], tuple[Resources, int]] = node_allocatable,
               index: PodIndex | None = None, memo: dict[str, Any] | None = None,
               ) -> tuple[ClusterView, dict[str, str]]:
    """The view of `nodes` (with their NRTs, bound pods and the ledger) and the nodes left out.

    `zones_of` and `allocatable_of` are `nrt_zones` and `node_allocatable`, or caches of them (the
    controller keeps one per object version: reading quantities is most of a view's build on a big
    cluster).  `index`: the pods already indexed for this pass (then `pods`, `slot_of` and
    `requests_of` are not read).  `memo`, a dict the caller keeps across calls, holds each node's
    figures with what they were computed from (the Node's and NRT's versions, the index's version of
    the node, its ledger entries): a node none of those changed for is not worked out again."""
    del now  # the ledger was settled by the caller at `now`; the view itself is timeless
    if index is None:
        index = PodIndex(requests_of, agent_pins).update(pods, slot_of)
    by_name: dict[str, Mapping[str, Any]] = {}
    for nrt in nrts:
        name = as_mapping(as_mapping(nrt).get("metadata")).get("name")
        if isinstance(name, str):
            by_name[name] = nrt
    pending: dict[str, list[Entry]] = {}  # placed, its pod not bound there yet: off the node's totals
    on_zone: dict[str, list[Entry]] = {}  # placed on a zone: off that zone's figures
    for e in ledger.entries:
        mine = index.slot((e.gang, e.slot))
        if mine is None or mine.node != e.node:  # a bound pod is already in the node's used figures
            pending.setdefault(e.node, []).append(e)
        if e.zone is not None or e.zones:
            on_zone.setdefault(e.node, []).append(e)

    out: list[Node] = []
    empty: list[Node] = []
    left_out: dict[str, str] = {}
    kept: dict[str, Any] = {}
    for obj in nodes:
        meta = as_mapping(as_mapping(obj).get("metadata"))
        name = meta.get("name")
        if not isinstance(name, str) or not name:
            continue
        topo = by_name.get(name)
        mine_pending, mine_zones = pending.get(name, []), on_zone.get(name, [])
        key = _memo_key(meta, topo, index.version(name)) if memo is not None else None
        hit = memo.get(name) if memo is not None and key is not None else None
        if hit is not None and hit[0] == key and hit[1] == mine_pending and hit[2] == mine_zones:
            result = hit[3]
        else:
            try:
                result = _node_views(obj, name, meta, topo, index.used(name), mine_pending, mine_zones,
                                     zones_of, allocatable_of)
            except BadObject as exc:
                result = str(exc)
        if key is not None:
            kept[name] = (key, mine_pending, mine_zones, result)
        if isinstance(result, str):
            left_out[name] = result
            continue
        out.append(result[0])
        empty.append(result[1])
    if memo is not None:
        memo.clear()
        memo.update(kept)
    out.sort(key=lambda n: n.name)
    empty.sort(key=lambda n: n.name)
    return ClusterView(nodes=tuple(out), empty=tuple(empty), gpu_mix=gpu_mix), left_out


def _memo_key(meta: Mapping[str, Any], topo: Mapping[str, Any] | None,
              pods_version: int) -> tuple[Any, ...] | None:
    """What a node's figures are computed from besides the ledger; None when an object carries no
    version (then they are worked out every time)."""
    rv = meta.get("resourceVersion")
    if not rv:
        return None
    if topo is None:
        return (meta.get("uid"), rv, None, None, pods_version)
    topo_meta = as_mapping(topo.get("metadata"))
    if not topo_meta.get("resourceVersion"):
        return None
    return (meta.get("uid"), rv, topo_meta.get("uid"), topo_meta.get("resourceVersion"), pods_version)


def _node_views(obj: Mapping[str, Any], name: str, meta: Mapping[str, Any], topo: Mapping[str, Any] | None,
                use: NodeUse, pending: list[Entry], on_zone: list[Entry],
                zones_of: Callable[[Mapping[str, Any]], tuple[tuple[Zone, ...], tuple[Zone, ...]]],
                allocatable_of: Callable[[Mapping[str, Any]], tuple[Resources, int]]) -> tuple[Node, Node]:
    """The node as the engine sees it now, and empty; BadObject when it is left out."""
    if not _ready(obj):
        raise BadObject("NotReady")
    spec = as_mapping(obj.get("spec"))
    alloc, max_pods = allocatable_of(obj)
    labels = {str(k): str(v) for k, v in as_mapping(meta.get("labels")).items()}
    zones: tuple[Zone, ...] = ()
    zones_empty: tuple[Zone, ...] = ()
    if topo is not None:
        if _stale(topo, str(meta.get("uid") or "")):
            raise BadObject("stale NRT: its owner is another Node uid")
        zones, zones_empty = zones_of(topo)
    zones = tuple(_zone_after(z, on_zone) for z in zones)
    a = _Amounts(cpu=alloc.cpu_milli, memory=alloc.memory, gpus=alloc.gpus, pods=max_pods,
                 hugepages=dict(alloc.hugepages), mig=dict(alloc.mig), devices=dict(alloc.devices))
    a.add(use.requests, -1)
    a.pods -= use.pods
    for e in pending:
        a.add(e.request, -1)
        a.pods -= 1
    taints, unschedulable = _taints(spec), bool(spec.get("unschedulable"))
    gpu_model, policy = labels.get(GPU_PRODUCT_LABEL, ""), node_policy(topo)
    scope = node_scope(topo)
    return (Node(name=name, labels=labels, taints=taints, unschedulable=unschedulable, free=a.resources(),
                 capacity=alloc, zones=zones, gpu_model=gpu_model, free_pods=max(0, a.pods),
                 topology_policy=policy, topology_scope=scope),
            Node(name=name, labels=labels, taints=taints, unschedulable=unschedulable, free=alloc,
                 capacity=alloc, zones=zones_empty, gpu_model=gpu_model, free_pods=max_pods,
                 topology_policy=policy, topology_scope=scope))


def _zone_after(zone: Zone, on_zone: list[Entry]) -> Zone:
    for e in on_zone:
        if e.zone == zone.numa or zone.numa in e.zones:
            zone = _less_zone(zone, e.request)
    return zone


TOPOLOGY_POLICY_ATTRIBUTE = "topologyManagerPolicy"
TOPOLOGY_SCOPE_ATTRIBUTE = "topologyManagerScope"
DEFAULT_SCOPE = Scope.CONTAINER.value  # the kubelet's default topologyManagerScope


def node_scope(nrt: Mapping[str, Any] | None) -> str:
    """The node's kubelet Topology Manager scope as its NRT reports it (`Node.topology_scope`): the
    `topologyManagerScope` attribute, else (older publishers) the scope the first entry of the
    deprecated `topologyPolicies` list names ("SingleNUMANodePodLevel": pod); "container", the
    kubelet's default, without an NRT or either.  A value that is not a scope is a bad object
    (BadObject: that node is left out)."""
    nrt = as_mapping(nrt)
    for attr in as_list(nrt.get("attributes")):
        attr = as_mapping(attr)
        if attr.get("name") == TOPOLOGY_SCOPE_ATTRIBUTE:
            value = attr.get("value")
            if not (isinstance(value, str) and value in TOPOLOGY_MANAGER_SCOPES):
                raise BadObject(f"{TOPOLOGY_SCOPE_ATTRIBUTE} {str(value)[:64]!r} is not one of "
                                f"{', '.join(TOPOLOGY_MANAGER_SCOPES)}")
            return value
    legacy = as_list(nrt.get("topologyPolicies"))
    return scope_of_legacy(legacy[0]) or DEFAULT_SCOPE if legacy else DEFAULT_SCOPE


def node_policy(nrt: Mapping[str, Any] | None) -> str:
    """The node's kubelet Topology Manager policy as its NRT reports it (`Node.topology_policy`, which
    pods that name no NUMA policy are placed for on that node): the `topologyManagerPolicy` attribute,
    else (older publishers) the first entry of the deprecated `topologyPolicies` list; "none" without an
    NRT, without either or with a value the engine does not know (a node's report only ever concerns
    itself)."""
    nrt = as_mapping(nrt)
    for attr in as_list(nrt.get("attributes")):
        attr = as_mapping(attr)
        if attr.get("name") == TOPOLOGY_POLICY_ATTRIBUTE:
            value = attr.get("value")
            if isinstance(value, str) and value in POD_SET_NUMA_POLICIES:
                return value
            return NumaPolicy.NONE.value
    legacy = as_list(nrt.get("topologyPolicies"))
    policy = policy_of_legacy(legacy[0]) if legacy else None
    return policy if policy in POD_SET_NUMA_POLICIES else NumaPolicy.NONE.value
