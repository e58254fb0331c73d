"""The kueue component's placement policy ranks each pod by the rule its Ready state carries, on a real
API server: dry-run creates of the pods a JobSet's Jobs (and an Indexed Job, and a LeaderWorkerSet's
offset workers) would make, each with the slots and the rule Kueue copied from the Ready state, come
back pinned to their rank's slot, or, where an index cannot be read, still behind the fail-safe
selector (Pending, never placed elsewhere).  The rank is `agent.api.ranks.RankRule.rank`'s, so the
table checks the policy against it.  A pod of Kueue's pod integration (a LeaderWorkerSet's, a
StatefulSet's, a pod group's) gets the slots as Kueue ungates it: that update is pinned the same way,
and an update the API server would refuse to pin (the old pod not gated) is left as it is."""

from __future__ import annotations

from typing import Any

import pytest

from tests.controlplane.fixtures import api, cluster, cluster_session, namespace
from tests.kueue.test_check import FAILSAFE, install_policy

__all__ = ["api", "cluster", "cluster_session", "namespace"]

SLOTS = "n0:0,n0:1,n0:2,n1:0,n1:1,n1:"  # rank 5: node n1 without a zone
JOBSET_RULE = "jobset.sigs.k8s.io/job-index*3+batch.kubernetes.io/job-completion-index"
INDEX = "batch.kubernetes.io/job-completion-index"
JOB_INDEX = "jobset.sigs.k8s.io/job-index"
WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"
RANKED = {"topolet.io/placement-rank": JOBSET_RULE}


def _rank_of(meta: dict[str, Any]) -> int | None:
    """What the controller's own reader makes of the pod: the rank, None when unreadable."""
    from agent.api.ranks import RankRule, parse_rank_rule

    notes = meta.get("annotations", {})
    rule = parse_rank_rule(notes["topolet.io/placement-rank"]) if "topolet.io/placement-rank" in notes \
        else RankRule(INDEX)
    return None if rule is None else rule.rank(meta)


# (what, labels, annotations besides the slots, expected (node, zone) or None: left Pending)
CASES: list[tuple[str, dict[str, str], dict[str, str], tuple[str, str | None] | None]] = [
    ("an Indexed Job's pod, no rule", {}, {INDEX: "4"}, ("n1", "1")),
    ("a JobSet's Job 0, pod 2", {JOB_INDEX: "0", INDEX: "2"}, {"topolet.io/placement-rank": JOBSET_RULE},
     ("n0", "2")),
    ("a JobSet's Job 1, pod 0", {JOB_INDEX: "1", INDEX: "0"}, {"topolet.io/placement-rank": JOBSET_RULE},
     ("n1", "0")),
    ("a JobSet's Job 1, pod 2: a slot without a zone", {JOB_INDEX: "1", INDEX: "2"},
     {"topolet.io/placement-rank": JOBSET_RULE}, ("n1", None)),
    ("the indexes as annotations", {}, {JOB_INDEX: "1", INDEX: "1", "topolet.io/placement-rank": JOBSET_RULE},
     ("n1", "1")),
    ("an offset worker (a LeaderWorkerSet's, indexed from 1)", {WORKER_INDEX: "3"},
     {"topolet.io/placement-rank": WORKER_INDEX,
      "kueue.x-k8s.io/pod-index-offset": "1"}, ("n0", "2")),
    ("no Job index", {INDEX: "1"}, {"topolet.io/placement-rank": JOBSET_RULE}, None),
    ("a pod index past its Job's pods", {JOB_INDEX: "0", INDEX: "3"}, RANKED, None),
    ("a rank past the slots", {JOB_INDEX: "2", INDEX: "0"}, RANKED, None),
    ("an index not in decimal", {INDEX: "0"}, {**RANKED, JOB_INDEX: "+1"}, None),
    ("an index too long", {JOB_INDEX: "0000001", INDEX: "0"}, RANKED, None),
    ("a rule it cannot read", {JOB_INDEX: "0", INDEX: "0"},
     {"topolet.io/placement-rank": "a*3+b*2+" + INDEX}, None),
    ("an offset below zero", {INDEX: "0"}, {"kueue.x-k8s.io/pod-index-offset": "1", INDEX: "0"}, None),
]


