"""The node's NodeResourceTopology: a pure builder from (topology, state) and a write-on-change publisher.

Public API (stable; the in-cluster daemon builds on it):

- `nrt_object(node, topology, state, *, reserved=EMPTY, gpu_capacity=None,
  topology_manager_policy="none", topology_manager_scope="container", pods_fingerprint=None,
  pods_fingerprint_method=None, memory_held=None, pinning_route=None, kubelet_cpus=None,
  devices=None) -> dict`:
  the `topology.node.k8s.io/v1alpha2` object.
  `node` is a Node (a dict as the API returns it, or a kubernetes V1Node) or a `(name, uid)` pair;
  `gpu_capacity` is `agent.gpu.capacity.numa_gpu_capacity(...)`'s `{numa: {resource: (capacity,
  available)}}`.  Pure: no I/O, no clock.  Raises ConfigError on invalid input.
  The names it writes (group, version, kind, zone type, attributes, the legacy policy enum) and the
  pod fingerprint (`pods_fingerprint`) are the contract's: `agent.api.nrt`, `agent.api.fingerprint`.
- `NRTPublisher(api_client, node_name, field_manager="topolet")` (`api_client`: an ApiClient or an
  `agent.kubeapi.client.KubeClient`): `.publish(obj) -> bool` applies `obj` (server-side apply,
  forced, as `field_manager`) only when it differs from the last object applied, when a previous
  call failed, after `invalidate()`, or when the periodic existence check
  (`verify_seconds`, a read) finds the object deleted or our fields changed by someone else.
  True when it sent an apply; raises `agent.kubeapi.client.KubeAPIError` when the API call failed
  (the next call applies again).  `.writes` / `.failures` count applies sent and failed calls;
  `.invalidate()` forces the next apply; `.resource_version` is the server's last known one.
  Call `publish` on every pass with the freshly built object: it decides itself whether to write,
  and only a call can notice a deleted object (a caller-side "unchanged, skip" gate defeats that).
  `.yielded_to`: the manager it leaves the object to ("": none), see below.
- `canonical(obj) -> str`: the text compared for "changed" (sorted keys, no spaces).
- `foreign_manager(live) -> str`: who else publishes a live NRT ("": topolet, or no one).

One NRT per node, named after it, and another publisher may own it: NFD's topology updater
(`nfd-topology-updater`, or `nfd-master` in NFD before v0.14) and the resource topology exporter
write the same object.  topolet never fights one: before its first apply, and every `verify_seconds`
while it stands aside, the publisher reads the object, and where it exists without topolet's
`app.kubernetes.io/managed-by` label, or one of those managers owns its zones (`managedFields`),
it applies nothing and sets `.yielded_to`; it applies again once the object is gone.  Any other
edit of an object topolet made is put back, as above.

Shape (k8stopologyawareschedwg/noderesourcetopology-api, v1alpha2 types.go): cluster-scoped, named
after the node, owned by the Node (the garbage collector removes it with the node).  One zone per
published NUMA node, `name: node-<N>`, `type: Node` — the only form scheduler-plugins'
NodeResourceTopologyMatch reads (it skips other types and parses N from the name).  Each zone has
`costs` (the NUMA distance to every published zone, itself included) and `resources`, each with
`capacity`, `allocatable`, `available` as quantity strings:

- `cpu`: capacity = the zone's online CPUs; allocatable = capacity less reserved CPUs (`reserved`
  plus the state's); available = allocatable less CPUs held by exclusive allocations in the state.
  The shared pool is not subtracted: pods there hold no CPU exclusively.  Under the kubelet's
  static CPU manager (`kubelet_cpus`, a `KubeletCPUs`) the kubelet's word replaces the state's:
  allocatable = the CPUs it offers for exclusive use, available = those less the CPUs it gave
  containers (NFD's topology updater counts the same).
- `memory`: capacity = the NUMA node's memory; allocatable = capacity less the hugepage pools
  (memory the pools hold is not available as regular memory, kubelet's rule); available =
  allocatable less `memory_held` for the zone.
- `hugepages-<size>` (`hugepages-2Mi`, `hugepages-1Gi`): capacity = allocatable = the pool's pages
  times the page size; available = allocatable less `memory_held` for the zone.
- `memory_held` (`{numa id: {"memory" | "hugepages-<size>": bytes}}`) is what pods bound to the
  zone hold; the in-cluster agent counts the requests of containers whose memory it binds
  (`agent.kube.nrt_build.zone_memory_held` says how a binding to several zones is split).
- GPU resources (`nvidia.com/gpu`, `nvidia.com/mig-...`) from `gpu_capacity`: capacity =
  allocatable, available as given.  GPUs of unknown locality (key -1) are in no zone.
- Every other device plugin resource (`example.com/nic`, `rdma/hca`, ...) from `devices`, shaped
  like `gpu_capacity` (`agent.kube.nrt_build.zone_devices`): capacity = allocatable, available as
  given.  A name `gpu_capacity` also gives for a zone is published once, as `gpu_capacity` says.

Memory-only NUMA nodes (CXL, HBM, GPU memory) are zones of their own, `node-<N>`, with `memory`
(and hugepages) but no `cpu`.  NodeResourceTopologyMatch's single-NUMA filter sets a zone's bit for a
resource only when the zone lists it, so a zone without `cpu` is never chosen for a pod requesting
CPU — which is right: topolet binds `cpuset.mems` to the CPUs' own nodes, so that memory is not what
an aligned pod gets.  Folding it into the nearest CPU zone would overstate what fits on one node.
Zones with an id above 63 are left out: the plugin indexes NUMA ids in a 64-slot table.

Top-level `attributes`: `topologyManagerPolicy` and `topologyManagerScope` (kubelet's values
verbatim), `nodeTopologyPodsFingerprint` and, when given, `nodeTopologyPodsFingerprintMethod`
(podfingerprint's names: "all", "with-exclusive-resources", "exclude-terminal") and
`topolet.io/pinning-route` (how the agent pins: "nri" or "pod-cgroup", `agent.kube.route`).  The deprecated
`topologyPolicies` list is filled too (e.g. "SingleNUMANodeContainerLevel") for older consumers.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from agent.api.fingerprint import FINGERPRINT_PREFIX
from agent.api.nrt import (
    API_VERSION,
    ATTR_FINGERPRINT,
    ATTR_FINGERPRINT_METHOD,
    ATTR_PINNING_ROUTE,
    ATTR_POLICY,
    ATTR_SCOPE,
    FINGERPRINT_METHODS,
    GROUP,
    KIND,
    MAX_ZONE_ID,
    PLURAL,
    VERSION,
    ZONE_TYPE,
    legacy_policy,
    zone_name,
)
from agent.api.policies import TOPOLOGY_MANAGER_POLICIES, TOPOLOGY_MANAGER_SCOPES
from agent.api.resources import format_quantity, hugepages_resource_name
from agent.api.validate import is_dns_subdomain
from agent.enforce.state import State
from agent.errors import ConfigError, KubeAPIError
from agent.kubeapi.client import KubeClient, resource_path
from agent.topology.cpuset import EMPTY, CPUSet
from agent.topology.model import NumaNode, Topology

log = logging.getLogger(__name__)

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
# Field managers of other NRT publishers (the user agent client-go sends, up to its first "/").
OTHER_PUBLISHERS = ("nfd-topology-updater", "nfd-master", "resource-topology-exporter")


@dataclass(frozen=True, slots=True)
class KubeletCPUs:
    """The kubelet's static CPU manager's word: CPUs it offers for exclusive use, and those it gave."""

    offered: CPUSet
    pinned: CPUSet


def _resource(name: str, capacity: int, allocatable: int, available: int) -> dict[str, str]:
    allocatable = min(max(allocatable, 0), capacity)
    available = min(max(available, 0), allocatable)
    # A plain non-negative integer is a canonical quantity in every unit (cores, bytes, devices).
    return {"name": name, "capacity": format_quantity(max(0, int(capacity))),
            "allocatable": format_quantity(max(0, int(allocatable))),
            "available": format_quantity(max(0, int(available)))}


def _node_ref(node: object) -> tuple[str, str]:
    """(name, uid) of a Node given as a dict, a kubernetes V1Node, or a (name, uid) pair."""
    if isinstance(node, tuple) and len(node) == 2:
        name, uid = node
    elif isinstance(node, Mapping):
        meta = node.get("metadata") or {}
        name, uid = meta.get("name"), meta.get("uid")
    else:
        meta = getattr(node, "metadata", None)
        name, uid = getattr(meta, "name", None), getattr(meta, "uid", None)
    if not isinstance(name, str) or not is_dns_subdomain(name):
        raise ConfigError(f"invalid node name {name!r}")
    if not isinstance(uid, str) or not uid:
        raise ConfigError(f"node {name} has no uid (an owner reference needs it)")
    return name, uid


def _zone_resources(numa: NumaNode, *, reserved: CPUSet, allocated: CPUSet,
                    gpus: Mapping[str, tuple[int, int]], held: Mapping[str, int]) -> list[dict[str, str]]:
    out: list[dict[str, str]] = []
    if not numa.memory_only and numa.cpus:
        free = numa.cpus - reserved
        out.append(_resource("cpu", len(numa.cpus), len(free), len(free - allocated)))
    pools = sorted(numa.hugepages, key=lambda h: h.size_bytes)
    pooled = sum(h.size_bytes * h.total for h in pools)
    if numa.memory_bytes > 0:
        regular = numa.memory_bytes - pooled
        out.append(_resource("memory", numa.memory_bytes, regular, regular - held.get("memory", 0)))
    for pool in pools:
        if pool.size_bytes > 0 and pool.total > 0:
            size = pool.size_bytes * pool.total
            name = hugepages_resource_name(pool.size_bytes)
            out.append(_resource(name, size, size, size - held.get(name, 0)))
    for name in sorted(gpus):
        capacity, available = gpus[name]
        if capacity > 0:
            out.append(_resource(name, capacity, capacity, available))
    return out


def _with_devices(gpus: Mapping[int, Mapping[str, tuple[int, int]]],
                  devices: Mapping[int, Mapping[str, tuple[int, int]]]
                  ) -> Mapping[int, Mapping[str, tuple[int, int]]]:
    """GPU and device plugin figures per zone in one map (a GPU figure wins over a device one)."""
    if not devices:
        return gpus
    out: dict[int, dict[str, tuple[int, int]]] = {n: dict(v) for n, v in devices.items()}
    for numa_id, per_zone in gpus.items():
        out.setdefault(numa_id, {}).update(per_zone)
    return out


def nrt_object(
    node: object,
    topology: Topology,
    state: State,
    *,
    reserved: CPUSet = EMPTY,
    gpu_capacity: Mapping[int, Mapping[str, tuple[int, int]]] | None = None,
    topology_manager_policy: str = "none",
    topology_manager_scope: str = "container",
    pods_fingerprint: str | None = None,
    pods_fingerprint_method: str | None = None,
    memory_held: Mapping[int, Mapping[str, int]] | None = None,
    pinning_route: str | None = None,
    kubelet_cpus: KubeletCPUs | None = None,
    devices: Mapping[int, Mapping[str, tuple[int, int]]] | None = None,
) -> dict[str, Any]:
    """The NodeResourceTopology object for this node, its `available` taken from `state`."""
    name, uid = _node_ref(node)
    if topology_manager_policy not in TOPOLOGY_MANAGER_POLICIES:
        raise ConfigError(f"unknown topology manager policy {topology_manager_policy!r} "
                          f"(kubelet's are {', '.join(TOPOLOGY_MANAGER_POLICIES)})")
    if topology_manager_scope not in TOPOLOGY_MANAGER_SCOPES:
        raise ConfigError(f"unknown topology manager scope {topology_manager_scope!r} "
                          f"(kubelet's are {', '.join(TOPOLOGY_MANAGER_SCOPES)})")
    if pods_fingerprint is not None and not pods_fingerprint.startswith(FINGERPRINT_PREFIX[:4]):
        raise ConfigError(f"not a pod fingerprint: {pods_fingerprint!r}")
    if pods_fingerprint_method is not None and pods_fingerprint_method not in FINGERPRINT_METHODS:
        raise ConfigError(f"unknown pod fingerprint method {pods_fingerprint_method!r}")
    gpus = _with_devices(gpu_capacity or {}, devices or {})
    for numa_id, per_zone in gpus.items():
        for res, (capacity, available) in per_zone.items():
            if not 0 <= available <= capacity:
                raise ConfigError(f"NUMA {numa_id} {res}: available {available} outside 0..{capacity}")

    bound = memory_held or {}
    for numa_id, amounts in bound.items():
        for res, amount in amounts.items():
            if amount < 0:
                raise ConfigError(f"NUMA {numa_id} {res}: negative amount held {amount}")
    if kubelet_cpus is not None:  # the kubelet pins CPUs here: its sets, not the state's
        held = topology.cpus - kubelet_cpus.offered
        allocated = kubelet_cpus.pinned
    else:
        held = reserved | state.reserved
        allocated = state.allocated()
    published = [n for n in topology.numa_nodes
                 if 0 <= n.id <= MAX_ZONE_ID and (n.cpus or n.memory_bytes > 0)]
    zones: list[dict[str, Any]] = []
    for numa in published:
        zone: dict[str, Any] = {"name": zone_name(numa.id), "type": ZONE_TYPE}
        costs = []
        for other in published:
            distance = topology.distance(numa.id, other.id)
            if distance > 0:
                costs.append({"name": zone_name(other.id), "value": distance})
        if costs:
            zone["costs"] = costs
        resources = _zone_resources(numa, reserved=held, allocated=allocated,
                                    gpus=gpus.get(numa.id, {}), held=bound.get(numa.id, {}))
        if resources:
            zone["resources"] = resources
        zones.append(zone)

    attributes = [
        {"name": ATTR_POLICY, "value": topology_manager_policy},
        {"name": ATTR_SCOPE, "value": topology_manager_scope},
    ]
    if pods_fingerprint is not None:
        attributes.append({"name": ATTR_FINGERPRINT, "value": pods_fingerprint})
    if pods_fingerprint_method is not None:
        attributes.append({"name": ATTR_FINGERPRINT_METHOD, "value": pods_fingerprint_method})
    if pinning_route is not None:
        attributes.append({"name": ATTR_PINNING_ROUTE, "value": pinning_route})
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {
            "name": name,
            "labels": {MANAGED_BY_LABEL: "topolet"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": name, "uid": uid}],
        },
        "topologyPolicies": [legacy_policy(topology_manager_policy, topology_manager_scope)],
        "zones": zones,
        "attributes": attributes,
    }


def canonical(obj: Mapping[str, Any]) -> str:
    """A canonical text of an object (sorted keys) for change detection."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def _ours_intact(ours: Mapping[str, Any], live: Mapping[str, Any]) -> bool:
    """Whether the live object still holds every field we apply, with our values."""
    for key, value in ours.items():
        if key == "metadata":
            continue
        if live.get(key) != value:
            return False
    meta, live_meta = ours.get("metadata") or {}, live.get("metadata") or {}
    live_labels = live_meta.get("labels") or {}
    if any(live_labels.get(k) != v for k, v in (meta.get("labels") or {}).items()):
        return False
    live_refs = live_meta.get("ownerReferences") or []
    return all(any(all(r.get(k) == v for k, v in ref.items()) for r in live_refs)
               for ref in meta.get("ownerReferences") or [])


