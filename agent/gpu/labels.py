"""GPU node labels: `topolet.io/gpu.*` always, GPU Feature Discovery's `nvidia.com/*` only on request.

Label values cannot hold ',' or '+', so lists are joined with '_' ("0_1" for NUMA nodes 0 and 1) and
"+me" is spelled ".me".  GFD label names follow its README ("Generated Labels"); values are ours.

The "gpu" feature source registered here derives GPUs from the topology's PCI scan alone (no NVML,
no file reads: labels may be built from a dump); the label builder publishes `nvidia.com/*` only
with GFD compatibility switched on.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator, Sequence

from agent.gpu.discover import gpus_from_topology
from agent.gpu.model import GPU, label_safe
from agent.gpu.products import family
from agent.labels.registry import RawFeature, feature_source
from agent.topology.model import Topology

PREFIX = "topolet.io/"
_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_PREFIX = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def valid_label_key(key: str) -> bool:
    """Kubernetes qualified name: optional DNS-subdomain prefix and '/', then a ≤63-char name."""
    prefix, sep, name = key.rpartition("/")
    if sep and (not prefix or len(prefix) > 253 or not _PREFIX.match(prefix)):
        return False
    return 0 < len(name) <= 63 and bool(_NAME.match(name))


def valid_label_value(value: str) -> bool:
    return value == "" or (len(value) <= 63 and bool(_NAME.match(value)))


def _common(values: Sequence[str]) -> str:
    """The one value all GPUs share, else "mixed"."""
    distinct = set(values)
    return values[0] if len(distinct) == 1 else "mixed"


def gpu_labels(gpus: Sequence[GPU], *, gfd_compat: bool = False, mig_layout: str = "",
               driver_version: str = "", cuda_version: str = "") -> dict[str, str]:
    """Labels for the node's GPUs (empty when there are none); every key and value is valid.

    Signature is stable for the label registry: new inputs only ever arrive as keyword arguments.
    `mig_layout` is the named layout in effect (e.g. "all-balanced"); omitted when "".
    """
    if not gpus:
        return {}
    products = [g.product or label_safe(g.name) or "unknown" for g in gpus]
    memory_mib = min(g.memory_bytes for g in gpus) >> 20
    numa = sorted({g.numa_node for g in gpus if g.numa_node >= 0})
    labels = {
        f"{PREFIX}gpu.count": str(len(gpus)),
        f"{PREFIX}gpu.product": _common(products),
        f"{PREFIX}gpu.mig-capable": "true" if any(g.mig_capable for g in gpus) else "false",
    }
    if memory_mib > 0:  # 0: a board the product table does not know, and no NVML to ask
        labels[f"{PREFIX}gpu.memory"] = str(memory_mib)
    if numa:
        labels[f"{PREFIX}gpu.numa-nodes"] = "_".join(map(str, numa))
    layout = label_safe(mig_layout.replace("+", "."))
    if layout:
        labels[f"{PREFIX}gpu.mig-layout"] = layout
    if gfd_compat:
        labels.update(_gfd_labels(gpus, products, memory_mib, driver_version, cuda_version))
    return {k: v for k, v in labels.items() if valid_label_key(k) and valid_label_value(v)}


def _gfd_labels(gpus: Sequence[GPU], products: list[str], memory_mib: int,
                driver_version: str, cuda_version: str) -> dict[str, str]:
    """GPU Feature Discovery's names for the same facts (its "none" MIG strategy)."""
    # GFD labels the first GPU's product; with a mix we say so rather than pick one.
    out = {
        "nvidia.com/gpu.count": str(len(gpus)),
        "nvidia.com/gpu.product": _common(products),
        "nvidia.com/mig.capable": "true" if any(g.mig_capable for g in gpus) else "false",
    }
    if memory_mib > 0:
        out["nvidia.com/gpu.memory"] = str(memory_mib)
    ccs = Counter(g.compute_capability for g in gpus if g.compute_capability)
    if len(ccs) == 1:
        major, minor = next(iter(ccs))
        out["nvidia.com/gpu.compute.major"] = str(major)
        out["nvidia.com/gpu.compute.minor"] = str(minor)
        out["nvidia.com/gpu.family"] = family((major, minor))
    parts = driver_version.split(".")
    if len(parts) >= 2 and all(p.isdigit() for p in parts):
        out["nvidia.com/cuda.driver.major"] = parts[0]
        out["nvidia.com/cuda.driver.minor"] = parts[1]
        if len(parts) > 2:
            out["nvidia.com/cuda.driver.rev"] = parts[2]
    rt = cuda_version.split(".")
    if len(rt) == 2 and all(p.isdigit() for p in rt):
        out["nvidia.com/cuda.runtime.major"], out["nvidia.com/cuda.runtime.minor"] = rt
    return out


@feature_source("gpu")
def gpu_features(topology: Topology) -> Iterator[RawFeature]:
    """`topolet.io/gpu.*` and (for the builder to gate) `nvidia.com/*` from the topology's GPUs."""
    gpus = gpus_from_topology(topology).gpus
    for key, value in gpu_labels(gpus, gfd_compat=True).items():
        namespace, _, name = key.partition("/")
        yield RawFeature(namespace, name, value)
