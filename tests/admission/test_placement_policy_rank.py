"""The native route's placement policy (daemonset/controller/placement-policy.yaml) ranks each pod by the
rule its template carries, on a real API server: dry-run creates of the gated pods an Indexed Job and a
queued JobSet's Jobs would make come back pinned to their rank's slot (the gate lifted, the node's name
required), or, where an index cannot be read, as created: gated, for the controller to patch.  The rank
is `agent.api.ranks.RankRule.rank`'s, so the table checks the policy against the controller's reader."""

from __future__ import annotations

from typing import Any

import pytest

from agent.api.ranks import RankRule, parse_rank_rule
from tests.controlplane.cluster import Cluster
from tests.controlplane.fixtures import api, cluster, cluster_session, namespace

__all__ = ["api", "cluster", "cluster_session", "namespace"]

pytestmark = pytest.mark.integration

GATE = {"name": "topolet.io/placement"}
SLOTS = "n0:0,n0:1,n0:2,n1:0,n1:1,n1:"  # rank 5: node n1 without a zone
INDEX = "batch.kubernetes.io/job-completion-index"
JOB_INDEX = "jobset.sigs.k8s.io/job-index"
RULE = f"{JOB_INDEX}*3+{INDEX}"
RANKED = {"topolet.io/placement-rank": RULE}

# (what, labels, annotations besides the slots, expected (node, zone) or None: left gated)
CASES: list[tuple[str, dict[str, str], dict[str, str], tuple[str, str | None] | None]] = [
    ("an Indexed Job's pod, no rule", {}, {INDEX: "4"}, ("n1", "1")),
    ("a JobSet's Job 0, pod 2", {JOB_INDEX: "0", INDEX: "2"}, {**RANKED, INDEX: "2"}, ("n0", "2")),
    ("a JobSet's Job 1, pod 0", {JOB_INDEX: "1", INDEX: "0"}, {**RANKED, INDEX: "0"}, ("n1", "0")),
    ("a slot without a zone", {JOB_INDEX: "1", INDEX: "2"}, RANKED, ("n1", None)),
    ("the indexes as annotations", {}, {**RANKED, JOB_INDEX: "1", INDEX: "1"}, ("n1", "1")),
    ("no Job index", {INDEX: "1"}, RANKED, None),
    ("a pod index past its Job's pods", {JOB_INDEX: "0", INDEX: "3"}, RANKED, None),
    ("a rank past the slots", {JOB_INDEX: "2", INDEX: "0"}, RANKED, None),
    ("an index not in decimal", {INDEX: "0"}, {**RANKED, JOB_INDEX: "+1"}, None),
    ("a rule it cannot read", {JOB_INDEX: "0", INDEX: "0"},
     {"topolet.io/placement-rank": "a*3+b*2+" + INDEX}, None),
    ("no index at all", {}, {}, None),
]


@pytest.mark.parametrize(("what", "labels", "notes", "expected"), CASES, ids=[c[0] for c in CASES])
def test_the_native_policy_pins_each_gated_pod_to_its_rank(
        cluster: Cluster, api: Any, namespace: str, what: str, labels: dict[str, str], notes: dict[str, str],
        expected: tuple[str, str | None] | None) -> None:
    cluster.install_placement_policy()
    annotations = {"topolet.io/placements": SLOTS, **notes}
    pod = api.request("POST", f"/api/v1/namespaces/{namespace}/pods", query={"dryRun": "All"},
                      content_type="application/json", body={
                          "apiVersion": "v1", "kind": "Pod",
                          "metadata": {"generateName": "ranked-",
                                       "labels": {**labels, "topolet.io/placements-by-index": "true"},
                                       "annotations": annotations},
                          "spec": {"nodeSelector": {"pool": "a"}, "schedulingGates": [GATE],
                                   "automountServiceAccountToken": False,
                                   "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}})
    selector, got = pod["spec"]["nodeSelector"], pod["metadata"].get("annotations", {})
    rule = parse_rank_rule(notes.get("topolet.io/placement-rank", INDEX))
    rank = rule.rank({"labels": labels, "annotations": annotations}) if isinstance(rule, RankRule) else None
    if expected is None:
        assert rank is None or rank >= len(SLOTS.split(",")), what  # the controller's reader agrees
        assert selector == {"pool": "a"} and pod["spec"]["schedulingGates"] == [GATE], what
        assert got == annotations, what
        return
    node, zone = expected
    assert SLOTS.split(",")[rank or 0] == f"{node}:{zone or ''}", what  # the controller's reader agrees
    assert selector == {"pool": "a", "kubernetes.io/hostname": node}, what
    assert not pod["spec"].get("schedulingGates"), what
    terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"][0]["matchFields"][0]["values"] == [node], what
    assert got.get("topolet.io/numa-zone") == zone, what
    assert "topolet.io/placements" not in got and "topolet.io/placement-rank" not in got, what
