"""agent/api/ranks.py: a pod's rank in its pod set from the index labels Kueue names (Kueue's TAS rank)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.api.ranks import OFFSET_ANNOTATION, RankRule, parse_rank_rule, rank_rule

JOB = "batch.kubernetes.io/job-completion-index"
JOBSET = "jobset.sigs.k8s.io/job-index"
MPI = "training.kubeflow.org/replica-index"
LWS = "leaderworkerset.sigs.k8s.io/worker-index"
JOBSET_RULE = RankRule(JOB, JOBSET, 3)


def pod(labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {"labels": labels or {}, "annotations": annotations or {}}


@pytest.mark.parametrize(("request_", "count", "want"), [
    # As Kueue v0.17 fills them: a Job, a JobSet's replicated Job (2 Jobs of 3), an MPIJob's workers, an
    # LWS group's workers.
    ({"podIndexLabel": JOB}, 4, RankRule(JOB)),
    ({"podIndexLabel": JOB, "subGroupIndexLabel": JOBSET, "subGroupCount": 2}, 6, JOBSET_RULE),
    ({"podIndexLabel": MPI}, 6, RankRule(MPI)),
    ({"podIndexLabel": LWS, "podSetGroupName": "g"}, 2, RankRule(LWS)),
    ({"podIndexLabel": JOB, "subGroupIndexLabel": JOBSET, "subGroupCount": 1}, 5, RankRule(JOB, JOBSET, 5)),
])
def test_the_topology_request_gives_the_rule(request_: dict[str, Any], count: int, want: RankRule) -> None:
    assert rank_rule(request_, count) == want


@pytest.mark.parametrize(("request_", "count", "why"), [
    (None, 3, "names no podIndexLabel"),
    ({}, 3, "names no podIndexLabel"),
    ({"required": "rack"}, 3, "names no podIndexLabel"),
    ({"podIndexLabel": ""}, 3, "names no podIndexLabel"),
    ({"podIndexLabel": 7}, 3, "names no podIndexLabel"),
    ({"podIndexLabel": JOB, "subGroupIndexLabel": JOBSET}, 6, "without a positive subGroupCount"),
    ({"podIndexLabel": JOB, "subGroupIndexLabel": JOBSET, "subGroupCount": 0}, 6, "without a positive"),
    ({"podIndexLabel": JOB, "subGroupIndexLabel": JOBSET, "subGroupCount": True}, 6, "without a positive"),
    ({"podIndexLabel": JOB, "subGroupIndexLabel": JOBSET, "subGroupCount": "2"}, 6, "without a positive"),
    ({"podIndexLabel": JOB, "subGroupIndexLabel": JOBSET, "subGroupCount": 4}, 6, "do not split into 4"),
    ({"podIndexLabel": "a*b"}, 3, "are not label keys"),
    ({"podIndexLabel": "x+y"}, 3, "are not label keys"),
    ({"podIndexLabel": JOB, "subGroupIndexLabel": "-bad", "subGroupCount": 1}, 3, "are not label keys"),
])
def test_a_request_without_a_usable_index_says_why(request_: object, count: int, why: str) -> None:
    got = rank_rule(request_, count)
    assert isinstance(got, str) and why in got


@pytest.mark.parametrize(("rule", "meta", "want"), [
    (RankRule(JOB), pod(annotations={JOB: "4"}), 4),
    (RankRule(JOB), pod(labels={JOB: "4"}, annotations={JOB: "9"}), 4),  # the label first, as Kueue reads
    (RankRule(MPI), pod(labels={MPI: "0"}), 0),
    (JOBSET_RULE, pod(labels={JOBSET: "1", JOB: "2"}), 5),
    (JOBSET_RULE, pod(labels={JOBSET: "0"}, annotations={JOB: "0"}), 0),
    # LWS workers count from 1 beside their leader: Kueue's offset annotation brings them to 0.
    (RankRule(LWS), pod(labels={LWS: "1"}, annotations={OFFSET_ANNOTATION: "1"}), 0),
    (RankRule(LWS), pod(labels={LWS: "3"}, annotations={OFFSET_ANNOTATION: "1"}), 2),
    # No rank: an index missing, malformed, past its sub-group, or the offset below 0.
    (RankRule(JOB), pod(), None),
    (RankRule(JOB), pod(labels={JOB: "01"}), None),
    (RankRule(JOB), pod(labels={JOB: "-1"}), None),
    (RankRule(JOB), pod(labels={JOB: " 1"}), None),
    (RankRule(JOB), pod(labels={JOB: "1" * 9}), None),
    (JOBSET_RULE, pod(labels={JOB: "1"}), None),
    (JOBSET_RULE, pod(labels={JOBSET: "1", JOB: "3"}), None),
    (RankRule(LWS), pod(labels={LWS: "0"}, annotations={OFFSET_ANNOTATION: "1"}), None),
    (RankRule(JOB), {"labels": "not a map", "annotations": ["x"]}, None),
])
def test_a_pods_rank(rule: RankRule, meta: dict[str, Any], want: int | None) -> None:
    assert rule.rank(meta) == want


@pytest.mark.parametrize("text", [
    None, 3, "", "*3+a", "a*0+b", "a*3+", "a*03+b", "a*3b", "a+b", "a*3+b*2+c", "a*99999999+b", "x" * 800,
    "a b", "/a", "a/",
])
def test_what_is_not_a_rule_reads_as_none(text: object) -> None:
    assert parse_rank_rule(text) is None


_label = st.from_regex(
    r"(?:[a-z0-9]{1,8}(?:\.[a-z0-9]{1,8}){0,2}/)?[A-Za-z0-9][-A-Za-z0-9_.]{0,20}[A-Za-z0-9]", fullmatch=True)


@given(_label, st.one_of(st.none(), _label), st.integers(1, 10**6))
def test_every_rule_reads_back_as_written(pod_label: str, sub_label: str | None, per: int) -> None:
    rule = RankRule(pod_label) if sub_label is None else RankRule(pod_label, sub_label, per)
    assert parse_rank_rule(rule.value()) == rule


@given(st.integers(1, 8), st.integers(1, 8))
def test_ranks_of_a_whole_jobset_are_each_slot_once(groups: int, per: int) -> None:
    request = {"podIndexLabel": JOB, "subGroupIndexLabel": JOBSET, "subGroupCount": groups}
    rule = rank_rule(request, groups * per)
    assert isinstance(rule, RankRule)
    ranks = [rule.rank(pod(labels={JOBSET: str(g), JOB: str(i)})) for g in range(groups) for i in range(per)]
    assert ranks == list(range(groups * per))
