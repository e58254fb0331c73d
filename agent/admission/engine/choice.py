"""`Choice`: one place for one pod (node, zones and the CPU taken from each, GPU), its sort key and cost."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Choice:
    """Where one pod would go and what it costs."""

    key: tuple[Any, ...]
    node: int
    zones: tuple[int, ...]  # the zones it takes CPU from (empty for node totals)
    cpu_split: tuple[int, ...]  # millicores taken from each of `zones`
    gpu_index: int | None
    cost: float
    # A pod the container scope splits: the zone (position) of each container, in spec order.
    containers: tuple[int, ...] = ()
