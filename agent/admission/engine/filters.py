"""Node filters: whether a node may take pods of a pod set whatever is free there.

Public API: `filter_reason(node, pod_set) -> str | None` (why the node is out, or None) and
`untolerated(node, tolerations) -> (hard, soft)` (whether a NoSchedule/NoExecute taint is not
tolerated, and how many PreferNoSchedule taints are not; the engine ranks such nodes lower).  The rules
are the scheduler's (taints, nodeSelector, required node affinity); pods of a zoned policy need a node
with NUMA zones.  Details: README.md beside this module.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from agent.admission.engine.model import Node, NodeSelectorRequirement, PodSet, Taint, Toleration
from agent.admission.engine.policies import engine_policy


def _tolerates(tol: Toleration, taint: Taint) -> bool:
    if tol.effect and tol.effect != taint.effect:
        return False
    if tol.operator == "Exists":
        return not tol.key or tol.key == taint.key
    return tol.key == taint.key and tol.value == taint.value


def untolerated(node: Node, tolerations: Sequence[Toleration]) -> tuple[bool, int]:
    """(a NoSchedule/NoExecute taint is not tolerated, how many PreferNoSchedule ones are not)."""
    hard, soft = False, 0
    for taint in node.taints:
        if any(_tolerates(t, taint) for t in tolerations):
            continue
        if taint.effect == "PreferNoSchedule":
            soft += 1
        else:
            hard = True
    return hard, soft


def _matches(req: NodeSelectorRequirement, labels: Mapping[str, str]) -> bool:
    value = labels.get(req.key)
    op = req.operator
    if op == "In":
        return value is not None and value in req.values
    if op == "NotIn":
        return value is None or value not in req.values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt") and value is not None and len(req.values) == 1:
        try:
            have, bound = int(value), int(req.values[0])
        except ValueError:
            return False
        return have > bound if op == "Gt" else have < bound
    return False


def filter_reason(node: Node, ps: PodSet) -> str | None:
    """Why `node` cannot take pods of `ps` whatever is free there, or None when it can."""
    if node.unschedulable:
        return "unschedulable"
    if node.taints and untolerated(node, ps.tolerations)[0]:
        return "untolerated taint"
    if any(node.labels.get(k) != v for k, v in ps.node_selector.items()):
        return "nodeSelector"
    if ps.required_affinity and not any(
            all(_matches(req, node.labels) for req in term) for term in ps.required_affinity):
        return "node affinity"
    if not node.zones and engine_policy(ps.policy_on(node)).zoned:
        return "no NUMA zones (no NodeResourceTopology)"
    return None
