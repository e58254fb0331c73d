"""The environment that names a workload's GPUs to CUDA and to NVIDIA's container toolkit.

Both `CUDA_VISIBLE_DEVICES` and `NVIDIA_VISIBLE_DEVICES` take a comma-separated list of GPU UUIDs
or indices.  UUIDs are used when every chosen GPU has one (NVML, or the driver's proc file): they
mean the same GPU whatever the enumeration order.  Otherwise indices are used, counted in PCI bus
order as our inventory counts them, and `CUDA_DEVICE_ORDER=PCI_BUS_ID` makes CUDA count the same way
(its default order, fastest first, would make index 0 a different GPU on a mixed machine).
"""

from __future__ import annotations

from collections.abc import Sequence

from agent.gpu.model import GPU


def visible_devices_env(gpus: Sequence[GPU]) -> dict[str, str]:
    """`CUDA_VISIBLE_DEVICES`, `NVIDIA_VISIBLE_DEVICES` (and, with indices, `CUDA_DEVICE_ORDER`) for `gpus`.

    No GPUs: an empty dict, leaving the caller's environment as it is.
    """
    if not gpus:
        return {}
    ordered = sorted(gpus, key=lambda g: g.pci_address)
    if all(g.uuid for g in ordered):
        names = ",".join(g.uuid for g in ordered)
        return {"CUDA_VISIBLE_DEVICES": names, "NVIDIA_VISIBLE_DEVICES": names}
    names = ",".join(str(g.index) for g in ordered)
    return {"CUDA_VISIBLE_DEVICES": names, "NVIDIA_VISIBLE_DEVICES": names, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
