"""The zone and placements formats the admission controller writes on pods and the agent pins by.

Public API:
- `parse_numa_zone(value)` / `numa_zone_value(zone, zones)`: `topolet.io/numa-zone` ("<N>", or one
  zone per regular container "<N>,<M>,...") read and written.
- `parse_placement(entry)`, `placement_entry(text, index)`: `topolet.io/placements`
  ("<node>:<zone>,...", one entry per completion index, an empty zone: none).
- `completion_index(meta)`: an Indexed Job's pod's index.
- `MAX_NUMA_ZONE`, `MAX_CONTAINER_ZONES`, `MAX_COMPLETION_INDEX`: the bounds every reader applies.
The one reader of each format, for the agent and the admission controller.
"""

from __future__ import annotations

from typing import Any

from agent.api.names import COMPLETION_INDEX, PLACEMENTS
from agent.api.objects import as_dict, decimal

MAX_NUMA_ZONE = 1023  # Linux numbers at most 1024 NUMA nodes
MAX_COMPLETION_INDEX = 10**6  # above the API's limit on an Indexed Job's completions


MAX_CONTAINER_ZONES = 64  # zones one `topolet.io/numa-zone` value may list (one per container)


def parse_numa_zone(value: object) -> tuple[int | None, tuple[int, ...]] | None:
    """A `topolet.io/numa-zone` value: ("<N>" → (N, ()): the pod's zone) or ("<N>,<M>,..." → (None,
    (N, M, ...)): a zone per regular container, in spec order); None when malformed.

    The one reader of the format, for the agent and the admission controller (`agent.admission`)."""
    if not isinstance(value, str):
        return None
    parts = value.split(",", MAX_CONTAINER_ZONES)
    zones = [decimal(p, MAX_NUMA_ZONE) for p in parts]
    if len(parts) > MAX_CONTAINER_ZONES or any(z is None for z in zones):
        return None
    if len(zones) == 1:
        return zones[0], ()
    return None, tuple(z for z in zones if z is not None)


def numa_zone_value(zone: int | None, zones: tuple[int, ...] = ()) -> str | None:
    """The `topolet.io/numa-zone` value of a pod's zone, or of its containers' zones; None for neither."""
    if zones:
        return ",".join(str(z) for z in zones)
    return None if zone is None else str(zone)


def parse_placement(entry: str) -> tuple[str, int | None] | None:
    """One "node:zone" entry of `topolet.io/placements` (an empty zone: none); None when malformed.

    The one reader of the format, for the agent and the admission controller (`agent.admission`)."""
    node, sep, zone = entry.partition(":")
    number = decimal(zone, MAX_NUMA_ZONE)
    if not sep or not node or (zone and number is None):
        return None
    return node, number


def placement_entry(text: str, index: int) -> tuple[str, int | None] | str:
    """Entry `index` of a `topolet.io/placements` value as (node, zone or None), or why it is not one."""
    entries = text.split(",")
    if index >= len(entries):
        return f"{PLACEMENTS}: no entry for completion index {index} ({len(entries)} entries)"
    parsed = parse_placement(entries[index])
    if parsed is None:
        return f"{PLACEMENTS}: entry {index} {entries[index][:64]!r} is not <node>:<NUMA node id>"
    return parsed


def completion_index(meta: dict[str, Any]) -> int | None:
    """The completion index a pod's metadata carries (Indexed Jobs), None when it has no valid one."""
    return decimal(as_dict(meta.get("annotations")).get(COMPLETION_INDEX), MAX_COMPLETION_INDEX)
