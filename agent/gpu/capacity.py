"""Per-NUMA-zone GPU capacity: whole GPUs and MIG devices, each as (capacity, available)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from agent.gpu.model import GPU
from agent.gpu.planner import ExistingInstance
from agent.gpu.profiles import GPUModel, resolve_model

WHOLE_GPU = "nvidia.com/gpu"


def _mig_resource(model: GPUModel | None, profile: str) -> str:
    if model is not None and model.has_profile(profile):
        return model.profile(profile).resource_name
    return f"nvidia.com/mig-{profile.replace('+', '.')}"


def numa_gpu_capacity(gpus: Sequence[GPU], mig_instances: Mapping[int, Sequence[ExistingInstance]],
                      gpus_in_use: Collection[int] = ()) -> dict[int, dict[str, tuple[int, int]]]:
    """{numa id: {resource: (capacity, available)}}; GPUs of unknown locality go under -1.

    A GPU in MIG mode offers its instances (available when not `in_use`), never itself; any other
    GPU offers one `nvidia.com/gpu`, available unless its index is in `gpus_in_use`.
    """
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
            cap, avail = zone.get(WHOLE_GPU, (0, 0))
            zone[WHOLE_GPU] = (cap + 1, avail + (0 if g.index in gpus_in_use else 1))
    return out
