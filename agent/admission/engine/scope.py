"""The container scope: where a pod's containers go on a node that aligns each container on its own.

Pure: plain integers in, no I/O.  `split` puts each container of a single-numa-node pod in a zone that
holds it; the engine uses it only where no zone holds the pod whole, and the node's agent pins each
container in the zone the placement names (`PodPlacement.zones`), so the engine counts exactly what the
agent takes.  Why, and the annotation that carries the zones: README.md beside this module.
"""

from __future__ import annotations

from collections.abc import Sequence

MAX_CONTAINERS = 64  # a pod with more containers is not split (agent.api.placements.MAX_CONTAINER_ZONES)


def split(zone_free: Sequence[int], containers: Sequence[int]) -> tuple[int, ...] | None:
    """For each container (its CPU in millicores, spec order), the position in `zone_free` (each
    zone's free CPU in millicores) it goes to: largest first, each in the tightest zone that holds it
    (lowest position on a tie); None when one finds no zone, or for more than MAX_CONTAINERS."""
    if not containers or len(containers) > MAX_CONTAINERS:
        return None
    room = list(zone_free)
    where = [0] * len(containers)
    for k in sorted(range(len(containers)), key=lambda k: (-containers[k], k)):
        fits = [(f, z) for z, f in enumerate(room) if f >= containers[k]]
        if not fits:
            return None
        _, z = min(fits)
        room[z] -= containers[k]
        where[k] = z
    return tuple(where)
