"""Per-NUMA-zone GPU capacity: whole GPUs and MIG devices, each as (capacity, available)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from agent.api.resources import GPU_RESOURCE, mig_resource_name
from agent.gpu.mig_live import read_live
from agent.gpu.model import GPU
from agent.gpu.planner import ExistingInstance
from agent.gpu.profiles import GPUModel, resolve_model

# GPU index → (in MIG mode now, its GPU instances); what NVML says at one moment.
MigInventory = Mapping[int, tuple[bool, tuple[ExistingInstance, ...]]]


def _mig_resource(model: GPUModel | None, profile: str) -> str:
    if model is not None and model.has_profile(profile):
        return model.profile(profile).resource_name
    return mig_resource_name(profile)


def held(gpu: GPU, gpus_in_use: Collection[int | str]) -> bool:
    """Whether `gpus_in_use` names this GPU: by index, PCI address or UUID (the state file records
    addresses; device plugins speak UUIDs)."""
    return gpu.index in gpus_in_use or gpu.pci_address in gpus_in_use or (
        bool(gpu.uuid) and gpu.uuid in gpus_in_use)


def numa_gpu_capacity(gpus: Sequence[GPU],
                      mig_instances: Mapping[int, Sequence[ExistingInstance]] | None = None,
                      gpus_in_use: Collection[int | str] = ()) -> dict[int, dict[str, tuple[int, int]]]:
    """{numa id: {resource: (capacity, available)}}; GPUs of unknown locality go under -1.

    A GPU in MIG mode offers its instances (available when not `in_use`), never itself; any other
    GPU offers one `nvidia.com/gpu`, available unless `gpus_in_use` names it (see `held`).  Fed from
    the node's inventory and its state: `numa_gpu_capacity(inventory.gpus, None, state.held_gpus())`.
    """
    mig_instances = mig_instances or {}
    out: dict[int, dict[str, tuple[int, int]]] = {}
    for g in sorted(gpus, key=lambda g: g.index):
        zone = out.setdefault(g.numa_node if g.numa_node >= 0 else -1, {})
        if g.mig_mode_current:
            model = resolve_model(g.name)
            for inst in mig_instances.get(g.index, ()):
                res = _mig_resource(model, inst.profile)
                cap, avail = zone.get(res, (0, 0))
                zone[res] = (cap + 1, avail + (0 if inst.in_use else 1))
        else:
            cap, avail = zone.get(GPU_RESOURCE, (0, 0))
            zone[GPU_RESOURCE] = (cap + 1, avail + (0 if held(g, gpus_in_use) else 1))
    return out


def read_mig_inventory(nvml: Any, in_use: Mapping[int, Collection[int]]) -> dict[
        int, tuple[bool, tuple[ExistingInstance, ...]]]:
    """Every MIG-capable GPU's mode and GPU instances through `nvml`, read the way the applier reads
    them (`agent.gpu.mig_live.read_live`); an instance is `in_use` when a process runs on it or
    `in_use` ({GPU index: {GPU-instance id}}, the MIG devices the kubelet handed out) names it.
    Raises what NVML raises."""
    return {g.index: (g.mig_current, tuple(sorted((inst for _, inst in g.gis.values()),
                                                  key=lambda i: (i.start, i.profile))))
            for g in read_live(nvml, in_use)}


def zone_gpus(gpus: Sequence[GPU], held: Collection[str] = (),
              mig: MigInventory | None = None) -> dict[int, dict[str, tuple[int, int]]]:
    """{numa id (-1: unknown): {resource: (capacity, available)}} of `gpus`: whole GPUs less those
    `held` names (PCI addresses or UUIDs: what allocations hold, with what the kubelet assigned), and
    with `mig` the MIG instances by profile — what the NRT publishes and `topolet_gpus` /
    `topolet_mig_devices` export."""
    instances = {index: found for index, (_, found) in mig.items()} if mig is not None else None
    return numa_gpu_capacity(with_mig_modes(gpus, mig or {}), instances, held)


def with_mig_modes(gpus: Sequence[GPU], inventory: MigInventory) -> tuple[GPU, ...]:
    """`gpus` with the MIG mode `inventory` read (the startup inventory's may be stale)."""
    from dataclasses import replace

    return tuple(replace(g, mig_mode_current=inventory[g.index][0]) if g.index in inventory else g
                 for g in gpus)
