"""Resource names and Kubernetes quantities, as both halves read and write them.

`GPU_RESOURCE`, `MIG_RESOURCE_PREFIX` (the device plugin's "mixed" strategy) and
`mig_resource_name(profile)`, `hugepages_resource_name(size_bytes)` (2 MiB → "hugepages-2Mi");
`parse_quantity(text) -> Fraction | None` (exact, None when malformed) and `format_quantity(value)`
(whole, else milli, else nano: read back exactly); `pod_level_resource(name)` and
`pod_level_resources(spec)`: what pod-level resources cover, and whether a spec sets them.
"""

from __future__ import annotations

import functools
import re
from fractions import Fraction
from typing import Any

from agent.api.objects import as_dict
from agent.errors import ConfigError

GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
HUGEPAGES_PREFIX = "hugepages-"

# Kubernetes resource quantity: a signed decimal (or exponent) number and a suffix.
_QUANTITY_RE = re.compile(r"([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(?:[eE]([+-]?[0-9]+)|([a-zA-Z]{0,2}))")
_QUANTITY_MAX_CHARS = 64
_SUFFIX: dict[str, Fraction] = {
    "": Fraction(1), "n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000),
    "k": Fraction(10**3), "M": Fraction(10**6), "G": Fraction(10**9), "T": Fraction(10**12),
    "P": Fraction(10**15), "E": Fraction(10**18),
    "Ki": Fraction(2**10), "Mi": Fraction(2**20), "Gi": Fraction(2**30), "Ti": Fraction(2**40),
    "Pi": Fraction(2**50), "Ei": Fraction(2**60),
}
_BINARY_SUFFIXES = (("Ei", 60), ("Pi", 50), ("Ti", 40), ("Gi", 30), ("Mi", 20), ("Ki", 10))


def mig_resource_name(profile: str) -> str:
    """The resource a MIG profile is published as: "1g.10gb" → "nvidia.com/mig-1g.10gb" ("+" → ".")."""
    return f"{MIG_RESOURCE_PREFIX}{profile.replace('+', '.')}"


def hugepages_resource_name(size_bytes: int) -> str:
    """Kubernetes' resource name for a hugepage size: 2 MiB → "hugepages-2Mi", 1 GiB → "hugepages-1Gi"."""
    if size_bytes <= 0:
        raise ConfigError(f"invalid hugepage size {size_bytes}")
    for suffix, shift in _BINARY_SUFFIXES:
        if size_bytes >= 1 << shift and size_bytes % (1 << shift) == 0:
            return f"{HUGEPAGES_PREFIX}{size_bytes >> shift}{suffix}"
    return f"{HUGEPAGES_PREFIX}{size_bytes}"


def parse_quantity(text: object) -> Fraction | None:
    """A Kubernetes quantity ("2", "1500m", "1Gi", "1e3") as an exact fraction; None if malformed
    (or longer than any real one: a tenant may write anything there)."""
    if isinstance(text, int) and not isinstance(text, bool) and abs(text) < 10**18:
        return _parse_quantity(text)
    if not isinstance(text, str) or len(text) > _QUANTITY_MAX_CHARS:
        return None
    return _parse_quantity(text)


@functools.lru_cache(maxsize=4096)  # a cluster's pods repeat a few quantities over and over
def _parse_quantity(text: str | int) -> Fraction | None:
    s = str(text).strip()
    m = _QUANTITY_RE.fullmatch(s)
    if m is None:
        return None
    number, exponent, suffix = m.groups()
    try:
        value = Fraction(number)
    except (ValueError, ZeroDivisionError):
        return None
    if exponent is not None:
        if abs(int(exponent)) > 30:
            return None
        return value * Fraction(10) ** int(exponent)
    if suffix not in _SUFFIX:
        return None
    return value * _SUFFIX[suffix]


def format_quantity(value: Fraction | int) -> str:
    """`value` as a Kubernetes quantity `parse_quantity` reads back exactly (whole, else milli, else
    nano).  A plain integer is a canonical quantity in every unit (cores, bytes, devices)."""
    if value.denominator == 1:
        return str(value.numerator)
    milli = value * 1000
    if milli.denominator == 1:
        return f"{milli.numerator}m"
    return f"{int(value * 10**9)}n"


def pod_level_resource(name: object) -> bool:
    """Whether Kubernetes' pod-level resources (`spec.resources`) cover `name`: cpu, memory and
    `hugepages-<size>` (k8s.io/component-helpers `IsSupportedPodLevelResource`)."""
    return name == "cpu" or name == "memory" or (isinstance(name, str) and name.startswith(HUGEPAGES_PREFIX))


def pod_level_resources(spec: dict[str, Any]) -> bool:
    """Whether a pod spec sets pod-level resources: a request or limit of a resource they cover in
    `spec.resources` (k8s.io/component-helpers `IsPodLevelResourcesSet`)."""
    res = as_dict(spec.get("resources"))
    return any(pod_level_resource(name) for key in ("requests", "limits") for name in as_dict(res.get(key)))
