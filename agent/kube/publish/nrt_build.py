"""What this node's NodeResourceTopology says: CPUs, memory, GPUs and other devices less what pods hold.

`build_nrt` assembles `nrt.nrt_object` from a `Snapshot` of the enforcer's view; GPUs per zone come
from `agent.gpu.capacity.zone_gpus`, other device plugin resources from `zone_devices` (a device in
its lowest published NUMA node), and `zone_memory_held` charges memory only to zones a container is
bound to, in proportion to its CPUs there.  The counting rules: README.md, "What is counted where".
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agent.api.policies import Scope
from agent.enforce.state import State
from agent.topology.cpuset import EMPTY as EMPTY_CPUS
from agent.topology.cpuset import CPUSet
from agent.topology.model import Topology

if TYPE_CHECKING:
    from agent.gpu.capacity import MigInventory
    from agent.gpu.model import GPU
    from agent.kube.kubelet.podresources.client import Device
    from agent.kube.publish.nrt import KubeletCPUs

MemoryRequests = Mapping[str, tuple[tuple[str, int], ...]]  # allocation id → ((resource, bytes), ...)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What the publisher describes, taken on the enforcer thread and handed over whole."""

    topology: Topology
    state: State
    pinned: tuple[tuple[str, str], ...] = ()  # (namespace, name) of pods with exclusive CPUs
    assigned_gpus: frozenset[str] = frozenset()  # whole GPUs the kubelet handed out (PCI addresses)
    memory: MemoryRequests = field(default_factory=dict)  # memory requests of pinned containers
    mig: MigInventory | None = None  # MIG mode and instances per GPU index, when NVML was read
    route: str | None = None  # how pods are pinned ("nri", "pod-cgroup"), once chosen
    kubelet_cpus: KubeletCPUs | None = None  # the kubelet's static CPU manager's CPUs, where it runs
    offered_devices: tuple[Device, ...] = ()  # device plugin devices the kubelet can hand out (not GPUs)
    held_devices: tuple[Device, ...] = ()  # those of them containers hold
    # The agent's --reserved-cpus: kept from exclusive use even before the state file records them
    # (a fresh node's first NRT is published before the engine's first commit).
    reserved: CPUSet = EMPTY_CPUS


def zone_memory_held(topology: Topology, state: State, requests: MemoryRequests) -> dict[int, dict[str, int]]:
    """{numa id: {"memory" | "hugepages-<size>": bytes}} held by memory-bound allocations (the rule
    in this module's docstring); allocations without `mems` or without requests hold nothing."""
    cpus_of = {n.id: n.cpus for n in topology.numa_nodes}
    out: dict[int, dict[str, int]] = {}
    for a in state.allocations:
        asked = requests.get(a.id)
        if not a.mems or not asked:
            continue
        zones = sorted(a.mems)
        weights = {z: len(a.cpus & cpus_of[z]) if z in cpus_of else 0 for z in zones}
        if not any(weights.values()):
            weights = dict.fromkeys(zones, 1)
        total = sum(weights.values())
        first = max(zones, key=lambda z: (weights[z], -z))
        for resource, amount in asked:
            shares = {z: amount * weights[z] // total for z in zones}
            shares[first] += amount - sum(shares.values())
            for z, share in shares.items():
                if share:
                    zone = out.setdefault(z, {})
                    zone[resource] = zone.get(resource, 0) + share
    return out


def build_nrt(node_ref: tuple[str, str], topology: Topology, state: State,
              pinned: tuple[tuple[str, str], ...], gpus: Sequence[GPU] = (),
              assigned_gpus: Collection[str] = (), *, memory: MemoryRequests | None = None,
              mig: MigInventory | None = None, route: str | None = None,
              kubelet_cpus: KubeletCPUs | None = None, offered_devices: Iterable[Device] = (),
              held_devices: Iterable[Device] = (), reserved: CPUSet = EMPTY_CPUS,
              scope: str = Scope.CONTAINER.value) -> dict[str, Any]:
    """The node's NRT: CPUs and GPUs less what `state` holds, GPUs less those the kubelet assigned
    (`assigned_gpus`: PCI addresses or UUIDs), memory and hugepages less what memory-bound
    containers request (`memory`, by allocation id), and the fingerprint of the pinned pods.

    With `mig` (NVML's word), a GPU in MIG mode offers its instances by profile
    (`nvidia.com/mig-<profile>`) in the zone of the GPU, available unless in use; without it no
    MIG resource is published (instances unknown).  `route` becomes the `topolet.io/pinning-route`
    attribute; `kubelet_cpus` (the kubelet's static CPU manager) replaces the state's CPUs;
    `offered_devices` less `held_devices` are the device plugin resources per zone (`zone_devices`);
    `scope` (`topolet agent --numa-scope`) becomes the `topologyManagerScope` attribute; `reserved`
    CPUs are never available, whether or not `state` records them yet."""
    from agent.api.fingerprint import pod_set_fingerprint
    from agent.kube.publish.nrt import nrt_object

    gpu_capacity: Mapping[int, Mapping[str, tuple[int, int]]] | None = None
    if gpus:
        from agent.gpu.capacity import zone_gpus

        gpu_capacity = zone_gpus(gpus, state.held_gpus() | frozenset(assigned_gpus), mig)
    obj: dict[str, Any] = nrt_object(
        node_ref, topology, state, gpu_capacity=gpu_capacity,
        pods_fingerprint=pod_set_fingerprint(pinned),
        pods_fingerprint_method="with-exclusive-resources",
        memory_held=zone_memory_held(topology, state, memory or {}), pinning_route=route,
        kubelet_cpus=kubelet_cpus, topology_manager_scope=scope, reserved=reserved,
        devices=zone_devices(offered_devices, held_devices, {n.id for n in topology.numa_nodes}))
    return obj


def zone_devices(offered: Iterable[Device], held: Iterable[Device],
                 zones: Collection[int]) -> dict[int, dict[str, tuple[int, int]]]:
    """{numa id: {resource: (capacity, available)}} of the devices `offered` (the kubelet's
    allocatable devices) less those `held` by containers, each device id in the lowest of its NUMA
    nodes among `zones` (the rule in this module's docstring); devices in none of them are left out."""
    taken = {(d.resource, i) for d in held for i in d.ids}
    seen: set[tuple[str, str]] = set()
    out: dict[int, dict[str, tuple[int, int]]] = {}
    for d in offered:
        nodes = [n for n in d.numa_nodes if n in zones]
        if not nodes:
            continue
        zone = out.setdefault(min(nodes), {})
        for device_id in d.ids:
            if (d.resource, device_id) in seen:
                continue
            seen.add((d.resource, device_id))
            capacity, available = zone.get(d.resource, (0, 0))
            zone[d.resource] = (capacity + 1, available + ((d.resource, device_id) not in taken))
    return out