@pytest.mark.parametrize(("what", "labels", "notes", "expected"), CASES, ids=[c[0] for c in CASES])
def test_the_policy_pins_each_pod_to_its_rank(api: Any, namespace: str, what: str, labels: dict[str, str],
                                              notes: dict[str, str],
                                              expected: tuple[str, str | None] | None) -> None:
    install_policy(api)
    annotations = {"topolet.io/placements": SLOTS, **notes}
    pod = api.request("POST", f"/api/v1/namespaces/{namespace}/pods", query={"dryRun": "All"},
                      content_type="application/json", body={
                          "apiVersion": "v1", "kind": "Pod",
                          "metadata": {"generateName": "ranked-", "labels": labels,
                                       "annotations": annotations},
                          "spec": {"nodeSelector": {FAILSAFE: "true", "pool": "a"},
                                   "automountServiceAccountToken": False,
                                   "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}})
    selector, got = pod["spec"]["nodeSelector"], pod["metadata"].get("annotations", {})
    rank = _rank_of({"labels": labels, "annotations": annotations})
    if expected is None:
        assert rank is None or rank >= len(SLOTS.split(",")), what  # the controller's reader agrees
        assert selector == {FAILSAFE: "true", "pool": "a"}, what
        assert got == annotations, what
        return
    node, zone = expected
    assert SLOTS.split(",")[rank or 0] == f"{node}:{zone or ''}", what  # the controller's reader agrees
    assert selector == {"pool": "a", "kubernetes.io/hostname": node}, what
    assert got.get("topolet.io/numa-zone") == zone, what
    assert "topolet.io/placements" not in got and "topolet.io/placement-rank" not in got, what


def _gated_pod(api: Any, namespace: str, labels: dict[str, str], notes: dict[str, str]) -> dict[str, Any]:
    return api.create(f"/api/v1/namespaces/{namespace}/pods", {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"generateName": "ungated-", "labels": labels, "annotations": notes},
        "spec": {"nodeSelector": {"pool": "a"}, "automountServiceAccountToken": False,
                 "schedulingGates": [{"name": "kueue.x-k8s.io/admission"}],
                 "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}})


def _ungate(api: Any, pod: dict[str, Any], rule: str) -> dict[str, Any]:
    """Kueue's pod integration starting the pod: its gate lifted and the podSetUpdates merged in."""
    pod["spec"]["schedulingGates"] = []
    pod["spec"]["nodeSelector"][FAILSAFE] = "true"
    pod["metadata"].setdefault("annotations", {}).update(
        {"topolet.io/placements": SLOTS, "topolet.io/placement-rank": rule})
    meta = pod["metadata"]
    out: dict[str, Any] = api.request("PUT", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                                      body=pod, content_type="application/json")
    return out


@pytest.mark.parametrize(("what", "labels", "notes", "rule", "expected"), [
    ("a LeaderWorkerSet's worker 2, indexed from 1", {WORKER_INDEX: "2"},
     {"kueue.x-k8s.io/pod-index-offset": "1"}, WORKER_INDEX, ("n0", "1")),
    ("a StatefulSet's pod 3", {"apps.kubernetes.io/pod-index": "3"}, {}, "apps.kubernetes.io/pod-index",
     ("n1", "0")),
    ("a pod group's pod 5: a slot without a zone", {"kueue.x-k8s.io/pod-group-pod-index": "5"}, {},
     "kueue.x-k8s.io/pod-group-pod-index", ("n1", None)),
    ("no index", {}, {}, "apps.kubernetes.io/pod-index", None),
])
def test_the_policy_pins_each_pod_as_kueue_ungates_it(
        api: Any, namespace: str, what: str, labels: dict[str, str], notes: dict[str, str], rule: str,
        expected: tuple[str, str | None] | None) -> None:
    install_policy(api)
    pod = _ungate(api, _gated_pod(api, namespace, labels, notes), rule)
    selector, got = pod["spec"]["nodeSelector"], pod["metadata"].get("annotations", {})
    assert not pod["spec"].get("schedulingGates"), what
    if expected is None:
        assert selector == {FAILSAFE: "true", "pool": "a"}, what
        assert got["topolet.io/placements"] == SLOTS, what
        return
    node, zone = expected
    assert selector == {"pool": "a", "kubernetes.io/hostname": node}, what
    assert got.get("topolet.io/numa-zone") == zone, what
    assert "topolet.io/placements" not in got and "topolet.io/placement-rank" not in got, what


def test_an_update_of_a_pod_left_behind_the_failsafe_is_not_pinned(api: Any, namespace: str) -> None:
    """Its node selector is the API server's to keep once it has no gate: a later update (a label, a
    finalizer removed) goes through as written, and the pod stays Pending."""
    install_policy(api)
    pod = _ungate(api, _gated_pod(api, namespace, {}, {}), "apps.kubernetes.io/pod-index")
    again = api.patch(f"/api/v1/namespaces/{namespace}/pods/{pod['metadata']['name']}",
                      {"metadata": {"labels": {"later": "yes"}}}, "application/merge-patch+json")
    assert again["metadata"]["labels"]["later"] == "yes"
    assert again["spec"]["nodeSelector"] == {FAILSAFE: "true", "pool": "a"}
