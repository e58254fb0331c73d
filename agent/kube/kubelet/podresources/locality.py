"""Where a container's devices sit: the NUMA nodes its CPUs should come from, for GPUs and other devices.

`gpu_numa_nodes` is pure: the node the device plugin reported, else for GPUs the inventory's by UUID
or index.  `GPULocator` asks the kubelet, and for a container asking for devices that holds none yet
asks again for up to `ADMISSION_WAIT_SECONDS` (the kubelet assigns them at admission).
`kubelet_gpus` names the whole GPUs device ids refer to (README.md, "Locality").
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Iterable, Sequence

from agent.api.objects import decimal
from agent.api.resources import GPU_RESOURCE, MIG_RESOURCE_PREFIX
from agent.gpu.model import GPU
from agent.kube.kubelet.podresources.client import Device, PodResourcesClient
from agent.topology.model import Topology

log = logging.getLogger(__name__)
_MAX_INDEX = 99_999  # an NVML index in a device id: five digits at most

ADMISSION_WAIT_SECONDS = 2.0  # how long a pod the kubelet has not admitted yet is asked about again
ADMISSION_POLL_SECONDS = 0.05


def is_gpu_resource(name: str) -> bool:
    """Whether an extended resource name is NVIDIA GPUs (whole, or MIG slices of them)."""
    return name == GPU_RESOURCE or name.startswith(MIG_RESOURCE_PREFIX)


def gpu_of(device_id: str, gpus: Sequence[GPU]) -> GPU | None:
    """The inventory GPU a device plugin id names, or None.

    Understood: a GPU UUID ("GPU-…"), an NVML index ("0"), either with a time-slicing replica suffix
    ("GPU-…::3"), an index-strategy MIG id ("<gpu index>:<mig index>") and an old-style MIG id
    ("MIG-GPU-<uuid>/<gi>/<ci>").  Newer MIG UUIDs ("MIG-<uuid>") do not name their GPU.
    """
    ref = device_id.strip().split("::", 1)[0]
    if ref.startswith("MIG-GPU-"):
        ref = ref[len("MIG-"):].split("/", 1)[0]
    elif ":" in ref and decimal(ref.split(":", 1)[0], _MAX_INDEX) is not None:
        ref = ref.split(":", 1)[0]
    index = decimal(ref, _MAX_INDEX)
    if index is not None:
        return next((g for g in gpus if g.index == index), None)
    if ref.startswith("GPU-"):
        want = ref.lower()
        return next((g for g in gpus if g.uuid and g.uuid.lower() == want), None)
    return None


def gpu_numa_nodes(devices: Iterable[Device], gpus: Sequence[GPU],
                   cpu_nodes: Collection[int]) -> frozenset[int] | None:
    """NUMA nodes (among `cpu_nodes`, those with CPUs) of the devices in `devices` (GPUs and every
    other device plugin resource); None when none is known.

    A device's reported NUMA nodes win; for a GPU without them each id is looked up in `gpus`.
    Nodes outside `cpu_nodes` are dropped: CPUs cannot come from there, and a strict NUMA policy
    must not be refused over a node number this machine does not have.
    """
    nodes: set[int] = set()
    for d in devices:
        if d.numa_nodes:
            nodes |= d.numa_nodes
            continue
        if not is_gpu_resource(d.resource):
            continue
        for device_id in d.ids:
            g = gpu_of(device_id, gpus)
            if g is not None and g.numa_node >= 0:
                nodes.add(g.numa_node)
    found = frozenset(n for n in nodes if n in cpu_nodes)
    return found or None


def needs_inventory(devices: Iterable[Device]) -> bool:
    """Whether some GPU device came without a NUMA node, so the inventory has to place it."""
    return any(is_gpu_resource(d.resource) and not d.numa_nodes for d in devices)


class GPULocator:
    """The NUMA nodes of a container's devices, from the kubelet's pod-resources socket and our GPU
    inventory."""

    def __init__(self, client: PodResourcesClient, inventory: Callable[[], Sequence[GPU]], *,
                 wait: float = ADMISSION_WAIT_SECONDS, sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.client = client
        self._inventory = inventory
        self._gpus: tuple[GPU, ...] | None = None
        self.wait = wait
        self._sleep = sleep
        self._clock = clock

    def gpus(self) -> tuple[GPU, ...]:
        """The node's GPUs, read once (an empty inventory when reading fails)."""
        if self._gpus is None:
            try:
                self._gpus = tuple(self._inventory())
            except Exception as exc:  # noqa: BLE001 - without an inventory, reported nodes still serve
                log.warning("GPU inventory unavailable for device locality: %s", exc)
                self._gpus = ()
        return self._gpus

    def numa_nodes(self, namespace: str, pod: str, container: str, topology: Topology, *,
                   admitting: bool = True) -> frozenset[int] | None:
        """The NUMA nodes the container's CPUs should prefer; None when it holds no device we can place.
        `admitting`: it asks for a resource a device plugin serves, so it may be asked about again
        while the kubelet has not admitted its pod (False: one question, as for a resource no plugin
        serves, which no admission would ever show)."""
        by_container = self.client.get(namespace, pod)
        deadline = self._clock() + (self.wait if admitting else 0.0)
        # Not admitted yet (unknown, or known without the devices it asks for): ask again.
        while by_container is not None and not by_container.get(container) and self._clock() < deadline:
            self._sleep(ADMISSION_POLL_SECONDS)
            by_container = self.client.get(namespace, pod)
        if not by_container:
            return None
        devices = by_container.get(container, ())
        if not devices:
            return None
        gpus = self.gpus() if needs_inventory(devices) else ()
        cpu_nodes = {n.id for n in topology.numa_nodes if n.cpus}
        return gpu_numa_nodes(devices, gpus, cpu_nodes)


def is_mig_device_id(device_id: str) -> bool:
    """Whether a device plugin id names a MIG device ("MIG-…", or "<gpu>:<mig>" by index)."""
    ref = device_id.strip().split("::", 1)[0]
    return ref.startswith("MIG-") or ":" in ref


def kubelet_gpus(device_ids: Iterable[str], gpus: Sequence[GPU]) -> frozenset[str]:
    """PCI addresses of the whole GPUs that device plugin ids name (MIG devices and ids of GPUs not
    in `gpus` left out)."""
    out: set[str] = set()
    for device_id in device_ids:
        if is_mig_device_id(device_id):
            continue
        g = gpu_of(device_id, gpus)
        if g is not None:
            out.add(g.pci_address)
    return frozenset(out)

