"""The node's NodeResourceTopology object, built pure from (topology, state): `nrt_object`.

`nrt_object(node, topology, state, ...)` returns the `topology.node.k8s.io/v1alpha2` object: one
`node-<N>` zone per published NUMA node with `costs` and `cpu`, `memory`, hugepages, GPU and other
device resources, and the Topology Manager attributes.  No I/O, no clock; ConfigError on bad input.
The names it writes are the contract's (`agent.api.nrt`, `agent.api.fingerprint`); how each figure
is counted is in this room's README.md.  `nrt_build` feeds it from the enforcer's view;
`nrt_publisher.NRTPublisher` writes it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
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
    KIND,
    MAX_ZONE_ID,
    ZONE_TYPE,
    legacy_policy,
    zone_name,
)
from agent.api.policies import TOPOLOGY_MANAGER_POLICIES, TOPOLOGY_MANAGER_SCOPES
from agent.api.resources import format_quantity, hugepages_resource_name
from agent.api.validate import is_dns_subdomain
from agent.enforce.state import State
from agent.errors import ConfigError
from agent.topology.cpuset import EMPTY, CPUSet
from agent.topology.model import NumaNode, Topology

log = logging.getLogger(__name__)
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"


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
    """The NodeResourceTopology object for this node, its `available` taken from `state`.

    `node` is a Node (a dict as the API returns it, or a kubernetes V1Node) or a `(name, uid)` pair;
    `gpu_capacity` and `devices` are `{numa id: {resource: (capacity, available)}}`
    (`agent.gpu.capacity.numa_gpu_capacity`, `nrt_build.zone_devices`); `memory_held` is
    `{numa id: {"memory" | "hugepages-<size>": bytes}}`.  Raises ConfigError on invalid input.
    """
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
