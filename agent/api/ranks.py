"""Which slot of its pod set a pod takes: its rank, read from the index labels its operator sets.

Kueue names them in each Workload pod set's `topologyRequest` (kueue.x-k8s.io/v1beta2): `podIndexLabel`,
and for sets of sub-groups (a JobSet's replicated Jobs) `subGroupIndexLabel` and `subGroupCount`.  The
rank is Kueue's TAS rank: sub-group index × pods per sub-group + pod index − the pod's
`kueue.x-k8s.io/pod-index-offset`.  A Ready state carries the rule as `topolet.io/placement-rank`
(`RankRule.value`), which the Kueue placement policy and the ledger read back (`parse_rank_rule`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agent.api.objects import as_dict, decimal, json_int

RANK_ANNOTATION = "topolet.io/placement-rank"
OFFSET_ANNOTATION = "kueue.x-k8s.io/pod-index-offset"
MAX_RANK = 10**6  # as MAX_COMPLETION_INDEX: past any pod set the API admits
# A label key: an optional DNS-subdomain prefix and "/", then a name of at most 63 characters.
_KEY = r"(?:[a-z0-9](?:[-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_VALUE = re.compile(rf"(?:(?P<sub>{_KEY})\*(?P<per>[1-9][0-9]{{0,6}})\+)?(?P<pod>{_KEY})")


@dataclass(frozen=True)
class RankRule:
    """How a pod set's pods are ranked: `pod_index` alone, or `sub_group` × `per_sub_group` + `pod_index`."""

    pod_index: str
    sub_group: str | None = None
    per_sub_group: int = 0

    def value(self) -> str:
        """The `topolet.io/placement-rank` annotation: `<pod label>` or `<sub label>*<n>+<pod label>`."""
        if self.sub_group is None:
            return self.pod_index
        return f"{self.sub_group}*{self.per_sub_group}+{self.pod_index}"

    def rank(self, meta: Mapping[str, Any]) -> int | None:
        """The rank of the pod with metadata `meta` (a label, else an annotation of that name), None when
        an index is missing or malformed, or the offset takes it below 0."""
        pod = _index(meta, self.pod_index)
        if pod is None:
            return None
        rank = pod
        if self.sub_group is not None:
            sub = _index(meta, self.sub_group)
            if sub is None or pod >= self.per_sub_group:
                return None
            rank = sub * self.per_sub_group + pod
        offset = decimal(as_dict(meta.get("annotations")).get(OFFSET_ANNOTATION), MAX_RANK)
        rank -= offset or 0
        return rank if 0 <= rank <= MAX_RANK else None


def _index(meta: Mapping[str, Any], key: str) -> int | None:
    text = as_dict(meta.get("labels")).get(key)
    if text is None:
        text = as_dict(meta.get("annotations")).get(key)
    return decimal(text, MAX_RANK)


def parse_rank_rule(text: object) -> RankRule | None:
    """A `topolet.io/placement-rank` value back into its rule; None when it is not one."""
    if not isinstance(text, str) or len(text) > 700:
        return None
    found = _VALUE.fullmatch(text)
    if found is None:
        return None
    if found["sub"] is None:
        return RankRule(found["pod"])
    return RankRule(found["pod"], found["sub"], int(found["per"]))


def rank_rule(topology_request: object, count: int) -> RankRule | str:
    """The rule a Workload pod set's `topologyRequest` gives its `count` pods, or why there is none."""
    request = as_dict(topology_request)
    pod = request.get("podIndexLabel")
    if not isinstance(pod, str) or not pod:
        return "its topologyRequest names no podIndexLabel"
    sub = request.get("subGroupIndexLabel")
    if sub is None:
        rule = RankRule(pod)
    else:
        groups = json_int(request.get("subGroupCount"), MAX_RANK)
        if not isinstance(sub, str) or not sub or not groups:
            return "its topologyRequest names a subGroupIndexLabel without a positive subGroupCount"
        if count % groups:
            return f"its {count} pods do not split into {groups} equal sub-groups"
        rule = RankRule(pod, sub, count // groups)
    if parse_rank_rule(rule.value()) != rule:
        return f"its index labels {rule.value()[:120]!r} are not label keys"
    return rule
