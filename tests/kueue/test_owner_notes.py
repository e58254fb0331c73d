"""`CheckWrites.known_notes`: the template annotations Kueue leaves out of a pod group's Workload, read
from its LeaderWorkerSet or StatefulSet once, on a writer, with a pass asked for when they are in."""

from __future__ import annotations

import threading
from typing import Any

from agent.admission.kueue.writes import CheckWrites
from agent.admission.report.metrics import AdmissionMetrics
from agent.errors import KubeAPIError
from tests.kube.kubelet_standin import wait_for

STS = {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "s", "uid": "sts-1"},
       "spec": {"template": {"metadata": {"annotations": {"topolet.io/numa-policy": "restricted"}}}}}


class _Kube:
    """GETs answered from `objects` by path (a missing path: 404), counted."""

    def __init__(self, objects: dict[str, dict[str, Any]]) -> None:
        self.objects, self.gets = objects, []

    def get(self, path: str, *_: Any, **__: Any) -> dict[str, Any]:
        self.gets.append(path)
        if path not in self.objects:
            raise KubeAPIError(f"GET {path}: not found", 404)
        return self.objects[path]


def writes(kube: _Kube) -> tuple[CheckWrites, threading.Event]:
    changed = threading.Event()
    out = CheckWrites(kube, AdmissionMetrics(), None, None, changed,  # type: ignore[arg-type]
                      lambda: None, lambda: 0.0, lambda _: None, "test")
    return out, changed


def group_workload(uid: str = "sts-1", kind: str = "StatefulSet", api: str = "apps/v1") -> dict[str, Any]:
    return {"metadata": {"name": "w", "namespace": "ns", "uid": "wl-1",
                         "annotations": {"kueue.x-k8s.io/is-group-workload": "true"},
                         "ownerReferences": [{"apiVersion": api, "kind": kind, "name": "s", "uid": uid},
                                             {"apiVersion": "v1", "kind": "Pod", "name": "s-0", "uid": "p"}]}}


def test_the_owner_is_read_once_and_a_pass_follows() -> None:
    kube = _Kube({"/apis/apps/v1/namespaces/ns/statefulsets/s": STS})
    w, changed = writes(kube)
    try:
        assert w.known_notes(group_workload()) is None  # being read
        wait_for(changed.is_set, "a pass asked for")
        assert w.known_notes(group_workload()) == {"main": {"topolet.io/numa-policy": "restricted"}}
        assert kube.gets == ["/apis/apps/v1/namespaces/ns/statefulsets/s"]
        w.retain({"wl-1"}, {"sts-1"})
        assert w.known_notes(group_workload()) is not None  # kept while its owner is
        w.retain(set(), set())
        assert w.known_notes(group_workload()) is None  # forgotten: read again
    finally:
        w.stop()


def test_an_owner_that_cannot_be_read_or_is_another_counts_as_none() -> None:
    """A 404, or an object of that name with another uid (made again): decided without its notes
    rather than never."""
    kube = _Kube({"/apis/apps/v1/namespaces/ns/statefulsets/s": STS})
    w, changed = writes(kube)
    try:
        for wl in (group_workload(uid="other"),
                   group_workload(kind="LeaderWorkerSet", api="leaderworkerset.x-k8s.io/v1")):
            changed.clear()
            assert w.known_notes(wl) is None
            wait_for(changed.is_set, "a pass asked for")
            assert w.known_notes(wl) == {}
        job = {"metadata": {"ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "j",
                                                 "uid": "j", "controller": True}]}}
        assert w.known_notes(job) == {}  # nothing to read
        assert len(kube.gets) == 2
    finally:
        w.stop()
