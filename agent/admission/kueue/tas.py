"""Kueue's Topology Aware Scheduling assignment of a pod set, read so that the check places inside it.

Pure: no I/O.  `tas_domains(topologyAssignment)` -> [`Domain`] in Kueue's order (TASError when it
cannot be read); `split(pod_set, domains)` -> one pod set per domain, named `part_name`; `whole(name)`
-> (the Workload pod set's name, the rank its part starts at); `placed_by_tas(gang)`.  Kueue's ungater
gives the pod of rank r the r-th pod place of the domains in order, so a part's pod i is rank offset + i.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from agent.admission.engine.model import Gang, PodSet
from agent.api.objects import as_dict, as_list, json_int

MAX_DOMAINS = 100_000  # past any cluster's nodes
MAX_PODS = 10**6
_PART = "/tas"  # "/" never appears in a Workload pod set's name (a DNS label)


class TASError(ValueError):
    """A topologyAssignment that cannot be read; the message says why."""


@dataclass(frozen=True)
class Domain:
    """One domain of a TAS assignment: the node labels that name it (level -> value) and its pods."""

    selector: tuple[tuple[str, str], ...]
    count: int


def _value(values: Mapping[str, Any], i: int, where: str) -> str:
    universal = values.get("universal")
    if universal is not None:
        if not isinstance(universal, str):
            raise TASError(f"{where}: universal is not a string")
        return universal
    individual = as_dict(values.get("individual"))
    roots = as_list(individual.get("roots"))
    prefix, suffix = individual.get("prefix", ""), individual.get("suffix", "")
    if i >= len(roots) or not all(isinstance(x, str) for x in (roots[i], prefix, suffix)):
        raise TASError(f"{where}: no value for domain {i}")
    return f"{prefix}{roots[i]}{suffix}"


def _count(counts: Mapping[str, Any], i: int, where: str) -> int:
    universal = counts.get("universal")
    raw = universal if universal is not None else (
        as_list(counts.get("individual"))[i] if i < len(as_list(counts.get("individual"))) else None)
    count = json_int(raw, MAX_PODS)
    if count is None:
        raise TASError(f"{where}: no pod count for domain {i}")
    return count


def tas_domains(assignment: object) -> list[Domain]:
    """The domains of a `topologyAssignment` (kueue.x-k8s.io/v1beta2: `levels`, `slices` of
    `domainCount` domains with `valuesPerLevel` and `podCounts`), in Kueue's order."""
    ta = as_dict(assignment)
    levels = as_list(ta.get("levels"))
    if not levels or not all(isinstance(k, str) and k for k in levels):
        raise TASError("its levels are not node label keys")
    out: list[Domain] = []
    for s, raw in enumerate(as_list(ta.get("slices"))):
        piece = as_dict(raw)
        where = f"slice {s}"
        domains = json_int(piece.get("domainCount"), MAX_DOMAINS)
        per_level = as_list(piece.get("valuesPerLevel"))
        if not domains or len(per_level) != len(levels) or len(out) + domains > MAX_DOMAINS:
            raise TASError(f"{where}: {piece.get('domainCount')!r} domains over {len(per_level)} of "
                           f"{len(levels)} levels")
        for i in range(domains):
            values = tuple((str(k), _value(as_dict(v), i, f"{where} level {k}"))
                           for k, v in zip(levels, per_level, strict=True))
            out.append(Domain(values, _count(as_dict(piece.get("podCounts")), i, where)))
    if not out:
        raise TASError("it has no domains")
    return out


def part_name(name: str, offset: int) -> str:
    """The name of the part of pod set `name` whose first pod is rank `offset`."""
    return f"{name}{_PART}{offset}"


def whole(name: str) -> tuple[str, int]:
    """(the Workload pod set's name, the rank its first pod is) of a pod set `split` made, or of any other
    (offset 0)."""
    base, sep, offset = name.rpartition(_PART)
    if sep and offset.isdigit():
        return base, int(offset)
    return name, 0


def split(pod_set: PodSet, domains: list[Domain]) -> list[PodSet]:
    """`pod_set` as one pod set per domain with pods, each restricted to its domain's node labels (on top
    of its own node selector) and named `part_name(name, its first rank)`; TASError when the domains'
    pods are not the pod set's count."""
    total = sum(d.count for d in domains)
    if total != pod_set.count:
        raise TASError(f"its domains hold {total} pods, the pod set {pod_set.count}")
    parts, offset = [], 0
    for d in domains:
        clash = [k for k, v in d.selector if pod_set.node_selector.get(k, v) != v]
        if clash:
            raise TASError(f"its domain {dict(d.selector)} contradicts the pod set's node selector on "
                           f"{clash[0]}")
        if d.count:
            parts.append(replace(pod_set, name=part_name(pod_set.name, offset), count=d.count,
                                 node_selector={**pod_set.node_selector, **dict(d.selector)}))
        offset += d.count
    return parts


def placed_by_tas(gang: Gang) -> bool:
    """Whether some pod set of `gang` was split by a TAS assignment: a gang that never fits inside it
    may fit inside the next one Kueue's TAS chooses, so it is told Retry, not Rejected."""
    return any(whole(ps.name)[0] != ps.name for ps in gang.pod_sets)
