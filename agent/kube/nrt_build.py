"""What this node's NodeResourceTopology says: CPUs and GPUs less what the state and the kubelet hold.

`build_nrt` assembles the object `agent.kube.nrt.nrt_object` shapes; `kubelet_gpus` turns the
kubelet's device ids (pod-resources) into the whole GPUs they name.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from agent.enforce.state import State
from agent.topology.model import Topology

if TYPE_CHECKING:
    from agent.gpu.model import GPU

# What the publisher describes: topology, allocation state, (namespace, name) of pinned pods, and
# the GPUs (PCI addresses) the kubelet handed to containers.
Snapshot = tuple[Topology, State, tuple[tuple[str, str], ...], frozenset[str]]


def build_nrt(node_ref: tuple[str, str], topology: Topology, state: State,
              pinned: tuple[tuple[str, str], ...], gpus: Sequence[GPU] = (),
              assigned_gpus: Collection[str] = ()) -> dict[str, Any]:
    """The node's NRT: CPUs and GPUs less what `state` holds and GPUs less those the kubelet
    assigned (`assigned_gpus`: PCI addresses or UUIDs), and the fingerprint of the pinned pods."""
    from agent.kube.nrt import nrt_object, pod_set_fingerprint

    gpu_capacity = None
    if gpus:
        from agent.gpu.capacity import numa_gpu_capacity

        gpu_capacity = numa_gpu_capacity(gpus, None, state.held_gpus() | frozenset(assigned_gpus))
    obj: dict[str, Any] = nrt_object(
        node_ref, topology, state, gpu_capacity=gpu_capacity,
        pods_fingerprint=pod_set_fingerprint(pinned),
        pods_fingerprint_method="with-exclusive-resources")
    return obj


def is_mig_device_id(device_id: str) -> bool:
    """Whether a device plugin id names a MIG device ("MIG-…", or "<gpu>:<mig>" by index)."""
    ref = device_id.strip().split("::", 1)[0]
    return ref.startswith("MIG-") or ":" in ref


def kubelet_gpus(device_ids: Iterable[str], gpus: Sequence[GPU]) -> frozenset[str]:
    """PCI addresses of the whole GPUs that device plugin ids name (MIG devices and ids of GPUs not
    in `gpus` left out)."""
    from agent.kube.podresources.locality import gpu_of

    out: set[str] = set()
    for device_id in device_ids:
        if is_mig_device_id(device_id):
            continue
        g = gpu_of(device_id, gpus)
        if g is not None:
            out.add(g.pci_address)
    return frozenset(out)

