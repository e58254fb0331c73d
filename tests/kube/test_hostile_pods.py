"""A tenant's pod never stops a node's agent: `plan_pod` raises only PodError whatever the pod says,
and the pod watch skips an object it cannot handle and moves past it (never replays it)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.api.placements import completion_index, parse_placement, placement_entry
from agent.api.podplan import plan_pod
from agent.api.resources import parse_quantity
from agent.kube.pods.watch import Changed, PodChange, PodWatcher
from tests.conftest import examples

CID = "containerd://" + "ab" * 32
HOSTILE = st.sampled_from(["0", "1", "²", "٣", "07", "9" * 5000, "-1", " 2", "", "1e3", "n1:²", "n1:0,n1:1",
                           "n1:", ":", "n1:99999", "n1:0," * 20_000]) | st.text(max_size=12)
NOTES = st.dictionaries(st.sampled_from(["topolet.io/numa-zone", "topolet.io/placements",
                                         "batch.kubernetes.io/job-completion-index", "topolet.io/numa-policy",
                                         "topolet.io/cpu-policy"]), HOSTILE, max_size=4)
QUANTITY = st.sampled_from(["2", "1e33", "1e-33", "²", "9" * 5000, "-2", "2.5", "2Ki", ""]) | st.integers()


def guaranteed(annotations: dict[str, Any], cpu: Any = "2", node: str = "n1") -> dict[str, Any]:
    res = {"cpu": cpu, "memory": "1Gi"}
    return {"metadata": {"uid": "u", "namespace": "t", "name": "p", "annotations": annotations},
            "spec": {"nodeName": node,
                     "containers": [{"name": "c", "resources": {"requests": res, "limits": res}}]},
            "status": {"phase": "Running", "qosClass": "Guaranteed",
                       "containerStatuses": [{"name": "c", "containerID": CID, "state": {"running": {}}}]}}


@settings(max_examples=examples(300), deadline=None)
@given(NOTES, QUANTITY)
def test_plan_pod_never_raises_on_hostile_annotations_or_quantities(notes: dict[str, Any], cpu: Any) -> None:
    plan = plan_pod(guaranteed(notes, cpu))
    for x in plan.containers:
        assert x.cpus >= 0 and (x.numa_zone is None or 0 <= x.numa_zone <= 1023)


@given(HOSTILE)
def test_placement_readers_never_raise(text: str) -> None:
    parse_placement(text)
    placement_entry(text, 0)
    placement_entry(text, 10**6)
    completion_index({"annotations": {"batch.kubernetes.io/job-completion-index": text}})
    parse_quantity(text)


def test_a_superscript_completion_index_is_a_bad_annotation_not_a_crash() -> None:
    """The review's poison pod: placements naming this node and index "²" (which isdigit() takes)."""
    plan = plan_pod(guaranteed({"topolet.io/placements": "n1:0",
                                "batch.kubernetes.io/job-completion-index": "²"}))
    assert [w.reason for w in plan.warnings] == ["InvalidAnnotation"]
    assert plan.containers[0].cpus == 0  # the shared pool: never a wrong pin


@pytest.mark.parametrize("value", [10**5000, "9" * 5000, "1e33"], ids=["huge-int", "long", "1e33"])
def test_an_unreadable_quantity_is_none(value: object) -> None:
    assert parse_quantity(value) is None


class _Watcher(PodWatcher):
    def __init__(self, sink: Any) -> None:
        self.invalid = 0

        def count() -> None:
            self.invalid += 1
        super().__init__(object(), "n1", sink, on_invalid=count)


def test_an_event_whose_handling_fails_is_skipped_and_never_replayed() -> None:
    def sink(change: PodChange) -> None:
        if isinstance(change, Changed) and change.plan.name == "poison":
            raise ValueError("a defect in the handler")

    watcher = _Watcher(sink)
    poison = guaranteed({})
    poison["metadata"].update(name="poison", resourceVersion="7")
    watcher.receive({"type": "ADDED", "object": poison})
    assert watcher.resource_version == "7" and watcher.invalid == 1
    watcher.receive({"type": "ADDED", "object": {"metadata": {"resourceVersion": "8"}}})  # no identity
    assert watcher.resource_version == "8" and watcher.invalid == 2