def foreign_manager(live: Mapping[str, Any], ours: str = "topolet") -> str:
    """Who else publishes the live NRT `live`: a known publisher that owns its zones, else the first
    manager of an object without our managed-by label ("" for ours, or no one)."""
    meta = live.get("metadata") or {}
    entries = [m for m in meta.get("managedFields") or [] if isinstance(m, Mapping)]
    for m in entries:
        name = str(m.get("manager") or "")
        if name in OTHER_PUBLISHERS and "f:zones" in (m.get("fieldsV1") or {}):
            return name
    if (meta.get("labels") or {}).get(MANAGED_BY_LABEL) == ours:
        return ""
    others = [str(m.get("manager") or "") for m in entries if m.get("manager") != ours]
    return next((n for n in others if n), "another manager")


class NRTPublisher:
    """Applies this node's NodeResourceTopology when it changed; never writes on a timer alone."""

    def __init__(self, api_client: Any, node_name: str, field_manager: str = "topolet", *,
                 verify_seconds: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        if not is_dns_subdomain(node_name):
            raise ConfigError(f"invalid node name {node_name!r}")
        if not field_manager or len(field_manager) > 128:
            raise ConfigError(f"invalid field manager {field_manager!r}")
        self.kube = KubeClient.of(api_client)  # an ApiClient or a KubeClient
        self.node_name = node_name
        self.field_manager = field_manager
        self.verify_seconds = verify_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._last: str | None = None  # canonical form of the last object the server accepted
        self._resource_version: str | None = None
        self._verified_at = -math.inf
        self.writes = 0  # applies sent and accepted
        self.failures = 0  # calls that failed (API down, refused)
        self.yielded_to = ""  # the other publisher left the object to ("": none)
        self._looked = False  # whether the object was read before our first apply

    def invalidate(self) -> None:
        """Apply on the next `publish` whatever it is given (e.g. after a watch saw the object deleted)."""
        with self._lock:
            self._last = None

    @property
    def resource_version(self) -> str | None:
        """The resourceVersion the server returned for our last apply or check."""
        return self._resource_version

    def publish(self, obj: Mapping[str, Any]) -> bool:
        """Apply `obj` when it differs from what we last applied (or it is gone); True when applied."""
        meta = obj.get("metadata") or {}
        if obj.get("apiVersion") != API_VERSION or obj.get("kind") != KIND:
            raise ConfigError(f"not a {API_VERSION} {KIND}")
        if meta.get("name") != self.node_name:
            raise ConfigError(f"NodeResourceTopology {meta.get('name')!r} is not this node's "
                              f"({self.node_name})")
        text = canonical(obj)
        with self._lock:
            if self._last is None:
                # Before our first apply, and every verify_seconds while standing aside: whose is it?
                if not self._looked or (self.yielded_to and
                                        self._clock() - self._verified_at >= self.verify_seconds):
                    self._look()
                if self.yielded_to:
                    return False
            elif self._gone_or_changed(obj):  # a read every verify_seconds, changed or not
                if self.yielded_to:
                    self._last = None  # looked at again every verify_seconds
                    return False
            elif text == self._last:
                return False
            try:
                self._apply(json.loads(text))
            except KubeAPIError:
                self._last = None
                self.failures += 1
                raise
            self._last = text
            self._verified_at = self._clock()
            self.writes += 1
            return True

    def _look(self) -> None:
        """Read the object: set `yielded_to` to its other publisher ("" when absent or ours)."""
        try:
            live = self.kube.get(self._path(), what=f"get NodeResourceTopology {self.node_name}")
        except KubeAPIError as exc:
            if not exc.not_found:
                self.failures += 1
                raise
            live = {}
        self._looked = True
        self._verified_at = self._clock()
        self._set_owner(foreign_manager(live, self.field_manager) if live else "")

    def _set_owner(self, manager: str) -> None:
        if manager and not self.yielded_to:
            log.warning("NodeResourceTopology %s is published by %s: topolet leaves it alone",
                        self.node_name, manager)
        elif self.yielded_to and not manager:
            log.info("NodeResourceTopology %s is no longer %s's: topolet publishes it", self.node_name,
                     self.yielded_to)
        self.yielded_to = manager

    def _gone_or_changed(self, obj: Mapping[str, Any]) -> bool:
        """Every `verify_seconds`, read the object back: True when it was deleted or our fields changed."""
        now = self._clock()
        if now - self._verified_at < self.verify_seconds:
            return False
        try:
            live = self.kube.get(self._path(), what=f"get NodeResourceTopology {self.node_name}")
        except KubeAPIError as exc:
            if exc.not_found:
                log.info("NodeResourceTopology %s is gone; applying it again", self.node_name)
                return True
            self.failures += 1
            raise
        self._verified_at = now
        self._resource_version = (live.get("metadata") or {}).get("resourceVersion")
        self._set_owner(foreign_manager(live, self.field_manager))
        if self.yielded_to:
            return True  # publish() stands aside
        if _ours_intact(obj, live):
            return False
        log.info("NodeResourceTopology %s was changed by someone else; applying it again", self.node_name)
        return True

    def _path(self) -> str:
        # Module globals read per call: tests point PLURAL at a resource the server does not serve.
        return resource_path(GROUP, VERSION, PLURAL, self.node_name)

    def _apply(self, body: dict[str, Any]) -> None:
        out = self.kube.apply(self._path(), body, self.field_manager, force=True,
                              what=f"apply NodeResourceTopology {self.node_name}")
        self._resource_version = (out.get("metadata") or {}).get("resourceVersion")
